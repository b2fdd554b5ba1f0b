"""Stages: the private copy of an inode's bytes that its writers share until a commit
point (SPEC §3.1) — made, reused from spare inodes, sealed (hashed, gated), dropped.

A stage lives in ``.rw/staging/`` under a name of its own; the tree never sees it until
the committer renames it over its file (landing.py)."""

from __future__ import annotations

import collections
import contextlib
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ..checks.findings import Finding
from ..journal.objects import TrailingHash, copy_fd, digest_fd, open_regular, unique_id
from .syscalls import WORKERS, borrowed, copy_metadata, keep_atime, quiet_reader, rel

if TYPE_CHECKING:
    from .commits import Commit
    from .workspace import Workspace

# A stage this large is hashed by a thread that follows its writes (objects.TrailingHash):
# sealing it then reads nothing again, when it was written front to back.
TRAIL_FROM = 8 << 20
# A stage this small, with no base to judge it against (a new file: only the secrets gate
# looks), is sealed on the event loop: hashing and scanning 8 KiB took 83 µs here, a
# thread hop 120 µs idle and 200 µs or more under load (docs/performance.md).
SEAL_ON_LOOP = 8 << 10
# Empty inodes kept in the staging area for new stages (``spare_link``), at most this many.
SPARES_MAX = 512
# Below SPARES_LOW, a thread of its own makes spares until there are SPARES_FILL
# (``keep_spares``): a stage then takes an inode made beforehand instead of allocating one
# while its writer waits. A save by temp + rename frees no empty inode for reuse (the
# temporary's placeholder is a removed file, kept as an object) and needs one a stage;
# allocating it took 0.3-0.7 ms of a 2 ms save here (ext4 scans past recently freed inodes).
SPARES_LOW = 64
SPARES_FILL = 128


@dataclass(eq=False)
class Stage:
    """The private copy of one inode's bytes that its writers share until a commit point."""

    fd: int
    name: bytes
    expected: str | None  # None: a file that does not exist yet (created in a batch)
    sealed: bool = False
    trail: TrailingHash | None = None  # hashing it as it is written, once it is large

    # What the gates judge (files.py, docs/gates.md): text written into the stage, not a
    # truncation to a length the caller chose. ``written``: a write (or fallocate, or an
    # O_TRUNC open: the empty file a rewrite starts from) reached this stage; ``cut``: its
    # last change is an explicit truncation (truncate(2), ftruncate(2)), which a later
    # write makes written text again.
    written: bool = False
    cut_last: bool = False
    # max_journaled_bytes when it was made: a stage that grows past it is never committed
    # (only a removed file's, still open, can: ``Files.leave_journal``), so nothing
    # hashes it as it grows, which would read all of a sparse stage's holes.
    limit: int = 1 << 62

    def wrote(self, off: int, end: int) -> None:
        """Bytes from ``off`` to ``end`` were written (a write, a fallocate). The C
        extension calls it for each write that goes straight into the stage."""
        self.written = True
        self.cut_last = False
        self._changed(off, end)

    def cut(self, off: int, end: int) -> None:
        """The stage was truncated by the caller to ``end`` bytes (from ``off`` on, its
        bytes changed)."""
        self.cut_last = True
        self._changed(off, end)

    def _changed(self, off: int, end: int) -> None:
        if end > self.limit:
            if self.trail is not None:
                self.trail.stop()
            self.trail, self.limit = None, -1  # (-1: never again)
        elif self.trail is not None:
            self.trail.wrote(off, end)
        elif end >= TRAIL_FROM and self.limit >= 0:
            # (every byte in it now was reported: writes reach a stage on the loop's thread)
            self.trail = TrailingHash(self.fd, max(end, os.fstat(self.fd).st_size))


# One thread makes spares, beside the WORKERS that commits wait for.
_SPARE_MAKER = trio.CapacityLimiter(1)


class Stages:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._spares: collections.deque[bytes] = collections.deque()  # staging names
        # Spares made beforehand (``keep_spares``), taken after those that commits free.
        self._made: collections.deque[bytes] = collections.deque()
        self._low = trio.Event()  # fewer than SPARES_LOW spares
        # Not None while the group applied last is not synced (the next group's syncfs
        # covers it): the staging names dropped meanwhile, unlinked after that sync
        # (``drop``, ``Committer._synced``).
        self.unsynced: list[bytes] | None = None

    async def new(self, source_fd: int, truncate: bool, expected: str | None = None) -> Stage:
        """A stage for the file behind ``source_fd``: its bytes (or none, if truncating).
        ``expected``: their digest, when the caller knows it (a queued commit's stage)."""
        if self._pooled() < SPARES_LOW:
            self._low.set()
        if os.fstat(source_fd).st_size == 0 or (truncate and expected is not None):
            # Nothing to copy or hash (a new file's first write, an O_TRUNC create or
            # rewrite): a few metadata calls, cheaper here than a worker-thread hop.
            return self.make(source_fd, truncate, expected)
        with borrowed(source_fd) as (src,):
            return await trio.to_thread.run_sync(
                self.make, src, truncate, expected, limiter=WORKERS
            )

    async def keep_spares(self) -> None:
        """Make spares in a thread whenever they run low (runs as long as the mount)."""
        while True:
            await self._low.wait()
            self._low = trio.Event()
            while self._pooled() < SPARES_FILL:
                made = await trio.to_thread.run_sync(self._make_spares, 16, limiter=_SPARE_MAKER)
                if not made:  # (no room, no inode: stages are made as before meanwhile)
                    break

    def _make_spares(self, n: int) -> int:
        """Make up to ``n`` empty files in staging and pool them as spares; how many."""
        for made in range(n):
            try:
                fd, name = self._new_file()
            except OSError:
                return made
            os.close(fd)
            self._made.append(name)
        return n

    def _new_file(self) -> tuple[int, bytes]:
        """(descriptor, name) of a new empty file in staging, only the daemon's to read."""
        name = unique_id().encode()
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=self.ws.staging_fd), name

    def _pooled(self) -> int:
        return len(self._spares) + len(self._made)

    def let_go_spares(self) -> None:
        """Unmounted: the spares go, so that a clean unmount leaves staging empty."""
        for pool in (self._spares, self._made):
            while pool:
                with contextlib.suppress(OSError):
                    self.unlink(pool.popleft())

    def make(self, source_fd: int, truncate: bool, known: str | None = None) -> Stage:
        fd, name = self._take_spare()
        if fd < 0:
            fd, name = self._new_file()
        try:
            st = os.fstat(source_fd)
            copy_metadata(source_fd, fd, st)
            with quiet_reader(source_fd) as src:
                if truncate:
                    expected = known or self.ws.digests.of_fd(src)
                else:
                    expected, _ = copy_fd(src, fd)
                    # So the commit's check of the live file rarely reads it again.
                    self.ws.digests.remember(st, expected)
            keep_atime(fd, st)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=self.ws.staging_fd)
            raise
        return Stage(fd, name, expected, limit=self.ws.policy.max_journaled_bytes)

    # An empty file replaced by its first commit (a new file's placeholder) is linked into
    # the staging area and becomes a later stage, instead of being freed while another
    # inode is allocated for the stage. Inode allocation is the cost of a new file: on ext4
    # without a journal it scans past every inode freed in the last minutes (it avoids
    # reusing them), so a tree of new files freeing one inode each slowed every create.

    def spare_link(self, dir_fd: int, path: bytes, st: os.stat_result) -> bytes | None:
        """Before the rename over ``path`` (in ``dir_fd``): keep its empty inode (not kept as an object, no
        other name) as a spare, under a name of its own in staging (committer thread)."""
        if st.st_nlink != 1 or len(self._spares) >= SPARES_MAX:
            return None
        name = unique_id().encode()
        try:
            os.link(
                path, name, src_dir_fd=dir_fd, dst_dir_fd=self.ws.staging_fd, follow_symlinks=False
            )
        except OSError:
            return None
        return name

    def pool_spare(self, c: Commit) -> None:
        """Pool a committed commit's spare, once the FUSE layer has taken the commit in and
        closed its descriptor of the replaced inode (so only commits with an owner make
        spares: rwfs's own writes may leave an inode's old descriptor open). A spare left in
        staging at a crash is removed by recovery like any orphaned stage."""
        assert c.spare is not None
        if c.outcome == "committed":
            self._spares.append(c.spare)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(c.spare, dir_fd=self.ws.staging_fd)
        c.spare = None

    def _take_spare(self) -> tuple[int, bytes]:
        """(descriptor, name) of a spare, empty and with no xattrs left; (-1, b"") when there
        is none (worker thread: the deque is safe across threads). Its old times need no
        reset: a stage is only made to be written or truncated, which sets its mtime (an
        ``O_TRUNC`` open of an empty stage sets it itself: ``fs.open``), and every commit
        reads it to hash it, which then sets its atime."""
        while True:
            try:
                name = (self._spares or self._made).popleft()
            except IndexError:
                return -1, b""
            try:
                fd = os.open(
                    name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.ws.staging_fd
                )
            except OSError:
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0:
                for attr in os.listxattr(fd):
                    with contextlib.suppress(OSError):
                        os.removexattr(fd, attr)
                self.ws.stats.count("spares_reused")
                return fd, name
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.ws.staging_fd)

    async def empty(self, mode: int, uid: int, gid: int) -> Stage:
        """A stage for a file that does not exist yet (one a batch creates)."""

        def make() -> Stage:
            fd, name = self._new_file()
            if os.geteuid() == 0:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            return Stage(fd, name, None, limit=self.ws.policy.max_journaled_bytes)

        return await trio.to_thread.run_sync(make, limiter=WORKERS)

    def keep_live_copy(self, path: bytes, digest: str) -> None:
        """Keep an object of ``digest`` copied from the live file at ``path``, if rwfs has
        none and that file (a regular one) holds those bytes now. Blocking: for a worker
        thread, or recovery."""
        if self.ws.objects.exists(digest):
            return
        try:
            fd, _ = open_regular(self.ws.root_fd, rel(path))
        except OSError:
            return
        if fd < 0:
            return
        try:
            if self.ws.digests.of_fd(fd) == digest:
                self.ws.objects.keep_fd_copy(fd, digest)
        finally:
            os.close(fd)

    def retire_draft(self, stage: Stage, digest: str | None) -> None:
        """A batch's draft that a newer one replaced: dropped, or, with ``stale_write =
        "conflict"``, moved (not copied) into the object store, where gc finds it unless a
        conflict refers to it: a process that read it may still write a stale update, and
        that conflict's merge needs it as the base."""
        if self.ws.policy.stale_write != "conflict" or digest is None or stage.fd < 0:
            self.drop(stage)
            return
        if stage.trail is not None:
            stage.trail.stop()
            stage.trail = None
        os.close(stage.fd)
        stage.fd = -1
        try:
            self.ws.objects._place(self.ws.staging_fd, stage.name, digest, move=True)
        except FileNotFoundError:
            pass

    def drop(self, stage: Stage) -> None:
        if stage.trail is not None:
            stage.trail.stop()
            stage.trail = None
        if stage.fd < 0:  # a deletion's, or one whose file was already dropped
            return
        os.close(stage.fd)
        stage.fd = -1
        if self.unsynced is not None:
            # A group's renames and links wait for the next group's syncfs: a name that
            # may hold the only durable copy of bytes (an in-place write's source, a kept
            # version's stage) goes after it (``Committer._attempt``).
            self.unsynced.append(stage.name)
            return
        self.unlink(stage.name)

    def unlink(self, name: bytes) -> None:
        try:
            os.unlink(name, dir_fd=self.ws.staging_fd)
        except FileNotFoundError:
            pass

    async def seal(
        self, stage: Stage, gate: tuple[bytes, int] | None = None
    ) -> tuple[str, int, list[Finding]]:
        """Hash a stage: (intended digest, size, findings). With ``gate`` = (path, the
        base's descriptor) the gates run too if the bytes changed, in the same worker-thread
        hop: a small file's commit is mostly hops, so this is one less. A small stage is
        sealed on the loop, with no hop at all, when its gates are quick too
        (SEAL_ON_LOOP, GATES_ON_LOOP)."""
        # atomic: the caller set stage.sealed before this await, so no write can slip in.
        trail, stage.trail = stage.trail, None

        def work(stage_fd: int, base_fd: int) -> tuple[str, int, list[Finding]]:
            got = trail.finish() if trail is not None else None
            if got is None:
                got = digest_fd(stage_fd)
            else:
                self.ws.stats.count("trailing_hashes")
            if gate is None or got[0] == stage.expected:
                return (*got, [])
            return (*got, self.ws.gating.run_now(gate[0], base_fd, stage_fd, stage.cut_last))

        with quiet_reader(gate[1] if gate is not None else -1) as base:
            if trail is None and os.fstat(stage.fd).st_size <= SEAL_ON_LOOP:
                if base < 0 or (gate is not None and self.ws.gating.quick(gate[0], base, stage.fd)):
                    return work(stage.fd, base)
            with borrowed(stage.fd, base) as (stage_fd, base_fd):
                return await trio.to_thread.run_sync(work, stage_fd, base_fd, limiter=WORKERS)
