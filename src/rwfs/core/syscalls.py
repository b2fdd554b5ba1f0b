"""System calls the core needs that ``os`` lacks or leaves awkward, and the worker threads
its blocking calls share. Nothing here knows about stages, commits or the journal."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
from collections.abc import Iterator

import trio

_libc = ctypes.CDLL(None, use_errno=True)
# The worker threads that hashing, copies, fsync and LMDB commits run in (never the loop).
WORKERS = trio.CapacityLimiter(4)


def syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def renameat2(src_dir_fd: int, src: bytes, dst_dir_fd: int, dst: bytes, flags: int) -> None:
    """rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE, which ``os`` does not offer."""
    if not flags:
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return
    if _libc.renameat2(src_dir_fd, src, dst_dir_fd, dst, flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def rel(path: bytes) -> bytes:
    """The name to give an ``*at()`` call for a workspace path (the root is ``.``)."""
    return path or b"."


def fsdecode(path: bytes) -> str:
    return os.fsdecode(path)


def copy_range(src: int, dst: int, size: int) -> None:
    """Copy the first ``size`` bytes of ``src`` over those of ``dst``, offset for offset."""
    off = 0
    while off < size:
        try:
            n = os.copy_file_range(src, dst, size - off, off, off)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            data = os.pread(src, min(size - off, 1 << 20), off)
            n = os.pwrite(dst, data, off) if data else 0
        if n == 0:
            raise OSError(errno.EIO, "the stage is shorter than it was sealed")
        off += n


@contextlib.contextmanager
def borrowed(*fds: int) -> Iterator[tuple[int, ...]]:
    """Duplicates of descriptors for a worker thread (-1 stays -1). The loop may close the
    originals meanwhile (a release, a commit landing, a stage dropped): the thread would
    then get EBADF, or, once the number is reused, read or write another file."""
    dups: list[int] = []
    try:
        for fd in fds:
            dups.append(os.dup(fd) if fd >= 0 else -1)
        yield tuple(dups)
    finally:
        for fd in dups:
            if fd >= 0:
                os.close(fd)


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


@contextlib.contextmanager
def quiet_reader(fd: int) -> Iterator[int]:
    """``fd``'s file opened again, to read without moving its access time (O_NOATIME):
    rwfs's own reads (a stage's copy, a hash, the gates' look at the old bytes) are no
    reads of the file's users. ``fd`` itself where that cannot be (-1; EPERM: a daemon
    that is neither the file's owner nor CAP_FOWNER)."""
    own = -1
    if fd >= 0:
        with contextlib.suppress(OSError):
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NOATIME | os.O_CLOEXEC)
    try:
        yield own if own >= 0 else fd
    finally:
        if own >= 0:
            os.close(own)


def keep_atime(fd: int, st: os.stat_result) -> None:
    """A write moves no access time (POSIX: only a read does): a stage takes the atime of
    the file it replaces, ``st``'s, and rwfs's own reads of it (the seal's hash, the
    gates) leave it as it is (O_NOATIME, where the daemon may set it), so the commit's
    rename keeps it."""
    with contextlib.suppress(OSError):  # (EPERM: not the file's owner, no CAP_FOWNER)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME)
    os.utime(fd, ns=(st.st_atime_ns, os.fstat(fd).st_mtime_ns))


def copy_metadata(src_fd: int, dst_fd: int, st: os.stat_result) -> None:
    """Give a stage the target's mode, owner and xattrs, so the rename keeps them."""
    if os.geteuid() == 0 or st.st_uid != os.geteuid():
        try:
            os.fchown(dst_fd, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))  # after chown, which clears set-id bits
    try:
        names = os.listxattr(src_fd)
    except OSError:
        return
    for name in names:
        try:
            os.setxattr(dst_fd, name, os.getxattr(src_fd, name))
        except OSError:
            pass
