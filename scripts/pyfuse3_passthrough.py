"""A minimal passthrough filesystem on rwfs's own stack (pyfuse3 + trio), with no
journaling at all: the floor under any design that answers FUSE requests in Python.

``scripts/bench`` mounts it as its ``pyfuse3`` column, beside bindfs (a C passthrough),
so that each row shows how much of rwfs's time is the stack it runs on and how much is
rwfs's own work (docs/performance.md). It serves the kernel the way rwfs does where that
costs nothing: entry and attribute timeouts of 60 s, ``keep_cache`` on open, the same
nice value, and the kernel caches rwfs's C extension asks for (``rwfs.fuse.kernelflags``: no
OPENDIR and every listing cached, no FLUSH at a read-only close, written pages kept).
It answers every request on the event loop with one or two system calls, but ``fsync``
in a worker thread.

Usage: pyfuse3_passthrough.py BACKING MOUNTPOINT   (foreground; unmount to stop)
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rwfs.fuse import kernelflags  # before pyfuse3, whose libfuse calls it must wrap

import pyfuse3  # noqa: E402  (isort: skip)
import trio

TIMEOUT = 60.0
NICE = -10  # rwfs.cli.mount.NICE: the same priority as the daemon it is compared with
_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def _errors(fn: F) -> F:
    """A system call's OSError becomes the FUSE error the kernel passes on."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

    return wrapper  # type: ignore[return-value]


class Passthrough(pyfuse3.Operations):
    def __init__(self, backing: bytes) -> None:
        super().__init__()
        self.backing = backing
        # The (parent inode, name) entries of each inode the kernel knows (a hard-linked
        # file's names; a directory's one), so that a rename moves a whole subtree.
        self.names: dict[int, set[tuple[int, bytes]]] = {}
        # A backing inode number the tree reuses after its object went is a new object
        # to the kernel only with a new generation: with the same one, the kernel takes
        # it for the inode it still caches, and a directory's old dentry is moved to the
        # new name (d_splice_alias), which can fail with ESTALE while a rename runs.
        self.generations: dict[int, int] = {}
        self.listings: dict[int, list[bytes]] = {}  # a directory's names, while listed

    def _path(self, ino: int) -> bytes:
        if ino == pyfuse3.ROOT_INODE:
            return self.backing
        names = self.names.get(ino)
        if not names:
            raise pyfuse3.FUSEError(errno.ESTALE)
        parent, name = next(iter(names))
        return os.path.join(self._path(parent), name)

    def _child(self, parent: int, name: bytes) -> bytes:
        return os.path.join(self._path(parent), name)

    def _attr(self, st: os.stat_result, ino: int | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino if ino is not None else st.st_ino
        a.generation = self.generations.get(a.st_ino, 0)
        a.entry_timeout = TIMEOUT
        a.attr_timeout = TIMEOUT
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_rdev = st.st_rdev
        a.st_size = st.st_size
        a.st_blksize = st.st_blksize
        a.st_blocks = st.st_blocks
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        return a

    def _enter(self, parent: int, name: bytes) -> pyfuse3.EntryAttributes:
        st = os.lstat(self._child(parent, name))
        known = self.names.setdefault(st.st_ino, set())
        if not known:  # no name of it is known: new, or its number was freed and reused
            self.generations[st.st_ino] = self.generations.get(st.st_ino, 0) + 1
        known.add((parent, name))
        return self._attr(st)

    def _remove(self, parent: int, name: bytes, remove: Callable[[bytes], None]) -> None:
        """Removes the entry; once it is gone its inode no longer has that name."""
        path = self._child(parent, name)
        ino = os.lstat(path).st_ino
        remove(path)
        self.names.get(ino, set()).discard((parent, name))

    def _stat(self, ino: int) -> os.stat_result:
        return os.lstat(self._path(ino))

    @_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        return self._enter(parent_inode, name)

    @_errors
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        return self._attr(self._stat(inode), inode)

    @_errors
    async def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> Any:
        path = self._path(inode)
        if fields.update_size:
            if fh is not None:
                os.ftruncate(kernelflags.handle(fh), attr.st_size)
            else:
                os.truncate(path, attr.st_size)
        if fields.update_mode:
            os.chmod(path, attr.st_mode & 0o7777, follow_symlinks=False)
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            os.chown(path, uid, gid, follow_symlinks=False)
        if fields.update_atime or fields.update_mtime:
            st = os.lstat(path)
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            os.utime(path, ns=(atime, mtime), follow_symlinks=False)
        return self._attr(os.lstat(path), inode)

    @_errors
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.readlink(self._path(inode))

    @_errors
    async def opendir(self, inode: int, ctx: Any) -> int:
        if kernelflags.no_opendir():
            raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel stops asking, caches listings
        return inode | kernelflags.CACHE_DIR

    @_errors
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        parent = kernelflags.dir_inode(fh)
        if parent is None:
            parent = kernelflags.handle(fh)
        names = self.listings.get(parent)
        if names is None or start_id == 0:
            names = self.listings[parent] = sorted(os.listdir(self._path(parent)))
        for i in range(start_id, len(names)):
            try:
                attr = self._enter(parent, names[i])
            except FileNotFoundError:
                continue
            if not pyfuse3.readdir_reply(token, names[i], attr, i + 1):
                return
        self.listings.pop(parent, None)  # the whole listing went out

    @_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
        os.mkdir(self._child(parent_inode, name), mode)
        return self._enter(parent_inode, name)

    @_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> Any:
        os.mknod(self._child(parent_inode, name), mode, rdev)
        return self._enter(parent_inode, name)

    @_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> Any:
        os.symlink(target, self._child(parent_inode, name))
        return self._enter(parent_inode, name)

    @_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._remove(parent_inode, name, os.unlink)

    @_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        self._remove(parent_inode, name, os.rmdir)

    @_errors
    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
        flags: int, ctx: Any,
    ) -> None:  # fmt: skip
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        src, dst = (parent_inode_old, name_old), (parent_inode_new, name_new)
        moved = os.lstat(old).st_ino
        try:
            there: int | None = os.lstat(new).st_ino
        except FileNotFoundError:
            there = None
        if _libc.renameat2(_AT_FDCWD, old, _AT_FDCWD, new, flags) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        if there is not None and there != moved:
            self.names.setdefault(there, set()).discard(dst)
            if flags & pyfuse3.RENAME_EXCHANGE:
                self.names[there].add(src)
        if there != moved:  # a rename onto another name of the same file changes nothing
            self.names.setdefault(moved, set()).discard(src)
            self.names[moved].add(dst)

    @_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> Any:
        os.link(self._path(inode), self._child(new_parent_inode, new_name), follow_symlinks=False)
        return self._enter(new_parent_inode, new_name)

    @_errors
    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        fd = os.open(self._path(inode), flags & ~os.O_CREAT)
        read_only = flags & os.O_ACCMODE == os.O_RDONLY
        return pyfuse3.FileInfo(fh=fd | (kernelflags.NOFLUSH if read_only else 0), keep_cache=True)

    @_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
        fd = os.open(self._child(parent_inode, name), flags | os.O_CREAT, mode)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True), self._enter(parent_inode, name)

    @_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(kernelflags.handle(fh), size, off)

    @_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return os.pwrite(fh, buf, off)

    async def flush(self, fh: int) -> None:
        pass

    @_errors
    async def release(self, fh: int) -> None:
        os.close(kernelflags.handle(fh))

    @_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        # In a worker thread, as rwfs does: a device flush must not stop the other requests.
        sync = os.fdatasync if datasync else os.fsync
        await trio.to_thread.run_sync(sync, kernelflags.handle(fh))

    @_errors
    async def statfs(self, ctx: Any) -> Any:
        sv = os.statvfs(self._path(pyfuse3.ROOT_INODE))
        s = pyfuse3.StatvfsData()
        for attr in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
            setattr(s, attr, getattr(sv, attr))
        for attr in ("f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(s, attr, getattr(sv, attr))
        return s

    @_errors
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        try:
            return os.getxattr(self._path(inode), name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_errors
    async def listxattr(self, inode: int, ctx: Any) -> Any:
        return [os.fsencode(n) for n in os.listxattr(self._path(inode), follow_symlinks=False)]

    @_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        os.setxattr(self._path(inode), name, value, follow_symlinks=False)

    @_errors
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        os.removexattr(self._path(inode), name, follow_symlinks=False)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    backing, point = (os.fsencode(os.path.abspath(a)) for a in argv)
    ops = Passthrough(backing)
    kernelflags.keep_written_pages()
    pyfuse3.init(ops, os.fsdecode(point), set(pyfuse3.default_options) | {"fsname=pyfuse3pt"})
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:
        pass
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
