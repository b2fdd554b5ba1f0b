"""Verbs act with their caller's rights (SPEC §3.3b), through a real mount that another
user reaches (``allow_other``; the daemon is root's, as in CI): every user may write a verb,
and each verb changes only what its caller could change without rwfs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, check_clean

OTHER = 65534  # nobody: no file here is theirs


def as_other(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def shared() -> Iterator[Mount]:
    """A workspace mounted with allow_other in a directory every user can enter (pytest's
    own are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="rwfs-rights-"))
    top.chmod(0o755)
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    m = Mount(ws, options=("allow_other",)).start()
    try:
        yield m
    finally:
        m.stop()
        try:
            check_clean(m)
        finally:
            shutil.rmtree(top, ignore_errors=True)


def _events(m: Mount) -> list[dict[str, object]]:
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _envelope(m: Mount) -> dict[str, object]:
    return dict(json.loads((m.path / ".rw" / "last-error").read_text()))


def test_a_verb_changes_only_what_its_caller_could_write(shared: Mount) -> None:
    m = shared
    (m.path / "mine.txt").write_text("root's v0\n")  # 0644, root's: the other may not write it
    (m.path / "pub.txt").write_text("public v0\n")
    os.chmod(m.path / "pub.txt", 0o666)
    (m.path / "private").mkdir(mode=0o700)
    (m.path / "private" / "p.txt").write_text("private v0\n")
    (m.path / ".rw" / "snapshots" / "s").mkdir()
    for name in ("mine.txt", "pub.txt", "private/p.txt"):
        (m.path / name).write_text(f"{name} v1\n")
    ctl = m.path / ".rw" / "ctl"
    assert os.stat(ctl).st_mode & 0o777 == 0o666  # every user may write a verb

    for name in ("mine.txt", "private/p.txt"):
        res = as_other(f"echo 'restore s {name}' > {ctl}")
        assert res.returncode != 0, (name, res.stderr)
        env = _envelope(m)
        assert env["errno"] == "EACCES" and env["reason_hint"] == "permission", env
        assert (m.path / name).read_text() == f"{name} v1\n", name
    res = as_other(f"echo 'restore s' > {ctl}")  # the whole tree holds files not theirs
    assert res.returncode != 0
    assert (m.path / "pub.txt").read_text() == "pub.txt v1\n"  # nothing at all was done
    assert not (m.path / ".rw" / "batches" / "restore-s").exists()

    res = as_other(f"echo 'restore s pub.txt' > {ctl}")  # a file they may write: done
    assert res.returncode == 0, res.stderr
    assert (m.path / "pub.txt").read_text() == "public v0\n"
    assert (m.path / "mine.txt").read_text() == "mine.txt v1\n"
    res = as_other(f"echo 'undo restore-s' > {ctl}")
    assert res.returncode == 0, res.stderr
    assert (m.path / "pub.txt").read_text() == "pub.txt v1\n"

    ctl.write_text("restore s mine.txt\n")  # root may
    assert (m.path / "mine.txt").read_text() == "root's v0\n"


def test_only_the_owner_changes_the_policy(shared: Mount) -> None:
    m = shared
    policy = m.path / ".rw" / "policy.toml"
    before = policy.read_text()
    res = as_other(f"echo 'durability = \"strict\"' > {policy}")
    assert res.returncode != 0
    assert policy.read_text() == before
    os.chown(m.path, OTHER, OTHER)  # the other user owns the workspace now: theirs to change
    assert os.stat(policy).st_uid == OTHER
    res = as_other(
        f"t=$(cat {policy}; echo '# the owner was here'); printf '%s\\n' \"$t\" > {policy}"
    )
    assert res.returncode == 0, res.stderr
    assert policy.read_text() == before.rstrip("\n") + "\n# the owner was here\n"
    os.chown(m.path, 0, 0)
    policy.write_text(before)


def test_a_batch_holds_its_openers_writes_and_only_they_steer_it(shared: Mount) -> None:
    m = shared
    (m.path / "pub.txt").write_text("public v0\n")
    os.chmod(m.path / "pub.txt", 0o666)
    (m.path / "mine.txt").write_text("root's v0\n")
    os.mkdir(m.path / ".rw" / "batches" / "b1")  # scope: its opener's uid, by default
    status = json.loads((m.path / ".rw" / "batches" / "b1" / "status").read_text())
    assert status["scope"] == {"kind": "uid", "uid": 0}

    res = as_other(f"echo 'by the other user' > {m.path}/pub.txt")
    assert res.returncode == 0, res.stderr
    (m.path / "mine.txt").write_text("root's draft\n")
    (m.path / ".rw" / "ctl").write_text("sync\n")
    assert (m.workspace / "pub.txt").read_text() == "by the other user\n", "held by b1"
    writes = [e for e in _events(m) if e["op"] == "write" and e["path"] == "pub.txt"]
    assert writes[-1]["uid"] == OTHER and str(writes[-1]["batch"]).startswith("auto-")

    ctl = m.path / ".rw" / "batches" / "b1" / "ctl"
    for verb in ("abort", "commit"):
        res = as_other(f"echo {verb} > {ctl}")
        assert res.returncode != 0, verb
        assert _envelope(m)["errno"] == "EACCES"
    assert json.loads((m.path / ".rw" / "batches" / "b1" / "status").read_text())["state"] == (
        "open"
    )

    ctl.write_text("abort\n")  # the opener may; the dropped draft is journaled
    assert (m.path / "mine.txt").read_text() == "root's v0\n"
    drops = [e for e in _events(m) if e["op"] == "drop"]
    assert [(e["path"], e["batch"], e["uid"]) for e in drops] == [("mine.txt", "b1", 0)]


def test_scratch_files_and_chunk_parts_are_their_writers_alone(shared: Mount) -> None:
    m = shared
    secret = b"token sk-ant-" + b"Q" * 30 + b"\n"
    (m.path / ".rw" / "scratch" / "creds.txt").write_bytes(secret)
    os.mkdir(m.path / ".rw" / "chunks" / "c1")
    (m.path / ".rw" / "chunks" / "c1" / "part-001").write_bytes(secret)
    st = os.stat(m.path / ".rw" / "scratch" / "creds.txt")
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert os.stat(m.path / ".rw" / "chunks" / "c1").st_mode & 0o777 == 0o700
    for path in ("scratch/creds.txt", "chunks/c1/part-001", "chunks/c1/preview"):
        res = as_other(f"cat {m.path}/.rw/{path}")
        assert res.returncode != 0 and "Permission denied" in res.stderr, (path, res)
        assert "sk-ant" not in res.stdout
    assert (m.path / ".rw" / "scratch" / "creds.txt").read_bytes() == secret  # the writer's
    assert (m.path / ".rw" / "chunks" / "c1" / "preview").read_bytes() == secret


def test_the_rights_are_the_trees_owners_and_modes(tmp_path: Path) -> None:
    """rights.py in process: the questions the kernel would ask, from owners and modes."""
    from rwfs.core import rights

    root = tmp_path / "tree"
    (root / "open").mkdir(parents=True)
    (root / "closed").mkdir(mode=0o700)
    (root / "sticky").mkdir()
    os.chmod(root / "sticky", 0o1777)
    for name, mode in (("open/pub.txt", 0o666), ("open/mine.txt", 0o644), ("closed/x", 0o666)):
        (root / name).write_text(name)
        os.chmod(root / name, mode)
    (root / "sticky" / "theirs").write_text("theirs")
    (root / "sticky" / "own").write_text("own")
    os.chown(root / "sticky" / "own", OTHER, OTHER)
    os.chmod(root, 0o755)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    other = {"uid": OTHER, "pid": 0}
    try:
        assert rights.may_change(fd, b"open/pub.txt", other)
        assert not rights.may_change(fd, b"open/mine.txt", other)
        assert not rights.may_change(fd, b"closed/x", other)  # 0666, in a 0700 directory
        assert not rights.may_change(fd, b"open/new.txt", other)  # root's 0755 directory
        assert rights.may_change(fd, b"sticky/new.txt", other)
        assert not rights.may_change(fd, b"sticky/theirs", other, remove=True)
        assert rights.may_change(fd, b"sticky/own", other, remove=True)
        assert rights.may_read(fd, b"open/mine.txt", other)
        assert not rights.may_read(fd, b"closed/x", other)
        assert not rights.may_read(fd, b"open/none", other)
        assert rights.may_change(fd, b"closed/x", {"uid": 0, "pid": 0})  # root passes
    finally:
        os.close(fd)


def test_the_workspace_owner_of_a_root_daemon_reads_the_log(shared: Mount) -> None:
    """A daemon's descriptors in /proc are root's: the owner's `rwfs log` reads the journal
    through the mount, and another user is told why it may not. (The CLI runs on the
    system Python, as README's "Several users" says an install for all must.)"""
    m = shared
    (m.path / "a.txt").write_text("a\n")
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    cli = (
        f"PYTHONPATH={Path(__file__).parents[1] / 'src'}:{site} /usr/bin/python3 -m rwfs.cli"
        f" log --json -C {m.path}"
    )
    res = as_other(cli)
    assert res.returncode == 1 and "workspace owner" in res.stderr, res
    os.chown(m.path, OTHER, OTHER)
    try:
        res = as_other(cli)
        assert res.returncode == 0, res.stderr
        paths = [json.loads(line).get("path") for line in res.stdout.splitlines()]
        assert "a.txt" in paths
    finally:
        os.chown(m.path, 0, 0)
