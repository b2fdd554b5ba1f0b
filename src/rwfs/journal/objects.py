"""Content-addressed object store under ``.rw/objects/ab/cdef…`` (named by SHA-256).

Objects are the previous bytes of files that rwfs replaced or removed. They enter the store
by hard link of the old inode (no copy): a removed inode is first linked under
``objects/incoming/<unique id>`` (a cheap syscall on the request path) and later hashed and moved
to its digest name by the group committer, off the event loop.

Everything here is blocking: callers run it in a worker thread.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import logging
import os
import stat
import threading
from collections.abc import Iterator
from typing import Any

from .. import beneath

log = logging.getLogger("rwfs")

EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()
_CHUNK = 1 << 20


_prefix = os.urandom(8).hex()
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix, _counter = os.urandom(8).hex(), itertools.count()


os.register_at_fork(after_in_child=_reseed)


def unique_id() -> str:
    """32 hex digits that no other call returns, in this process or any other: a random
    prefix per process and a counter. (uuid4 costs a getrandom() each; a new file takes
    several ids, some on the request path.)"""
    return f"{_prefix}{next(_counter):016x}"


READ_REGULAR = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(dir_fd: int, path: bytes | str) -> tuple[int, os.stat_result]:
    """Open a file of the tree to read its bytes, if it is a regular file, and nothing
    else: ``(descriptor, stat)``, or ``(-1, stat)`` for a directory, a symlink, a FIFO, a
    socket or a device node, which is never opened (a device's open can act on the device,
    a socket's fails with ENXIO, a FIFO's blocks or, nonblocking, makes a writer's open
    succeed). FileNotFoundError when absent.

    The type is read by ``lstat`` first; the open is nonblocking and does not follow a
    symlink, and ``fstat`` checks the type again, for a file swapped in between. A path of
    several components is resolved beneath ``dir_fd`` (``beneath.parent``): ``Escape`` if a
    directory on it is a symlink."""
    path = os.fsencode(path)
    if b"/" in path:
        with beneath.parent(dir_fd, path) as (d, name):
            return open_regular(d, name)
    path = path or b"."
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        return -1, st
    try:
        fd = os.open(path, READ_REGULAR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EISDIR):
            raise
        return -1, os.stat(path, dir_fd=dir_fd, follow_symlinks=False)  # swapped meanwhile
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return -1, st
    return fd, st


def data_regions(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The data regions ``(start, end)`` of the first ``size`` bytes of ``fd``, in order
    (SEEK_DATA/SEEK_HOLE): what lies between them is a hole, which reads as zeros. A
    filesystem that cannot tell holes yields one region, the whole file."""
    off = 0
    while off < size:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole remains
                return
            yield off, size  # (EINVAL: no SEEK_DATA here)
            return
        if data >= size:
            return
        try:
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        except OSError:
            hole = size
        yield data, hole
        off = hole


def digest_fd(fd: int) -> tuple[str, int]:
    """SHA-256 of a file's whole content, read through ``fd``; returns (digest, size).

    Holes are hashed as the zeros they read as, without reading them: SHA-256 still runs
    over every byte (the digest is of the logical bytes), but the disk reads only data."""
    h = hashlib.sha256()
    size = os.fstat(fd).st_size
    off = 0
    for start, end in data_regions(fd, size):
        _hash_zeros(h, start - off)
        off = start
        while off < end:
            buf = os.pread(fd, min(_CHUNK, end - off), off)
            if not buf:  # the file shrank under us
                return "sha256:" + h.hexdigest(), off
            h.update(buf)
            off += len(buf)
    _hash_zeros(h, size - off)
    # Bytes written past the size seen at the start (a file that grew meanwhile).
    while buf := os.pread(fd, _CHUNK, size):
        h.update(buf)
        size += len(buf)
    return "sha256:" + h.hexdigest(), size


class TrailingHash:
    """SHA-256 of a file being written front to back, computed in a thread of its own
    that follows the writes, so that sealing a large file reads little of it again.

    The thread reads the file itself (through its own descriptor): a write only calls
    ``wrote()``, with no thread hop. A write into bytes already read (or being read), or
    a truncation below them, voids the hash; ``finish()`` then returns None and the seal
    hashes the whole file as usual.

    ``wrote()`` comes after its write, so the thread reads no further than the bytes
    reported so far (``reported``: the file's size when the hash began, then the end of
    each write told of): otherwise it could read an appended block before its report,
    which would then void the hash of a file written strictly front to back.
    """

    def __init__(self, fd: int, reported: int) -> None:
        self._fd = os.dup(fd)
        self._h = hashlib.sha256()
        self._pos = 0  # bytes hashed
        self._reading = 0  # end of the bytes hashed or being read
        self._reported = reported  # the thread reads no further
        self._void = False
        self._done = False
        self._more = threading.Event()
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="rwfs-hash", daemon=True).start()

    def wrote(self, off: int, end: int) -> None:
        """Called after a write (or a truncation) that changed bytes from ``off`` to
        ``end``."""
        if off < self._reading:
            self._void = True
        self._reported = max(self._reported, end)
        self._more.set()

    def stop(self) -> None:
        """The file is dropped: end the thread, nothing to return."""
        self._void = self._done = True
        self._more.set()

    def finish(self) -> tuple[str, int] | None:
        """Once nothing writes the file any more: (digest, size), or None if void. Blocks
        until the thread has read to the end: call it from a worker thread."""
        self._done = True
        self._more.set()
        self._stopped.wait()
        return None if self._void else ("sha256:" + self._h.hexdigest(), self._pos)

    def _run(self) -> None:
        try:
            while not self._void:
                self._more.clear()  # before looking: a write after this wakes the wait
                size = min(os.fstat(self._fd).st_size, self._reported)
                if self._pos < size:
                    n = min(_CHUNK, size - self._pos)
                    self._reading = self._pos + n  # before the read: see wrote()
                    buf = os.pread(self._fd, n, self._pos)
                    self._h.update(buf)
                    self._pos += len(buf)
                elif self._done:
                    # (a write never reported would leave a prefix hashed: not the file's)
                    self._void = self._pos != os.fstat(self._fd).st_size
                    return
                else:
                    self._more.wait()
        except OSError:
            self._void = True
        finally:
            os.close(self._fd)
            self._stopped.set()


# ioctl FICLONE (linux/fs.h): ``dst`` shares all of ``src``'s extents (a reflink).
FICLONE = 0x40049409
# What FICLONE fails with where the filesystem cannot share extents (ext4, tmpfs, ...) or
# the two files are on different filesystems.
_NO_CLONE = (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS)


def copy_fd(src: int, dst: int) -> tuple[str, int]:
    """Copy ``src`` into ``dst`` (an empty file) and hash it; returns (digest, size).

    Where the filesystem shares extents (XFS, Btrfs), ``dst`` becomes a reflink of ``src``:
    nothing is copied, and the digest is read from ``dst``, so it is that of the bytes it
    holds. Elsewhere the bytes are copied here and hashed on the way. ``copy_file_range``
    is not used: on ext4 it copies inside the kernel, and hashing the copy afterwards read
    it once more, 8% slower than this. Holes stay holes: only data regions are written
    (SEEK_DATA/SEEK_HOLE), so a sparse file's stage, and the file it is committed as, stay
    sparse.
    """
    try:
        fcntl.ioctl(dst, FICLONE, src)
    except OSError as exc:
        if exc.errno not in _NO_CLONE:
            raise
    else:
        return digest_fd(dst)
    h = hashlib.sha256()
    size = os.fstat(src).st_size
    off = 0
    for start, end in data_regions(src, size):
        _hash_zeros(h, start - off)
        off = start
        while off < end:
            buf = os.pread(src, min(_CHUNK, end - off), off)
            if not buf:  # the file shrank under us
                size = off
                break
            h.update(buf)
            view = memoryview(buf)
            while view:
                n = os.pwrite(dst, view, off)
                view = view[n:]
                off += n
        if size == off:
            break
    _hash_zeros(h, size - off)
    os.ftruncate(dst, size)
    return "sha256:" + h.hexdigest(), size


_ZEROS = bytes(_CHUNK)


def _hash_zeros(h: Any, n: int) -> None:
    while n > 0:
        k = min(n, _CHUNK)
        h.update(_ZEROS[:k] if k < _CHUNK else _ZEROS)
        n -= k


# Space the state directory holds back (``.rw/reserve``) for a full disk: released, it lets
# a removal be journaled (its intent record, the group's LMDB pages) when nothing else can
# be freed; made again once space is freed (docs/history.md).
RESERVE_BYTES = 1 << 20


class Reserve:
    """``.rw/reserve``: RESERVE_BYTES allocated, to give back when the disk is full.
    Blocking (a worker thread, or before the mount is served)."""

    def __init__(self, state_fd: int) -> None:
        self.state_fd = state_fd

    def make(self) -> bool:
        """Allocate the reserve if it is not; False if there is no room for it."""
        try:
            fd = os.open(
                b"reserve", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=self.state_fd
            )
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Give the reserve's space back; False if there was none."""
        try:
            st = os.stat(b"reserve", dir_fd=self.state_fd)
            os.unlink(b"reserve", dir_fd=self.state_fd)
        except FileNotFoundError:
            return False
        return st.st_blocks > 0


class ObjectStore:
    def __init__(self, state_fd: int) -> None:
        _makedirs_at(state_fd, b"objects")
        _makedirs_at(state_fd, b"objects/incoming")
        self.fd = os.open(b"objects", os.O_RDONLY | os.O_DIRECTORY, dir_fd=state_fd)
        self.incoming_fd = os.open(b"incoming", os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.fd)
        # Bytes (allocated) of the objects placed since the store was opened: gc.Retention
        # tells from it when the store may be over its budget.
        self.added = 0
        self._adding = threading.Lock()

    @staticmethod
    def name(digest: str) -> bytes:
        hexd = digest.split(":", 1)[1]
        return f"{hexd[:2]}/{hexd[2:]}".encode()

    def exists(self, digest: str) -> bool:
        try:
            os.stat(self.name(digest), dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def open(self, digest: str) -> int:
        return os.open(self.name(digest), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)

    def _place(self, src_dir_fd: int, src: bytes, digest: str, move: bool) -> None:
        name = self.name(digest)
        sub = name.split(b"/")[0]
        try:
            os.mkdir(sub, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        # link (+ unlink for a move) rather than rename: never replace an object that exists.
        try:
            os.link(src, name, src_dir_fd=src_dir_fd, dst_dir_fd=self.fd, follow_symlinks=False)
        except FileExistsError:
            pass
        else:
            try:
                size = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_blocks * 512
            except OSError:
                size = 0
            with self._adding:
                self.added += size
        if move:
            os.unlink(src, dir_fd=src_dir_fd)

    def keep_link(self, dir_fd: int, path: bytes, digest: str) -> None:
        """Keep the inode at ``path`` (relative to ``dir_fd``) as object ``digest``."""
        self._place(dir_fd, path, digest, move=False)

    def adopt(self, dir_fd: int, path: bytes) -> bytes:
        """Link the inode at ``path`` into ``incoming/``; returns its incoming name."""
        name = unique_id().encode()
        os.link(path, name, src_dir_fd=dir_fd, dst_dir_fd=self.incoming_fd, follow_symlinks=False)
        return name

    def adopt_copy(self, dir_fd: int, path: bytes) -> bytes:
        """``adopt`` for a hard-linked file, whose inode its other names go on changing in
        place: a copy of its bytes goes into ``incoming/`` (blocking: a worker thread).

        Not synced: the group syncs it before its event is recorded, as it syncs every
        stage. Its incoming name ends in the digest of the bytes copied, so that a copy
        a crash of the machine cut short is told apart from the bytes it was to keep
        (``settle_incoming``)."""
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        src = os.open(path, how, dir_fd=dir_fd)
        name = unique_id().encode()
        try:
            out = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o400, dir_fd=self.incoming_fd)
            try:
                digest, _ = copy_fd(src, out)
            finally:
                os.close(out)
        finally:
            os.close(src)
        named = name + b"." + digest.removeprefix("sha256:").encode()
        os.rename(name, named, src_dir_fd=self.incoming_fd, dst_dir_fd=self.incoming_fd)
        return named

    def settle_incoming(self, name: bytes) -> tuple[str, int] | None:
        """Hash an adopted inode and move it to its digest name; None if it is gone, or
        not a regular file (never opened: it holds no bytes to keep, and is removed), or
        a copy whose bytes are not those it was made with (``adopt_copy``: cut short by a
        crash of the machine, so they are bytes no file held; removed)."""
        try:
            fd, _ = open_regular(self.incoming_fd, name)
        except FileNotFoundError:
            return None
        if fd < 0:
            os.unlink(name, dir_fd=self.incoming_fd)
            return None
        try:
            digest, size = digest_fd(fd)
        finally:
            os.close(fd)
        _, dot, copied = name.partition(b".")
        if dot and "sha256:" + copied.decode() != digest:
            log.warning(
                "a kept copy of removed bytes is not what was copied (a crash of the machine"
                " cut it short): it is dropped, and the removal is journaled without it"
            )
            os.unlink(name, dir_fd=self.incoming_fd)
            return None
        self._place(self.incoming_fd, name, digest, move=True)
        return digest, size

    def incoming(self) -> list[bytes]:
        return [os.fsencode(n) for n in os.listdir(self.incoming_fd)]

    def keep_bytes(self, data: bytes) -> str:
        """Keep ``data`` as an object (durably); returns its digest."""
        digest = digest_bytes(data)
        if self.exists(digest):
            return digest
        tmp = unique_id().encode()
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400, dir_fd=self.incoming_fd)
        try:
            os.write(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        self._place(self.incoming_fd, tmp, digest, move=True)
        return digest

    def read(self, digest: str) -> bytes:
        """An object's bytes, hashed again: OSError(EIO) if they no longer match."""
        fd = self.open(digest)
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
        if digest_bytes(data) != digest:
            raise OSError(errno.EIO, f"object {digest} is damaged")
        return data

    def keep_fd_copy(self, fd: int, digest: str | None = None) -> str:
        """Keep a copy of the bytes behind ``fd`` (for inodes still in use); returns the
        copy's digest. With ``digest`` (known bytes), nothing is copied if it is kept."""
        if digest is not None and self.exists(digest):
            return digest
        tmp = unique_id().encode()
        out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o400, dir_fd=self.incoming_fd)
        try:
            copied, _ = copy_fd(fd, out)
            os.fsync(out)
        finally:
            os.close(out)
        self._place(self.incoming_fd, tmp, copied, move=True)
        return copied


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _makedirs_at(dir_fd: int, path: bytes) -> None:
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
