"""A run session owns every change made for it, and its summary tells each one truly.

Through real mounts: ``rwfs run --batch`` and ``--review`` sessions undone with their
deletions, a later session's write into an earlier session's open batch (told, at the
start and in the summary, never silent), each refusal with its own reason and draft, and
what ``undo`` leaves.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, check_clean, rwfs_mounted
from test_run_cli import rwfs


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    ws = tmp_path / "proj"
    (ws / "src").mkdir(parents=True)
    (ws / ".git").mkdir()
    (ws / "src" / "app.py").write_text("x = 1\n")
    (ws / "notes.txt").write_text("hello\n")
    (ws / "old.txt").write_text("to be removed\n")
    (ws / "old.txt").chmod(0o640)
    try:
        yield ws
    finally:
        if rwfs_mounted(str(ws)):
            subprocess.run(["fusermount3", "-u", "-z", str(ws)], capture_output=True)
            raise AssertionError(f"{ws} was left mounted")


def tree(top: Path) -> dict[str, tuple[int, bytes]]:
    """Every file below ``top`` (not .rw/ nor .git/): its mode bits and bytes."""
    out = {}
    for d, dirs, files in os.walk(top):
        dirs[:] = [x for x in dirs if x not in (".rw", ".git")]
        for f in files:
            p = Path(d, f)
            out[str(p.relative_to(top))] = (p.stat().st_mode & 0o7777, p.read_bytes())
    return out


def session_of(stderr: str) -> str:
    """The session's name, from its summary's first line."""
    found = re.search(r"^rwfs run: session (\S+) ended", stderr, re.M)
    assert found, stderr
    return found.group(1)


def summary_of(res: subprocess.CompletedProcess[str]) -> dict:
    assert res.returncode == 0, res.stderr
    return json.loads(res.stderr.strip().splitlines()[-1])


def journal(project: Path) -> list[dict]:
    out = rwfs("log", "--json", cwd=project)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


EDIT = "printf 'x = 2\\n' > src/app.py; printf 'new\\n' > new.txt; rm old.txt"


def test_undo_of_a_plain_batch_or_review_session_puts_its_tree_back(project: Path) -> None:
    m = Mount(project).start()
    try:
        for opts in ([], ["--batch", "agent1"], ["--review"]):
            before = tree(project)
            s = summary_of(rwfs("run", "--json", *opts, "--", "sh", "-c", EDIT, cwd=project))
            name = s["session"]
            # Held by an open batch, not in the journal yet: counted all the same.
            assert (s["changed"], s["created"], s["deleted"]) == (
                ["src/app.py"],
                ["new.txt"],
                ["old.txt"],
            ), s
            if opts:
                batch = s["batch"]["name"]
                done = rwfs("batch", "commit", batch, cwd=project)
                assert done.returncode == 0, done.stderr
            assert not (project / "old.txt").exists()
            every = journal(project)
            begun = next(e["lsn"] for e in every if e["op"] == "session" and e["session"] == name)
            events = [e for e in every if e["lsn"] > begun and e["op"] in ("write", "unlink")]
            assert sorted(e["op"] for e in events) == ["unlink", "write", "write"], events
            for e in events:  # the session's, with its writer, as its other events
                assert e.get("session") == name, e
                assert e.get("pid") and e.get("comm"), e
            unlink = next(e for e in events if e["op"] == "unlink")
            assert unlink["comm"] == "rm" and unlink["mode"] == 0o640, unlink
            undo = rwfs("undo", name, cwd=project)
            assert undo.returncode == 0, undo.stderr
            assert tree(project) == before, opts  # deletion, creation, edit: all back
    finally:
        m.stop()
    check_clean(m)


def test_a_later_session_is_told_its_write_joined_an_earlier_sessions_batch(
    project: Path,
) -> None:
    m = Mount(project).start()
    try:
        first = rwfs("run", "--review", "--", "sh", "-c", "printf 'x = 2\\n' > src/app.py",
                     cwd=project)  # fmt: skip
        assert first.returncode == 0, first.stderr  # (no terminal: the batch stays open)
        a = session_of(first.stderr)
        review = f"{a}-review"
        later = "printf 'x = 3\\n' > src/app.py; printf 'b\\n' > notes.txt"
        res = rwfs("run", "--", "sh", "-c", later, cwd=project)
        assert res.returncode == 0, res.stderr
        b = session_of(res.stderr)
        # Told before COMMAND starts, and in the summary: which batch has the file now.
        assert f"batch {review} (opened for session {a}) is open, holding 1 files" in res.stderr
        lines = res.stderr.splitlines()
        joined = [ln for ln in lines if ln.startswith(f"  went into batch {review}")]
        assert len(joined) == 1 and f"session {a}, not into the tree: 1 (src/app.py)" in joined[0]
        assert "changed 1 (notes.txt);" in res.stderr  # src/app.py is not in the tree
        again = later.replace("x = 3", "x = 4")
        js = summary_of(rwfs("run", "--json", "--", "sh", "-c", again, cwd=project))
        assert js["held_elsewhere"] == [{"path": "src/app.py", "batch": review, "batch_session": a}]
        assert js["changed"] == []  # (notes.txt holds b already)
        assert (project / "src" / "app.py").read_text() == "x = 4\n"  # the batch's draft
        assert rwfs("batch", "commit", review, cwd=project).returncode == 0
        # The batch was session a's: its commit is a's, and a's undo takes it back.
        assert rwfs("undo", a, cwd=project).returncode == 0
        assert (project / "src" / "app.py").read_text() == "x = 1\n"
        assert (project / "notes.txt").read_text() == "b\n"
        assert rwfs("undo", b, cwd=project).returncode == 0
        assert (project / "notes.txt").read_text() == "hello\n"
        # A batch whose scope covers the session takes every write of it: said too.
        assert rwfs("batch", "begin", "manual", cwd=project).returncode == 0
        res = rwfs("run", "--json", "--", "sh", "-c", "printf 'm\\n' > notes.txt", cwd=project)
        assert "batch manual is open, holding 0 files: every write of this session" in res.stderr
        held = summary_of(res)["held_elsewhere"]
        assert held == [{"path": "notes.txt", "batch": "manual", "batch_session": None}]
        assert rwfs("batch", "abort", "manual", cwd=project).returncode == 0
    finally:
        m.stop()
    check_clean(m)


def test_each_refusal_in_the_summary_has_its_own_reason_and_draft(
    project: Path, tmp_path: Path
) -> None:
    (tmp_path / "bad1.py").write_text("x = (\n")
    (tmp_path / "bad2.py").write_text("x = [\n")
    script = (
        f"cp {tmp_path}/bad1.py src/app.py; cp {tmp_path}/bad2.py src/app.py; "
        "printf 'x = 3\\n' > src/app.py"  # the last write succeeds
    )
    m = Mount(project).start()
    try:
        s = summary_of(rwfs("run", "--json", "--", "sh", "-c", script, cwd=project))
        one, two = s["refusals"]
        assert one["draft"] != two["draft"]
        assert "'(' was never closed" in one["reason"], one
        assert "'[' was never closed" in two["reason"], two
        for r in (one, two):
            assert r["reason"].startswith("Your write to src/app.py was refused because")
            assert "succeeded" not in r["reason"] and ".rw/rejected/" not in r["reason"]
        assert Path(one["draft_file"]).read_text() == "x = (\n"  # (still mounted)
    finally:
        m.stop()
    check_clean(m)
    # rwfs run mounts and unmounts: each draft's path is one that is there afterwards.
    res = rwfs("run", "--", "sh", "-c", script, cwd=project)
    assert res.returncode == 0, res.stderr
    assert not rwfs_mounted(str(project))
    refused = [ln for ln in res.stderr.splitlines() if ln.startswith("  refused ")]
    assert len(refused) == 2, res.stderr
    for line, bad in zip(refused, ("x = (\n", "x = [\n"), strict=True):
        assert line.count("(draft: ") == 1, line
        assert f"'{bad[4]}' was never closed" in line, line
        draft = line.rsplit("(draft: ", 1)[1].rstrip(")")
        assert Path(draft).read_text() == bad, line


def test_the_summary_says_what_undo_leaves(project: Path) -> None:
    script = (
        "mkdir -p docs && printf 'd\\n' > docs/a.md && ln -s a.md docs/link && "
        "printf 'ref\\n' > .git/HEAD"
    )
    res = rwfs("run", "--", "sh", "-c", script, cwd=project)
    assert res.returncode == 0, res.stderr
    leaves = [ln for ln in res.stderr.splitlines() if ln.startswith("  undo leaves ")]
    assert len(leaves) == 1, res.stderr
    assert "directories made (docs)" in leaves[0] and "symlinks made (docs/link)" in leaves[0]
    assert ".git/" in leaves[0]
    name = session_of(res.stderr)
    undo = rwfs("undo", name, "-C", str(project))
    assert undo.returncode == 0, undo.stderr
    # As it said: the file is gone, the directory, the symlink and .git/HEAD stay.
    assert not (project / "docs" / "a.md").exists()
    assert (project / "docs").is_dir() and (project / "docs" / "link").is_symlink()
    assert (project / ".git" / "HEAD").read_text() == "ref\n"


def test_the_summary_does_not_list_as_created_what_is_gone(project: Path) -> None:
    # pytest's way: files written in a directory of their own, which is then renamed.
    script = "mkdir t && printf 'x\\n' > t/f && printf 'y\\n' > kept.txt && mv t .pytest_cache"
    s = summary_of(rwfs("run", "--json", "--", "sh", "-c", script, cwd=project))
    assert s["created"] == ["kept.txt"]
    assert s["gone"] == ["t/f"]
