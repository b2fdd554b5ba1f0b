"""The life of a file's bytes through the mount, from the first write to the tree: the
commit decision of SPEC §3.2, without FUSE. ``fs.py`` translates kernel requests into
calls of ``Files`` and implements ``Kernel``, what this module asks of the kernel's caches;
nothing here imports pyfuse3, and errors leave as ``OSError`` or ``RwfsError``.

States of an inode's stage (``Inode.stage``, ``Inode.pending``; ``inodes.py``):

- **none**: reads and in-place writes go to the backing file (``Inode.fd``).
- **open**: ``ensure_stage`` (a write, a truncation, ``O_TRUNC``) made a private copy of
  the bytes shown (the tree's file, or the draft an open batch holds); writes go there.
- **sealed**: a commit point (``commit``: flush, fsync, the last release, a truncate(2)
  of a closed file, a ``link``) set ``stage.sealed`` before its first await; the digest
  and the gates run. A write meanwhile waits on ``inode.lock`` for a new stage. From
  sealed, one of, as ``decision.decide`` answers from the facts ``_sealed`` gathers:

  - **no-op**: the bytes are the base again: the stage is dropped, a ``noop`` recorded.
  - **refused**: a gate rejects, or a stale write under ``stale_write = "conflict"``: the
    draft is kept as an object, the stage goes (``_unstage``: back to the batch's draft,
    an empty stage for a batch's new file, or none), the kernel drops the inode's pages,
    and the writer gets the refusal.
  - **held by a batch**: the file's open batch, or the writer's (``Batches.hold``):
    ``pending`` is the held ``Commit`` (``held``), whose stage stays the file's bytes
    until the batch commits or aborts; a new stage is built on the draft.
  - **queued**: ``Committer.submit``; ``pending`` is set until the committer calls
    ``committed`` (on the loop). Writes wait for it (``settle``).

- **committed** (``committed``): the outcome decides. ``committed``: the stage's
  descriptor is the live file's now (the backing fd, rekeyed); any other outcome
  (conflict, error, aborted, noop, landed, replaced): the kernel drops its pages.
  ``release_fd`` closes the backing file once no handle, stage or commit needs it.

States of a path:

- **a file of the tree**, known to the inode table once looked up.
- **virtual** (``virtual``, ``Inode.virtual``): a file an open batch created, or renamed
  over one of the tree; only a stage until the batch's commit (``_unvirtual``: committed,
  it is the tree's file; otherwise the tree's file there is adopted or the name dropped).
- **hidden** (``hidden``): a file an open batch deletes: gone from the view, in the tree
  until the batch commits (``committed`` of a deletion, ``intended is None``).

The namespace is decided here too: what an ``unlink``/``rmdir`` (``remove``), a ``rename``
(``rename``: gated onto a journaled file), a ``link`` and a ``create`` in an open batch
(``create_in_batch``) become, each journaled around its syscall (``Committer.operation``).
The batch's side: an unlink a batch takes (``hide``), of its new file (``drop_virtual``),
a rename of its new file (``rename_virtual``, gated like ``gate_rename`` onto a file the
mount shows), and EXDEV for any other rename a batch would have to take
(``batch_rename``). A held draft that ends while descriptors are open on it is let go, not
dropped (``letting_go``). A removal is remembered for a while (``path_removed``): a new
file made there is gated as a save of the removed one (``_recreated``). So is a commit that
is an explicit truncation alone (``cuts``, ``_keep_cut``): the same user's next write of
the file (or a rename onto it) is gated against the bytes from before it
(``_cut_before``), and a refusal puts those back (``_put_back``).

Meanwhile a path may be renamed (``Inode.paths`` moves), unlinked (no path left: the
seal's result is dropped, ``orphan_stage``; descriptors still open keep the stage until
the last release), or linked (``link`` commits and settles first, and refuses a file a
batch holds). A commit still queued at a renamed regular file moves with it; one at a
name a rename or an unlink takes away is kept as a version (``_movable``,
``_superseded``); anything else queued there lands first (``settle_below``). A
hard-linked file is one inode under several paths; its commit is written into that inode
(``Landing.write_in_place``). The read records (``reads``, ``read_at``) remember
what each process read, so that a commit over a version it never saw is a stale write
(SPEC §6.4; ``path_leaves`` before a path stops naming its file).

Concurrency (trio: tasks interleave only at ``await``):

- ``inode.lock`` guards one inode's stage creation and sealing: ``ensure_stage`` and
  ``commit`` run under it, so a stage is never sealed twice nor replaced mid-seal.
  ``drop_virtual`` takes it too. Reads take no lock.
- ``commit`` awaits the seal (hash, gates), the gates again, a stale read's digest, a
  refusal's record, ``Batches.hold`` and ``Committer.submit``. Across each, the inode may
  lose its paths (checked after the seal: ``orphan_stage``), be renamed (gated again as
  what it is now), or its batch end (``held`` is read again); a handler of another inode
  or path runs meanwhile.
- ``ensure_stage`` awaits the copy of the bytes and, for a queued commit, ``settle``
  (a flush and the commit's ``done``) under ``inode.lock``: a commit point of the same
  inode waits; handlers that take no lock (a read, ``getattr``, an unlink or rename of
  the path) run meanwhile.
- ``remove`` and ``rename`` await the settling of both names, unless what is queued
  there can move or be kept (``_movable``; ``rename`` looks again after its gate, and
  goes on only if the same commits are still queued, untaken), then, for one name of a
  hard-linked file, the copy of its bytes (``Workspace.keep_removed``, a worker thread)
  before the syscall: a commit through another name can land in that moment and put its
  bytes in the copy. Commits that move or are kept never meet that await (they need a
  file with one name), so no group can take them between the look and the syscall.
  ``link`` awaits the commit of the source's stage and its digest. None holds an inode's
  lock; a refusal of a save by re-creation awaits, under the lock, the stage and the
  submit of the bytes it puts back (``_put_back``).
- Other locks are taken only through the calls that need them: ``Batch.lock``
  (``batches.py``) serialises a batch's ``hold``, ``unhold``, ``commit`` and ``abort``;
  ``Committer.commit_lock`` serialises the committer's groups, a batch's commit, and each
  write that keeps an object (a refusal, a stale write's conflict); all but the committer
  take it through ``Committer.exclusive``, after the last group's records.
- ``committed`` is called by the committer on the loop, with no await, so ``pending``,
  ``stage`` and ``fd`` change together.
- The read records and ``virtual``/``hidden`` are changed with no await between reading
  and writing them; ``_replaced_read`` awaits a hash of a kept descriptor, which
  ``_keep_gone`` may close meanwhile: the hash and the conflict each use a duplicate
  (``borrowed``).
- The kernel's caches are dropped off the loop (``Kernel``); ``invalidate_now`` is awaited
  only where no request of ours holds the kernel's lock on the inode (not under fsync).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from .. import faults
from ..checks.allowances import Allowance
from ..journal.objects import EMPTY_DIGEST, copy_fd, open_regular
from .batches import COMMITTING, Batches
from .commits import Commit
from .decision import Facts, Kind, decide
from .errors import RwfsError
from .inodes import Inode, InodeTable
from .stages import Stage
from .syscalls import WORKERS, borrowed, copy_metadata, fsdecode, rel, renameat2
from .workspace import Workspace

# Stale writes: the (process, file) pairs remembered before all are forgotten, and the
# replaced files whose bytes are held open, so that a process that read one can be told
# what it read (the oldest is let go first).
READS_MAX = 100_000
GONE_MAX = 256
# A new file made where the same user removed a journaled file this many seconds before is
# a save of that file (Files._recreated); at most REMOVED_MAX removals are remembered. The
# same window and bound serve a write after an explicit truncation (Files._cut_before).
RECREATE_S = 10.0
REMOVED_MAX = 64


def _nlink(root_fd: int, inode: Inode) -> int:
    """How many names the inode's backing file has (1 if it has none in the tree)."""
    if inode.virtual:
        return 1
    try:
        if inode.fd >= 0:
            return os.fstat(inode.fd).st_nlink
        return os.stat(rel(inode.path), dir_fd=root_fd, follow_symlinks=False).st_nlink
    except OSError:
        return 1


def _exists(root_fd: int, path: bytes) -> bool:
    try:
        os.stat(path, dir_fd=root_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _refused(code: int) -> OSError:
    # The FUSE layer answers an OSError with its errno (fs._guard).
    return OSError(code, os.strerror(code))


def _too_large(path: bytes, size: int, limit: int) -> RwfsError:
    return RwfsError(
        errno.EFBIG,
        "quota_exceeded",
        "max_journaled_bytes",
        f"This change would make the file {size} bytes, past max_journaled_bytes ({limit}), "
        "and a file an open batch holds cannot leave journaling, so rwfs refused it: the "
        "file is unchanged; commit or abort the batch first, or raise max_journaled_bytes "
        "in .rw/policy.toml.",
        path=fsdecode(path),
        suggested_action="commit or abort the batch, then make the change again",
        details={"size": size, "max_journaled_bytes": limit},
    )


# rename(2) flags (linux/fs.h), as the kernel passes them to FUSE.
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class Kernel(Protocol):
    """What the core asks of the kernel's caches; the FUSE layer implements it."""

    def invalidate(self, inode: Inode) -> None:
        """Drop the inode's cached pages soon (a request of ours may hold its lock)."""

    async def invalidate_now(self, inode: Inode) -> None:
        """Drop the inode's cached pages before answering."""

    def drop_entry(self, path: bytes) -> None:
        """Make the kernel look ``path`` up again and list its directory again."""

    def tree_changed(self, path: bytes) -> None:
        """rwfs itself wrote ``path``: drop what the kernel knows of each level above."""


@dataclass(eq=False, slots=True)
class Gone:
    """A file its path stopped naming (renamed over or away, removed) while another
    process had read it there: a descriptor of its bytes, hashed only if that process
    then writes the path (a stale write's ``read``, and its conflict's base)."""

    fd: int
    digest: str | None = None


@dataclass(eq=False, slots=True)
class Removed:
    """The bytes of a file its path stopped naming, for ``Files._recreated``."""

    fd: int
    uid: int
    at: float  # time.monotonic()


@dataclass(eq=False, slots=True)
class Cut:
    """A file cut short by an explicit truncation alone (truncate(2), ftruncate(2), no
    write), for ``Files._cut_before``: a descriptor of its bytes before the cut, who cut
    it, when, the commits of the cut (the path's last) and the digest it left."""

    fd: int
    uid: int
    at: float  # time.monotonic()
    commits: list[Commit]  # the cut's, and those of later cuts by the same user
    intended: str
    earlier: list[Commit]  # queued at the path before the cut, to land before it


@dataclass(eq=False, slots=True)
class ReadAt:
    """The file a process last opened to read at a path: its inode and version. Once the
    path stops naming that file (``replaced``), the digest the process read if it is
    known (``read``), else the replaced file's bytes (``gone``), and whether the file had
    changed since the read anyway (``changed``)."""

    serial: int  # Inode.serial: inode numbers may be handed on (inodes.py)
    version: int
    replaced: bool = False
    read: str | None = None
    gone: Gone | None = None
    changed: bool = False


class Files:
    """The stage lifecycle and commit decision of every inode (see the module's doc)."""

    def __init__(self, ws: Workspace, batches: Batches, inodes: InodeTable, kernel: Kernel) -> None:
        self.ws = ws
        self.batches = batches
        self.inodes = inodes
        self.kernel = kernel
        # (process, Inode.serial) -> the inode's version when that process last opened it to read.
        self.reads: dict[tuple[int, int], int] = {}
        # path -> process -> what it read there: a save that replaces the file's inode (a
        # rename over it, or unlink and create) leaves the path naming another inode.
        self.read_at: dict[bytes, dict[int, ReadAt]] = {}
        self.read_at_n = 0
        self.gone_fds: list[Gone] = []  # holding a descriptor, oldest first (GONE_MAX)
        # Paths whose bytes are an open batch's draft rather than the tree's file: new
        # files created in the batch, or a new file renamed over one (Inode.virtual).
        self.virtual: dict[bytes, Inode] = {}
        self.hidden: set[bytes] = set()  # paths an open batch deletes: gone from the view
        # path -> the journaled file a save removed there, for a while (_recreated).
        self.removed: dict[bytes, Removed] = {}
        # path -> its bytes before an explicit truncation, while that is its last commit.
        self.cuts: dict[bytes, Cut] = {}
        # Files removed (their bytes kept as objects) since the disk last filled up.
        self.removals = 0
        # A write went through at its commit point (path, intended, its commit; None for a
        # noop): ``.rw/why/`` says so before the writer's call returns (read-your-writes).
        self.on_written: Callable[[bytes, str | None, Commit | None], None] = (
            lambda path, intended, commit: None
        )

    async def settle(self, inode: Inode) -> None:
        """Wait until the inode's queued commit is in the tree (a draft an open batch
        holds stays until the batch commits: there is nothing to wait for)."""
        while inode.pending is not None and not inode.pending.held:
            # EIO while the journal cannot record it (the commit stays queued).
            await self.ws.committer.settle_commit(inode.pending)

    def queued(self, path: bytes) -> list[Commit]:
        """The commits at ``path`` or below it that are queued or being applied (not those
        a rename replaced: they no longer touch the path)."""
        prefix = path + b"/"
        return [
            c
            for c in self.ws.committer.unsettled()
            if not c.superseded and (c.path == path or c.path.startswith(prefix))
        ]

    async def settle_below(self, path: bytes) -> None:
        """Settle the commits at ``path`` and, for a directory, below it: a queued commit
        names its path, which a rename or removal would make stale."""
        inode = self.inodes.by_path.get(path)
        if inode is not None:
            await self.settle(inode)  # its commit may not be queued yet
        while busy := self.queued(path):
            await self.ws.committer.settle_commit(busy[0])

    def committed(self, c: Commit) -> None:
        """Called by the committer (on the loop) once a queued commit is settled."""
        self._cut_landed(c)
        inode: Inode | None = c.owner
        if c.intended is None:  # a batch's deletion (or a restore's), committed or dropped
            self.hidden.discard(c.path)
            if c.outcome == "committed" and c.path not in self.virtual:
                self.gone(c.path)
            else:
                self.kernel.drop_entry(c.path)
            return
        if inode is None:  # rwfs itself wrote the path (a resumed batch, a conflict's verb)
            if c.outcome == "committed":
                self.kernel.tree_changed(c.path)
            inode = self.inodes.by_path.get(c.path)
            if inode is not None and c.outcome == "committed":
                self._new_version(inode, c.stage.expected, str(c.intended), {})
                if inode.handles == 0 and inode.stage is None and inode.pending is None:
                    st = os.stat(rel(c.path), dir_fd=self.ws.root_fd, follow_symlinks=False)
                    self.inodes.rekey(inode, (st.st_dev, st.st_ino))
                self.kernel.invalidate(inode)
            return
        if c.superseded:
            self._superseded(inode, c)
            return
        if inode.pending is c:
            inode.pending = None
        if inode.virtual and inode.pending is None:
            self._unvirtual(inode, c.outcome)
        if inode.stage is c.stage:
            inode.stage = None
        elif (
            inode.stage is not None
            and inode.pending is None
            and c.outcome in ("committed", "landed")
        ):
            # A stage opened on top of a batch's draft: its base is now the tree's bytes.
            # (Not one built on a later commit still queued: its base is that commit's.)
            inode.stage.expected = c.intended
        if c.outcome == "committed" and c.info.get("in_place"):
            pass  # a hard-linked file: its own inode holds the bytes now, the stage goes
        elif c.outcome == "committed":
            # The stage's descriptor now reaches the live file: keep it as the backing fd.
            if inode.fd >= 0:
                os.close(inode.fd)
            inode.fd, inode.fd_writable = c.stage.fd, True
            st = os.fstat(inode.fd)
            self.inodes.rekey(inode, (st.st_dev, st.st_ino))
        elif c.outcome in ("conflict", "error", "aborted", "noop", "landed", "replaced"):
            self.kernel.invalidate(inode)
        self.release_fd(inode)

    def _superseded(self, inode: Inode, c: Commit) -> None:
        """A rename replaced the file while this commit was queued; its stage is the
        object that keeps its bytes now. A descriptor still open on the replaced file
        reads them there until its last close (POSIX keeps a replaced file), and a write
        through it copies them first (``ensure_stage``): the object never changes."""
        if inode.pending is c:
            inode.pending = None
        if inode.stage is not c.stage or inode.handles == 0 or inode.paths:
            if inode.stage is c.stage:
                inode.stage = None
            self.ws.stages.drop(c.stage)  # (its name in staging/: the object stays)
        self.release_fd(inode)

    def _unvirtual(self, inode: Inode, outcome: str) -> None:
        """A batch-created file's draft is settled: committed, it is the tree's file now;
        otherwise (aborted, back to its base bytes, or a file appeared there first) the
        name shows the tree again."""
        inode.virtual = False
        for p in list(inode.paths):
            if self.virtual.get(p) is inode:
                del self.virtual[p]
        if outcome == "committed":
            return
        # The kernel holds this inode for the name, and keeps it until an invalidation
        # that runs later (and never for a descriptor open on it): while the tree has a
        # file there, this inode stays that file, as an inode whose draft a batch drops
        # does. Not for a draft a rename replaced: the rename detaches the name itself.
        if outcome != "replaced" and self._adopt_tree_file(inode):
            return
        for p in list(inode.paths):
            self.inodes.detach(p)
            self.kernel.drop_entry(p)
        self.inodes.orphan(inode)

    def _adopt_tree_file(self, inode: Inode) -> bool:
        """Make a virtual inode whose draft ended the tree's file at its name: its backing
        key, and a backing descriptor for the handles still open on it. False if the tree
        has no regular file there, or one another inode stands for (a hard link)."""
        if len(inode.paths) != 1 or inode.path in self.hidden:
            return False
        try:
            st = os.stat(inode.path, dir_fd=self.ws.root_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and inode.handles > 0:
                self.open_backing(inode, writable=False)
                st = os.fstat(inode.fd)
        except OSError:
            return False
        other = self.inodes.by_key.get((st.st_dev, st.st_ino))
        if not stat.S_ISREG(st.st_mode) or (other is not None and other is not inode):
            if inode.fd >= 0:
                os.close(inode.fd)
                inode.fd = -1
            return False
        self.inodes.rekey(inode, (st.st_dev, st.st_ino))
        return True

    def gone(self, path: bytes) -> None:
        gone = self.inodes.detach(path)
        if gone is not None:
            self.inodes.orphan(gone)
        self.kernel.drop_entry(path)

    def release_fd(self, inode: Inode) -> None:
        if inode.handles == 0 and not inode.paths and inode.pending is None:
            self.orphan_stage(inode)  # (a replaced file's bytes, read until now: _superseded)
        if inode.handles == 0 and inode.stage is None and inode.pending is None:
            if inode.fd >= 0:
                os.close(inode.fd)
                inode.fd = -1
            self.inodes.maybe_drop(inode)

    def open_backing(self, inode: Inode, writable: bool) -> None:
        if inode.fd >= 0 and (inode.fd_writable or not writable):
            return
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(rel(inode.path), flags | os.O_RDWR, dir_fd=self.ws.root_fd)
            w = True
        except OSError as exc:
            if writable or exc.errno not in (
                errno.EACCES,
                errno.EROFS,
                errno.ETXTBSY,
                errno.EISDIR,
            ):
                raise
            fd = os.open(rel(inode.path), flags | os.O_RDONLY, dir_fd=self.ws.root_fd)
            w = False
        if inode.fd >= 0:
            os.close(inode.fd)
        inode.fd, inode.fd_writable = fd, w

    async def ensure_stage(self, inode: Inode, truncate: bool = False) -> None:
        """Give the inode an open (unsealed) stage, settling a queued commit first."""
        async with inode.lock:
            while inode.stage is None or inode.stage.sealed:
                held = inode.pending
                if held is not None and held.held:
                    # A draft an open batch holds: build on it, against the batch's base.
                    inode.stage = await self.ws.stages.new(held.stage.fd, truncate)
                    inode.stage.expected = held.stage.expected
                    continue
                if held is not None and held.intended is not None and held.stage.fd >= 0:
                    # A commit still queued: build on its bytes, as a rewrite loop does,
                    # instead of waiting for its group. It lands first (the queue is in
                    # order), then this one replaces it; recovery knows the chain.
                    source = held.stage.fd
                    inode.stage = await self.ws.stages.new(source, truncate, held.intended)
                    continue
                if held is not None:
                    await self.settle(inode)
                    continue
                kept = inode.stage
                if kept is not None and not inode.paths:
                    # A replaced file's bytes, an object now (``_superseded``): copied.
                    inode.stage = await self.ws.stages.new(kept.fd, truncate)
                    self.ws.stages.drop(kept)
                    continue
                self.open_backing(inode, writable=False)
                inode.stage = await self.ws.stages.new(inode.fd, truncate)

    def orphan_stage(self, inode: Inode) -> None:
        """Unlinked while open: nothing to commit. The stage holds the file's bytes for the
        descriptors still open (POSIX keeps an unlinked file readable and writable until
        its last close), so only the last release drops it."""
        if inode.handles == 0 and inode.stage is not None:
            self.ws.stages.drop(inode.stage)
            inode.stage = None

    @contextlib.contextmanager
    def letting_go(self, inode: Inode, held: Commit) -> Iterator[None]:
        """Around a change that ends the batch's draft of a file (its deletion, or the
        batch forgetting the file): descriptors still open on the file read and write the
        draft's bytes until their last close, as POSIX keeps a removed file, so the batch
        lets go of the stage rather than dropping it; the last release drops it
        (``orphan_stage``). Undone if the change fails."""
        stage = held.stage
        if inode.stage is not stage:
            yield  # the inode has a stage of its own (or none)
            return
        if inode.handles > 0:
            stage.sealed = False
            held.stage = Stage(-1, b"", stage.expected)
        else:
            inode.stage = None
        try:
            yield
        except BaseException:
            held.stage, inode.stage, stage.sealed = stage, stage, True
            raise

    async def drop_virtual(self, inode: Inode, who: dict[str, Any]) -> None:
        """Unlink of a file the open batch created: the batch forgets it, or, if it stood
        in for a file of the tree (removed and made again, or a temporary file renamed
        over it), deletes that file; descriptors still open keep reading and writing its
        stage until their last close."""
        held = inode.pending
        async with inode.lock:
            path = inode.path
            for p in list(inode.paths):
                self.virtual.pop(p, None)
                self.inodes.detach(p)
            inode.virtual = False
            self.inodes.orphan(inode)
            if held is not None and held.held:
                batch = self.batches.all[str(held.batch)]
                with self.letting_go(inode, held):
                    if held.stage.expected is None:
                        await self.batches.unhold(batch, held.path)
                    else:
                        await self.batches.hide(batch, held.path, held.stage.expected, who)
                        self.hidden.add(held.path)
            elif (deleting := self.batches.holding(path)) is not None:
                if deleting.held[path].intended is None:  # made where the batch deletes one
                    self.hidden.add(path)
            self.orphan_stage(inode)

    def journaled(
        self, path: bytes, st: os.stat_result | None = None, is_dir: bool = False
    ) -> bool:
        if self.ws.policy.is_passthrough(path, is_dir):
            return False
        if st is not None and stat.S_ISREG(st.st_mode):
            return st.st_size <= self.ws.policy.max_journaled_bytes
        return True

    async def leave_journal(self, inode: Inode, who: dict[str, Any], size: int) -> None:
        """A change (a write, a truncation, a fallocate) would take the journaled file to
        ``size`` bytes, past ``max_journaled_bytes``: the file leaves journaling now and is
        written in place from then on (docs/policy.md), so that no stage, digest or kept
        object ever costs more than the limit. What the file holds until this change is
        committed first (a commit point: the gates judge it, and a refusal fails the
        change), kept as an object, and an ``unjournaled`` event says so. A file an open
        batch holds or takes cannot leave it: EFBIG, and nothing changes."""
        limit = self.ws.policy.max_journaled_bytes
        while True:
            if not inode.paths:
                return  # removed meanwhile: its stage (if any) is the caller's to write
            if inode.virtual or self.held(inode) is not None or self.batches.for_writer(who):
                raise _too_large(inode.path, size, limit)
            if inode.stage is not None or inode.pending is not None:
                await self.commit(inode, who, wait=True)
                await self.settle(inode)
                continue
            path = inode.path
            kept = await trio.to_thread.run_sync(self._keep_last, path, limiter=WORKERS)
            # (A writer may have made a stage meanwhile: committed in turn, then again.)
            if inode.stage is None and inode.pending is None and inode.paths:
                break
        # atomic: from the record to the caller's change in place, no stage can begin.
        for p in sorted(inode.paths):
            self.ws.committer.record(
                {
                    "op": "unjournaled",
                    "path": fsdecode(p),
                    "batch": None,
                    "expected": kept,
                    "size": size,
                    "limit": limit,
                    **who,
                }
            )
        self.ws.stats.count("unjournaled")

    def _keep_last(self, path: bytes) -> str | None:
        """In a worker thread: keep the file's bytes at ``path`` (at most
        ``max_journaled_bytes``, holes not copied) as an object; returns their digest."""
        digest, _ = self.ws.digests.live(path)
        if digest is not None:
            self.ws.stages.keep_live_copy(path, digest)
        return digest

    async def hide(self, path: bytes, inode: Inode | None, who: dict[str, Any]) -> bool:
        """Unlink by a writer an open batch takes (or of a file it holds): the deletion
        waits for the batch's commit, the file is gone from the view now. False if the
        unlink is not the batch's."""
        held = inode.pending if inode is not None and inode.pending is not None else None
        batch = self.batches.all.get(str(held.batch)) if held and held.held else None
        batch = batch or self.batches.for_writer(who)
        if batch is None or path in self.hidden:
            return False
        if inode is not None and not (held and held.held):
            await self.settle(inode)  # the batch's base is the file's committed bytes
        st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        if not (stat.S_ISREG(st.st_mode) and self.journaled(path, st)):
            return False
        if held is not None and held.held and held.path == path:
            assert inode is not None
            with self.letting_go(inode, held):
                await self.batches.hide(batch, path, held.stage.expected, who)
        elif held is not None and held.held:
            # One name of a hard-linked file whose draft the batch holds under another:
            # that name keeps the draft; this one's base is the file's committed bytes.
            await self.batches.hide(batch, path, held.stage.expected, who)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.ws.root_fd)
            try:
                base = await self.ws.digests.of(fd)
            finally:
                os.close(fd)
            await self.batches.hide(batch, path, base, who)
        self.hidden.add(path)
        gone = self.inodes.detach(path)
        if gone is not None:
            self.inodes.orphan(gone)
        return True

    # ---- the namespace: what an unlink, a rename, a link or a create of a file becomes ----

    async def remove(self, path: bytes, who: dict[str, Any], is_dir: bool) -> None:
        """unlink(2) or rmdir(2) of ``path``: an open batch's new file is forgotten, a file
        a batch takes is hidden until its commit; otherwise the removal reaches the tree,
        journaled with the removed bytes kept (and remembered for a save that makes the
        file again: ``_recreated``)."""
        virtual = self.virtual.get(path)
        if virtual is not None:
            if is_dir:
                raise _refused(errno.ENOTDIR)
            await self.drop_virtual(virtual, who)
            return
        while not is_dir and await self._sealing(path):
            pass  # its commit is queued (or held) now: kept as a version, below
        inode = self.inodes.by_path.get(path)
        if not is_dir and await self.hide(path, inode, who):
            return
        # Kept for the kernel, which may still hold a directory (a shell's cwd).
        st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        # A regular file's commits still queued are kept as versions rather than written
        # into the tree first (as for the name a rename replaces: ``_superseded``).
        sup = None if is_dir or not self.journaled(path, st) else self._movable(path, st)
        if sup is None:
            sup = []
            if inode is not None:
                await self.settle(inode)
                st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        if is_dir:
            with self.ws.committer.operation(self.journaled(path, None, True), who, "rmdir", path):
                os.rmdir(path, dir_fd=self.ws.root_fd)
        else:
            self.path_leaves(path, who["pid"])
            incoming = removed = None
            journaled = self.journaled(path, st)
            if journaled and stat.S_ISREG(st.st_mode):
                incoming = await self.ws.keep_removed(path, st)  # keep the bytes
                how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                # For a save that makes the file again (_recreated): what the mount shows.
                # (A regular file, by the stat above: no need to check before opening.)
                with contextlib.suppress(OSError):
                    if sup and sup[-1].size:
                        removed = os.open(sup[-1].stage.name, how, dir_fd=self.ws.staging_fd)
                    elif st.st_size and not sup:
                        removed = os.open(path, how, dir_fd=self.ws.root_fd)
            extra: dict[str, Any] = {}
            if sup:  # the removed bytes are the last superseded commit's
                extra.update(expected=sup[-1].intended, size=sup[-1].size)
                extra["supersedes"] = [c.id for c in sup]
            try:
                mode = stat.S_IMODE(st.st_mode)  # of the file removed: undo, restore use it
                extra["owner"] = [st.st_uid, st.st_gid]  # and .rw/ shows its versions with it
                with self.ws.committer.operation(
                    journaled, who, "unlink", path, incoming, mode=mode, **extra
                ):
                    os.unlink(path, dir_fd=self.ws.root_fd)
                    for c in sup:
                        c.superseded = True
                    faults.point("after_unlink")
            except OSError:
                if incoming is not None:
                    os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
                if removed is not None:
                    os.close(removed)
                raise
            removed = self._cut_removed(path, who, removed)
            if removed is not None:
                self.path_removed(path, who, removed)
            if incoming is not None:
                self.removals += 1
        gone = self.inodes.detach(path)
        # Its backing inode number is free for reuse now (a directory has no other name).
        if gone is not None and (is_dir or st.st_nlink == 1):
            self.inodes.orphan(gone)
            if is_dir:
                gone.removed = st
        elif gone is not None:
            await self._other_names(gone, path, st)

    async def rename(self, src: bytes, dst: bytes, flags: int, who: dict[str, Any]) -> None:
        """rename(2): a rename onto a journaled file is a commit of it (gated first), the
        replaced bytes are kept, the moved file's digest journaled; an open batch's files
        are renamed within the batch, and a rename a batch would have to take is EXDEV
        (mv and most tools then copy and delete, which the batch holds)."""
        while await self._sealing(src) or await self._sealing(dst):
            pass  # (a commit point under way may go to a batch: decided below)
        if src in self.virtual or dst in self.virtual:
            await self.rename_virtual(src, dst, flags, who)
            return
        if self.batch_rename(src, dst, who):
            raise _refused(errno.EXDEV)
        exchange = bool(flags & RENAME_EXCHANGE)
        allowance: Allowance | None = None  # the writer's, of dst, that this rename uses
        batch_waited = False
        # A commit names its path, which the rename would make stale (a conflict, ESTALE
        # to a writer waiting in fsync). A regular file's commits still queued move with
        # it (``carry``: the save of a temporary file renamed over its target) or, at the
        # name it replaces, become kept versions (``sup``); anything else queued at either
        # name lands first. Writers can queue more while this waits or gates: again.
        while True:
            if await self._sealing(src) or await self._sealing(dst):
                continue  # its commit is queued now: carried or kept, below
            sst = os.stat(src, dir_fd=self.ws.root_fd, follow_symlinks=False)
            try:
                dst_st: os.stat_result | None = os.stat(
                    dst, dir_fd=self.ws.root_fd, follow_symlinks=False
                )
            except FileNotFoundError:
                dst_st = None
            same = dst_st is not None and (sst.st_dev, sst.st_ino) == (dst_st.st_dev, dst_st.st_ino)
            if same and not flags & RENAME_NOREPLACE:
                return  # two names of one file: rename(2) does nothing and succeeds
            is_dir = stat.S_ISDIR(sst.st_mode)
            journaled = self.journaled(src, sst, is_dir) or self.journaled(dst, dst_st, is_dir)
            carry = self._movable(src, sst, dst_st, exchange)
            sup = self._movable(dst, dst_st, exchange=exchange)
            if carry is None or sup is None or (not journaled and (carry or sup)):
                for p in (src, dst):
                    await self.settle_below(p)
                continue
            if journaled and (is_dir or (dst_st is not None and stat.S_ISDIR(dst_st.st_mode))):
                # A hard-linked file's commit journals its other names as the tree has
                # them when it lands: a directory's rename may move one the inode table
                # does not know (not looked up since the mount), and the commit would be
                # journaled before the rename with the name the rename gave. It lands
                # first, so that its names are those of its place in the journal. (No
                # await from here to the syscall for a directory.)
                if linked := [
                    c for c in self.ws.committer.unsettled() if c.linked and not c.superseded
                ]:
                    await self.ws.committer.settle_commit(linked[0])
                    continue
                if not batch_waited and any(
                    b.state == COMMITTING for b in self.batches.all.values()
                ):
                    # A batch's commit (an undo, a restore) writes hard-linked files in
                    # place in its thread, under commit_lock, and journals their names
                    # ahead of this rename's event: once, it ends first.
                    batch_waited = True
                    async with self.ws.committer.commit_lock:
                        pass
                    continue
            if (
                journaled
                and not flags
                and dst_st is not None
                and stat.S_ISREG(dst_st.st_mode)
                and stat.S_ISREG(sst.st_mode)
            ):
                shown = (carry[-1].stage.fd if carry else -1, sup[-1].stage.fd if sup else -1)
                allowance = await self.gate_rename(src, dst, who, *shown, taken=allowance)
            if (
                self._same(carry, self._movable(src, sst, dst_st, exchange))
                and self._same(sup, self._movable(dst, dst_st, exchange=exchange))
                and self._commit_point(src) is None
                and self._commit_point(dst) is None
            ):
                break
        if journaled:
            moved = None if exchange else self.inodes.by_path.get(src)
            self.path_leaves(src, who["pid"])
            if dst_st is not None:
                self.path_leaves(dst, who["pid"], moved)
        # (No await from here to the syscall: the commits carried stay queued.)
        incoming = None
        # A file past max_journaled_bytes is neither kept nor hashed, on either side:
        # its cost would be its size (docs/policy.md).
        if (
            journaled
            and not exchange
            and dst_st is not None
            and stat.S_ISREG(dst_st.st_mode)
            and self.journaled(dst, dst_st)
        ):
            incoming = await self.ws.keep_removed(dst, dst_st)  # keep the replaced bytes
            # (A hard-linked file is copied in a thread: a writer may have queued a commit
            # at either name meanwhile, which the rename would leave at a name that no
            # longer holds its file. Then all of it again.)
            if not (
                self._same(carry, self._movable(src, sst, dst_st, exchange))
                and self._same(sup, self._movable(dst, dst_st, exchange=exchange))
                and self._commit_point(src) is None
                and self._commit_point(dst) is None
            ):
                os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
                if allowance is not None:  # (gated again there)
                    self.ws.allowances.give_back(allowance)
                await self.rename(src, dst, flags, who)
                return
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        moved_fd = None
        if journaled and stat.S_ISREG(sst.st_mode) and not carry and self.journaled(dst, sst):
            moved_fd = os.open(src, how, dir_fd=self.ws.root_fd)
        # A file renamed away may be made again at its name (vim's default save).
        removed = None
        if carry and carry[-1].size and not exchange:
            removed = os.open(carry[-1].stage.name, how, dir_fd=self.ws.staging_fd)
        elif moved_fd is not None and sst.st_size and not exchange:
            removed = os.dup(moved_fd)
        extra: dict[str, Any] = {}
        if carry:  # the moved bytes are the last carried commit's, not the tree's yet
            extra.update(intended=carry[-1].intended, carries=[c.id for c in carry])
        if sup:  # the replaced bytes are the last superseded commit's
            extra.update(expected=sup[-1].intended, size=sup[-1].size)
            extra["supersedes"] = [c.id for c in sup]
        if stat.S_ISREG(sst.st_mode) and not exchange:  # .rw/ shows its versions with them
            extra.update(mode=stat.S_IMODE(sst.st_mode), owner=[sst.st_uid, sst.st_gid])
        if allowance is not None:  # let through by an allowance (allowances.py)
            extra["allowed"] = allowance.record()
        if journaled and not exchange and self.ws.policy.is_passthrough(dst, is_dir):
            # Onto a name rwfs does not journal (pytest's cache made as a temporary
            # directory, then renamed onto .pytest_cache): what it moves leaves the
            # journal there, whose model would otherwise keep files removed untold.
            extra["untracked"] = True
        try:
            with self.ws.committer.operation(
                journaled,
                who,
                "rename",
                src,
                incoming,
                dest=fsdecode(dst),
                exchange=exchange or None,
                **extra,
            ) as late:
                renameat2(self.ws.root_fd, src, self.ws.root_fd, dst, flags)
                late["hash_fd"], late["carried"] = moved_fd, carry
                for c in carry:
                    c.journal_path = c.journal_path or c.path
                    c.path = dst
                for c in sup:
                    c.superseded = True
        except OSError:
            if incoming is not None:
                os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
            if allowance is not None:  # nothing was renamed: the allowance stays
                self.ws.allowances.give_back(allowance)
            for fd in (moved_fd, removed):
                if fd is not None:
                    os.close(fd)
            raise
        self.forget_removed(dst)
        if exchange or is_dir:
            # (A directory's: what was cut below either name is at another path now.)
            for p in [p for p in self.cuts if p == src or p.startswith((src + b"/", dst + b"/"))]:
                self._drop_cut(p)
        else:
            removed = self._cut_removed(src, who, removed)
        if removed is not None:
            self.path_removed(src, who, removed)
        if incoming is not None:
            self.removals += 1
        if exchange:
            self.inodes.exchange(src, dst)  # a directory's children move with it
        else:
            if dst_st is not None:
                gone = self.inodes.detach(dst)
                if gone is not None and dst_st.st_nlink == 1 and not stat.S_ISDIR(dst_st.st_mode):
                    self.inodes.orphan(gone)
                elif gone is not None and not stat.S_ISDIR(dst_st.st_mode):
                    await self._other_names(gone, dst, dst_st)
            self.inodes.move(src, dst)

    def _commit_point(self, path: bytes) -> Inode | None:
        """The inode at ``path`` if a commit point of it is under way: its stage sealed
        (hashed and gated, under ``inode.lock``) and not queued yet. A rename then would
        move the tree's file without the bytes the writer wrote before it (an empty
        temporary, for a save by rename), and journal those; the commit would follow as
        a write of the new name. A rename over it, or an unlink, would drop the commit (its
        file gone) and keep the bytes from before it."""
        inode = self.inodes.by_path.get(path)
        if inode is None or inode.virtual or not inode.lock.locked():
            return None
        stage = inode.stage
        if stage is None or not stage.sealed:
            return None
        if inode.pending is not None and inode.pending.stage is stage:
            return None  # queued (or a batch's draft): ``_movable`` decides
        return inode

    async def _sealing(self, path: bytes) -> bool:
        """Wait for a commit point of the file at ``path`` under way (``_commit_point``),
        if there is one: True if it waited."""
        inode = self._commit_point(path)
        if inode is None:
            return False
        async with inode.lock:
            pass
        return True

    def _movable(
        self,
        path: bytes,
        st: os.stat_result | None,
        dst_st: os.stat_result | None = None,
        exchange: bool = False,
    ) -> list[Commit] | None:
        """The commits queued at ``path`` if a rename can move its file (or, for the name a
        rename replaces, replace it) without waiting for them: [] if none is queued; None
        if they must land first (a directory's, a hard-linked file's, an exchange, ones a
        group has taken: ``Committer.movable``). ``dst_st``: the file a moved one replaces,
        whose bytes must be kept without an await (not hard-linked)."""
        busy = self.queued(path)
        inode = self.inodes.by_path.get(path)
        if not busy:
            # (A commit whose submit has not queued it yet lands first, as ``settle`` does.)
            held = inode is not None and inode.pending is not None and not inode.pending.held
            return None if held else []
        if (
            exchange
            or inode is None
            or inode.virtual
            or len(inode.paths) != 1
            or inode.pending is not busy[-1]
            or st is None
            or not stat.S_ISREG(st.st_mode)
            or st.st_nlink != 1
            or (dst_st is not None and not (stat.S_ISREG(dst_st.st_mode) and dst_st.st_nlink == 1))
        ):
            return None
        for c in busy:
            if not (
                c.owner is inode
                and c.path == path
                and not c.held
                and c.intended is not None
                and c.stage.fd >= 0
                and self.ws.committer.movable(c)
            ):
                return None
        return busy

    @staticmethod
    def _same(was: list[Commit], now: list[Commit] | None) -> bool:
        return (
            now is not None
            and len(was) == len(now)
            and all(a is b for a, b in zip(was, now, strict=True))
        )

    async def _other_names(self, inode: Inode, path: bytes, st: os.stat_result) -> None:
        """One name of a hard-linked file went away and the inode table knew no other:
        find the file's other names in the workspace, so that its commits have a path
        and stay journaled (a name outside the workspace is not found: the file is then
        written in place, unjournaled, as ``fs._in_place`` says)."""
        if inode.paths:
            return
        names = await trio.to_thread.run_sync(
            self.ws.links.other_names, path, st, (), limiter=WORKERS
        )
        for p in names:
            if p not in self.inodes.by_path:
                inode.paths.add(p)
                self.inodes.by_path[p] = inode

    async def link(self, src: Inode, path: bytes, who: dict[str, Any]) -> None:
        """link(2): a new name of a file, journaled with the file's digest. Not of a file
        whose bytes are an open batch's (its draft, or a name it deletes): EXDEV."""
        if src.virtual or self.held(src) is not None or path in self.hidden:
            # The tree does not hold what the mount shows at one of the two names: a link
            # there would not link it.
            raise _refused(errno.EXDEV)
        # The new name must reach the bytes every reader sees: commit an open stage (say,
        # a truncate(2) while a descriptor is open) before linking the backing file, again
        # if a writer opened another meanwhile.
        journaled = self.journaled(path)
        while True:
            before = src.stage
            await self.commit(src, who, wait=True)
            await self.settle(src)
            if not (src.stage is None or src.stage is before or not src.paths):
                continue  # (a stage that stays is a batch's draft, or an unlinked file's)
            if self.held(src) is not None:  # the commit went to an open batch
                raise _refused(errno.EXDEV)
            digest = None  # the new name's bytes, for its history and the path index
            with contextlib.suppress(OSError):
                fd, st = open_regular(self.ws.root_fd, rel(src.path)) if journaled else (-1, None)
                if fd >= 0 and not self.journaled(path, st):  # too large to hash
                    os.close(fd)
                    fd = -1
                if fd >= 0:
                    try:
                        digest = await self.ws.digests.of(fd)
                    finally:
                        os.close(fd)
            # No commit of the file may be queued across the link: it would be journaled
            # before the link while it reaches the tree after it, and the link's digest
            # would then stand for the new name in place of the bytes it holds.
            if self.held(src) is not None:
                raise _refused(errno.EXDEV)
            if src.pending is None:
                break
        with self.ws.committer.operation(
            journaled, who, "link", path, source=fsdecode(src.path), intended=digest
        ):
            os.link(
                rel(src.path),
                path,
                src_dir_fd=self.ws.root_fd,
                dst_dir_fd=self.ws.root_fd,
                follow_symlinks=False,
            )
        batch = self.batches.for_writer(who) if journaled else None
        if batch is not None:  # an abort removes it again
            st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
            await self.batches.made_link(batch, path, st.st_ino)

    async def create_in_batch(
        self, path: bytes, mode: int, who: dict[str, Any], owner: tuple[int, int]
    ) -> Inode | None:
        """create(2) by a writer of an open batch, or where a batch deletes a file: the new
        file is only a stage until the batch commits (a virtual inode, returned); None if
        the new file is the tree's."""
        if not self.journaled(path) or path in self.virtual:
            return None
        # A file an open batch deletes is the batch's, whoever makes it again.
        held = self.batches.holding(path) if path in self.hidden else None
        batch = held or self.batches.for_writer(who)
        if batch is None or not (path in self.hidden or not _exists(self.ws.root_fd, path)):
            return None
        self.hidden.discard(path)
        stage = await self.ws.stages.empty(mode, *owner)
        inode = self.inodes.add_virtual(path)
        inode.stage = stage
        inode.lookups += 1
        self.virtual[path] = inode
        return inode

    def batch_rename(self, src: bytes, dst: bytes, who: dict[str, Any]) -> bool:
        if src in self.hidden or dst in self.hidden:
            return True
        held = [self.inodes.by_path.get(p) for p in (src, dst)]
        if any(i is not None and i.pending is not None and i.pending.held for i in held):
            return True
        try:
            st = os.stat(src, dir_fd=self.ws.root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            # A batch's changes below it are held by their paths, which a commit resolves:
            # they would stay at the old ones (and a symlink put there would take them).
            return self._held_below(src)
        if self.batches.for_writer(who) is None:
            return False
        return stat.S_ISREG(st.st_mode) and self.journaled(src, st)

    def _held_below(self, d: bytes) -> bool:
        """Whether an open batch holds a draft, a deletion or a new file below ``d``."""
        top = d + b"/"
        return any(
            p.startswith(top)
            for paths in (self.hidden, self.virtual, *(b.held for b in self.batches.all.values()))
            for p in paths
        )

    async def rename_virtual(self, src: bytes, dst: bytes, flags: int, who: dict[str, Any]) -> None:
        """Rename of a file an open batch created: within the batch, the draft now stands
        for ``dst`` (a new file there, or new bytes for the file there: the write-a-temp-
        then-rename pattern). Anything else involving such a file is EXDEV, which makes
        mv and most tools copy instead."""
        inode = self.virtual.get(src)
        if inode is None or flags & RENAME_EXCHANGE:
            raise _refused(errno.EXDEV)
        target = self.virtual.get(dst)
        real = None
        if target is None:
            try:
                real = os.stat(dst, dir_fd=self.ws.root_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
        shown = target is not None or (real is not None and dst not in self.hidden)
        if shown and flags & RENAME_NOREPLACE:
            raise _refused(errno.EEXIST)
        if real is not None and not (stat.S_ISREG(real.st_mode) and self.journaled(dst, real)):
            raise _refused(errno.EXDEV)
        if inode.pending is None or not inode.pending.held:
            await self.commit(inode, who)  # its bytes join the batch first
        held = inode.pending
        if held is None or not held.held or self.virtual.get(src) is not inode:
            raise _refused(errno.EXDEV)
        old = target or self.inodes.by_path.get(dst)
        if old is not None and target is None:
            await self.settle(old)  # the batch's base is the file's committed bytes
        old_held = self.held(old) if old is not None else None
        base = None
        if old_held is not None:
            base = old_held.stage.expected  # the batch's base of dst
        elif real is not None:
            fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.ws.root_fd)
            try:
                base = await self.ws.digests.of(fd)
            finally:
                os.close(fd)
        if shown:
            # As outside a batch, a rename onto a file is a commit of it: the gates judge
            # the draft against what the mount shows there.
            await self._gate_virtual_rename(held, dst, old_held, base, who)
            if self.virtual.get(src) is not inode or inode.pending is not held or not held.held:
                raise _refused(errno.EXDEV)  # the batch ended meanwhile
        batch = self.batches.all[str(held.batch)]
        src_base = held.stage.expected  # not None: src was a file of the tree, deleted
        if old is not None and old_held is not None and len(old.paths) > 1:
            # A hard-linked file's draft, held under dst: the file's other names keep it,
            # and dst alone gets the new file.
            await self.batches.move_entry(batch, old_held, min(old.paths - {dst}))
            old_held = None
        if old is not None and old_held is not None:
            with self.letting_go(old, old_held):  # its open descriptors keep its draft
                await self.batches.retarget(batch, held, dst, base)
        else:
            await self.batches.retarget(batch, held, dst, base)
        if old is not None:
            self.virtual.pop(dst, None)
            self.inodes.detach(dst)
            self.inodes.orphan(old)
        self.hidden.discard(dst)
        del self.virtual[src]
        self.inodes.move(src, dst)
        self.virtual[dst] = inode
        if src_base is not None:
            # The file the batch made at src replaced one of the tree (removed, then
            # created again): moving it away leaves that one deleted.
            await self.batches.hide(batch, src, src_base, who)
            self.hidden.add(src)

    async def _gate_virtual_rename(
        self,
        held: Commit,
        dst: bytes,
        old_held: Commit | None,
        base: str | None,
        who: dict[str, Any],
    ) -> None:
        """``gate_rename`` for a batch's draft renamed onto a file the mount shows: its
        own draft, or the tree's file."""
        fd = -1
        if old_held is None and dst not in self.virtual:  # (a new file of the batch: empty)
            fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.ws.root_fd)
        try:
            old_fd = old_held.stage.fd if old_held is not None else fd
            findings = await self.ws.gating.run(dst, old_fd, held.stage.fd)
            findings, allowance = self.ws.gating.let_through(dst, who, findings)
            if allowance is not None:  # (the batch's change of dst, from now on)
                held.info["allowed"] = allowance.record()
            if any(f.action == "reject" for f in findings):
                shown = old_held.intended if old_held is not None else base
                with borrowed(held.stage.fd) as (new_fd,):
                    raise await self.ws.refusals.refuse(
                        dst, new_fd, shown, str(held.intended), findings, who
                    )
        finally:
            if fd >= 0:
                os.close(fd)

    async def gate_rename(
        self,
        src: bytes,
        dst: bytes,
        who: dict[str, Any],
        src_fd: int = -1,
        dst_fd: int = -1,
        taken: Allowance | None = None,
    ) -> Allowance | None:
        """A rename onto a journaled file is a commit of it: the gates see the moved bytes,
        and a refusal fails the rename() with both files as they were. ``src_fd``,
        ``dst_fd``: the bytes the mount shows there when the tree does not hold them yet
        (a commit still queued). Returns the writer's allowance of ``dst`` this rename used
        (``taken``: the one it used when it was gated before, applied again). Onto a file
        the same user just cut by an explicit truncation, the moved bytes are judged
        against the bytes from before the cut (``_cut_before``), and a refusal puts those
        back at ``dst``."""
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

        def shown(fd: int, path: bytes) -> int:
            return os.dup(fd) if fd >= 0 else os.open(path, how, dir_fd=self.ws.root_fd)

        cut = self.cuts.get(dst)
        if cut is not None and (
            not self._cut_stands(cut, who) or self.batches.for_writer(who) is not None
        ):
            cut = None
        new_fd = shown(src_fd, src)
        try:
            if cut is not None and await self.ws.digests.of(new_fd) == cut.intended:
                cut = None  # the bytes the cut left again (sed -i of the empty file): no edit
            old_fd = os.dup(cut.fd) if cut is not None else shown(dst_fd, dst)
            try:
                findings = await self.ws.gating.run(dst, old_fd, new_fd)
                findings, taken = self.ws.gating.let_through(dst, who, findings, taken)
                if any(f.action == "reject" for f in findings):
                    expected, intended = (
                        await self.ws.digests.of(old_fd),
                        await self.ws.digests.of(new_fd),
                    )
                    err = await self.ws.refusals.refuse(
                        dst, new_fd, expected, intended, findings, who
                    )
                    # The writer names its temporary (sed: "cannot rename sedX: Bad
                    # message"): why/ has the envelope under that name too.
                    err.envelope["source"] = fsdecode(src)
                    if cut is not None:
                        await self._cut_put_back(dst, cut, expected, who, err)
                    raise err
            finally:
                os.close(old_fd)
        finally:
            os.close(new_fd)
        return taken

    async def commit(self, inode: Inode, ctx_info: dict[str, Any], wait: bool = False) -> None:
        """A commit point (SPEC §3.2 step 2): seal the stage and hand it to the committer."""
        async with inode.lock:
            stage = inode.stage
            if stage is None or stage.sealed:
                if wait:
                    await self.settle(inode)
                return
            if not inode.paths:
                self.orphan_stage(inode)
                return
            stage.sealed = True  # atomic: set before the first await, so writers wait
            removed, cut = self._recreated(inode, stage, ctx_info), False
            if removed is None:
                removed = self._cut_before(inode, stage, ctx_info)
                cut = removed is not None
            try:
                await self._sealed(inode, stage, ctx_info, wait, removed, cut)
            finally:
                if removed is not None:
                    os.close(removed)

    async def _sealed(
        self,
        inode: Inode,
        stage: Stage,
        ctx_info: dict[str, Any],
        wait: bool,
        removed: int | None,
        cut: bool = False,
    ) -> None:
        """``commit`` of a sealed stage, under ``inode.lock``. ``removed``: a descriptor of
        the bytes of the file a save by removal and re-creation removed (``_recreated``),
        or (``cut``) of the file's bytes before the explicit truncation this write follows
        (``_cut_before``): the gates judge against them, and a refusal puts them back."""
        # The gates judge the new bytes against what the mount showed: the tree's file,
        # or the draft of it an open batch holds. A new (empty) file has nothing a write
        # could break: only the secrets gate has something to look at. They judge
        # written text: a stage nothing was written into holds only truncations to
        # lengths the caller chose (truncate(2), ftruncate(2)), a deliberate
        # change, journaled and undoable like any other but never refused, so that the
        # truncate that returned success is not undone at this commit point (SPEC §3.3a,
        # §4.1). One whose last change is such a truncation is not judged by the
        # truncation and elision gates (``Stage.cut_last``, ``gates.check``).
        gated = inode.path
        held_before = self.held(inode)
        shown, base_fd = self._shown(inode, held_before, stage)
        gate = stage.written and (
            shown != EMPTY_DIGEST or self.ws.policy.gate("secrets", gated)["action"] != "off"
        )
        if shown == EMPTY_DIGEST:
            base_fd = -1  # nothing to read: judged as a new file (and sealed on the loop)
        if removed is not None and stage.written:  # judged against the file the save removed
            base_fd, gate = removed, True
        intended, size, findings = await self.ws.stages.seal(
            stage, (gated, base_fd) if gate else None
        )
        if not inode.paths:  # unlinked during the seal
            stage.sealed = False
            self.orphan_stage(inode)
            return
        path = inode.path
        held = self.held(inode)
        shown, base_fd = self._shown(inode, held, stage)
        # What the gates judge against: the removed file's bytes (which the new file's
        # stands for), or the bytes from before the truncation, not the tree's file.
        judged = removed if removed is not None and held is None else base_fd
        if not cut:
            base_fd = judged
        # Duplicates: a commit this one waits on below (gates off the loop, a digest, a
        # batch's hold) may land and close these (or their numbers be reused).
        with borrowed(base_fd, judged) as (base_fd, judged):
            drafted = held.intended if held is not None else None
            kind = decide(Facts(intended, stage.expected, drafted)).kind
            if kind in (Kind.DRAFT_AGAIN, Kind.BASE_AGAIN):
                assert held is not None
                self.ws.stages.drop(stage)
                inode.stage = held.stage
                if kind is Kind.BASE_AGAIN:
                    await self.batches.unhold(self.batches.all[str(held.batch)], path)
                return
            if kind is Kind.NOOP:
                self.ws.stages.drop(stage)
                inode.stage = self.beneath(inode)
                # A write all the same: mtime moves where it shows (atime does not: no read).
                if inode.stage is not None:
                    kept = os.fstat(inode.stage.fd).st_atime_ns
                    os.utime(inode.stage.fd, ns=(kept, time.time_ns()))
                else:
                    kw: dict[str, Any] = {"dir_fd": self.ws.root_fd, "follow_symlinks": False}
                    kept = os.stat(rel(path), **kw).st_atime_ns
                    os.utime(rel(path), ns=(kept, time.time_ns()), **kw)
                self.ws.committer.record(
                    {
                        "op": "noop",
                        "path": fsdecode(path),
                        "batch": None,
                        "intended": intended,
                        **ctx_info,
                    }
                )
                self.ws.stats.count("noops")
                self.on_written(path, intended, None)
                return
            if stage.written and (path != gated or held is not held_before):
                # Renamed during the seal, or the batch ended meanwhile: gate it as what it
                # is now, against what the mount shows now.
                findings = await self.ws.gating.run(path, judged, stage.fd, stage.cut_last)
            # The writer's allowance of this path, if it has one, is used up here and waives
            # what it may (allowances.py). Within a batch it goes with the batch's change. Not
            # by a truncation alone, never judged: it waits for the write after it, which is
            # judged against the bytes from before the cut (``_cut_before``).
            allowance = None
            if stage.written:
                findings, allowance = self.ws.gating.let_through(path, ctx_info, findings)
            if allowance is None and held is not None and "allowed" in held.info:
                allowance_record: dict[str, Any] | None = held.info["allowed"]
            else:
                allowance_record = allowance.record() if allowance is not None else None
            stale, read_fd = self._stale_read(inode, ctx_info), -1
            if stale is None:
                stale, read_fd = await self._replaced_read(inode, path, ctx_info, shown)
            # A file an open batch holds stays in it, whoever writes it (every writer
            # built on the draft); otherwise the batch whose scope the writer is in.
            batch = self.batches.all.get(str(held.batch)) if held else None
            if batch is None and inode.virtual:  # made again where the batch deletes a file
                batch = self.batches.holding(path)
            batch = batch or self.batches.for_writer(ctx_info)
            rejected = any(f.action == "reject" for f in findings)
            policy = self.ws.policy.stale_write
            decision = decide(
                Facts(intended, stage.expected, drafted, rejected, stale, policy, batch is not None)
            )
            if decision.kind is Kind.REFUSE:
                # Refused: the draft is kept, the stage goes, the file reads as before.
                put_back = removed is not None and held is None
                if put_back:
                    assert removed is not None
                    shown = await self.ws.digests.of(removed)
                err = await self.ws.refusals.refuse(
                    path, stage.fd, shown, intended, findings, ctx_info
                )
                await self._unstage(inode, held, stage)
                if put_back:
                    assert removed is not None and shown is not None
                    refused = err.envelope.get("lsn") or 0
                    base = str(stage.expected)
                    await self._put_back(inode, path, removed, shown, base, ctx_info, refused)
                if wait:
                    # fsync(): the kernel holds the inode's lock until we answer, and
                    # invalidating needs it, so it runs after the answer.
                    self.kernel.invalidate(inode)
                else:
                    await self.kernel.invalidate_now(inode)  # a reread must not see the draft
                raise err
            info = dict(ctx_info)
            if findings:
                info["warnings"] = [
                    {"gate": f.gate, "message": f.message, **f.details} for f in findings
                ]
            if allowance_record is not None:
                info["allowed"] = allowance_record
            if decision.kind is Kind.CONFLICT:
                with borrowed(read_fd) as (rfd,):  # eviction may close the original
                    err = await self.ws.refusals.stale_conflict(
                        path,
                        stage,
                        intended,
                        stale or None,
                        ctx_info,
                        actual=(shown, base_fd),
                        batch=held.batch if held is not None else None,
                        read_fd=rfd,
                    )
                await self._unstage(inode, held, stage)
                if allowance is not None:  # the write did not happen: the allowance stays
                    self.ws.allowances.give_back(allowance)
                if wait:
                    self.kernel.invalidate(inode)
                else:
                    await self.kernel.invalidate_now(inode)
                raise err
            if decision.stale_warning:
                info.setdefault("warnings", []).append(
                    {
                        "gate": "stale_write",
                        "message": "this process read an older version of the file than "
                        "the one it replaced: a change made meanwhile may be lost",
                        "read": stale or None,
                    }
                )
                self.ws.stats.count("stale_writes")
            self._new_version(inode, shown, intended, ctx_info)
            commit = Commit(path, stage, intended, size, info, owner=inode)
            if len(inode.paths) > 1:  # hard links: committed in place, every name journaled
                commit.aliases = tuple(sorted(inode.paths - {path}))
            commit.linked = bool(commit.aliases) or _nlink(self.ws.root_fd, inode) > 1
            if decision.kind is Kind.HOLD:
                assert batch is not None
                if held is None and inode.pending is not None:
                    # Built on a commit still queued (``ensure_stage``): a batch's base is
                    # the tree's bytes, so that one lands first.
                    await self.settle(inode)
                if await self.batches.hold(batch, commit, wait):  # (False: it closed)
                    inode.pending = commit
                    commit.shown = True
                    self.on_written(path, intended, commit)
                    return
            remembered = None
            if ((not stage.written and stage.cut_last) or intended == EMPTY_DIGEST) and (
                not inode.virtual
            ):
                # An explicit truncation alone, or a file emptied (``: > f``, small enough to
                # pass): a write of the same user's soon after is judged against the bytes
                # from before it (``_cut_before``).
                remembered = await self._keep_cut(path, commit, judged, ctx_info)
            before, inode.pending = inode.pending, commit
            try:
                await self.ws.committer.submit(commit, wait)
            except BaseException:
                if remembered is not None:
                    self._drop_cut(path)
                # Refused before the committer took it (e.g. the journal is unavailable):
                # nothing was written, so the stage goes and the file reads as before.
                if inode.pending is commit and not self.ws.committer.is_queued(commit):
                    inode.pending = before if before is not None and not before.settled else None
                    if inode.stage is stage:
                        inode.stage = self.beneath(inode)
                    self.ws.stages.drop(stage)
                    self.kernel.invalidate(inode)
                    if allowance is not None:
                        self.ws.allowances.give_back(allowance)
                raise
            # (a submit that waited, for fsync or strict durability, saw its record already)
            commit.shown = True
            self.on_written(path, intended, commit)

    def path_removed(self, path: bytes, who: dict[str, Any], fd: int) -> None:
        """``path`` stopped naming a journaled file (an unlink, or a rename away), whose
        bytes ``fd`` holds (this takes it): a new file made there soon after by the same
        user is that file saved again (``_recreated``)."""
        old = self.removed.pop(path, None)
        if old is not None:
            os.close(old.fd)
        self.removed[path] = Removed(fd, who.get("uid", -1), time.monotonic())
        while len(self.removed) > REMOVED_MAX:  # the oldest goes
            os.close(self.removed.pop(next(iter(self.removed))).fd)

    def let_go_kept(self) -> bool:
        """The disk is full: close every descriptor kept of removed, cut or replaced files
        (for ``_recreated``, ``_cut_before`` and stale writes: those checks then find
        nothing, never a false refusal), so that a removed file no object keeps frees its
        space. True if any."""
        had = bool(self.removed or self.gone_fds or self.cuts)
        for rec in self.removed.values():
            os.close(rec.fd)
        self.removed.clear()
        for cut in self.cuts.values():
            os.close(cut.fd)
        self.cuts.clear()
        for gone in self.gone_fds:
            os.close(gone.fd)
            gone.fd = -1
        self.gone_fds.clear()
        return had

    def forget_removed(self, path: bytes) -> None:
        """``path`` names another file now (a rename onto it, a new directory)."""
        old = self.removed.pop(path, None)
        if old is not None:
            os.close(old.fd)
        self._drop_cut(path)

    # ---- a write after an explicit truncation ----

    def _cut_stands(self, rec: Cut, who: dict[str, Any]) -> bool:
        return rec.uid == who.get("uid", -1) and time.monotonic() - rec.at <= RECREATE_S

    async def _keep_cut(
        self, path: bytes, commit: Commit, base_fd: int, who: dict[str, Any]
    ) -> Cut | None:
        """``commit`` cuts ``path`` by an explicit truncation alone (nothing written), or
        empties it: a change the gates let through, but a write that follows it is judged
        against the bytes from before it, as within one open (``ftruncate`` then
        ``write``), so that truncating a file and writing it again puts no cut or elided
        file in place unseen. Remembers ``base_fd``'s bytes (copied first when a commit in place, of a
        hard-linked file, would change them), or, after an earlier cut of the same user's
        still standing, the bytes from before that one; None if nothing is kept."""
        rec = self.cuts.get(path)
        now = time.monotonic()
        if rec is not None and self._cut_stands(rec, who) and rec.intended == commit.stage.expected:
            rec.at, rec.intended = now, str(commit.intended)
            rec.commits.append(commit)
            return rec
        self._drop_cut(path)
        if base_fd < 0 or os.fstat(base_fd).st_size <= commit.size:
            return None  # nothing cut away (a file made longer)
        if commit.linked:

            def copy(src: int) -> int:
                how = os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC
                out = os.open(".", how, 0o600, dir_fd=self.ws.staging_fd)
                try:
                    copy_metadata(src, out, os.fstat(src))  # (a put-back copies them)
                    copy_fd(src, out)
                except BaseException:
                    os.close(out)
                    raise
                return out

            try:
                with borrowed(base_fd) as (src,):
                    fd = await trio.to_thread.run_sync(copy, src, limiter=WORKERS)
            except OSError:
                return None  # (no O_TMPFILE, no room: judged as ever)
        else:
            fd = os.dup(base_fd)  # the replaced inode keeps its bytes (an object now)
        earlier = self.queued(path)
        rec = Cut(fd, who.get("uid", -1), now, [commit], str(commit.intended), earlier)
        self.cuts[path] = rec
        while len(self.cuts) > REMOVED_MAX:  # the oldest goes
            os.close(self.cuts.pop(next(iter(self.cuts))).fd)
        return rec

    def _drop_cut(self, path: bytes) -> None:
        rec = self.cuts.pop(path, None)
        if rec is not None:
            os.close(rec.fd)

    def _cut_landed(self, c: Commit) -> None:
        """A commit settled: a cut remembered at its path stands only while the path's
        last commit is that cut (another write, a restore, an undo end it; not one queued
        before it, which lands first)."""
        for p in (c.path, *c.aliases):
            rec = self.cuts.get(p)
            if rec is None or c in rec.earlier:
                continue
            if not (c.outcome == "committed" and c in rec.commits):
                self._drop_cut(p)

    def _cut_before(self, inode: Inode, stage: Stage, who: dict[str, Any]) -> int | None:
        """A write (written text, not a truncation again) of a file the same user cut by an
        explicit truncation alone within RECREATE_S, onto what the cut left: its gates
        judge it against the bytes from before the cut, and a refusal puts those back;
        returns a descriptor of them (the caller closes it), else None. Not inside an open
        batch: its commit judges its drafts against the tree's file anyway."""
        rec = self.cuts.get(inode.path) if inode.paths else None
        if rec is None or not stage.written:
            return None
        del self.cuts[inode.path]
        if (
            not self._cut_stands(rec, who)
            or stage.expected != rec.intended
            or inode.virtual
            or self.held(inode) is not None
            or self.batches.for_writer(who) is not None
        ):
            os.close(rec.fd)
            return None
        return rec.fd

    async def _cut_put_back(
        self, path: bytes, cut: Cut, digest: str, who: dict[str, Any], err: RwfsError
    ) -> None:
        """A rename onto ``path`` right after its cut was refused: the bytes from before
        the cut come back, as for a refused write (``_put_back``), unless the file is being
        written meanwhile (a stage open on it) or a batch holds it."""
        inode = self.inodes.by_path.get(path)
        if inode is None:
            return
        async with inode.lock:
            if (
                self.cuts.get(path) is not cut
                or inode.virtual
                or self.held(inode) is not None
                or (inode.stage is not None and inode.stage is not self.beneath(inode))
            ):
                return
            del self.cuts[path]
            try:
                refused = err.envelope.get("lsn") or 0
                await self._put_back(inode, path, cut.fd, digest, cut.intended, who, refused)
            finally:
                os.close(cut.fd)
        self.kernel.invalidate(inode)  # (the rename holds the kernel's lock on it)

    def _cut_removed(self, path: bytes, who: dict[str, Any], fd: int | None) -> int | None:
        """``path`` stops naming its file (removed, renamed away), which ``fd`` holds: if
        the same user cut it a moment before, a save that makes it again is judged against
        the bytes from before the cut (``_recreated``): a descriptor of those, else ``fd``."""
        rec = self.cuts.pop(path, None)
        if rec is None:
            return fd
        if not self._cut_stands(rec, who):
            os.close(rec.fd)
            return fd
        if fd is not None:
            os.close(fd)
        return rec.fd

    def _recreated(self, inode: Inode, stage: Stage, who: dict[str, Any]) -> int | None:
        """A save by removal and re-creation (``git checkout``, ``git stash``, vim's default
        save, ``rm f`` then a new ``f``): the first commit of a new, still empty file at a
        path whose journaled file the same user removed within RECREATE_S. Its gates judge
        the new bytes against the removed ones, as they would an edit of that file; returns
        a descriptor of them (the caller closes it), else None."""
        if stage.expected != EMPTY_DIGEST or inode.virtual or self.held(inode) is not None:
            return None
        if not inode.paths:
            return None
        rec = self.removed.pop(inode.path, None)
        if rec is None:
            return None
        if rec.uid != who.get("uid", -1) or time.monotonic() - rec.at > RECREATE_S:
            os.close(rec.fd)
            return None
        return rec.fd

    async def _put_back(
        self,
        inode: Inode,
        path: bytes,
        removed: int,
        digest: str,
        expected: str,
        who: dict[str, Any],
        refused: int,
    ) -> None:
        """A refused save by removal and re-creation: the new file (``expected``: empty)
        gets the removed bytes back, so the path holds what it held before the save, as a
        refused edit leaves it. The same for a refused write after an explicit truncation
        (``expected``: what the truncation left): the bytes from before it come back.
        It is a commit of rwfs's own, journaled as a write by rwfs (the daemon's pid, comm
        ``rwfs``, ``put_back``, and ``refused_lsn``, the refusal it follows), in the
        writer's name only as far as its uid and session go (an undo of the session takes
        it back with the save); it is no success of the writer's, so ``why/`` keeps the
        refusal."""
        with borrowed(removed) as (fd,):
            stage = await self.ws.stages.new(fd, truncate=False)
        stage.expected = expected
        stage.sealed = True
        size = os.fstat(stage.fd).st_size
        info = {**who, "pid": os.getpid(), "comm": "rwfs", "put_back": True}
        if refused:
            info["refused_lsn"] = refused
        commit = Commit(path, stage, digest, size, info, owner=inode)
        if len(inode.paths) > 1:  # hard links: committed in place, every name journaled
            commit.aliases = tuple(sorted(inode.paths - {path}))
        commit.linked = bool(commit.aliases) or _nlink(self.ws.root_fd, inode) > 1
        self._new_version(inode, expected, digest, who)
        inode.stage, inode.pending = stage, commit
        await self.ws.committer.submit(commit, wait=False)

    def shown_fd(self, path: bytes) -> int:
        """A descriptor of what the mount shows at ``path`` when the tree does not hold it
        (an open stage, a batch's draft or new file), -1 otherwise; not to be closed (a
        worker thread takes a duplicate: ``borrowed``)."""
        inode = self.virtual.get(path) or self.inodes.by_path.get(path)
        if inode is None or path in self.hidden:
            return -1
        if inode.stage is not None:
            return inode.stage.fd
        held = self.held(inode)
        return held.stage.fd if held is not None else -1

    @staticmethod
    def held(inode: Inode) -> Commit | None:
        """The draft of the file an open batch holds, if it holds one."""
        return inode.pending if inode.pending is not None and inode.pending.held else None

    @staticmethod
    def _shown(inode: Inode, held: Commit | None, stage: Stage) -> tuple[str | None, int]:
        """What the mount showed of the file before this stage: (digest, a descriptor of
        its bytes, -1 for none). A batch's draft if it holds one; else the tree's file,
        which for a file the batch creates is an empty one."""
        if held is not None:
            return held.intended, held.stage.fd
        if inode.virtual:
            return EMPTY_DIGEST, -1
        queued = Files.beneath(inode)
        if queued is not None and queued is not stage:
            return stage.expected, queued.fd  # built on a commit not yet landed
        return stage.expected, inode.fd

    async def _unstage(self, inode: Inode, held: Commit | None, stage: Stage) -> None:
        """A refused commit point: its stage goes and the file shows what it showed
        before: the batch's draft, the tree's file, or, for a file an open batch created
        and holds no draft of yet, an empty file (as a refused first write leaves a new
        file outside a batch)."""
        st = os.fstat(stage.fd)
        self.ws.stages.drop(stage)
        if held is not None:
            inode.stage = held.stage
        elif inode.virtual and inode.paths:
            # Unsealed: the last release commits it, so the batch holds the empty file.
            inode.stage = await self.ws.stages.empty(stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        else:
            inode.stage = self.beneath(inode)

    @staticmethod
    def beneath(inode: Inode) -> Stage | None:
        """The stage the mount shows when the file has none being written: its queued
        commit's (not landed yet), None for the tree's file."""
        queued = inode.pending
        return queued.stage if queued is not None and queued.stage.fd >= 0 else None

    def _stale_read(self, inode: Inode, who: dict[str, Any]) -> str | None:
        """A lost update (SPEC §6.4): the digest this process last read of the file ("" if
        it is no longer known), if another process changed the file since; else None."""
        if self.ws.policy.stale_write == "off":
            return None
        seen = self.reads.get((who.get("pid", 0), inode.serial))
        if seen is None or seen == inode.version:
            return None
        return inode.digests.get(seen) or ""  # "": a version too old to be remembered

    async def _replaced_read(
        self, inode: Inode, path: bytes, who: dict[str, Any], shown: str | None
    ) -> tuple[str | None, int]:
        """A lost update over a replaced file (SPEC §6.4): this process read ``path``,
        then another process replaced the file there (``path_leaves``), and what it read
        is not what the path holds now. Returns (the digest it read, "" if it is no longer
        known, or None: not stale; a descriptor of those bytes or -1)."""
        if self.ws.policy.stale_write == "off":
            return None, -1
        rec = self.read_at.get(path, {}).get(who.get("pid", 0))
        if rec is None or not rec.replaced or rec.serial == inode.serial:
            return None, -1  # (the file it read may be back at its path)
        read, gone = rec.read, rec.gone
        if read is None and gone is not None:
            if gone.digest is None and gone.fd >= 0:
                try:
                    gone.digest = await self.ws.digests.of(gone.fd)  # off the loop
                except OSError:
                    pass
            read = gone.digest
        if read is not None and read == shown:
            return None, -1  # replaced by the very bytes it read: nothing is lost
        if read is None and not rec.changed:
            return None, -1  # its bytes were let go (GONE_MAX): never a false stale write
        return read or "", gone.fd if gone is not None and read is not None else -1

    def opened_to_read(self, pid: int, inode: Inode) -> None:
        """Process ``pid`` opened the file to read: remember which version it read."""
        if len(self.reads) > READS_MAX or self.read_at_n > READS_MAX:
            self._forget_reads()
        self.reads[(pid, inode.serial)] = inode.version
        self._note_read(pid, inode)

    def _note_read(self, pid: int, inode: Inode) -> None:
        at = self.read_at.setdefault(inode.path, {})
        if pid not in at:
            self.read_at_n += 1
        at[pid] = ReadAt(inode.serial, inode.version)

    def _forget_reads(self) -> None:
        """The memory of reads is bounded: past READS_MAX pairs, all are forgotten."""
        self.reads.clear()
        self.read_at.clear()
        self.read_at_n = 0
        for gone in self.gone_fds:
            os.close(gone.fd)
            gone.fd = -1
        self.gone_fds.clear()

    def path_made(self, path: bytes, ino: int, pid: int) -> None:
        """Process ``pid`` made the file at ``path``: where it had read a file another
        process removed since, writing its new file loses nothing of anyone's."""
        at = self.read_at.get(path)
        inode = self.inodes.get(ino)
        if at and pid in at and inode is not None:
            at[pid] = ReadAt(inode.serial, inode.version)

    def path_leaves(self, path: bytes, actor: int, now: Inode | None = None) -> None:
        """``path`` is about to stop naming its file (renamed over or away, removed; an
        exchange): a process that read the file there and then writes the path would
        write over a file it never read. Called before the syscall, while the path still
        names the file: if the syscall fails, the path names the inode each reader read
        and ``_replaced_read`` finds nothing stale. The changing process's own change is
        no stale write: its record follows the file it put there (``now``), if any;
        ``actor`` is that process."""
        at = self.read_at.get(path)
        if not at:
            return
        mine = at.pop(actor, None)
        if mine is not None:
            if now is not None and not now.is_dir:
                at[actor] = ReadAt(now.serial, now.version)
            else:
                self.read_at_n -= 1
        inode = self.inodes.by_path.get(path)
        if inode is None:
            return
        gone: Gone | None = None
        for pid, rec in at.items():
            # Replaced once already (it keeps what it read then), or read as an inode
            # the kernel has forgotten since: not known to be this file.
            if pid == actor or rec.replaced or rec.serial != inode.serial:
                continue
            rec.replaced = True
            rec.changed = rec.version != inode.version
            rec.read = inode.digests.get(rec.version)
            if rec.read is None and not rec.changed:
                # Never committed through the mount: its bytes tell what was read.
                gone = gone or self._keep_gone(path)
                rec.gone = gone

    def _keep_gone(self, path: bytes) -> Gone | None:
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            gone = Gone(os.open(path, how, dir_fd=self.ws.root_fd))
        except OSError:
            return None
        self.gone_fds.append(gone)
        if len(self.gone_fds) > GONE_MAX:
            old = self.gone_fds.pop(0)
            os.close(old.fd)
            old.fd = -1
        return gone

    def _new_version(self, inode: Inode, old: str | None, new: str, who: dict[str, Any]) -> None:
        inode.digests[inode.version] = old
        inode.version += 1
        inode.digests[inode.version] = new
        inode.digests.pop(inode.version - 16, None)
        pid = who.get("pid", 0)
        key = (pid, inode.serial)
        if key in self.reads:  # a writer has seen its own bytes
            self.reads[key] = inode.version
        for path in inode.paths:
            at = self.read_at.get(path)
            if at is not None and pid in at:
                at[pid] = ReadAt(inode.serial, inode.version)
