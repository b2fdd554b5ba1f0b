"""What pyfuse3 cannot ask libfuse for: kernel caches and more (see ``_fuseopen.c``).

``rwfs.cli`` imports this module before anything imports pyfuse3. It loads the
``_fuseopen`` extension with RTLD_GLOBAL, so that pyfuse3, loaded after it, calls its
``fuse_reply_open`` and ``fuse_session_new``. Then:

- rwfs marks a handle number with ``CACHE_DIR`` (the kernel keeps the directory's
  listing) or ``NOFLUSH`` (no FLUSH when a read-only descriptor is closed);
- when ``no_opendir()``, rwfs answers OPENDIR with ENOSYS: the kernel stops sending
  OPENDIR and RELEASEDIR and keeps every listing; a directory's readdir then carries
  ``DIR_INODE | inode`` as its handle (``dir_inode()``);
- after ``keep_written_pages()``, the kernel keeps the pages a write cached;
- after ``fast_writes(fh, inode, stage, limit)``, the handle's writes that end within
  ``limit`` go straight into the stage while it stays the inode's open stage (no Python
  request task, no bytes copy);
- ``caller()`` is the sender of the latest flush, fsync or write request, which pyfuse3
  does not pass to those handlers (read it before the handler's first await);
- after ``serve(fn)``, the kernel's fallocate and lseek (SEEK_DATA, SEEK_HOLE) requests,
  which pyfuse3 has no method for, reach ``fn``; each is answered once with ``reply()``;
- after ``want_passthrough()`` before the mount, and where the kernel and rwfs's
  privileges allow it (``passthrough_ready()``), an open answered with a handle marked
  ``PASSTHROUGH`` and given a backing id (``backing_open``, ``passthrough``) is read,
  written and mapped by the kernel on the backing file itself (FUSE passthrough, Linux
  6.9): no READ or WRITE request reaches rwfs for it. Its RELEASE is answered by the
  extension too, and the handle number queued: ``released()`` takes the queue.

When the extension is missing or pyfuse3 was loaded first, none of this happens and the
kernel caches less. ``handle()`` strips marks from a handle number, should one ever come
back with them.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

_too_late = "pyfuse3" in sys.modules  # already bound to libfuse's fuse_reply_open
try:
    _flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
    try:
        from . import _fuseopen  # type: ignore[attr-defined]
    finally:
        sys.setdlopenflags(_flags)
except ImportError:  # not built
    _fuseopen = None

ACTIVE = _fuseopen is not None and not _too_late
CACHE_DIR = 1 << 62 if ACTIVE else 0
NOFLUSH = 1 << 61 if ACTIVE else 0
PASSTHROUGH = 1 << 60 if ACTIVE else 0
DIR_INODE = 1 << 63
_UNMARK = ~((1 << 62) | (1 << 61) | (1 << 60))


def no_opendir() -> bool:
    """Whether rwfs may answer OPENDIR with ENOSYS: the session's directory handlers are
    wrapped, and the kernel (5.1 or later) then stops sending OPENDIR."""
    if not ACTIVE or not _fuseopen.wrapped():
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 1)


def keep_written_pages() -> None:
    """Ask the kernel (at the session's init) to keep a file's pages when its mtime moves.
    Only right where rwfs makes every change itself and drops what it changed: over the
    workspace, not at a separate mount point whose raw tree can change behind it."""
    if ACTIVE:
        _fuseopen.keep_pages(True)


def pages_kept() -> bool:
    """Whether the session asked the kernel to keep pages at a new mtime."""
    return bool(ACTIVE and _fuseopen.pages_kept())


def dir_inode(fh: int) -> int | None:
    """The directory's inode number, when the kernel sent no OPENDIR (else None)."""
    return fh & ~DIR_INODE if ACTIVE and fh & DIR_INODE else None


def handle(fh: int) -> int:
    """The handle number rwfs allocated, without marks."""
    return fh & _UNMARK


def flagged() -> int:
    """How many open answers carried flags so far."""
    return int(_fuseopen.flagged()) if ACTIVE else 0


def fast_writes(fh: int, inode: object, stage: object, limit: int) -> None:
    """Let the handle's next writes go straight into ``stage`` (the extension checks, at
    each, that it is still ``inode.stage`` and not sealed, and that the write ends within
    ``limit`` bytes, and calls ``stage.wrote``)."""
    if ACTIVE:
        _fuseopen.fast_write(fh, inode, stage, limit)


def fast_writes_end(fh: int) -> None:
    """The handle is released."""
    if ACTIVE:
        _fuseopen.fast_write_end(fh)


def fast_written() -> int:
    """How many writes went straight into a stage so far."""
    return int(_fuseopen.fast_writes()) if ACTIVE else 0


def caller() -> tuple[int, int]:
    """(pid, uid) of the sender of the flush, fsync or write request being handled (the pid
    a thread id), if read before the handler's first await; (0, -1) when unknown (the
    extension is not active)."""
    if not ACTIVE:
        return 0, -1
    pid, uid = _fuseopen.caller()
    return int(pid), int(uid)


def serve(fn: Callable[..., None] | None) -> bool:
    """Hand the kernel's fallocate and lseek requests to ``fn(token, op, ino, fh, *args)``
    (op "fallocate": mode, offset, length; op "lseek": offset, whence), on the loop's
    thread. ``fn`` must not block: it answers, now or from a task, with ``reply()``.
    False when the extension is not active (the kernel then falls back on its own)."""
    if not ACTIVE:
        return False
    _fuseopen.serve(fn)
    return True


def reply(token: int, err: int = 0, offset: int | None = None) -> None:
    """Answer a request ``serve()`` handed over: an errno (0: success) or an lseek offset."""
    if offset is not None and not err:
        _fuseopen.reply_offset(token, offset)
    else:
        _fuseopen.reply_err(token, err)


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with its mode, which the os module does not offer."""
    _fuseopen.fallocate(fd, mode, offset, length)


def want_passthrough() -> None:
    """Before the mount: ask the kernel at INIT for FUSE passthrough, if it offers it."""
    if ACTIVE:
        _fuseopen.want_passthrough(True)


def passthrough_ready() -> bool:
    """Whether the session asked the kernel for FUSE passthrough at INIT (a backing id
    still needs CAP_SYS_ADMIN: ``backing_open`` fails with EPERM without it)."""
    return bool(ACTIVE and _fuseopen.passthrough_ready())


def backing_open(fd: int, ino: int) -> int:
    """Register an open backing file with the kernel: its backing id. OSError when the
    kernel refuses (EPERM: no CAP_SYS_ADMIN; EOPNOTSUPP: no passthrough). Until
    ``backing_close``, the extension answers inode ``ino``'s ``security.capability`` (the
    kernel asks before each write it passes through), GETATTR and SETATTR of its mode,
    owner and times itself, from a descriptor of its own on the file."""
    return int(_fuseopen.backing_open(fd, ino))


def backing_close(backing_id: int, ino: int) -> None:
    """The kernel lets the backing file go (the open files passed through keep theirs),
    and ``ino``'s questions go to Python again."""
    _fuseopen.backing_close(backing_id, ino)


def dir_attrs(fd: int, timeout: float) -> bool:
    """The attribute timeout of the answers the extension gives (a passed-through file's
    GETATTR and SETATTR), and GETATTR of the directories ``dir_known`` lists answered
    there too, unless ``fd`` is -1 (else one on the tree's filesystem: the root's). False
    when directories are not (without the extension, nothing is answered there)."""
    return bool(ACTIVE and _fuseopen.dir_attrs(fd, timeout))


def dir_known(ino: int, at: int, path: bytes, st: os.stat_result) -> None:
    """The directory ``path`` (relative to ``at``; ``b""``: ``at`` itself) is inode
    ``ino``, whose attributes rwfs just answered with ``st``: its next GETATTRs may be
    answered in C, as long as the file handle still opens that directory, linked."""
    _fuseopen.dir_known(ino, at, path, st.st_dev, st.st_ino)


def dir_answers() -> int:
    """How many GETATTRs of directories the extension answered."""
    return int(_fuseopen.dir_answers()) if ACTIVE else 0


def direct_attrs() -> int:
    """How many GETATTRs and SETATTRs of passed-through inodes the extension answered."""
    return int(_fuseopen.direct_attrs()) if ACTIVE else 0


def direct_answers() -> int:
    """How many ``security.capability`` questions of passed-through inodes the extension
    answered."""
    return int(_fuseopen.direct_answers()) if ACTIVE else 0


def passthrough(fh: int, backing_id: int) -> int:
    """The handle number to answer an OPEN or CREATE with so that the kernel passes that
    open file through to the backing file ``backing_id`` names."""
    if not _fuseopen.passthrough(fh, backing_id):
        raise OSError(errno.EMFILE, "too many passthrough answers pending")
    return fh | PASSTHROUGH


def passthrough_opens() -> int:
    """How many opens the kernel was told to pass through so far."""
    return int(_fuseopen.passthrough_opens()) if ACTIVE else 0


def released() -> tuple[int, ...]:
    """The passed-through handles whose RELEASE the extension answered since the last
    call, in order: rwfs must let each go as ``Operations.release`` would have."""
    return _fuseopen.released() if ACTIVE else ()  # type: ignore[no-any-return]


def release_answers() -> int:
    """How many RELEASEs of passed-through handles the extension answered."""
    return int(_fuseopen.release_answers()) if ACTIVE else 0
