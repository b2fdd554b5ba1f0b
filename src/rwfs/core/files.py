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
  sealed, one of, as ``decision.decide`` answers from the facts ``CommitPoint.run``
  gathers (commitpoint.py):

  - **no-op**: the bytes are the base again: the stage is dropped, a ``noop`` recorded.
  - **refused**: a gate rejects, or a stale write under ``stale_write = "conflict"``: the
    draft is kept as an object, the stage goes (``unstage``: back to the batch's draft,
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

The namespace is decided in namespace.py and renames.py: what an ``unlink``/``rmdir``
(``Namespace.remove``), a ``rename`` (``Renames.rename``: gated onto a journaled file), a
``link`` and a ``create`` in an open batch (``Namespace.create_in_batch``) become, each
journaled around its syscall (``Committer.operation``). The batch's side: an unlink a
batch takes (``Namespace.hide``), of its new file (``Namespace.drop_virtual``), a rename
of its new file (``Renames.rename_virtual``, gated like ``Renames.gate_rename`` onto a
file the mount shows), and EXDEV for any other rename a batch would have to take
(``Namespace.batch_rename``). A held draft that ends while descriptors are open on it is
let go, not dropped (``letting_go``). A removal is remembered for a while
(``Baselines.path_removed``, baselines.py): a new file made there is gated as a save of
the removed one (``Baselines.recreated``). So is a commit that is an explicit truncation
alone (``Baselines.keep_cut``): the same user's next write of the file (or a rename onto
it) is gated against the bytes from before it (``Baselines.cut_before``), and a refusal
puts those back (``Baselines.put_back``).

Meanwhile a path may be renamed (``Inode.paths`` moves), unlinked (no path left: the
seal's result is dropped, ``orphan_stage``; descriptors still open keep the stage until
the last release), or linked (``Namespace.link`` commits and settles first, and refuses
a file a batch holds). A commit still queued at a renamed regular file moves with it;
one at a name a rename or an unlink takes away is kept as a version
(``Renames.movable``, ``_superseded``); anything else queued there lands first
(``settle_below``). A hard-linked file is one inode under several paths; its commit is
written into that inode (``Landing.write_in_place``). The read records (reads.py)
remember what each process read, so that a commit over a version it never saw is a
stale write (SPEC §6.4; ``Reads.path_leaves`` before a path stops naming its file).

Concurrency (trio: tasks interleave only at ``await``):

- ``inode.lock`` guards one inode's stage creation and sealing: ``ensure_stage`` and
  ``commit`` run under it, so a stage is never sealed twice nor replaced mid-seal.
  ``Namespace.drop_virtual`` takes it too. Reads take no lock.
- ``commit`` awaits the seal (hash, gates), the gates again, a stale read's digest, a
  refusal's record, ``Batches.hold`` and ``Committer.submit``. Across each, the inode may
  lose its paths (checked after the seal: ``orphan_stage``), be renamed (gated again as
  what it is now), or its batch end (``held`` is read again); a handler of another inode
  or path runs meanwhile.
- ``ensure_stage`` awaits the copy of the bytes and, for a queued commit, ``settle``
  (a flush and the commit's ``done``) under ``inode.lock``: a commit point of the same
  inode waits; handlers that take no lock (a read, ``getattr``, an unlink or rename of
  the path) run meanwhile.
- ``Namespace.remove`` and ``Renames.rename`` await the settling of both names, unless
  what is queued there can move or be kept (``Renames.movable``; ``rename`` looks again
  after its gate, and goes on only if the same commits are still queued, untaken), then,
  for one name of a hard-linked file, the copy of its bytes (``Workspace.keep_removed``,
  a worker thread) before the syscall: a commit through another name can land in that
  moment and put its bytes in the copy. Commits that move or are kept never meet that
  await (they need a file with one name), so no group can take them between the look and
  the syscall. ``Namespace.link`` awaits the commit of the source's stage and its
  digest. None holds an inode's lock; a refusal of a save by re-creation awaits, under
  the lock, the stage and the submit of the bytes it puts back (``Baselines.put_back``).
- Other locks are taken only through the calls that need them: ``Batch.lock``
  (``batches.py``) serialises a batch's ``hold``, ``unhold``, ``commit`` and ``abort``;
  ``Committer.commit_lock`` serialises the committer's groups, a batch's commit, and each
  write that keeps an object (a refusal, a stale write's conflict); all but the committer
  take it through ``Committer.exclusive``, after the last group's records.
- ``committed`` is called by the committer on the loop, with no await, so ``pending``,
  ``stage`` and ``fd`` change together.
- The read records and ``virtual``/``hidden`` are changed with no await between reading
  and writing them; ``Reads.replaced_read`` awaits a hash of a kept descriptor, which
  ``Reads._keep_gone`` may close meanwhile: the hash and the conflict each use a
  duplicate (``borrowed``).
- The kernel's caches are dropped off the loop (``Kernel``); ``invalidate_now`` is awaited
  only where no request of ours holds the kernel's lock on the inode (not under fsync).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import trio

from ..journal.objects import EMPTY_DIGEST
from .baselines import Baselines
from .batches import Batches
from .commitpoint import CommitPoint
from .commits import Commit
from .errors import RwfsError
from .inodes import Inode, InodeTable
from .namespace import Namespace
from .reads import Reads
from .renames import Renames
from .stages import Stage
from .syscalls import WORKERS, fsdecode, rel
from .workspace import Workspace


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


class Files:
    """The stage lifecycle of every inode, and the parts that decide the rest (see the
    module's doc): ``point`` (a sealed stage's commit decision, carried out), ``names``
    and ``renames`` (namespace operations), ``reads`` (what each process read: stale
    writes), ``baselines`` (what a save after a removal or a cut is judged against)."""

    def __init__(self, ws: Workspace, batches: Batches, inodes: InodeTable, kernel: Kernel) -> None:
        self.ws = ws
        self.batches = batches
        self.inodes = inodes
        self.kernel = kernel
        # Paths whose bytes are an open batch's draft rather than the tree's file: new
        # files created in the batch, or a new file renamed over one (Inode.virtual).
        self.virtual: dict[bytes, Inode] = {}
        self.hidden: set[bytes] = set()  # paths an open batch deletes: gone from the view
        self.passed: dict[int, Inode] = {}  # by serial: files with direct opens (direct.py)
        # The FUSE layer's: let go of the direct opens whose release the kernel sent and
        # the C extension answered, queued until now (called before any decision that
        # counts direct opens).
        self.let_go: Callable[[], None] = lambda: None
        # Files removed (their bytes kept as objects) since the disk last filled up.
        self.removals = 0
        # A write went through at its commit point (path, intended, its commit; None for a
        # noop): ``.rw/why/`` says so before the writer's call returns (read-your-writes).
        self.on_written: Callable[[bytes, str | None, Commit | None], None] = (
            lambda path, intended, commit: None
        )
        self.point = CommitPoint(self)
        self.names = Namespace(self)
        self.renames = Renames(self)
        self.reads = Reads(self)
        self.baselines = Baselines(self)

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
        self.baselines.cut_landed(c)
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
                self.reads.new_version(inode, c.stage.expected, str(c.intended), {})
                try:
                    st = os.stat(rel(c.path), dir_fd=self.ws.root_fd, follow_symlinks=False)
                    key = (st.st_dev, st.st_ino)
                except OSError:
                    key = None
                if key is not None and not inode.busy:
                    self.inodes.rekey(inode, key)
                elif key != inode.key:
                    # Open, it stays the replaced file (its descriptors read it), which no
                    # name of the tree reaches now: once freed, its backing inode number
                    # may be another file's, which must not be taken for this one.
                    self.inodes.unkey(inode)
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
            removed, cut = self.baselines.recreated(inode, stage, ctx_info), False
            if removed is None:
                removed = self.baselines.cut_before(inode, stage, ctx_info)
                cut = removed is not None
            try:
                await self.point.run(inode, stage, ctx_info, wait, removed, cut)
            finally:
                if removed is not None:
                    os.close(removed)

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
    def shown(inode: Inode, held: Commit | None, stage: Stage) -> tuple[str | None, int]:
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

    async def unstage(self, inode: Inode, held: Commit | None, stage: Stage) -> None:
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
