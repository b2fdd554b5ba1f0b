"""Explicit batches against every way programs write a file, through real FUSE mounts.

Each test mounts a workspace at a separate mount point, so the raw tree stays visible:
while a batch is open the tree must keep its base bytes and the mount must show the
drafts; after ``commit`` the tree holds exactly the drafts, every file with its own bytes
and its own inode number; after ``abort`` the tree and the mount are exactly as before.

The first tests are regressions: two files that shared one inode inside a batch (a
committed file got another file's bytes), a stale-write conflict inside a batch that hid
the batch's draft and broke ``rwfs log``, and gates that stopped running once ``sed -i``
had saved a file in a batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import RWFS, Mount, check_clean, prepare_state

A = b'def a():\n    return "a"\n'
B = b"one\ntwo\n"
C = b'def c():\n    return "c"\n'
BASE = {"a.py": A, "b.txt": B, "c.py": C}
BROKEN = b"def a(:\n    return\n"  # a Python syntax error where the file parsed before


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@contextmanager
def batch_mount(
    tmp_path: Path, files: dict[str, bytes], policy: str | None = None
) -> Iterator[Mount]:
    """``files`` in a fresh workspace mounted beside it (the raw tree stays readable at
    ``m.workspace``); always unmounted, then checked clean (no traceback, fsck agrees)."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    for name, data in files.items():
        (ws / name).write_bytes(data)
    if policy is not None:
        prepare_state(ws, policy)
    m = Mount(ws, mp).start()
    try:
        yield m
    finally:
        m.stop()
    check_clean(m)


def ctl(m: Mount, name: str, verb: str) -> int:
    """Write a verb to a batch's ctl in one write(); 0, or the errno it failed with."""
    fd = os.open(m.path / ".rw" / "batches" / name / "ctl", os.O_WRONLY)
    try:
        os.write(fd, verb.encode() + b"\n")
        return 0
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)


def sh(cwd: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def ok(cwd: Path, cmd: str) -> None:
    res = sh(cwd, cmd)
    assert res.returncode == 0, f"{cmd}: {res.returncode} {res.stderr}"


def files_of(top: Path) -> dict[str, bytes]:
    """Every regular file directly in ``top`` (``.rw`` aside) and its bytes."""
    return {
        p.name: p.read_bytes()
        for p in sorted(top.iterdir())
        if p.name != ".rw" and p.is_file() and not p.is_symlink()
    }


def assert_distinct_inodes(top: Path) -> None:
    """What ``ls -li`` shows: one inode number per file, except for hard links."""
    by_ino: dict[int, list[str]] = {}
    for p in sorted(top.iterdir()):
        if p.name != ".rw":
            by_ino.setdefault(p.lstat().st_ino, []).append(p.name)
    for ino, names in by_ino.items():
        if len(names) > 1:
            first = (top / names[0]).lstat()
            assert first.st_nlink >= len(names), f"{names} share inode {ino} in {top}"
            assert len({(top / n).read_bytes() for n in names}) == 1


def status(m: Mount, name: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((m.path / ".rw" / "batches" / name / "status").read_bytes())
    return got


def rwfs_log(ws: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RWFS, "log", "-C", str(ws)], capture_output=True, text=True, timeout=60, check=False
    )


# ---- 1. two files never share an inode inside a batch ----


def test_a_new_file_never_takes_the_inode_of_an_earlier_draft(tmp_path: Path) -> None:
    """A file created in a batch was found by the inode number of its first stage; once
    that stage was replaced and freed, the next new file's stage got the number, and the
    new file resolved to the old one: both names showed one file, and commit wrote one
    file's bytes over the other."""
    a2 = b'def a():\n    return "A2"\n'
    new = b'def new():\n    return "new"\n'
    g = b"var g = 2;\n"
    c2 = C
    with batch_mount(tmp_path, {"a.py": A, "c.py": C}) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        ok(mp, 'sed -i \'s/"a"/"A1"/\' a.py')
        ok(mp, "printf 'def a():\\n    return \"A2\"\\n' > a.py")
        ok(mp, "printf 'def new():\\n    return \"new\"\\n' > new.py")
        ok(mp, "printf 'var g = 1;\\n' > tmp && mv tmp g.js")
        ok(mp, "printf 'var g = 2;\\n' > g.js")
        ok(mp, "cp c.py c2.py")
        want = {"a.py": a2, "c.py": C, "c2.py": c2, "g.js": g, "new.py": new}
        assert files_of(mp) == want
        assert_distinct_inodes(mp)
        assert len({(mp / n).stat().st_ino for n in want}) == len(want)
        assert files_of(m.workspace) == {"a.py": A, "c.py": C}  # the tree waits
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == want
        assert files_of(mp) == want
        assert_distinct_inodes(mp)
        assert len({(mp / n).stat().st_ino for n in want}) == len(want)
        assert status(m, "b1")["state"] == "committed"
