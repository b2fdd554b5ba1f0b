"""The inode of a file an open batch holds as a draft only (a *virtual* inode), through real
FUSE mounts: rwfs and the kernel must agree on which inode a name is, whatever happens to
the draft.

The regression: in a batch, a temporary renamed over a file (``os.replace``) makes that
name a virtual inode; writing the file's base bytes back (``shutil.copyfile`` from a file
with those bytes) ends the batch's change of it, and rwfs then detached the inode from its
name, while the kernel kept it for that name: ``chmod`` of the file failed with ENOENT (at
once through a descriptor, and about one time in fifteen by name, when the chmod came
before the kernel had dropped its entry).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import Mount, check_clean

BASE = b"one\ntwo\n"
NEW = b"three\n"


@contextmanager
def batch_mount(tmp_path: Path, files: dict[str, bytes]) -> Iterator[Mount]:
    """``files`` in a fresh workspace mounted beside it (the raw tree stays readable at
    ``m.workspace``), with batch ``b1`` open; always unmounted, then checked clean."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    for name, data in files.items():
        (ws / name).write_bytes(data)
    m = Mount(ws, mp).start()
    try:
        os.mkdir(mp / ".rw" / "batches" / "b1")
        yield m
    finally:
        m.stop()
    check_clean(m)


def ctl(m: Mount, verb: str) -> None:
    fd = os.open(m.path / ".rw" / "batches" / "b1" / "ctl", os.O_WRONLY)
    try:
        os.write(fd, verb.encode() + b"\n")
    finally:
        os.close(fd)


def held_paths(m: Mount) -> list[str]:
    status = json.loads((m.path / ".rw" / "batches" / "b1" / "status").read_bytes())
    return [p["path"] for p in status["paths"]]


def make_virtual(mp: Path, name: str, how: str) -> None:
    """Make ``name`` (a file of the tree) a draft of the open batch that is a new file."""
    if how == "renamed":  # an editor's save: a temporary, then rename over the file
        (mp / f".{name}.tmp").write_bytes(NEW)
        os.replace(mp / f".{name}.tmp", mp / name)
    else:  # removed, then made again
        os.unlink(mp / name)
        (mp / name).write_bytes(NEW)
    assert (mp / name).read_bytes() == NEW


@pytest.mark.parametrize("how", ["renamed", "made again"])
def test_a_draft_written_back_to_its_base_keeps_its_inode(tmp_path: Path, how: str) -> None:
    """The batch's change of the file ends (its bytes are the base again); the inode the
    kernel holds for the name is still that name's file: fchmod, fstat and reads work
    through the descriptor, and the name keeps its inode number."""
    with batch_mount(tmp_path, {"f.txt": BASE}) as m:
        mp, f = m.path, m.path / "f.txt"
        make_virtual(mp, "f.txt", how)
        ino = os.stat(f).st_ino
        fd = os.open(f, os.O_RDWR | os.O_TRUNC)
        try:
            os.write(fd, BASE)
            os.fsync(fd)  # a commit point: the draft is the base again
            assert held_paths(m) == []
            os.fchmod(fd, 0o600)
            assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
            assert os.pread(fd, 100, 0) == BASE
            os.pwrite(fd, b"ONE", 0)  # and a write through it is the batch's again
        finally:
            os.close(fd)
        assert os.stat(f).st_ino == ino
        assert f.read_bytes() == b"ONE\ntwo\n"
        assert held_paths(m) == ["f.txt"]
        assert (m.workspace / "f.txt").read_bytes() == BASE
        ctl(m, "commit")
        assert (m.workspace / "f.txt").read_bytes() == b"ONE\ntwo\n"
        assert stat.S_IMODE((m.workspace / "f.txt").stat().st_mode) == 0o600


def test_chmod_after_copying_the_base_back_over_a_renamed_draft(tmp_path: Path) -> None:
    """The reported sequence, by name, each round on files of its own: save by rename,
    ``shutil.copyfile`` of a file holding the base bytes, ``chmod``. (Racy before the fix:
    one round in fifteen or so failed.)"""
    rounds = 40
    files = {f"f{i}.txt": BASE for i in range(rounds)}
    with batch_mount(tmp_path, {**files, "base.txt": BASE}) as m:
        mp = m.path
        for i in range(rounds):
            f = mp / f"f{i}.txt"
            make_virtual(mp, f.name, "renamed")
            shutil.copyfile(mp / "base.txt", f)
            os.chmod(f, 0o640)
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o640, i
            assert f.read_bytes() == BASE, i
        assert held_paths(m) == []
        ctl(m, "commit")
        for i in range(rounds):
            tree = m.workspace / f"f{i}.txt"
            assert tree.read_bytes() == BASE
            assert stat.S_IMODE(tree.stat().st_mode) == 0o640


@pytest.mark.parametrize("how", ["renamed", "made again"])
def test_a_descriptor_of_a_draft_reads_the_file_after_abort(tmp_path: Path, how: str) -> None:
    """Abort ends every draft: a descriptor still open on one reads, and changes the
    mode of, the file the name shows again (as a descriptor of a file the batch only
    changed does)."""
    with batch_mount(tmp_path, {"f.txt": BASE}) as m:
        f = m.path / "f.txt"
        make_virtual(m.path, "f.txt", how)
        fd = os.open(f, os.O_RDONLY)
        try:
            ctl(m, "abort")
            assert os.pread(fd, 100, 0) == BASE
            os.fchmod(fd, 0o600)
            assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        finally:
            os.close(fd)
        assert f.read_bytes() == BASE
        assert stat.S_IMODE((m.workspace / "f.txt").stat().st_mode) == 0o600


def test_a_descriptor_of_a_draft_that_landed_reads_the_file(tmp_path: Path) -> None:
    """The tree got the draft's bytes behind the mount before ``commit`` (the draft
    *landed*): a descriptor still open on the draft's inode reads the tree's file, and
    the name keeps that inode."""
    with batch_mount(tmp_path, {"f.txt": BASE}) as m:
        f = m.path / "f.txt"
        make_virtual(m.path, "f.txt", "renamed")
        ino = os.stat(f).st_ino
        (m.workspace / "f.txt").write_bytes(NEW)  # the raw tree, behind the mount
        fd = os.open(f, os.O_RDONLY)
        try:
            ctl(m, "commit")
            assert os.pread(fd, 100, 0) == NEW
            os.fchmod(fd, 0o600)
            assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        finally:
            os.close(fd)
        assert os.stat(f).st_ino == ino
        assert stat.S_IMODE((m.workspace / "f.txt").stat().st_mode) == 0o600
