"""The inode table: FUSE inode numbers, the paths and backing files they stand for.

A file's FUSE number is its backing file's own ``st_ino`` when it can be, so that it is the
same at every mount (git's index records ``st_ino``: a number that changed at each mount
would make the first ``git status`` after it re-read every file). It cannot always be: a
commit replaces a file's backing inode (the stage is renamed over it) while the file must
keep its identity, and so its number, for the kernel and for every open handle. The numbers:

- ``ROOT`` (1): the workspace's root, as FUSE requires;
- ``2 .. HIGH - 1``: a file's backing ``st_ino``, for a file on the root's device, when no
  other inode the table knows holds that number (``_number``);
- ``HIGH .. CONTROL - 1``: counted up, never reused within a mount: a file on another
  device (a mount inside the workspace), one whose backing number is taken or out of the
  range, a file an open batch creates (``add_virtual``);
- ``CONTROL .. LIMIT - 1``: counted up, the ``.rw/`` entries (``allocate_control``).

A number is taken while its ``Inode`` is in ``by_ino``, that is for as long as the kernel
knows it (lookups), or a handle, a stage or a commit needs it. A file keeps its number when
a commit gives it a new backing inode (``rekey``), so the number no longer equals the
backing ``st_ino``; while it is taken, a file whose backing inode has that number (the old
inode freed by gc and reused by the backing filesystem) gets one from the high range. Two
files never hold one number at the same time. Once the kernel has forgotten an inode, its
number may stand for another file (as a plain filesystem reuses a freed inode): what must
tell one incarnation from another within a mount uses ``Inode.serial``.

Hard links share one ``Inode`` (found by the backing ``(st_dev, st_ino)``). An inode is
found by the key of a backing file only while a name of the tree reaches that file: not
once it is removed (``orphan``), nor once rwfs replaced it while it was open (``unkey``).
Descriptors are bounded: an inode holds a backing descriptor only while it has open handles
or a stage; paths are resolved from the root descriptor.

A file an open batch creates (``add_virtual``) has no backing file yet, only stages that
come and go: it is never found by backing key, since a dropped stage's inode number is
soon another stage's, another new file's. It gets a backing key when its draft reaches the
tree (``rekey``).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .syscalls import rel

if TYPE_CHECKING:
    from .commits import Commit
    from .stages import Stage

ROOT = 1
HIGH = 1 << 62  # numbers the table counts for tree files (module docstring)
CONTROL = 3 << 61  # the .rw/ entries' numbers
LIMIT = 1 << 63  # (kernelflags.DIR_INODE marks a directory's number in a handle)

_serials = itertools.count(1)


@dataclass(eq=False, slots=True)  # slots: a mount may know hundreds of thousands of them
class Inode:
    ino: int
    paths: set[bytes]
    key: tuple[int, int]
    is_dir: bool
    lookups: int = 0
    handles: int = 0
    fd: int = -1  # backing descriptor while handles are open
    fd_writable: bool = False
    stage: Stage | None = None  # shared by every writer until a commit point
    pending: Commit | None = None  # sealed and queued for the group committer
    # Its last name was removed while open. Its backing inode may still be linked as a
    # kept object (the unlink's pre-image), so st_nlink must be reported as 0 by hand.
    unlinked: bool = False
    _lock: trio.Lock | None = field(default=None, init=False, repr=False)
    # Unique within a mount, unlike ``ino``, which a forgotten inode's file may hand on.
    serial: int = field(default_factory=lambda: next(_serials), init=False)
    # Bumped at every commit point that changes what the mount shows, with the digest of
    # each recent version: stale-write detection compares a writer's last read with it.
    version: int = 0
    digests: dict[int, str | None] = field(default_factory=dict)
    # Created in an open batch: its bytes are only a stage, not (yet) a file of the tree.
    virtual: bool = False
    # A removed directory's last attributes: the kernel may still ask for them (a cwd).
    removed: os.stat_result | None = None
    # Open handles whose reads and writes the kernel does itself (direct.py).
    direct: int = 0

    @property
    def lock(self) -> trio.Lock:
        """Serialises the stage's creation and sealing; made at first use (most inodes are
        only looked up and read)."""
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock

    @property
    def path(self) -> bytes:
        """One path of this inode (hard links have several; any one reaches the file).

        FileNotFoundError when it has none left (removed while the kernel still held it):
        an empty path would name the workspace's root, and a chmod of a file another
        process just removed would change the root's mode."""
        if not self.paths:
            raise FileNotFoundError(errno.ENOENT, "the file was removed", f"inode {self.ino}")
        return min(self.paths)

    @property
    def busy(self) -> bool:
        return self.handles > 0 or self.stage is not None or self.pending is not None


class InodeTable:
    def __init__(self, root_key: tuple[int, int]) -> None:
        root = Inode(ROOT, {b""}, root_key, True, lookups=1)
        self.by_ino: dict[int, Inode] = {ROOT: root}
        self.by_path: dict[bytes, Inode] = {b"": root}
        self.by_key: dict[tuple[int, int], Inode] = {root_key: root}
        self.dev = root_key[0]
        self._next = HIGH
        self._next_control = CONTROL
        self.high = 0  # tree files given a number from the high range

    def allocate(self) -> int:
        """A number from the high range, for a tree file (never reused within a mount)."""
        n = self._next
        if n >= CONTROL:
            raise OSError(errno.ENOSPC, "out of inode numbers")
        self._next += 1
        self.high += 1
        return n

    def allocate_control(self) -> int:
        """A number for a ``.rw/`` entry: above every tree file's."""
        n = self._next_control
        if n >= LIMIT:
            raise OSError(errno.ENOSPC, "out of inode numbers")
        self._next_control += 1
        return n

    def _number(self, key: tuple[int, int]) -> int:
        """The number of a file new to the table: its backing ``st_ino`` when that is
        on the root's device, in range and taken by no inode the table holds (one kept
        across a commit, an unlinked one still open); else one from the high range."""
        dev, ino = key
        if dev == self.dev and ROOT < ino < HIGH and ino not in self.by_ino:
            return ino
        return self.allocate()

    def get(self, ino: int) -> Inode | None:
        return self.by_ino.get(ino)

    def resolve(self, path: bytes, st: os.stat_result) -> Inode:
        """The inode for ``path`` whose backing file has stat ``st`` (found or new)."""
        key = (st.st_dev, st.st_ino)
        inode = self.by_path.get(path)
        if inode is not None:
            if inode.key == key or inode.stage is not None or inode.pending is not None:
                return inode
            self.detach(path)  # the path now names another file
        inode = self.by_key.get(key)
        if inode is None:
            inode = Inode(self._number(key), set(), key, stat.S_ISDIR(st.st_mode))
            self.by_ino[inode.ino] = inode
            self.by_key[key] = inode
        inode.paths.add(path)
        self.by_path[path] = inode
        return inode

    def add_names(self, inode: Inode, paths: list[bytes]) -> None:
        """Other names of the inode's file, found in the tree (hard links the kernel has
        not looked up): known by path from now on, unless a path already names another."""
        for p in paths:
            if p not in self.by_path:
                inode.paths.add(p)
                self.by_path[p] = inode

    def add_virtual(self, path: bytes) -> Inode:
        """A new inode for a file that exists only as a stage (created in an open batch):
        known by path and number, never by backing key (see the module's docstring)."""
        self.detach(path)  # whatever the path named before is not this file
        ino = self.allocate()
        inode = Inode(ino, {path}, (-1, ino), False, virtual=True)
        self.by_ino[ino] = inode
        self.by_path[path] = inode
        return inode

    def detach(self, path: bytes) -> Inode | None:
        """Forget that ``path`` names its inode (after unlink, or rename over it)."""
        inode = self.by_path.pop(path, None)
        if inode is not None:
            inode.paths.discard(path)
            self.maybe_drop(inode)
        return inode

    def orphan(self, inode: Inode) -> None:
        """Its last name is gone (nlink 0), though handles or lookups may keep it: its
        backing inode number may be reused by a new file, which must not resolve to it."""
        if inode.paths:
            return
        inode.unlinked = True
        if self.by_key.get(inode.key) is inode:
            del self.by_key[inode.key]

    def move(self, src: bytes, dst: bytes) -> None:
        """Record a rename: ``src`` (and for a directory everything below it) is now ``dst``."""
        inode = self.by_path.pop(src, None)
        if inode is None:
            return
        inode.paths.discard(src)
        inode.paths.add(dst)
        self.by_path[dst] = inode
        if inode.is_dir:
            prefix = src + b"/"
            for old in [p for p in self.by_path if p.startswith(prefix)]:
                child = self.by_path.pop(old)
                new = dst + old[len(src) :]
                child.paths.discard(old)
                child.paths.add(new)
                self.by_path[new] = child

    def exchange(self, a: bytes, b: bytes) -> None:
        """Record a RENAME_EXCHANGE: what was at ``a`` (and below it) is at ``b``, and back."""
        moves: list[tuple[bytes, Inode, bytes]] = []
        for p, inode in self.by_path.items():
            for src, dst in ((a, b), (b, a)):
                if p == src or p.startswith(src + b"/"):
                    moves.append((p, inode, dst + p[len(src) :]))
        for old, inode, _ in moves:
            del self.by_path[old]
            inode.paths.discard(old)
        for _, inode, new in moves:
            inode.paths.add(new)
            self.by_path[new] = inode

    def rekey(self, inode: Inode, key: tuple[int, int]) -> None:
        """The inode's bytes now live in another backing inode (a commit renamed it). It
        keeps its number, which stays taken while the table holds it (``_number``)."""
        if self.by_key.get(inode.key) is inode:
            del self.by_key[inode.key]
        inode.key = key
        self.by_key[key] = inode

    def unkey(self, inode: Inode) -> None:
        """The inode's backing file left the tree while the inode is held (rwfs replaced
        it while it was open): no longer found by its backing key (``Files.committed``)."""
        if self.by_key.get(inode.key) is inode:
            del self.by_key[inode.key]

    def forget(self, ino: int, n: int) -> None:
        inode = self.by_ino.get(ino)
        if inode is None or ino == ROOT:
            return
        inode.lookups -= n
        self.maybe_drop(inode)

    def maybe_drop(self, inode: Inode) -> None:
        if inode.lookups > 0 or inode.busy or inode.ino == ROOT:
            return
        self.by_ino.pop(inode.ino, None)
        if self.by_key.get(inode.key) is inode:
            del self.by_key[inode.key]
        for p in inode.paths:
            if self.by_path.get(p) is inode:
                del self.by_path[p]
        inode.paths.clear()


def nlink(root_fd: int, inode: Inode) -> int:
    """How many names the inode's backing file has (1 if it has none in the tree)."""
    if inode.virtual:
        return 1
    try:
        if inode.fd >= 0:
            return os.fstat(inode.fd).st_nlink
        return os.stat(rel(inode.path), dir_fd=root_fd, follow_symlinks=False).st_nlink
    except OSError:
        return 1
