"""Paths rwfs resolves itself, confined to the workspace (SPEC §3.3b, I6).

A workspace path is resolved from the workspace's descriptor without following a symlink in
any component and without leaving the workspace: ``openat2(2)`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` opens the directory that holds the last name,
and the operation is then made on that one name, relative to that descriptor, never
following it either (``O_NOFOLLOW``, ``follow_symlinks=False``). A writer through the mount
may rename a directory away and plant a symlink to the host in its place between rwfs's
check and its use; from the directory's descriptor on, nothing is looked up by name again.

A path that meets a symlink, or that leaves the workspace (``..``, an absolute path), fails
with ``Escape`` (an ``OSError``) before anything changed; a component that is not a
directory fails with ENOTDIR, as it would anywhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from stat import S_ISLNK

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
CONFINED = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class Escape(OSError):
    """A workspace path that meets a symlink or leaves the workspace: rwfs does not
    resolve it."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_have_openat2 = True


def _openat2(dir_fd: int, path: bytes, flags: int) -> int:
    how = _OpenHow(flags, 0, CONFINED)
    for _ in range(8):
        fd = _syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):  # EAGAIN: a rename raced the walk
            raise OSError(err, os.strerror(err), os.fsdecode(path))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), os.fsdecode(path))


def _one(dir_fd: int, name: bytes, flags: int) -> int:
    """Open one name in ``dir_fd`` without following it: ELOOP for a symlink (which
    ``O_DIRECTORY`` would call ENOTDIR)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    except NotADirectoryError:
        if S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fsdecode(name)) from None
        raise


def _walk(dir_fd: int, path: bytes, flags: int) -> int:
    """``openat2`` for kernels before 5.6: one component at a time, none followed."""
    parts = path.split(b"/")
    fd = os.open(b".", DIR_PATH, dir_fd=dir_fd)
    try:
        for i, part in enumerate(parts):
            nxt = _one(fd, part, flags if i == len(parts) - 1 else DIR_PATH)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check(path: bytes) -> None:
    """A path rwfs keeps has no empty, ``.`` or ``..`` component: one given to it that has is
    refused, whatever the kernel would make of it. A NUL byte is a ValueError, as in ``os``
    (``openat2`` through ctypes would resolve the path only up to it)."""
    if b"\0" in path:
        raise ValueError("embedded null byte")
    if (
        path.startswith(b"/")
        or path.endswith(b"/")
        or b"//" in path
        or (b"." in path and any(p in (b".", b"..") for p in path.split(b"/")))
    ):
        raise Escape(errno.EXDEV, "not a plain path beneath the workspace", os.fsdecode(path))


def open_beneath(root_fd: int, path: bytes, flags: int) -> int:
    """Open workspace path ``path`` (relative to ``root_fd``; ``b""`` is the root itself)
    with ``flags``, following no symlink in any component, the last included."""
    global _have_openat2
    if not path:
        return os.open(b".", flags, dir_fd=root_fd)
    _check(path)
    try:
        if _have_openat2:
            try:
                return _openat2(root_fd, path, flags | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENOSYS:
                    raise
                _have_openat2 = False
        return _walk(root_fd, path, flags | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise Escape(
                exc.errno,
                "a component of the path is a symlink or not a directory",
                os.fsdecode(path),
            ) from None
        raise


@contextmanager
def parent(root_fd: int, path: bytes) -> Iterator[tuple[int, bytes]]:
    """``(dir_fd, name)``: a descriptor of the directory that holds ``path``'s last name,
    and that name; the descriptor is closed on leaving (``root_fd`` itself for a name in
    the root). The root itself is ``(root_fd, b".")``."""
    head, _, name = path.rpartition(b"/")
    if not head:
        if name:
            _check(name)
        yield root_fd, name or b"."
        return
    fd = open_beneath(root_fd, head, DIR_PATH)
    try:
        yield fd, name
    finally:
        os.close(fd)


def opendir(root_fd: int, path: bytes) -> int:
    """A readable descriptor of the directory ``path`` (to list it)."""
    return open_beneath(root_fd, path, os.O_RDONLY | os.O_DIRECTORY)


def stat(root_fd: int, path: bytes) -> os.stat_result:
    """``lstat`` of ``path``, its directories resolved beneath the root."""
    head, _, name = path.rpartition(b"/")
    if not head:
        _check(name or b"x")
        return os.stat(name or b".", dir_fd=root_fd, follow_symlinks=False)
    _check(path)
    fd = open_beneath(root_fd, head, DIR_PATH)
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def makedirs(root_fd: int, path: bytes, mode: int = 0o755) -> None:
    """Make the missing directories of ``path`` (the path itself included), one component
    at a time from the root, following none of them."""
    _check(path)
    fd = os.open(b".", DIR_PATH, dir_fd=root_fd)
    try:
        for part in path.split(b"/"):
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = _one(fd, part, DIR_PATH)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Escape(
                        exc.errno, "a directory on the path is a symlink", os.fsdecode(path)
                    ) from None
                raise
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
