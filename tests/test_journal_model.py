"""The journal's model of the tree stays true: replayed in LSN order, the journal gives each
path the bytes the tree holds (``rwfs fsck`` agrees), whatever order the tree saw the changes
in. Regressions named after what they guard: a hard-linked file's other names journaled at
its write's LSN, and no drift from the files rwfs does not journal (passthrough names,
files past ``max_journaled_bytes``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import Mount, check_clean, prepare_state

from rwfs.core.commits import record_event
from rwfs.journal.store import Store


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


def test_a_links_names_are_journaled_as_they_were_at_its_write(workspace: Path) -> None:
    """A write through one name of a hard-linked file, then a rename of the directory of
    another name the mount has not looked up since the remount: the write is journaled
    with the name the link had then (D1/y), before the rename moves it, and the next
    write with the name it has since (D3/y); replayed, the journal gives D3/y the new
    bytes, as the tree has them."""
    m = Mount(workspace).start()
    try:
        (m.path / "D1").mkdir()
        (m.path / "D1" / "y").write_text("a\n")
        os.link(m.path / "D1" / "y", m.path / "x")
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        with open(m.path / "x", "a") as f:
            f.write("b\n")
        os.rename(m.path / "D1", m.path / "D3")
        with open(m.path / "x", "a") as f:  # again: D3/y, the link's name now, not known
            f.write("c\n")
        events = journal(m)
        writes = [e for e in events if e["op"] == "write" and e["path"] == "x"]
        rename = next(e for e in events if e["op"] == "rename" and e["path"] == "D1")
        assert [(e["lsn"] < rename["lsn"], e.get("links")) for e in writes] == [
            (True, ["D1/y"]),
            (False, ["D3/y"]),
        ]
        assert (m.path / "D3" / "y").read_text() == "a\nb\nc\n"
        hist = m.path / ".rw" / "history" / "D3" / "y"
        got = [(hist / v).read_text() for v in sorted(os.listdir(hist))]
        assert got[-1] == "a\nb\nc\n" and "a\nb\n" in got, got
    finally:
        m.stop()
    check_clean(m)


def _fsck_mounted(m: Mount) -> subprocess.CompletedProcess[str]:
    res = m.fsck()
    assert res.returncode == 0, f"fsck found drift:\n{res.stdout}{res.stderr}"
    return res


def test_no_drift_after_pytest_and_rm_of_its_cache(workspace: Path) -> None:
    """pytest makes its cache as a journaled temporary directory and renames it onto
    .pytest_cache, a passthrough name: what lands there leaves the journal's model, so
    removing it (untold: passthrough) is no drift. So is a name of that kind made by a
    rename of one file, and removed."""
    m = Mount(workspace).start()
    try:
        (m.path / "test_one.py").write_text("def test_one():\n    assert True\n")
        (m.path / ".rw" / "snapshots" / "before").mkdir()
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "test_one.py"],
            cwd=m.path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert (m.path / ".pytest_cache" / "README.md").exists()
        events = journal(m)
        assert any(e["op"] == "rename" and e["dest"] == ".pytest_cache" for e in events), (
            "pytest no longer renames its cache into place: this test tests nothing"
        )
        _fsck_mounted(m)
        subprocess.run(["rm", "-rf", str(m.path / ".pytest_cache")], check=True)
        (m.path / "notes.txt").write_text("kept\n")
        os.rename(m.path / "notes.txt", m.path / "notes.log")  # *.log: passthrough
        os.unlink(m.path / "notes.log")
        _fsck_mounted(m)
        # The journal's model: nothing is claimed at the passthrough names, so history
        # lists none of them, and a restore of a point before pytest finds nothing there
        # to take back (a claim of bytes it cannot find would be a conflict, ESTALE).
        hist = set(os.listdir(m.path / ".rw" / "history"))
        assert not hist & {".pytest_cache", "notes.log"}, hist
        (m.path / ".rw" / "ctl").write_text("restore before\n")
        assert sorted(set(os.listdir(m.path)) - {"__pycache__"}) == ["test_one.py"]
    finally:
        m.stop()
    check_clean(m)
    store = Store(str(workspace / ".rw" / "journal"), readonly=True)
    try:
        claimed = [p for p, e in store.paths().items() if e.get("digest")]
    finally:
        store.close()
    assert claimed == [b"test_one.py"], claimed


def test_no_drift_after_removing_a_file_past_max_journaled_bytes(workspace: Path) -> None:
    """A file that grows past max_journaled_bytes leaves journaling; its removal is not
    journaled, and the journal claims nothing about it any more."""
    prepare_state(workspace, "max_journaled_bytes = 4096\n")
    m = Mount(workspace).start()
    try:
        big = m.path / "big.bin"
        big.write_bytes(b"x" * 100)
        with open(big, "ab") as f:
            f.write(b"y" * 8192)
        assert big.stat().st_size == 8292
        assert any(e["op"] == "unjournaled" for e in journal(m))
        os.unlink(big)
        _fsck_mounted(m)
    finally:
        m.stop()
    check_clean(m)


def test_no_drift_after_git_clean(workspace: Path) -> None:
    """git clean -fdx removes every untracked file, journaled or not (a passthrough
    directory made by a rename among them), and the journal stays true to the tree."""
    m = Mount(workspace).start()
    try:

        def git(*args: str) -> None:
            subprocess.run(
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                cwd=m.path,
                check=True,
                capture_output=True,
                timeout=60,
            )

        git("init", "-q")
        (m.path / "kept.txt").write_text("tracked\n")
        git("add", "kept.txt")
        git("commit", "-q", "-m", "one")
        (m.path / "junk").mkdir()
        (m.path / "junk" / "a.txt").write_text("untracked\n")
        os.link(m.path / "junk" / "a.txt", m.path / "junk" / "b.txt")
        (m.path / "tmp-cache").mkdir()
        (m.path / "tmp-cache" / "x.txt").write_text("cache\n")
        os.rename(m.path / "tmp-cache", m.path / "build")  # build/**: passthrough
        (m.path / "build" / "y.o").write_bytes(b"\0obj")
        git("clean", "-fdxq")
        assert sorted(os.listdir(m.path)) == [".git", "kept.txt"]
        _fsck_mounted(m)
    finally:
        m.stop()
    check_clean(m)


def test_drift_of_a_store_from_before_is_named_and_repaired_at_mount(workspace: Path) -> None:
    """A journal as rwfs wrote it before its model was kept true: a write through x
    journaled with its link's name after a rename (D3/y) at an LSN before that rename,
    and a file that left journaling, removed untold. fsck names both; the next mount
    repairs the index by events of its own, once, and fsck is clean."""
    prepare_state(workspace, "")
    (workspace / ".rw" / "intents").mkdir()
    (workspace / "D3").mkdir()
    (workspace / "D3" / "y").write_text("a\nb\n")
    os.link(workspace / "D3" / "y", workspace / "x")
    a, b, c = sha(b"a\n"), sha(b"a\nb\n"), sha(b"c" * 10)
    store = Store(str(workspace / ".rw" / "journal"))
    try:

        def old(txn: Any) -> None:
            txn._t.delete(b"index:links", db=store.db[b"meta"])  # a store from before
            for ev in (
                {"op": "create", "path": "D1/y", "intended": a},
                {"op": "link", "path": "x", "source": "D1/y", "intended": a},
                {"op": "write", "path": "x", "expected": a, "intended": b, "links": ["D3/y"]},
                {"op": "rename", "path": "D1", "dest": "D3"},
                {"op": "create", "path": "big.bin", "intended": c},
                {"op": "unjournaled", "path": "big.bin", "expected": None},
            ):
                if ev["op"] == "unjournaled":  # (its row stayed)
                    txn.append_event({"batch": None, **ev})
                    continue
                lsn = record_event(txn, {"batch": None, **ev})  # (no policy: as before)
                for other in ev.get("links", ()):
                    txn.set_path(os.fsencode(other), b, lsn)
                if ev["op"] == "write":
                    txn.set_path(b"x", b, lsn)

        store.write(old)
    finally:
        store.close()
    m = Mount(workspace)
    res = m.fsck()
    assert res.returncode == 1
    lines = sorted(res.stdout.splitlines())
    assert len(lines) == 2, res.stdout + res.stderr
    assert lines[0].startswith("D3/y: journaled as " + a) and "hard link x" in lines[0]
    assert "mount once to repair it" in lines[0]
    assert lines[1] == f"big.bin: journaled as {c} but absent"
    m.start()
    try:
        repairs = [e for e in journal(m) if e.get("repair")]
        assert [(e["op"], e["path"]) for e in repairs] == [
            ("write", "D3/y"),
            ("unjournaled", "big.bin"),
        ]
        assert (repairs[0]["expected"], repairs[0]["intended"]) == (a, b)
        hist = m.path / ".rw" / "history" / "D3" / "y"
        assert (hist / sorted(os.listdir(hist))[-1]).read_text() == "a\nb\n"
    finally:
        m.stop()
    check_clean(m)
    m.start()  # once: a second mount has nothing to repair
    try:
        assert len([e for e in journal(m) if e.get("repair")]) == 2
    finally:
        m.stop()
    check_clean(m)
