"""POSIX behaviour through the mount matches the backing filesystem's (SPEC §9, Transparency).

Each test runs one scenario twice: in an rwfs mount and in a plain directory on the same
filesystem. Both runs must give the same results and errnos, and leave trees with the same
file types, modes, sizes, link counts, owners and bytes. The ``mount`` fixture checks in
teardown that the daemon logged no traceback and that ``rwfs fsck`` agrees with the tree.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import mmap
import os
import stat
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Mount

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(src: Path | bytes, dst: Path | bytes, flags: int) -> None:
    if _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(length)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def outcome(fn: Callable[[Path], Any], root: Path) -> Any:
    """What ``fn`` returned, or the errno name of the OSError it raised."""
    try:
        return ("ok", fn(root))
    except OSError as exc:
        return ("error", errno.errorcode.get(exc.errno or 0, exc.errno))


def meta(st: os.stat_result) -> tuple[int, ...]:
    """The metadata both trees must agree on (not inode numbers or times)."""
    return (
        stat.S_IFMT(st.st_mode),
        stat.S_IMODE(st.st_mode),
        st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
        st.st_nlink,
        st.st_uid,
        st.st_gid,
    )


def tree(root: Path) -> dict[bytes, tuple[Any, ...]]:
    """Every entry below ``root`` with its metadata and bytes (or link target)."""
    out: dict[bytes, tuple[Any, ...]] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    body: Any = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(full)
            else:
                body = None
            out[os.path.relpath(full, base)] = (*meta(st), body)
    return out


@pytest.fixture
def roots(mount: Mount, tmp_path: Path) -> tuple[Path, Path]:
    plain = tmp_path / "plain"
    plain.mkdir()
    return mount.path, plain


def both(roots: tuple[Path, Path], fn: Callable[[Path], Any]) -> Any:
    """Run ``fn`` in the mount and in the plain directory; both must agree, trees too."""
    got_mount = outcome(fn, roots[0])
    got_plain = outcome(fn, roots[1])
    assert got_mount == got_plain, f"mount: {got_mount!r}\nplain: {got_plain!r}"
    assert tree(roots[0]) == tree(roots[1])
    return got_mount


def errname(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except OSError as exc:
        return errno.errorcode[exc.errno or 0]
    return "no error"


def journal(m: Mount) -> list[dict[str, Any]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


# ---- files: create, open flags, read, write ----


def test_create_write_read_close(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "new.txt"
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o640)
        try:
            assert os.write(fd, b"hello ") == 6
            assert os.write(fd, b"world\n") == 6
            st = os.fstat(fd)
        finally:
            os.close(fd)
        fd = os.open(p, os.O_RDONLY)
        try:
            data = os.read(fd, 100)
            assert os.read(fd, 100) == b""
        finally:
            os.close(fd)
        return data, meta(st), meta(os.stat(p))

    data, during, after = both(roots, run)[1]
    assert data == b"hello world\n"
    assert during[:3] == (stat.S_IFREG, 0o640, 12)
    assert after == during


def test_open_excl_on_existing_file(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "f").write_bytes(b"keep")
        res = errname(lambda: os.open(root / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        fd = os.open(root / "g", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        return res, (root / "f").read_bytes()

    assert both(roots, run) == ("ok", ("EEXIST", b"keep"))


def test_open_missing_without_creat_and_directory_for_writing(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "d").mkdir()
        return (
            errname(lambda: os.open(root / "missing", os.O_RDONLY)),
            errname(lambda: os.open(root / "d", os.O_WRONLY)),
            errname(lambda: os.open(root / "d" / "x" / "y", os.O_CREAT | os.O_WRONLY)),
        )

    assert both(roots, run) == ("ok", ("ENOENT", "EISDIR", "ENOENT"))


def test_o_append(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "log.txt"
        p.write_bytes(b"abc")
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, b"def")
            os.pwrite(fd, b"ghi", 0)  # Linux: pwrite on O_APPEND appends
            pos = os.lseek(fd, 0, os.SEEK_CUR)
        finally:
            os.close(fd)
        # A second appender, interleaved with a first one still open.
        a = os.open(p, os.O_WRONLY | os.O_APPEND)
        b = os.open(p, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(a, b"1")
            os.write(b, b"2")
            os.write(a, b"3")
        finally:
            os.close(a)
            os.close(b)
        return p.read_bytes(), pos

    data, _ = both(roots, run)[1]
    assert data == b"abcdefghi123"


def test_o_trunc(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "t.txt"
        p.write_bytes(b"a long original content\n")
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        try:
            size_open = os.fstat(fd).st_size
            os.write(fd, b"short\n")
        finally:
            os.close(fd)
        # O_TRUNC alone, nothing written: the file is empty after close.
        q = root / "empty.txt"
        q.write_bytes(b"bytes")
        os.close(os.open(q, os.O_WRONLY | os.O_TRUNC))
        return size_open, p.read_bytes(), q.read_bytes(), os.stat(q).st_size

    assert both(roots, run) == ("ok", (0, b"short\n", b"", 0))


def test_truncate_up_and_down_reads_holes_as_zeros(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "t.bin"
        p.write_bytes(b"abcd")
        os.truncate(p, 10)
        up = p.read_bytes()
        os.truncate(p, 2)
        down = p.read_bytes()
        os.truncate(p, 0)
        zero = p.read_bytes()
        # A write far past the end leaves a hole that reads as zeros.
        with open(p, "r+b") as f:
            f.seek(1 << 20)
            f.write(b"end")
        data = p.read_bytes()
        return up, down, zero, len(data), data[:-3] == bytes(1 << 20), data[-3:]

    assert both(roots, run) == (
        "ok",
        (b"abcd" + bytes(6), b"ab", b"", (1 << 20) + 3, True, b"end"),
    )


def test_ftruncate_on_open_fd(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "ft.bin"
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, b"x" * 100)
            os.ftruncate(fd, 10)
            s1 = os.fstat(fd).st_size
            r1 = os.pread(fd, 200, 0)
            os.ftruncate(fd, 50)
            s2 = os.fstat(fd).st_size
            r2 = os.pread(fd, 200, 0)
            os.pwrite(fd, b"Y", 20)
            r3 = os.pread(fd, 200, 0)
        finally:
            os.close(fd)
        return s1, r1, s2, r2, r3, p.read_bytes()

    s1, r1, s2, r2, r3, final = both(roots, run)[1]
    assert (s1, r1, s2) == (10, b"x" * 10, 50)
    assert r2 == b"x" * 10 + bytes(40)
    assert r3 == final == b"x" * 10 + bytes(10) + b"Y" + bytes(29)


def test_ftruncate_read_only_fd_fails(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "ro.bin"
        p.write_bytes(b"data")
        fd = os.open(p, os.O_RDONLY)
        try:
            return errname(lambda: os.ftruncate(fd, 0)), p.read_bytes()
        finally:
            os.close(fd)

    assert both(roots, run) == ("ok", ("EINVAL", b"data"))


# ---- metadata ----


def test_chmod(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "m.sh"
        p.write_bytes(b"#!/bin/sh\n")
        modes = []
        for mode in (0o755, 0o600, 0o4711, 0o000, 0o644):
            os.chmod(p, mode)
            modes.append(stat.S_IMODE(os.stat(p).st_mode))
        (root / "d").mkdir()
        os.chmod(root / "d", 0o700)
        # chmod while a write is staged: the committed file keeps the new mode.
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, b"#!/bin/sh\nexit 0\n")
            os.fchmod(fd, 0o751)
            during = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        return modes, during, stat.S_IMODE(os.stat(p).st_mode)

    assert both(roots, run) == ("ok", ([0o755, 0o600, 0o4711, 0, 0o644], 0o751, 0o751))


def test_chown_as_root(roots: tuple[Path, Path]) -> None:
    assert os.geteuid() == 0, "this test needs root"

    def run(root: Path) -> Any:
        p = root / "owned"
        p.write_bytes(b"x")
        os.chown(p, 1234, 5678)
        a = os.stat(p)
        os.chown(p, -1, 42)
        b = os.stat(p)
        (root / "d").mkdir()
        os.chown(root / "d", 7, 8)
        os.symlink("owned", root / "ln")
        os.chown(root / "ln", 9, 10, follow_symlinks=False)
        # chown while a write is staged, then the commit: the owner stays.
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, b"yy")
            os.fchown(fd, 100, 200)
        finally:
            os.close(fd)
        c = os.stat(p)
        return (a.st_uid, a.st_gid), (b.st_uid, b.st_gid), (c.st_uid, c.st_gid)

    assert both(roots, run) == ("ok", ((1234, 5678), (1234, 42), (100, 200)))


def test_utime_with_explicit_ns(roots: tuple[Path, Path]) -> None:
    atime, mtime = 1_000_000_000_123_456_789, 1_100_000_000_987_654_321

    def run(root: Path) -> Any:
        p = root / "u"
        p.write_bytes(b"x")
        os.utime(p, ns=(atime, mtime))
        st = os.stat(p)
        (root / "d").mkdir()
        os.utime(root / "d", ns=(atime + 1, mtime + 1))
        dst = os.stat(root / "d")
        os.symlink("u", root / "ln")
        os.utime(root / "ln", ns=(atime + 2, mtime + 2), follow_symlinks=False)
        lst = os.lstat(root / "ln")
        st_after_link = os.stat(p)  # utime on the link left the target alone
        return (
            (st.st_atime_ns, st.st_mtime_ns),
            (dst.st_atime_ns, dst.st_mtime_ns),
            (lst.st_atime_ns, lst.st_mtime_ns),
            st_after_link.st_mtime_ns,
        )

    assert both(roots, run) == (
        "ok",
        (
            (atime, mtime),
            (atime + 1, mtime + 1),
            (atime + 2, mtime + 2),
            mtime,
        ),
    )


def test_utime_on_a_staged_file_survives_its_commit(roots: tuple[Path, Path]) -> None:
    atime, mtime = 1_200_000_000_000_000_001, 1_300_000_000_000_000_002

    def run(root: Path) -> Any:
        p = root / "u"
        p.write_bytes(b"x")
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, b"changed")
            os.utime(fd, ns=(atime, mtime))
        finally:
            os.close(fd)
        st = os.stat(p)
        return st.st_mtime_ns, p.read_bytes()

    # POSIX: a write after the utime would bump mtime again, but none follows here.
    assert both(roots, run) == ("ok", (mtime, b"changed"))


def test_mtime_changes_where_posix_says(roots: tuple[Path, Path]) -> None:
    old = 1_000_000_000_000_000_000

    def run(root: Path) -> Any:
        p = root / "f"
        p.write_bytes(b"abc")
        (root / "d").mkdir()
        os.utime(p, ns=(old, old))
        os.utime(root / "d", ns=(old, old))
        got = {}
        p.write_bytes(b"abc")  # the same bytes: still a write, mtime moves
        got["same-bytes write"] = os.stat(p).st_mtime_ns > old
        os.utime(p, ns=(old, old))
        p.write_bytes(b"new")
        got["write"] = os.stat(p).st_mtime_ns > old
        os.utime(p, ns=(old, old))
        os.truncate(p, 1)
        got["truncate"] = os.stat(p).st_mtime_ns > old
        os.utime(p, ns=(old, old))
        with open(p, "rb") as f:
            f.read()
        got["read"] = os.stat(p).st_mtime_ns > old
        os.chmod(p, 0o600)
        got["chmod"] = os.stat(p).st_mtime_ns > old
        (root / "d" / "child").write_bytes(b"")
        got["dir: create"] = os.stat(root / "d").st_mtime_ns > old
        os.utime(root / "d", ns=(old, old))
        os.rename(root / "d" / "child", root / "d" / "child2")
        got["dir: rename"] = os.stat(root / "d").st_mtime_ns > old
        os.utime(root / "d", ns=(old, old))
        os.unlink(root / "d" / "child2")
        got["dir: unlink"] = os.stat(root / "d").st_mtime_ns > old
        return got

    assert both(roots, run) == (
        "ok",
        {
            "same-bytes write": True,
            "write": True,
            "truncate": True,
            "read": False,
            "chmod": False,
            "dir: create": True,
            "dir: rename": True,
            "dir: unlink": True,
        },
    )


# ---- namespace ----


def test_mkdir_rmdir(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        d = root / "d"
        os.mkdir(d, 0o750)
        os.mkdir(d / "sub")
        (d / "sub" / "f").write_bytes(b"x")
        res = [
            errname(lambda: os.mkdir(d)),
            errname(lambda: os.rmdir(d)),
            errname(lambda: os.rmdir(d / "sub")),
            errname(lambda: os.rmdir(d / "sub" / "f")),
            errname(lambda: os.rmdir(root / "nope")),
            os.stat(d).st_nlink,
            stat.S_IMODE(os.stat(d).st_mode),
        ]
        os.unlink(d / "sub" / "f")
        os.rmdir(d / "sub")
        res.append(os.stat(d).st_nlink)
        os.rmdir(d)
        res.append(errname(lambda: os.stat(d)))
        return res

    assert both(roots, run) == (
        "ok",
        ["EEXIST", "ENOTEMPTY", "ENOTEMPTY", "ENOTDIR", "ENOENT", 3, 0o750, 2, "ENOENT"],
    )


def test_unlink(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "gone"
        p.write_bytes(b"bytes")
        os.unlink(p)
        (root / "d").mkdir()
        return (
            errname(lambda: os.stat(p)),
            errname(lambda: os.open(p, os.O_RDONLY)),
            errname(lambda: os.unlink(p)),
            errname(lambda: os.unlink(root / "d")),
            os.listdir(root),
        )

    assert both(roots, run) == ("ok", ("ENOENT", "ENOENT", "ENOENT", "EISDIR", ["d"]))


def test_unlink_and_recreate_same_name(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "again"
        out = []
        for i in range(5):
            p.write_bytes(b"round %d" % i)
            out.append(p.read_bytes())
            os.unlink(p)
        os.mkdir(p)
        (p / "inside").write_bytes(b"x")
        out.append(os.listdir(p))
        return out

    assert both(roots, run)[1][-1] == ["inside"]


def test_rename_files(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"A")
        os.rename(root / "a", root / "b")
        (root / "d").mkdir()
        os.rename(root / "b", root / "d" / "c")
        with open(root / "d" / "c", "ab") as f:
            f.write(b"+")
        os.rename(root / "d" / "c", root / "c")
        os.rename(root / "c", root / "c")  # onto itself: nothing happens
        return (
            errname(lambda: os.stat(root / "a")),
            errname(lambda: os.stat(root / "d" / "c")),
            (root / "c").read_bytes(),
            sorted(os.listdir(root)),
            errname(lambda: os.rename(root / "d", root / "d" / "inside")),
            errname(lambda: os.rename(root / "nope", root / "z")),
        )

    assert both(roots, run) == ("ok", ("ENOENT", "ENOENT", b"A+", ["c", "d"], "EINVAL", "ENOENT"))


def test_rename_directories_children_stay_readable(roots: tuple[Path, Path]) -> None:
    # Passthrough children (*.log): written in place, never staged.
    def run(root: Path) -> Any:
        os.makedirs(root / "dir" / "sub")
        (root / "dir" / "x.log").write_bytes(b"X")
        (root / "dir" / "sub" / "y.log").write_bytes(b"Y")
        # Look the children up before the move, so the kernel and rwfs know them.
        before = [(root / "dir" / "x.log").read_bytes(), (root / "dir" / "sub" / "y.log").stat()]
        fd = os.open(root / "dir" / "sub" / "y.log", os.O_WRONLY | os.O_APPEND)
        try:
            os.rename(root / "dir", root / "moved")
            os.write(fd, b"2")  # an fd open across the move still writes the file
        finally:
            os.close(fd)
        os.rename(root / "moved" / "sub", root / "sub2")
        return (
            before[0],
            errname(lambda: os.stat(root / "dir" / "x.log")),
            (root / "moved" / "x.log").read_bytes(),
            (root / "sub2" / "y.log").read_bytes(),
            sorted(os.listdir(root)),
            os.listdir(root / "moved"),
        )

    assert both(roots, run) == (
        "ok",
        (b"X", "ENOENT", b"X", b"Y2", ["moved", "sub2"], ["x.log"]),
    )


def test_rename_directory_with_journaled_children(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        os.makedirs(root / "dir" / "sub")
        (root / "dir" / "x").write_bytes(b"X")  # commits still queued at the rename
        (root / "dir" / "sub" / "y").write_bytes(b"Y")
        fd = os.open(root / "dir" / "f", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, b"before ")
            os.rename(root / "dir", root / "moved")
            os.write(fd, b"after")
        finally:
            os.close(fd)
        (root / "moved" / "sub" / "y").write_bytes(b"Y2")
        os.rename(root / "moved" / "sub", root / "sub2")
        return (
            errname(lambda: os.stat(root / "dir" / "x")),
            (root / "moved" / "x").read_bytes(),
            (root / "moved" / "f").read_bytes(),
            (root / "sub2" / "y").read_bytes(),
            sorted(os.listdir(root)),
        )

    assert both(roots, run) == (
        "ok",
        ("ENOENT", b"X", b"before after", b"Y2", ["moved", "sub2"]),
    )


def test_rename_over_existing_file(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "src").write_bytes(b"new")
        (root / "dst").write_bytes(b"old")
        os.chmod(root / "src", 0o600)
        keep = os.open(root / "dst", os.O_RDONLY)
        try:
            os.rename(root / "src", root / "dst")
            still = os.pread(keep, 10, 0)
        finally:
            os.close(keep)
        (root / "d1").mkdir()
        (root / "d2").mkdir()
        (root / "d2" / "x").write_bytes(b"")
        return (
            still,
            (root / "dst").read_bytes(),
            stat.S_IMODE(os.stat(root / "dst").st_mode),
            errname(lambda: os.stat(root / "src")),
            errname(lambda: os.rename(root / "dst", root / "d1")),
            errname(lambda: os.rename(root / "d1", root / "dst")),
            errname(lambda: os.rename(root / "d1", root / "d2")),
        )

    assert both(roots, run) == (
        "ok",
        (b"old", b"new", 0o600, "ENOENT", "EISDIR", "ENOTDIR", "ENOTEMPTY"),
    )


def test_rename_noreplace(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"A")
        (root / "b").write_bytes(b"B")
        res = errname(lambda: renameat2(root / "a", root / "b", RENAME_NOREPLACE))
        renameat2(root / "a", root / "c", RENAME_NOREPLACE)
        return res, (root / "b").read_bytes(), (root / "c").read_bytes()

    assert both(roots, run) == ("ok", ("EEXIST", b"B", b"A"))


def test_rename_exchange(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"content of a")
        (root / "b").write_bytes(b"content of b")
        os.chmod(root / "b", 0o600)
        renameat2(root / "a", root / "b", RENAME_EXCHANGE)
        files = (root / "a").read_bytes(), (root / "b").read_bytes()
        modes = stat.S_IMODE(os.stat(root / "a").st_mode)
        # Write through both names afterwards: each lands on the right file.
        (root / "a").write_bytes(b"a again")
        with open(root / "b", "ab") as f:
            f.write(b"+")
        (root / "d").mkdir()
        (root / "d" / "inner").write_bytes(b"I")
        renameat2(root / "a", root / "d", RENAME_EXCHANGE)
        kinds = stat.S_ISDIR(os.stat(root / "a").st_mode), stat.S_ISREG(os.stat(root / "d").st_mode)
        return (
            files,
            modes,
            kinds,
            (root / "a" / "inner").read_bytes(),
            (root / "d").read_bytes(),
            (root / "b").read_bytes(),
            errname(lambda: renameat2(root / "b", root / "missing", RENAME_EXCHANGE)),
        )

    assert both(roots, run) == (
        "ok",
        (
            (b"content of b", b"content of a"),
            0o600,
            (True, True),
            b"I",
            b"a again",
            b"content of a+",
            "ENOENT",
        ),
    )


def test_symlink_readlink_lstat(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "target").write_bytes(b"through the link")
        os.symlink("target", root / "ln")
        os.symlink("does/not/exist", root / "dangling")
        os.symlink(b"\xff\x01weird", os.fsencode(root / "odd"))
        (root / "dir").mkdir()
        os.symlink("../target", root / "dir" / "up")
        lst = os.lstat(root / "ln")
        # Writing through the link writes the target.
        with open(root / "ln", "ab") as f:
            f.write(b"!")
        return (
            os.readlink(root / "ln"),
            os.readlink(os.fsencode(root / "odd")),
            stat.S_ISLNK(lst.st_mode),
            lst.st_size,
            (root / "ln").read_bytes(),
            (root / "dir" / "up").read_bytes(),
            errname(lambda: (root / "dangling").read_bytes()),
            errname(lambda: os.symlink("x", root / "ln")),
            errname(lambda: os.readlink(root / "target")),
            errname(lambda: os.open(root / "ln", os.O_RDONLY | os.O_NOFOLLOW)),
        )

    assert both(roots, run) == (
        "ok",
        (
            "target",
            b"\xff\x01weird",
            True,
            6,
            b"through the link!",
            b"through the link!",
            "ENOENT",
            "EEXIST",
            "EINVAL",
            "ELOOP",
        ),
    )


def test_hard_links(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        a, b = root / "a", root / "b"
        a.write_bytes(b"shared")
        os.link(a, b)
        sa, sb = os.stat(a), os.stat(b)
        same_ino = sa.st_ino == sb.st_ino
        b.write_bytes(b"written via b")
        via_a = a.read_bytes()
        with open(a, "ab") as f:
            f.write(b"+a")
        via_b = b.read_bytes()
        # An fd open on one name sees writes made through the other.
        fd = os.open(a, os.O_RDONLY)
        try:
            with open(b, "r+b") as f:
                f.write(b"W")
            seen = os.pread(fd, 100, 0)
        finally:
            os.close(fd)
        os.chmod(a, 0o600)
        mode_b = stat.S_IMODE(os.stat(b).st_mode)
        os.unlink(a)
        after = os.stat(b).st_nlink, b.read_bytes()
        b.write_bytes(b"alone again")  # a single link: journaled again
        return (
            (sa.st_nlink, sb.st_nlink),
            same_ino,
            via_a,
            via_b,
            seen,
            mode_b,
            after,
            b.read_bytes(),
            errname(lambda: os.link(b, b)),
        )

    assert both(roots, run) == (
        "ok",
        (
            (2, 2),
            True,
            b"written via b",
            b"written via b+a",
            b"Written via b+a",
            0o600,
            (1, b"Written via b+a"),
            b"alone again",
            "EEXIST",
        ),
    )


def test_hard_links_against_saves_renames_and_truncates(roots: tuple[Path, Path]) -> None:
    """A hard-linked file is one file: a write, a truncate(2) or an O_TRUNC through any
    name changes every name; a save by rename gives one name a new file and leaves the
    other the old one; rename(2) between two names of one file does nothing."""

    def run(root: Path) -> Any:
        (root / "sub").mkdir()
        a, b, c = root / "a.txt", root / "sub" / "b.txt", root / "c.txt"
        a.write_bytes(b"x = 1\n" * 50)
        os.link(a, b)  # another directory
        os.link(b, c)
        b.write_bytes(b"x = 2\n")  # O_TRUNC through one name
        after_write = a.read_bytes(), c.read_bytes()
        os.truncate(c, 9)  # (longer: no truncation gate)
        after_truncate = a.read_bytes(), os.stat(a).st_size
        os.rename(a, c)  # two names of one file: nothing happens
        both_there = a.exists(), c.exists()
        noreplace = errname(lambda: renameat2(a, c, RENAME_NOREPLACE))
        tmp = root / "sub" / ".b.txt.tmp"
        tmp.write_bytes(b"y = 3\n")
        os.replace(tmp, b)  # a save by rename: b is a new file
        return (
            after_write,
            after_truncate,
            both_there,
            noreplace,
            a.read_bytes(),
            b.read_bytes(),
            os.stat(a).st_nlink,
            os.stat(b).st_nlink,
        )

    assert both(roots, run) == (
        "ok",
        (
            (b"x = 2\n", b"x = 2\n"),
            (b"x = 2\n\0\0\0", 9),
            (True, True),
            "EEXIST",
            b"x = 2\n\0\0\0",
            b"y = 3\n",
            2,
            1,
        ),
    )


def test_link_while_a_truncate_is_staged(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"some bytes")
        fd = os.open(root / "a", os.O_RDWR)
        try:
            os.truncate(root / "a", 4)  # by path, while a descriptor is open
            os.link(root / "a", root / "b")
            os.pwrite(fd, b"!", 4)
        finally:
            os.close(fd)
        return (root / "b").read_bytes(), os.stat(root / "b").st_nlink

    assert both(roots, run) == ("ok", (b"some!", 2))


def test_unlinked_open_file_reports_no_links(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"abcdef")
        fd = os.open(root / "a", os.O_RDWR)
        try:
            os.unlink(root / "a")
            os.ftruncate(fd, 3)
            first = os.fstat(fd).st_nlink, os.fstat(fd).st_size
            (root / "a").write_bytes(b"a new file")  # the name again, another file
            second = os.fstat(fd).st_nlink, os.pread(fd, 100, 0)
        finally:
            os.close(fd)
        return first, second, os.stat(root / "a").st_nlink

    assert both(roots, run) == ("ok", ((0, 3), (0, b"abc"), 1))


def test_a_removed_open_file_is_changed_alone_never_the_root(roots: tuple[Path, Path]) -> None:
    # Regression: an inode left with no name stood for the path "", the workspace's root.
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"x")
        fd = os.open(root / "a", os.O_RDWR)
        try:
            os.unlink(root / "a")
            root_before = os.stat(root)
            os.fchmod(fd, 0o600)
            os.utime(fd, ns=(10**18, 10**18))
            st = os.fstat(fd)
        finally:
            os.close(fd)
        root_after = os.stat(root)
        unchanged = (root_after.st_mode, root_after.st_mtime_ns) == (
            root_before.st_mode,
            root_before.st_mtime_ns,
        )
        return unchanged, stat.S_IMODE(st.st_mode), st.st_mtime_ns

    assert both(roots, run) == ("ok", (True, 0o600, 10**18))


def test_a_removed_directory_lists_empty_and_a_removed_file_keeps_its_xattrs(
    roots: tuple[Path, Path],
) -> None:
    def run(root: Path) -> Any:
        (root / "d").mkdir()
        (root / "keep").write_bytes(b"k")
        dfd = os.open(root / "d", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.rmdir(root / "d")
            listed = os.listdir(dfd)
        finally:
            os.close(dfd)
        (root / "f").write_bytes(b"x")
        os.setxattr(root / "f", "user.a", b"1")
        fd = os.open(root / "f", os.O_RDWR)
        try:
            os.unlink(root / "f")
            os.setxattr(fd, "user.b", b"2")
            names = sorted(os.listxattr(fd)), os.getxattr(fd, "user.a")
        finally:
            os.close(fd)
        return listed, names, sorted(os.listxattr(root))

    listed, names, root_xattrs = both(roots, run)[1]
    assert listed == [] and names == (["user.a", "user.b"], b"1")
    assert root_xattrs == []


def test_a_directory_replaced_by_a_rename_is_still_stat_able_through_its_descriptor(
    roots: tuple[Path, Path],
) -> None:
    def run(root: Path) -> Any:
        (root / "old").mkdir(mode=0o750)
        (root / "new").mkdir(mode=0o700)
        dfd = os.open(root / "old", os.O_RDONLY | os.O_DIRECTORY)
        try:
            before = os.fstat(dfd)
            os.rename(root / "new", root / "old")
            after = os.fstat(dfd)
            listed = os.listdir(dfd)
        finally:
            os.close(dfd)
        now = (root / "old").stat()
        return (
            stat.S_ISDIR(after.st_mode),
            stat.S_IMODE(after.st_mode),
            after.st_ino == before.st_ino,
            now.st_ino != before.st_ino,
            stat.S_IMODE(now.st_mode),
            listed,
        )

    assert both(roots, run) == ("ok", (True, 0o750, True, True, 0o700, []))


def test_mkfifo(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        os.mkfifo(root / "fifo", 0o640)
        st = os.lstat(root / "fifo")
        return stat.S_ISFIFO(st.st_mode), stat.S_IMODE(st.st_mode)

    assert both(roots, run) == ("ok", (True, 0o640))


def test_xattrs(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "x"
        p.write_bytes(b"data")
        os.setxattr(p, "user.one", b"1")
        os.setxattr(p, "user.two", b"\x00binary\xff")
        got = os.getxattr(p, "user.one"), os.getxattr(p, "user.two")
        names = sorted(os.listxattr(p))
        # xattrs survive a write (the commit replaces the backing file).
        p.write_bytes(b"new data")
        kept = os.getxattr(p, "user.two")
        # Set while a write is staged: still there after the commit.
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, b"NEW")
            os.setxattr(fd, "user.three", b"3")
        finally:
            os.close(fd)
        three = os.getxattr(p, "user.three")
        os.removexattr(p, "user.one")
        (root / "d").mkdir()
        os.setxattr(root / "d", "user.dir", b"D")
        return (
            got,
            names,
            kept,
            three,
            sorted(os.listxattr(p)),
            errname(lambda: os.getxattr(p, "user.one")),
            errname(lambda: os.removexattr(p, "user.one")),
            errname(lambda: os.setxattr(p, "user.two", b"x", os.XATTR_CREATE)),
            errname(lambda: os.setxattr(p, "user.nope", b"x", os.XATTR_REPLACE)),
            os.getxattr(root / "d", "user.dir"),
        )

    assert both(roots, run) == (
        "ok",
        (
            (b"1", b"\x00binary\xff"),
            ["user.one", "user.two"],
            b"\x00binary\xff",
            b"3",
            ["user.three", "user.two"],
            "ENODATA",
            "ENODATA",
            "EEXIST",
            "ENODATA",
            b"D",
        ),
    )


def test_a_write_clears_a_file_capability_set_while_the_file_is_open(
    roots: tuple[Path, Path],
) -> None:
    """The kernel asks for security.capability before every write and removes it. Through
    the mount, a handle's later writes skip rwfs's Python handler and so does that question
    (the C extension reads it from the stage): a capability set meanwhile must still go."""
    # vfs_cap_data, revision 2, effective: cap_net_raw (13) permitted.
    cap = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)

    def run(root: Path) -> Any:
        p = root / "tool"
        p.write_bytes(b"#!/bin/sh\n")
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"a\n")
            os.write(fd, b"b\n")
            os.setxattr(p, "security.capability", cap)
            set_while_open = os.getxattr(p, "security.capability") == cap
            os.write(fd, b"c\n")
            after_write = errname(lambda: os.getxattr(p, "security.capability"))
        finally:
            os.close(fd)
        return set_while_open, after_write, p.read_bytes()

    assert both(roots, run) == ("ok", (True, "ENODATA", b"#!/bin/sh\na\nb\nc\n"))


def test_statvfs(roots: tuple[Path, Path]) -> None:
    sm, sp = os.statvfs(roots[0]), os.statvfs(roots[1])
    assert sm.f_bsize > 0 and sm.f_frsize > 0
    assert 0 < sm.f_bfree <= sm.f_blocks and sm.f_bavail <= sm.f_bfree
    assert 0 < sm.f_ffree <= sm.f_files
    assert sm.f_namemax == sp.f_namemax == 255
    assert (sm.f_frsize, sm.f_blocks, sm.f_files) == (sp.f_frsize, sp.f_blocks, sp.f_files)
    # Free space moves with the backing filesystem (within what other writers do).
    assert abs(sm.f_bfree * sm.f_frsize - sp.f_bfree * sp.f_frsize) < 1 << 30


def test_names_with_arbitrary_bytes(roots: tuple[Path, Path]) -> None:
    odd = b"caf\xe9 \x01 name"
    other = b"\xff\xfe\n\t tab-newline \x7f"

    def run(root: Path) -> Any:
        base = os.fsencode(root)
        p = os.path.join(base, odd)
        with open(p, "wb") as f:
            f.write(b"odd")
        os.mkdir(os.path.join(base, other))
        q = os.path.join(base, other, odd)
        os.rename(p, q)
        with open(q, "ab") as f:
            f.write(b"!")
        listing = sorted(os.listdir(base)), os.listdir(os.path.join(base, other))
        long_name = os.path.join(base, b"n" * 255)
        with open(long_name, "wb") as f:
            f.write(b"long")
        return (
            listing,
            open(q, "rb").read(),
            errname(lambda: open(os.path.join(base, b"n" * 256), "wb")),
        )

    assert both(roots, run) == (
        "ok",
        (([other], [odd]), b"odd!", "ENAMETOOLONG"),
    )


# ---- data paths ----


def test_large_file(roots: tuple[Path, Path]) -> None:
    chunk = os.urandom(1 << 20)
    total = 20

    def run(root: Path) -> Any:
        p = root / "big.bin"
        h = hashlib.sha256()
        with open(p, "wb") as f:
            for i in range(total):
                block = bytes([i]) + chunk[1:]
                h.update(block)
                f.write(block)
        # Read back in odd-sized pieces.
        r = hashlib.sha256()
        with open(p, "rb") as f:
            while buf := f.read(123_457):
                r.update(buf)
        # Overwrite one byte in the middle of the big file.
        with open(p, "r+b") as f:
            f.seek(10 << 20)
            f.write(b"\xaa")
            f.seek(10 << 20)
        with open(p, "rb") as f:
            f.seek(10 << 20)
            mid = f.read(2)
        return r.hexdigest() == h.hexdigest(), os.stat(p).st_size, mid

    assert both(roots, run) == ("ok", (True, total << 20, b"\xaa" + chunk[1:2]))


def test_mmap_write(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "mapped.bin"
        p.write_bytes(bytes(range(256)) * 64)
        fd = os.open(p, os.O_RDWR)
        try:
            m = mmap.mmap(fd, 0)
            try:
                m[10:15] = b"HELLO"
                m[-3:] = b"END"
                m.flush()
            finally:
                m.close()
        finally:
            os.close(fd)
        data = p.read_bytes()
        return data[10:15], data[-3:], len(data), data[:10] == bytes(range(10))

    assert both(roots, run) == ("ok", (b"HELLO", b"END", 256 * 64, True))


def test_mmap_write_without_flush_lands_at_close(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "mapped2.bin"
        p.write_bytes(bytes(8192))
        with open(p, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            m[100:104] = b"MMAP"
            m.close()
        with open(p, "rb") as f:
            return f.read()[100:104]

    assert both(roots, run) == ("ok", b"MMAP")


def test_read_while_another_fd_writes(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "shared"
        p.write_bytes(b"original")
        r = os.open(p, os.O_RDONLY)
        w = os.open(p, os.O_WRONLY)
        try:
            os.write(w, b"REWRITE!tail")
            seen_open_before = os.pread(r, 100, 0), os.fstat(r).st_size
            late = os.open(p, os.O_RDONLY)
            try:
                seen_open_after = os.pread(late, 100, 0)
            finally:
                os.close(late)
            by_path = p.read_bytes(), os.stat(p).st_size
            # A second writer shares the same view: its write lands in the same file.
            w2 = os.open(p, os.O_WRONLY)
            try:
                os.pwrite(w2, b"++", 8)
            finally:
                os.close(w2)
            os.write(w, b"!")
            mixed = os.pread(r, 100, 0)
        finally:
            os.close(w)
            os.close(r)
        return seen_open_before, seen_open_after, by_path, mixed, p.read_bytes()

    assert both(roots, run) == (
        "ok",
        (
            (b"REWRITE!tail", 12),
            b"REWRITE!tail",
            (b"REWRITE!tail", 12),
            b"REWRITE!++il!",
            b"REWRITE!++il!",
        ),
    )


def test_write_to_unlinked_but_open_file(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "ghost"
        p.write_bytes(b"start")
        fd = os.open(p, os.O_RDWR)
        try:
            os.unlink(p)
            os.pwrite(fd, b"-after-unlink", 5)
            # close() of a duplicate is a flush, a commit point: the bytes stay readable.
            os.close(os.dup(fd))
            first = os.pread(fd, 100, 0)
            os.pwrite(fd, b"!", 18)
            os.fsync(fd)
            second = os.pread(fd, 100, 0), os.fstat(fd).st_size, os.fstat(fd).st_nlink
        finally:
            os.close(fd)
        return first, second, errname(lambda: os.stat(p)), os.listdir(root)

    assert both(roots, run) == (
        "ok",
        (b"start-after-unlink", (b"start-after-unlink!", 19, 0), "ENOENT", []),
    )


def test_shell_redirect_closes_a_duplicate_before_writing(
    roots: tuple[Path, Path], mount: Mount
) -> None:
    def run(root: Path) -> Any:
        (root / "f").write_bytes(b"previous content\n")
        subprocess.run(["bash", "-c", "echo x > f"], cwd=root, check=True)
        one = (root / "f").read_bytes()
        subprocess.run(
            ["bash", "-c", "exec 3>g; echo a >&3; echo b >&3; exec 3>&-; echo c >> g"],
            cwd=root,
            check=True,
        )
        return one, (root / "g").read_bytes()

    assert both(roots, run) == ("ok", (b"x\n", b"a\nb\nc\n"))
    # The empty moment between the duplicate's close and the write was never committed.
    empty = "sha256:" + hashlib.sha256(b"").hexdigest()
    events = [e for e in journal(mount) if e.get("path") == "f" and e["op"] == "write"]
    assert [e["intended"] for e in events] == [
        "sha256:" + hashlib.sha256(b"previous content\n").hexdigest(),
        "sha256:" + hashlib.sha256(b"x\n").hexdigest(),
    ]
    assert all(e["intended"] != empty for e in events)


def test_o_direct_write_and_read(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        subprocess.run(
            ["dd", "if=/dev/zero", "of=direct.bin", "bs=4096", "count=16", "oflag=direct"],
            cwd=root,
            check=True,
            capture_output=True,
        )
        res = subprocess.run(
            ["dd", "if=direct.bin", "of=/dev/null", "bs=4096", "iflag=direct"],
            cwd=root,
            capture_output=True,
        )
        return res.returncode, os.stat(root / "direct.bin").st_size

    assert both(roots, run) == ("ok", (0, 65536))


def test_many_writers_and_rapid_rewrites(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        for i in range(30):
            (root / f"f{i % 3}").write_bytes(b"v%d" % i)
        fds = [os.open(root / "f0", os.O_WRONLY) for _ in range(4)]
        try:
            for n, fd in enumerate(fds):
                os.pwrite(fd, b"%d" % n, n)
        finally:
            for fd in fds:
                os.close(fd)
        return [(root / f"f{i}").read_bytes() for i in range(3)]

    assert both(roots, run)[1][0] == b"0123"


def test_time_of_write_is_now(roots: tuple[Path, Path]) -> None:
    start = time.time_ns()

    def run(root: Path) -> Any:
        (root / "t").write_bytes(b"x")
        st = os.stat(root / "t")
        return st.st_mtime_ns >= start - 10**9 and st.st_mtime_ns <= time.time_ns() + 10**9

    assert both(roots, run) == ("ok", True)


def test_fallocate_modes_and_seek_data_hole(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        p = root / "f.bin"
        p.write_bytes(b"x" * 100_000)
        fd = os.open(p, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, 200_000)  # grows the file with zeros
            grown = os.fstat(fd).st_size, os.pread(fd, 4, 99_998)
            fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20)  # preallocates only
            kept = os.fstat(fd).st_size
            fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, 8192, 16384)
            punched = os.pread(fd, 8, 8188), os.pread(fd, 8, 24572)
            seeks = tuple(
                os.lseek(fd, off, w)
                for off, w in ((0, os.SEEK_DATA), (0, os.SEEK_HOLE), (8192, os.SEEK_DATA))
            )
            fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, 10)
            fallocate(fd, FALLOC_FL_ZERO_RANGE, 199_990, 20)  # grows by 10
            beyond = errname(lambda: os.lseek(fd, 300_000, os.SEEK_DATA))
            bad = errname(lambda: fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 10))  # needs KEEP_SIZE
        finally:
            os.close(fd)
        ro = os.open(p, os.O_RDONLY)
        try:
            not_writable = errname(lambda: os.posix_fallocate(ro, 0, 10))
        finally:
            os.close(ro)
        return grown, kept, punched, seeks, beyond, bad, not_writable, p.read_bytes()[:12]

    grown, kept, punched, seeks, beyond, bad, not_writable, head = both(roots, run)[1]
    assert grown == (200_000, b"xx\0\0") and kept == 200_000
    assert punched == (b"xxxx\0\0\0\0", b"\0\0\0\0xxxx")
    assert seeks == (0, 8192, 24576)
    assert (beyond, bad, not_writable) == ("ENXIO", errno.errorcode[errno.EOPNOTSUPP], "EBADF")
    assert head == b"\0" * 10 + b"xx"
    assert os.stat(roots[0] / "f.bin").st_size == 200_010


def test_fallocate_of_a_hard_linked_file_changes_it_in_place(roots: tuple[Path, Path]) -> None:
    def run(root: Path) -> Any:
        (root / "a").write_bytes(b"y" * 10_000)
        os.link(root / "a", root / "b")
        fd = os.open(root / "b", os.O_WRONLY)
        try:
            fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, 0, 4096)
        finally:
            os.close(fd)
        return (root / "a").read_bytes()

    assert both(roots, run)[1] == b"\0" * 4096 + b"y" * (10_000 - 4096)


def test_sparse_file_stays_sparse_after_a_journaled_rewrite(mount: Mount, tmp_path: Path) -> None:
    # Regression: the stage copy used to write every hole out as zeros.
    size = 64 << 20
    for root in (mount.path, tmp_path):
        f = root / "sparse.bin"
        with open(f, "wb") as fh:
            fh.truncate(size)
        with open(f, "r+b") as fh:
            fh.write(b"head")
            fh.seek(size - 4)
            fh.write(b"tail")
    (mount.path / ".rw" / "ctl").write_text("sync\n")
    got = (mount.path / "sparse.bin").read_bytes()
    assert got == (tmp_path / "sparse.bin").read_bytes()
    assert got[:4] == b"head" and got[-4:] == b"tail" and len(got) == size
    assert os.stat(mount.path / "sparse.bin").st_blocks * 512 < size // 4
