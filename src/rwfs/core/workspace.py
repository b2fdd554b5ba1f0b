"""The core: a workspace's backing tree, its stages and the group committer (SPEC §3).

Nothing here knows about FUSE. The tree is reached only through ``root_fd`` with ``*at()``
calls and no-follow flags; paths are bytes relative to the workspace root (``b""`` is the
root itself).

Concurrency (trio): handlers interleave only at ``await``. Blocking work — hashing, copies,
fsync, LMDB commits, renames of a group — runs in worker threads. Invariants that rely on
"no await here" are marked ``# atomic:`` where they occur.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import fcntl
import logging
import math
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from .. import beneath, faults
from ..checks import gates, parsers
from ..checks.allowances import Allowance, Allowances, allow_hint, waivable, waive, writer_uid
from ..journal.intents import IntentLog
from ..journal.objects import (
    EMPTY_DIGEST,
    ObjectStore,
    Reserve,
    TrailingHash,
    copy_fd,
    digest_fd,
    open_regular,
    unique_id,
)
from ..journal.store import JournalUnavailable, Store, now_iso
from ..policy import Policy

log = logging.getLogger("rwfs.commit")
_libc = ctypes.CDLL(None, use_errno=True)
_LIMIT = trio.CapacityLimiter(4)
# A stage this large is hashed by a thread that follows its writes (objects.TrailingHash):
# sealing it then reads nothing again, when it was written front to back.
TRAIL_FROM = 8 << 20
# A stage this small, with no base to judge it against (a new file: only the secrets gate
# looks), is sealed on the event loop: hashing and scanning 8 KiB took 83 µs here, a
# thread hop 120 µs idle and 200 µs or more under load (docs/performance.md).
SEAL_ON_LOOP = 8 << 10
# Gates run on the loop too, in the seal or for a rename, when the old and the new bytes
# are both this small and the syntax gate's parse of the old bytes is kept (only the edit
# is parsed again): a rewrite of a 100-line module took 80 µs of gates here, against the
# 120-200 µs of a thread hop; a full parse of 4 KiB would take about 0.5 ms.
GATES_ON_LOOP = 4 << 10
# Timestamps move in ticks of the kernel's coarse clock (a few ms): a file's digest is
# cached only when its last change is older than this (``_remember``).
RACY_NS = 50_000_000
# Empty inodes kept in the staging area for new stages (``_spare``), at most this many.
SPARES_MAX = 512
# A queued commit holds its stage's descriptor, and the FUSE layer keeps the file's own
# open until it lands. With this many items queued the committer starts a group at once
# instead of at the end of commit_interval_ms; with QUEUE_MAX, a writer's commit waits
# until a group has taken the queue. So descriptors stay bounded (SPEC §1: this machine
# allows 20,000) however fast files are written and however long the interval.
QUEUE_URGENT = 512
QUEUE_MAX = 2048
# While the journal cannot commit, the committer tries again after a delay that starts here
# and doubles up to RETRY_MAX (seconds); a sync, an fsync or an unmount tries at once.
RETRY_MIN = 0.1
RETRY_MAX = 3.2
# At unmount, how long the daemon keeps trying a failing journal before it exits and leaves
# the acknowledged commits to the intent log (the next mount finishes them).
CLOSE_WAIT = 5.0
# How long the records of a group just applied wait for the next group, to be written in
# its receipts' transaction (one durable LMDB commit for both; seconds). The next fsync of
# a writer that fsyncs file after file comes well within it.
RECORD_WAIT = 0.005


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


class RwfsError(Exception):
    """A refusal or failure with an errno and a SPEC §7.2 envelope."""

    def __init__(
        self, errno_: int, error: str, reason_hint: str, message: str, **extra: Any
    ) -> None:
        super().__init__(message)
        self.errno = errno_
        self.envelope = {
            "ok": False,
            "error": error,
            "reason_hint": reason_hint,
            "errno": errno.errorcode.get(errno_, str(errno_)),
            "message": message,
            **extra,
        }


def journal_unavailable(path: bytes, why: str) -> RwfsError:
    return RwfsError(
        errno.EIO,
        "journal_unavailable",
        "journal",
        f"The journal could not record this write ({why}), so nothing was written and "
        "the file is unchanged; free space in the workspace's filesystem and retry.",
        path=fsdecode(path),
        suggested_action="free disk space, then retry the write",
    )


@dataclass
class JournalState:
    """Whether the journal commits, and since when it does not (``.rw/status``)."""

    failing_since: str | None = None  # when the first of the failed attempts ran
    last_error: str | None = None
    last_failure: str | None = None  # when the latest failed attempt ran
    failed_attempts: int = 0  # since failing_since
    retry_in: float = RETRY_MIN  # the committer's delay before its next attempt

    @property
    def ok(self) -> bool:
        return self.failing_since is None


class Stats:
    """What this mount has done: counts, latency samples, hot paths (for ``.rw/stats``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.samples: dict[str, list[float]] = {}
        self.paths: dict[bytes, int] = {}
        self.started = time.monotonic()

    def count(self, name: str, by: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + by

    def sample(self, name: str, seconds: float) -> None:
        got = self.samples.setdefault(name, [])
        got.append(seconds)
        if len(got) > 2000:  # keep the newest 1000
            del got[:1000]

    def commit(self, path: bytes) -> None:
        self.count("commits")
        self.paths[path] = self.paths.get(path, 0) + 1
        if len(self.paths) > 10_000:
            self.paths.clear()

    def report(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float:
            ordered = sorted(xs)
            return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 3)

        elapsed = max(time.monotonic() - self.started, 1e-9)
        hot = sorted(self.paths.items(), key=lambda kv: -kv[1])[:10]
        return {
            "since_mount_s": round(elapsed, 1),
            "counts": dict(sorted(self.counts.items())),
            "commits_per_second": round(self.counts.get("commits", 0) / elapsed, 3),
            "latency_ms": {
                name: {"n": len(xs), "p50": pct(xs, 0.5), "p99": pct(xs, 0.99)}
                for name, xs in sorted(self.samples.items())
                if xs
            },
            "hot_paths": [{"path": fsdecode(p), "commits": n} for p, n in hot],
        }


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
            self.trail.wrote(off)
        elif end >= TRAIL_FROM and self.limit >= 0:
            self.trail = TrailingHash(self.fd)


@dataclass(eq=False)
class Commit:
    """A sealed stage queued for the group committer."""

    path: bytes
    stage: Stage
    intended: str | None  # None: the batch deletes the file (stage unused)
    size: int
    info: dict[str, Any]
    owner: Any = None  # the caller's handle on the file (the FUSE layer's inode)
    id: str = field(default_factory=unique_id)
    done: trio.Event = field(default_factory=trio.Event)  # settled and recorded
    # Set once the commit cannot be lost (stage synced, receipt in LMDB, renamed): a
    # writer waiting in fsync goes on then, while the commit record is written.
    durable: trio.Event = field(default_factory=trio.Event)
    outcome: str = ""  # committed | landed | conflict | error
    error: RwfsError | None = None
    new_ino: int = 0
    spare: bytes | None = None  # the replaced empty file, linked into staging (``_spare``)
    # Its bytes are kept as an object and its stage is to go (a conflict, a landed commit,
    # a path that is no longer a file): dropped by ``settle`` on the loop, never by the
    # committer's thread, because until then the FUSE layer may still read the stage.
    discard: bool = False
    lsn: int = 0
    batch: str | None = None  # an explicit batch's name (batches.py); None: a batch of one
    held: bool = False  # held by an open batch: not queued, the tree waits for its commit
    # Other names the writer's inode is known by (hard links): where ``_write_in_place``
    # looks first for the names a commit in place changes too.
    aliases: tuple[bytes, ...] = ()
    # The file had other names when it was sealed (hard links), known to the inode table
    # or not: a rename of a directory waits for it (``Files.rename``), since the names it
    # journals (``links``) are found in the tree when it lands, and must be the names the
    # file had at its place in the journal.
    linked: bool = False
    # The replace step ran (``outcome`` is decided) but the commit record could not be
    # written: a retry of its group only records it.
    replaced: bool = False
    settled: bool = False  # ``Workspace.settle`` ran: the FUSE layer knows the outcome
    # Its success was shown as its writer's call returned (``Files.on_written``), before
    # its record: the record only adds its LSN to ``.rw/why/``.
    shown: bool = False
    failed: int = 0  # attempts of its group that failed (the journal could not commit)
    wake: trio.Event = field(default_factory=trio.Event)  # set on durable, done or a failure
    # A rename moved the file while this commit was queued (``Files.rename``): ``path`` is
    # where the tree has the file now, ``journal_path`` where it was written (its event's
    # path: the journal tells the write, then the rename, as they happened).
    journal_path: bytes | None = None
    # A rename over the file, or its unlink, took it away while this commit was queued:
    # its bytes were the mount's at ``path`` until then, so they are kept as an object;
    # the tree is not touched.
    superseded: bool = False
    taking: int = -1  # ``Workspace._takings`` when it was queued (``Workspace.movable``)

    def finish(self) -> None:
        """Settled and recorded: wake whoever waits for it, durable or done."""
        self.durable.set()
        self.done.set()
        self.nudge()

    def nudge(self) -> None:
        """Wake whoever waits for this commit (``Workspace.submit``) to look at it again."""
        woken, self.wake = self.wake, trio.Event()
        woken.set()


@dataclass(eq=False)
class Event:
    """A namespace event queued for the journal."""

    event: dict[str, Any]
    incoming: bytes | None = None  # removed bytes adopted into the object store
    hash_fd: int | None = None  # an open file whose digest becomes event["intended"]
    id: str = ""
    lsn: int = 0  # once recorded
    settled: bool = False  # its digests are in ``event`` (``_settle_event_digests``)
    carried: tuple[Commit, ...] = ()  # a rename's: the queued commits it moved (``carries``)


class Workspace:
    def __init__(self, root_fd: int, state_fd: int, store: Store, policy: Policy) -> None:
        self.root_fd = root_fd
        self.state_fd = state_fd
        self.store = store
        self.policy = policy
        # Where the mount shows the workspace (the daemon sets it): paths an envelope gives
        # a writer to open resolve from any directory through it.
        self.mountpoint: str | None = None
        self.objects = ObjectStore(state_fd)
        self.reserve = Reserve(state_fd)
        self.reserve.make()
        try:
            os.mkdir(b"staging", 0o700, dir_fd=state_fd)
        except FileExistsError:
            pass
        self.staging_fd = os.open(b"staging", os.O_RDONLY | os.O_DIRECTORY, dir_fd=state_fd)
        self.intents: IntentLog | None = None
        # (st_dev, st_ino) -> (stat signature, digest): a file is rehashed only when changed.
        self._digests: dict[tuple[int, int], tuple[tuple[int, int, int], str]] = {}
        # Hard links (other_names): each file's names last found, and the link count at
        # which the whole tree was last walked for them.
        self._links_seen: dict[tuple[int, int], set[bytes]] = {}
        self._walked: dict[tuple[int, int], int] = {}
        self._queue: list[Commit | Event] = []
        self._takings = 0  # how many times a group took the queue (``Commit.taking``)
        self._has_work = trio.Event()
        self._urgent = trio.Event()
        self._taken = trio.Event()  # set when a group takes the queue (QUEUE_MAX)
        self.commit_lock = trio.Lock()  # one writer of the tree's commits at a time
        self._closing = False
        self._inflight: list[Commit | Event] = []  # the group being applied
        # The group applied last, whose records wait to join the next group's receipts
        # (one durable LMDB transaction for both, ``_apply_group``): its items, its
        # intent-log generations.
        self._unrecorded: tuple[list[Commit | Event], list[int]] | None = None
        # Not None while it is not synced either (the next group's syncfs covers it): the
        # staging names dropped meanwhile, unlinked after that sync (``drop_stage``).
        self._unsynced: list[bytes] | None = None
        self._budget: dict[tuple[bytes, str], int] = {}  # retries left per (path, refused bytes)
        self.allowances = Allowances()  # deliberate changes, let through once (allowances.py)
        self._spares: collections.deque[bytes] = collections.deque()  # staging names (_spare)
        self.stats = Stats()
        self.journal = JournalState()
        # A group the journal could not take, tried again before anything newer, with the
        # intent-log generations that hold its records: while it fails, no generation is
        # added for it (nothing else of the queue is taken meanwhile).
        self._retry: list[Commit | Event] = []
        self._retry_gens: list[int] = []
        self.recovery_left: list[str] = []  # what recovery at this mount left unsettled
        self.on_committed: Callable[[Commit], None] = lambda c: None  # settled
        self.on_recorded: Callable[[Commit], None] = lambda c: None  # and its record written
        self.on_gone: Callable[[bytes], None] = lambda path: None  # rwfs removed a path

    def unsettled(self) -> list[Commit]:
        """Commits sealed but not yet recorded (queued, in the group being applied, in the
        group applied last whose records wait for the next, or in a group the journal
        could not take)."""
        applied = self._unrecorded[0] if self._unrecorded else []
        items = (*applied, *self._inflight, *self._retry, *self._queue)
        return [c for c in items if isinstance(c, Commit)]

    def unrecorded_digests(self) -> set[str]:
        """Digests that items not yet recorded name (their objects may not be journaled
        yet): what a collection that runs before they are recorded must keep."""
        applied = self._unrecorded[0] if self._unrecorded else []
        out: set[str | None] = set()
        for item in (*applied, *self._inflight, *self._retry, *self._queue):
            if isinstance(item, Commit):
                out |= {item.stage.expected, item.intended}
            else:
                out |= {item.event.get("expected"), item.event.get("intended")}
        return {d for d in out if d}

    def is_queued(self, commit: Commit) -> bool:
        return any(item is commit for item in (*self._retry, *self._queue))

    def movable(self, commit: Commit) -> bool:
        """Whether a rename may move (or replace) the file of this queued commit without
        waiting for it: no group has taken it, and its intent record is in the generation
        the rename's will be written to (recovery reads them together)."""
        return (
            self.journal.ok
            and not self._retry
            and not commit.info.get("wait")
            and commit.taking == self._takings  # (in ``_queue``: no group took it yet)
        )

    @property
    def queued(self) -> int:
        """Items waiting for the journal: commits and namespace events."""
        return len(self._queue) + len(self._retry)

    @property
    def journal_ok(self) -> bool:
        return self.journal.ok

    def owed_commits(self) -> int:
        """Commits acknowledged or applied to the tree whose record is not in the journal."""
        return sum(1 for c in self.unsettled() if not c.done.is_set())

    def journal_status(self) -> dict[str, Any]:
        """The journal's side of ``.rw/status``."""
        j = self.journal
        return {
            "ok": j.ok,
            "failing_since": j.failing_since,
            "last_error": j.last_error,
            "last_failure": j.last_failure,
            "failed_attempts": j.failed_attempts,
            "queued_commits": self.owed_commits(),
            "next_retry_s": None if j.ok else j.retry_in,
        }

    def journal_refused(self, path: bytes) -> RwfsError:
        """A new commit refused because the journal cannot commit (SPEC §7.2)."""
        j, n = self.journal, self.owed_commits()
        return RwfsError(
            errno.EIO,
            "journal_unavailable",
            "journal",
            f"The journal cannot commit since {j.failing_since} ({j.last_error}), so rwfs "
            "refused this commit: nothing was written and the file keeps its previous "
            f"bytes; {n} earlier commits are queued and rwfs keeps retrying them. Free space "
            "on the filesystem that holds WORKSPACE/.rw/journal (or fix the device), wait "
            "until .rw/status shows the journal ok, then write the file again.",
            path=fsdecode(path),
            suggested_action="free disk space for .rw/journal, then write the file again",
            details={"failing_since": j.failing_since, "last_error": j.last_error, "queued": n},
        )

    def journal_queued(self, path: bytes) -> RwfsError:
        """A writer that waits for durability (fsync, strict close, sync) of commits the
        journal cannot take now: they stay queued and are not lost (SPEC §7.2)."""
        j, n = self.journal, self.owed_commits()
        what = (
            "this file's commit is not durable yet: it stays queued (the intent log keeps "
            "it), the mount shows its new bytes and the tree still holds the previous ones"
            if path
            else f"the {n} commits queued are not durable yet: they stay queued (the intent "
            "log keeps them) and the mount shows their new bytes"
        )
        return RwfsError(
            errno.EIO,
            "journal_unavailable",
            "journal",
            f"The journal cannot commit since {j.failing_since} ({j.last_error}), so {what}; "
            "rwfs commits them when the journal can write again, or the next mount does. "
            "Free space on the filesystem that holds WORKSPACE/.rw/journal (or fix the "
            "device), then fsync again or write sync to .rw/ctl to confirm.",
            path=fsdecode(path),
            suggested_action="free disk space for .rw/journal, then write sync to .rw/ctl",
            details={"failing_since": j.failing_since, "last_error": j.last_error, "queued": n},
        )

    def open_intents(self) -> None:
        """Start a fresh intent-log generation (after recovery has read the old ones)."""
        self.intents = IntentLog(self.state_fd)
        self.intents.start(self.store.meta_int(b"applied_gen"))

    # ---- digests (blocking: call in a thread) ----

    def digest_of_fd(self, fd: int, st: os.stat_result | None = None) -> str:
        """The digest of an open file, from the cache when its stat says it is unchanged."""
        st = st or os.fstat(fd)
        hit = self._digests.get((st.st_dev, st.st_ino))
        if hit is not None and hit[0] == _signature(st):
            return hit[1]
        digest, _ = digest_fd(fd)
        self._remember(st, digest)  # the stat taken before the bytes were read
        return digest

    def _remember(self, st: os.stat_result, digest: str) -> None:
        """Cache a digest under the stat its bytes were read after. Not when the file
        changed within RACY_NS of now: a change in the same timestamp tick as the last one
        leaves (size, mtime, ctime) as they were, and the cache would then vouch for bytes
        the file no longer holds (git calls such entries "racily clean")."""
        if time.time_ns() - st.st_ctime_ns < RACY_NS:
            return
        self._digests[(st.st_dev, st.st_ino)] = (_signature(st), digest)
        if len(self._digests) > 200_000:
            self._digests.clear()

    def live_digest(self, path: bytes) -> tuple[str | None, os.stat_result | None]:
        """(digest, stat) of the live file at ``path``; (None, None) when absent, and
        (None, stat) for anything but a regular file, which is not opened
        (``objects.open_regular``). ``beneath.Escape`` if a directory on the path is a
        symlink."""
        try:
            return self._live_at(self.root_fd, rel(path))
        except TooLarge:
            raise TooLarge(errno.EFBIG, "past max_journaled_bytes", fsdecode(path)) from None

    def _live_at(self, dir_fd: int, name: bytes) -> tuple[str | None, os.stat_result | None]:
        try:
            fd, st = open_regular(dir_fd, name)
        except FileNotFoundError:
            return None, None
        if fd < 0:
            return None, st
        try:
            if st.st_size > self.policy.max_journaled_bytes:
                # An unjournaled file (passthrough by size): never hashed whole, so that a
                # verb over a sparse file of terabytes costs what a small one does.
                raise TooLarge(errno.EFBIG, "past max_journaled_bytes", fsdecode(name))
            return self.digest_of_fd(fd, st), st
        finally:
            os.close(fd)

    async def keep_removed(self, path: bytes, st: os.stat_result) -> bytes:
        """Keep the bytes of the file at ``path`` before an unlink or a rename removes
        that name: its inode goes into ``objects/incoming`` (hashed with the group), or,
        for a hard-linked file whose other names go on changing it in place, a copy made
        in a worker thread. Returns the incoming name."""
        if st.st_nlink == 1:
            with beneath.parent(self.root_fd, path) as (d, name):
                return self.objects.adopt(d, name)

        def copy() -> bytes:
            with beneath.parent(self.root_fd, path) as (d, name):
                return self.objects.adopt_copy(d, name)

        return await trio.to_thread.run_sync(copy, limiter=_LIMIT)

    # ---- stages ----

    async def new_stage(self, source_fd: int, truncate: bool, expected: str | None = None) -> Stage:
        """A stage for the file behind ``source_fd``: its bytes (or none, if truncating).
        ``expected``: their digest, when the caller knows it (a queued commit's stage)."""
        if os.fstat(source_fd).st_size == 0 or (truncate and expected is not None):
            # Nothing to copy or hash (a new file's first write, an O_TRUNC create or
            # rewrite): a few metadata calls, cheaper here than a worker-thread hop.
            return self._new_stage(source_fd, truncate, expected)
        with borrowed(source_fd) as (src,):
            return await trio.to_thread.run_sync(
                self._new_stage, src, truncate, expected, limiter=_LIMIT
            )

    def _new_stage(self, source_fd: int, truncate: bool, known: str | None = None) -> Stage:
        fd, name = self._take_spare()
        if fd < 0:
            name = unique_id().encode()
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(name, flags, 0o600, dir_fd=self.staging_fd)
        try:
            st = os.fstat(source_fd)
            copy_metadata(source_fd, fd, st)
            with quiet_reader(source_fd) as src:
                if truncate:
                    expected = known or self.digest_of_fd(src)
                else:
                    expected, _ = copy_fd(src, fd)
                    # So the commit's check of the live file rarely reads it again.
                    self._remember(st, expected)
            keep_atime(fd, st)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=self.staging_fd)
            raise
        return Stage(fd, name, expected, limit=self.policy.max_journaled_bytes)

    # An empty file replaced by its first commit (a new file's placeholder) is linked into
    # the staging area and becomes a later stage, instead of being freed while another
    # inode is allocated for the stage. Inode allocation is the cost of a new file: on ext4
    # without a journal it scans past every inode freed in the last minutes (it avoids
    # reusing them), so a tree of new files freeing one inode each slowed every create.

    def _spare_link(self, dir_fd: int, path: bytes, st: os.stat_result) -> bytes | None:
        """Before the rename over ``path`` (in ``dir_fd``): keep its empty inode (not kept as an object, no
        other name) as a spare, under a name of its own in staging (committer thread)."""
        if st.st_nlink != 1 or len(self._spares) >= SPARES_MAX:
            return None
        name = unique_id().encode()
        try:
            os.link(
                path, name, src_dir_fd=dir_fd, dst_dir_fd=self.staging_fd, follow_symlinks=False
            )
        except OSError:
            return None
        return name

    def _spare(self, c: Commit) -> None:
        """Pool a committed commit's spare, once the FUSE layer has taken the commit in and
        closed its descriptor of the replaced inode (so only commits with an owner make
        spares: rwfs's own writes may leave an inode's old descriptor open). A spare left in
        staging at a crash is removed by recovery like any orphaned stage."""
        assert c.spare is not None
        if c.outcome == "committed":
            self._spares.append(c.spare)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(c.spare, dir_fd=self.staging_fd)
        c.spare = None

    def _take_spare(self) -> tuple[int, bytes]:
        """(descriptor, name) of a spare, empty and with no xattrs left; (-1, b"") when there
        is none (worker thread: the deque is safe across threads). Its old times need no
        reset: a stage is only made to be written or truncated, which sets its mtime (an
        ``O_TRUNC`` open of an empty stage sets it itself: ``fs.open``), and every commit
        reads it to hash it, which then sets its atime."""
        while True:
            try:
                name = self._spares.popleft()
            except IndexError:
                return -1, b""
            try:
                fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.staging_fd)
            except OSError:
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0:
                for attr in os.listxattr(fd):
                    with contextlib.suppress(OSError):
                        os.removexattr(fd, attr)
                self.stats.count("spares_reused")
                return fd, name
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.staging_fd)

    async def empty_stage(self, mode: int, uid: int, gid: int) -> Stage:
        """A stage for a file that does not exist yet (one a batch creates)."""

        def make() -> Stage:
            name = unique_id().encode()
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(name, flags, 0o600, dir_fd=self.staging_fd)
            if os.geteuid() == 0:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            return Stage(fd, name, None, limit=self.policy.max_journaled_bytes)

        return await trio.to_thread.run_sync(make, limiter=_LIMIT)

    def keep_live_copy(self, path: bytes, digest: str) -> None:
        """Keep an object of ``digest`` copied from the live file at ``path``, if rwfs has
        none and that file (a regular one) holds those bytes now. Blocking: for a worker
        thread, or recovery."""
        if self.objects.exists(digest):
            return
        try:
            fd, _ = open_regular(self.root_fd, rel(path))
        except OSError:
            return
        if fd < 0:
            return
        try:
            if self.digest_of_fd(fd) == digest:
                self.objects.keep_fd_copy(fd, digest)
        finally:
            os.close(fd)

    def retire_draft(self, stage: Stage, digest: str | None) -> None:
        """A batch's draft that a newer one replaced: dropped, or, with ``stale_write =
        "conflict"``, moved (not copied) into the object store, where gc finds it unless a
        conflict refers to it: a process that read it may still write a stale update, and
        that conflict's merge needs it as the base."""
        if self.policy.stale_write != "conflict" or digest is None or stage.fd < 0:
            self.drop_stage(stage)
            return
        if stage.trail is not None:
            stage.trail.stop()
            stage.trail = None
        os.close(stage.fd)
        stage.fd = -1
        try:
            self.objects._place(self.staging_fd, stage.name, digest, move=True)
        except FileNotFoundError:
            pass

    def drop_stage(self, stage: Stage) -> None:
        if stage.trail is not None:
            stage.trail.stop()
            stage.trail = None
        if stage.fd < 0:  # a deletion's, or one whose file was already dropped
            return
        os.close(stage.fd)
        stage.fd = -1
        if self._unsynced is not None:
            # A group's renames and links wait for the next group's syncfs: a name that
            # may hold the only durable copy of bytes (an in-place write's source, a kept
            # version's stage) goes after it (``_attempt``).
            self._unsynced.append(stage.name)
            return
        self._unlink_stage(stage.name)

    def _unlink_stage(self, name: bytes) -> None:
        try:
            os.unlink(name, dir_fd=self.staging_fd)
        except FileNotFoundError:
            pass

    async def seal(
        self, stage: Stage, gate: tuple[bytes, int] | None = None
    ) -> tuple[str, int, list[gates.Finding]]:
        """Hash a stage: (intended digest, size, findings). With ``gate`` = (path, the
        base's descriptor) the gates run too if the bytes changed, in the same worker-thread
        hop: a small file's commit is mostly hops, so this is one less. A small stage is
        sealed on the loop, with no hop at all, when its gates are quick too
        (SEAL_ON_LOOP, GATES_ON_LOOP)."""
        # atomic: the caller set stage.sealed before this await, so no write can slip in.
        trail, stage.trail = stage.trail, None

        def work(stage_fd: int, base_fd: int) -> tuple[str, int, list[gates.Finding]]:
            got = trail.finish() if trail is not None else None
            if got is None:
                got = digest_fd(stage_fd)
            else:
                self.stats.count("trailing_hashes")
            if gate is None or got[0] == stage.expected:
                return (*got, [])
            return (*got, self._run_gates(gate[0], base_fd, stage_fd, stage.cut_last))

        with quiet_reader(gate[1] if gate is not None else -1) as base:
            if trail is None and os.fstat(stage.fd).st_size <= SEAL_ON_LOOP:
                if base < 0 or (gate is not None and self._quick_gates(gate[0], base, stage.fd)):
                    return work(stage.fd, base)
            with borrowed(stage.fd, base) as (stage_fd, base_fd):
                return await trio.to_thread.run_sync(work, stage_fd, base_fd, limiter=_LIMIT)

    # ---- gates ----

    async def run_gates(
        self, path: bytes, base_fd: int, new_fd: int, cut: bool = False
    ) -> list[gates.Finding]:
        """The gates' findings on new bytes (a sealed stage, a file renamed onto ``path``)
        against the bytes they replace. ``cut``: their last change is an explicit
        truncation by the caller (``Stage.cut_last``; ``gates.check``)."""
        if self._quick_gates(path, base_fd, new_fd):
            return self._run_gates(path, base_fd, new_fd, cut)
        with borrowed(base_fd, new_fd) as (base, new):
            return await trio.to_thread.run_sync(
                self._run_gates, path, base, new, cut, limiter=_LIMIT
            )

    def _quick_gates(self, path: bytes, base_fd: int, new_fd: int) -> bool:
        """Whether the gates of these bytes cost less than a thread hop (GATES_ON_LOOP)."""
        if os.fstat(new_fd).st_size > GATES_ON_LOOP:
            return False
        if base_fd < 0:
            return True
        size = os.fstat(base_fd).st_size
        return size <= GATES_ON_LOOP and parsers.quick(path, lambda: os.pread(base_fd, size, 0))

    def _run_gates(
        self, path: bytes, base_fd: int, stage_fd: int, cut: bool = False
    ) -> list[gates.Finding]:
        t = time.perf_counter()
        limit = gates.MAX_GATED_BYTES + 1
        if os.fstat(stage_fd).st_size >= limit or (
            base_fd >= 0 and os.fstat(base_fd).st_size >= limit
        ):
            return []  # gates leave large files alone: no need to read them
        old = os.pread(base_fd, limit, 0) if base_fd >= 0 else b""  # -1: a new file
        new = os.pread(stage_fd, limit, 0)
        findings = gates.check(path, old, new, self.policy.gate, cut=cut)
        self.stats.sample("gates", time.perf_counter() - t)
        for f in findings:
            self.stats.count(f"gate.{f.gate}.{'refused' if f.action == 'reject' else 'warned'}")
        return findings

    def prime(self, path: bytes) -> None:
        """In a worker thread: parse a file the way its next commit will (see
        ``parsers.prime``), so that commit's syntax gate parses only around the edit."""
        try:
            fd, _ = open_regular(self.root_fd, rel(path))  # never a FIFO's or a device's
        except OSError:
            return
        if fd < 0:
            return
        try:
            data = os.pread(fd, gates.MAX_GATED_BYTES + 1, 0)
        finally:
            os.close(fd)
        if parsers.prime(path, data):
            self.stats.count("gates.primed")

    def let_through(
        self,
        path: bytes,
        who: dict[str, Any],
        findings: list[gates.Finding],
        taken: Allowance | None = None,
    ) -> tuple[list[gates.Finding], Allowance | None]:
        """Where gate findings become a refusal: the writer's allowance of ``path``, if it
        has one, is used up by this commit and waives what it may (allowances.py). Returns
        the findings left and the allowance used (its ``record()`` goes in the commit's
        event as ``allowed``). ``taken``: one this same operation used already (a rename
        gated again), applied again without taking another."""
        if taken is None:
            uid = writer_uid(who)
            if uid is None or not waivable(findings):
                return findings, None  # rwfs's own write; or refused for a secret anyway
            taken = self.allowances.take(uid, path)
            if taken is None:
                return findings, None
            self.stats.count("allowed")
        taken.waived = []
        return waive(findings, taken), taken

    async def refuse(
        self,
        path: bytes,
        draft_fd: int,
        expected: str | None,
        intended: str,
        findings: list[gates.Finding],
        info: dict[str, Any],
    ) -> RwfsError:
        """Keep a refused draft, journal the refusal, and say so to the writer (SPEC §4.2-4.3)."""
        async with self.exclusive():  # the draft and its event, together, for gc
            with borrowed(draft_fd) as (fd,):
                await trio.to_thread.run_sync(
                    self.objects.keep_fd_copy, fd, intended, limiter=_LIMIT
                )
            key = (path, intended)
            left = max(self._budget.get(key, self.policy.retry_budget + 1) - 1, 0)
            self._budget[key] = left
            if len(self._budget) > 10_000:
                self._budget.clear()
            first = next(f for f in findings if f.action == "reject")
            draft_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + intended[7:15]
            # Through the mount, absolute: it resolves from the writer's directory, whatever
            # it is (the envelope's ``draft`` stays relative to the workspace's top).
            draft = os.path.join(self.mountpoint or "", ".rw", "rejected", draft_id)
            name = fsdecode(path)
            item = self.record(
                {
                    "op": "refuse",
                    "path": name,
                    "batch": None,
                    "gate": first.gate,
                    # (the gate's own words: each refusal keeps its reason, run.py's summary)
                    "message": first.message,
                    "expected": expected,
                    "intended": intended,
                    "draft": draft_id,
                    "retry_budget": left,
                    # (uid, gid: the draft is its writer's, .rw/rejected/ shows it so)
                    **{k: info[k] for k in ("pid", "comm", "uid", "gid", "session") if k in info},
                }
            )
        # The refusal's LSN, for the envelope: an agent can tell its own refusal from an
        # older one. (Not when the journal is failing: the event waits in the queue.)
        with contextlib.suppress(RwfsError, JournalUnavailable):
            await self.sync()
        allow = None
        if not waivable(findings):  # a secret: re-applying the same edit would bring it back
            todo = (
                "take the secret out of the text, or keep it in .rw/scratch/, outside the "
                f"tree, and write the file again; your draft is at {draft}"
            )
        else:
            # A deliberate change has a way through (allowances.py), named at every such
            # refusal: the gates cannot tell it from an accident, the writer can.
            allow = allow_hint(name, f".rw/rejected/{draft_id}", self.mountpoint)
            deliberate = (
                f"if the change is deliberate, allow it with {allow['command']} and write "
                f"it again (to write your draft: {allow['then']})"
            )
            if left > 0:
                todo = f"read {name} again and re-apply your edit in full, or, {deliberate}"
            else:
                todo = (
                    f"this same text has been refused before: {deliberate}; otherwise change "
                    "strategy (for example, write the complete file or a smaller edit) instead "
                    "of retrying"
                )
            todo += f"; your draft is at {draft}"
        return RwfsError(
            getattr(errno, self.policy.refusal_errno),
            "blocked",
            first.gate,
            f"Your write to {name} was refused because {first.message}; the file is unchanged "
            f"from before your edit: {todo}.",
            path=name,
            suggested_action=todo,
            retry_budget=left,
            draft=f".rw/rejected/{draft_id}",
            draft_path=draft,
            expected=expected,
            intended=intended,
            details={**first.details, "gates": [f.gate for f in findings]},
            lsn=item.lsn or None,
            batch=None,
            pid=info.get("pid"),
            comm=info.get("comm"),
            uid=info.get("uid"),
            gid=info.get("gid"),
            **({"allow": allow} if allow is not None else {}),
        )

    async def stale_conflict(
        self,
        path: bytes,
        stage: Stage,
        intended: str,
        read: str | None,
        info: dict[str, Any],
        actual: tuple[str | None, int],
        batch: str | None = None,
        read_fd: int = -1,
    ) -> RwfsError:
        """Refuse a lost update (policy ``stale_write = "conflict"``): the writer's bytes are
        kept, a conflict is opened with what it read as the base, and ESTALE says so.

        ``actual`` is what the mount shows of the file, (digest, descriptor), kept as an
        object too: the tree may not hold it (an open ``batch``'s draft, a commit still
        queued). The bytes the writer read are kept from ``read_fd`` (a file replaced
        since it read it) or else from the tree, if they are not kept yet (a batch's
        base)."""
        name = fsdecode(path)
        shown = actual[0]

        def write(txn: Any) -> int:
            ev: dict[str, Any] = {
                "op": "conflict",
                "path": name,
                "batch": batch,
                "expected": read,
                "intended": intended,
                "actual": shown,
                "reason": "stale_write",
                **{k: info[k] for k in ("pid", "comm", "uid", "session") if k in info},
            }
            lsn = txn.append_event(ev)
            for digest in {intended, read, shown}:
                if digest is not None and self.objects.exists(digest):
                    txn.add_object(digest, 0, lsn)
            return int(
                txn.new_conflict(
                    {
                        "path": name,
                        "batch": batch,
                        "lsn": lsn,
                        "expected": read,
                        "intended": intended,
                        "actual": shown,
                        "reason": "stale_write",
                    }
                )
            )

        def keep(stage_fd: int, shown_fd: int) -> None:
            self.objects.keep_fd_copy(stage_fd, intended)
            if shown is not None and shown_fd >= 0:
                self.objects.keep_fd_copy(shown_fd, shown)
            if read is not None and read_fd >= 0:
                self.objects.keep_fd_copy(read_fd, read)
            if read is not None:
                self.keep_live_copy(path, read)

        async with self.exclusive():  # the bytes and what refers to them, together, for gc
            with borrowed(stage.fd, actual[1]) as (fd, shown_fd):
                await trio.to_thread.run_sync(keep, fd, shown_fd, limiter=_LIMIT)
            cid = await trio.to_thread.run_sync(self.store.write, write, limiter=_LIMIT)
        return RwfsError(
            errno.ESTALE,
            "stale_precondition",
            "stale_write",
            f"Your write to {name} was refused because another process changed the file after "
            f"you read it, and your bytes would erase that change; the file is unchanged: read "
            f"it again and re-apply your edit (your bytes and a merge are in .rw/conflicts/{cid}/).",
            path=name,
            expected=read,
            intended=intended,
            actual=shown,
            batch=batch,
        )

    async def digest(self, fd: int) -> str:
        """A file's digest (from the cache when its stat is unchanged), off the loop."""
        with borrowed(fd) as (dup,):
            return await trio.to_thread.run_sync(self.digest_of_fd, dup, limiter=_LIMIT)

    async def submit(self, commit: Commit, wait: bool) -> Commit:
        """Queue a sealed commit; in strict mode (or ``wait``) return once it is durable.

        While the journal cannot commit, a new commit is refused (EIO, nothing written):
        the commits already acknowledged go first, and the writer is told at once rather
        than after commits that cannot land. A writer that waits and whose group then
        fails gets EIO too, and its commit is dropped (``_fail_group``)."""
        if not self.journal.ok:
            if self._retry:
                raise self.journal_refused(commit.path)
            # Nothing acknowledged is owed: see whether LMDB commits again.
            try:
                await trio.to_thread.run_sync(self._probe_journal, limiter=_LIMIT)
            except Exception as exc:
                self._failed_attempt(str(exc))
                raise self.journal_refused(commit.path) from None
            self._journal_back()
        while commit.owner is not None and len(self._queue) >= QUEUE_MAX:
            # A writer through the mount (rwfs's own commits may hold commit_lock here).
            self._urgent.set()
            await self._taken.wait()
        wait = wait or self.policy.durability == "strict"
        commit.info["wait"] = wait
        if not wait:
            # Acknowledged before it is durable: the intent log keeps it from a crash of
            # the daemon. A writer that waits is answered only once it is durable (the
            # receipt prepared), so it needs no record here: a crash before that leaves an
            # orphan stage, and the writer never saw success.
            assert self.intents is not None
            self.intents.append(
                {
                    "kind": "commit",
                    "id": commit.id,
                    "path": fsdecode(commit.path),
                    "stage": commit.stage.name.decode(),
                    "expected": commit.stage.expected,
                    "intended": commit.intended,
                    "size": commit.size,
                    "info": commit.info,
                }
            )
        faults.point("after_seal")
        self._enqueue(commit)
        if wait:
            self._urgent.set()
            # rwfs's own writes (no owner: a verb, a resumed batch) wait for the record
            # and for the FUSE layer's view of them to be updated.
            target = commit.durable if commit.owner is not None else commit.done
            while not target.is_set():
                if commit.failed:  # applied, but its record could not be written: queued
                    raise self.journal_queued(commit.path)
                await commit.wake.wait()
            if commit.error is not None:
                raise commit.error
            if commit.outcome == "conflict":
                raise conflict_error(commit)
        return commit

    def announce(
        self, event: dict[str, Any], incoming: bytes | None = None, done: bool = False
    ) -> Event:
        """Log a namespace operation before it touches the tree (see ``confirm``/``cancel``);
        with ``done``, one that already happened, in the same record (see ``record``).

        Recovery applies a logged operation that was confirmed, skips one that was
        cancelled, and for one in flight at the crash checks the tree (recovery.py).
        """
        assert self.intents is not None
        item = Event({"ts": now_iso(), **event}, incoming)
        item.id = unique_id()
        rec: dict[str, Any] = {
            "kind": "event",
            "id": item.id,
            "event": item.event,
            "incoming": incoming and incoming.decode(),
        }
        self.intents.append({**rec, "done": True} if done else rec)
        return item

    @contextlib.contextmanager
    def operation(
        self,
        journaled: bool,
        who: dict[str, Any],
        op: str,
        path: bytes,
        incoming: bytes | None = None,
        **extra: Any,
    ) -> Iterator[dict[str, Any]]:
        """Journal a namespace operation around its syscall: announced before, confirmed
        after, cancelled if it raised. The caller may set ``hash_fd`` in the yielded dict
        (an open file whose digest becomes the event's ``intended``)."""
        if not journaled:
            yield {}
            return
        ev = {"op": op, "path": fsdecode(path), "batch": None, **extra, **who}
        item = self.announce({k: v for k, v in ev.items() if v is not None}, incoming)
        late: dict[str, Any] = {}
        try:
            yield late
        except BaseException:
            self.cancel(item)
            raise
        item.carried = tuple(late.get("carried", ()))
        self.confirm(item, late.get("hash_fd"))

    def confirm(self, item: Event, hash_fd: int | None = None) -> None:
        """The announced operation succeeded: journal it."""
        assert self.intents is not None
        faults.point("after_namespace_op")
        self.intents.append({"kind": "done", "id": item.id})
        item.hash_fd = hash_fd
        self._enqueue(item)

    def cancel(self, item: Event) -> None:
        """The announced operation failed and changed nothing."""
        assert self.intents is not None
        self.intents.append({"kind": "cancel", "id": item.id})

    def record(self, event: dict[str, Any]) -> Event:
        """Journal an event that changes nothing in the tree (e.g. a noop), or a change
        already applied (a setattr): one intent record, announced and done at once."""
        item = self.announce(event, done=True)
        self._enqueue(item)
        return item

    def _enqueue(self, item: Commit | Event) -> None:
        if isinstance(item, Commit):
            item.taking = self._takings
        self._queue.append(item)
        self._has_work.set()
        if len(self._queue) >= QUEUE_URGENT:
            self._urgent.set()

    def _probe_journal(self) -> None:
        self.store.write(lambda txn: txn.set_meta_int(b"probe", 1))

    def _failed_attempt(self, why: str) -> None:
        j = self.journal
        j.last_failure = now_iso()
        j.last_error = why
        j.failed_attempts += 1
        if j.failing_since is None:
            j.failing_since, j.retry_in = j.last_failure, RETRY_MIN
            log.error("the journal cannot commit: %s (%d commits queued)", why, self.owed_commits())
        else:
            j.retry_in = min(j.retry_in * 2, RETRY_MAX)
            if j.failed_attempts % 20 == 0:
                log.error(
                    "the journal still cannot commit after %d attempts since %s: %s",
                    j.failed_attempts,
                    j.failing_since,
                    why,
                )

    def _journal_back(self) -> None:
        j = self.journal
        if j.failing_since is None:
            return
        log.warning(
            "the journal commits again (it failed %d times since %s: %s)",
            j.failed_attempts,
            j.failing_since,
            j.last_error,
        )
        self.journal = JournalState()

    async def sync(self) -> None:
        """Make everything queued so far durable; EIO (``journal_queued``) if the journal
        cannot: the queued commits stay queued."""
        self._urgent.set()
        await self.flush()
        if not self.journal.ok and (self._retry or self._queue):
            raise self.journal_queued(b"")

    async def settle_commit(self, c: Commit) -> None:
        """Wait until a queued commit is recorded; EIO (``journal_queued``) if the journal
        cannot record it now (it stays queued)."""
        if c.done.is_set():
            return
        self._urgent.set()
        await self.flush()  # after a group in progress, if any: it holds commit_lock
        if not c.done.is_set() and not self.journal.ok:
            raise self.journal_queued(c.path)
        await c.done.wait()

    # ---- the group committer ----

    async def run_committer(self) -> None:
        while True:
            if not self.journal.ok:
                # Try the failed group again (or probe LMDB) after a delay that doubles up
                # to RETRY_MAX; a sync, an fsync or an unmount tries at once on its own.
                await trio.sleep(self.journal.retry_in)
            else:
                # The group applied last is recorded with the next one's receipts if that
                # comes soon (an fsync after an fsync), else alone.
                with trio.move_on_after(RECORD_WAIT if self._unrecorded else math.inf):
                    await self._has_work.wait()
                if self._has_work.is_set() and not self._closing:
                    with trio.move_on_after(self.policy.commit_interval_ms / 1000):
                        await self._urgent.wait()
            await self.flush(recorded=self._closing or not self._has_work.is_set())
            if self._closing and not self._queue and not self._retry:
                return

    async def close(self, wait: float = CLOSE_WAIT) -> int:
        """Unmounted: flush the queue. While the journal fails, keep trying for ``wait``
        seconds; returns how many acknowledged commits are still not journaled (the intent
        log keeps them, and the next mount finishes them)."""
        self._closing = True
        self._has_work.set()
        deadline = trio.current_time() + wait
        while True:
            # The deadline bounds the retries of a failing journal, never a flush: what a
            # request still answering queued during a slow group (a loaded machine) is
            # flushed too, or the tree stays ahead of the journal until the next mount.
            with trio.CancelScope(shield=True):
                await self.flush()
            if self.journal.ok and not self._retry:
                if not self._queue:
                    break
                continue
            left_s = deadline - trio.current_time()
            if left_s <= 0:
                break
            await trio.sleep(min(self.journal.retry_in, left_s))
        if self.intents is not None and self.journal.ok and not self._queue and not self._retry:
            # What the last group left in the log is only what was cancelled since: a
            # clean unmount leaves nothing for the next mount (or fsck) to recover. Rotated
            # first: an operation still answering would append to the new generation.
            gen = self.intents.rotate()
            if self.intents.settled(gen):
                self.intents.drop(gen)
        left = self.owed_commits()
        if left:
            log.error(
                "%d acknowledged commits are not journaled at unmount (the journal cannot "
                "commit since %s: %s); the intent log keeps them and the next mount "
                "finishes them",
                left,
                self.journal.failing_since,
                self.journal.last_error,
            )
        return left

    async def flush(self, recorded: bool = True) -> None:
        """Commit what is queued as one group. With ``recorded``, return once every group
        is recorded (or kept for a retry); without, the last group's records may wait for
        the next group's receipts (``_unrecorded``): it is durable, applied and settled."""
        async with self.commit_lock:
            await self.flush_locked(recorded)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """``commit_lock``, with every group applied so far recorded: for whoever writes
        the journal besides the committer (a batch's commit, a kept object and its
        record), whose records must follow those of the groups before."""
        async with self.commit_lock:
            if self._unrecorded is not None:
                await self._attempt([], [])  # its records, alone
            yield

    async def flush_locked(self, recorded: bool = True) -> None:
        """``flush`` for a caller that holds ``commit_lock`` (e.g. gc: nothing may be kept
        as an object between this flush and its collection without being journaled)."""
        if self._urgent.is_set():
            # Only a set event is replaced: the committer may be waiting on this one (a
            # replaced one would never wake it, and a writer in fsync would wait for the
            # commit interval instead of this flush).
            self._urgent = trio.Event()
        if not self.journal.ok:
            # First what the journal could not take, in the generations that hold it.
            if self._retry:
                group, gens, self._retry, self._retry_gens = self._retry, self._retry_gens, [], []
                if not await self._attempt(group, gens):
                    return
            else:
                try:
                    await trio.to_thread.run_sync(self._probe_journal, limiter=_LIMIT)
                except Exception as exc:
                    self._failed_attempt(str(exc))
                    return
                self._journal_back()
        if self._queue:
            # atomic: take the queue and rotate the intent log together.
            group, self._queue = self._queue, []
            self._takings += 1
            self._taken.set()
            self._taken = trio.Event()
            self._has_work = trio.Event()
            assert self.intents is not None
            await self._attempt(group, [self.intents.rotate()], record=recorded)
        elif self._unrecorded is not None and recorded:
            await self._attempt([], [])  # records the group applied last, alone
        elif self._has_work.is_set():
            # Only a set event is replaced: the committer may be waiting on this one.
            self._has_work = trio.Event()

    async def _attempt(
        self, group: list[Commit | Event], gens: list[int], record: bool = True
    ) -> bool:
        """Apply one group whose records are in the intent-log generations ``gens``, with
        the records of the group applied before it (``_unrecorded``); True if both are
        journaled (this one's records, without ``record``, may wait for the next group).
        If not, what is owed is kept for a retry (``_retry``), except the writers that
        wait and whose commit nothing of was written (``_fail_group``)."""
        before, before_gens = self._unrecorded or ([], [])
        self._unrecorded = None
        self._inflight = [*before, *group]  # (still unsettled: renames wait for them)
        progress = {
            "prepared": False,
            "recorded_before": False,
            "recorded": False,
            "synced": False,  # this group and every one before it
        }
        started = time.perf_counter()
        try:
            await trio.to_thread.run_sync(
                self._apply_group,
                group,
                gens,
                progress,
                trio.lowlevel.current_trio_token(),
                (before, before_gens),
                record,
                self._unsynced is not None,
                limiter=_LIMIT,
            )
        except Exception as exc:  # LMDB or the disk failed: never let it stop the daemon
            self._inflight = []
            self._failed_attempt(str(exc))
            log.info("group commit of %d items failed: %s", len(group), exc)
            if progress["recorded_before"]:
                self._recorded(before)
            elif before:  # applied already: its retry writes only its records
                self._keep_for_retry(before, before_gens)
            if progress["prepared"] and self._unsynced is None:
                self._unsynced = []  # (it may have renamed: the retry syncs first)
            if not progress["prepared"]:
                group = self._fail_group(group, str(exc))  # nothing of it was written
            else:
                # Receipts are prepared and the tree holds the group's changes; only the
                # records are missing: the retry writes them. Meanwhile the FUSE layer
                # takes the outcome (the stage is the live file now).
                for item in group:
                    if isinstance(item, Commit) and not item.settled:
                        self.settle(item)
            if group:
                self._keep_for_retry(group, gens)
            elif self.intents is not None:
                for gen in gens:  # nothing of these generations is owed any more
                    if gen != self.intents.gen:
                        self.intents.drop(gen)
            return False
        self._inflight = []
        self._journal_back()
        if group:
            self.stats.count("groups")
            self.stats.sample("group_commit", time.perf_counter() - started)
        if progress["synced"]:
            self._synced()
        elif self._unsynced is None:
            self._unsynced = []  # this group's renames wait for the next group's syncfs
        self._recorded(before)
        for item in group:
            if isinstance(item, Commit) and not item.settled:
                self.settle(item)
        if progress["recorded"]:
            self._recorded(group)
        else:
            self._unrecorded = (group, gens)
        return True

    def _synced(self) -> None:
        """Every group applied so far is synced: the staging names dropped meanwhile go."""
        names, self._unsynced = self._unsynced or [], None
        for name in names:
            self._unlink_stage(name)

    def _recorded(self, group: list[Commit | Event]) -> None:
        """A group's records are in the journal: wake whoever waits for them."""
        for item in group:
            if isinstance(item, Commit):
                if item.outcome == "committed":
                    self.stats.commit(item.path)
                else:
                    self.stats.count(item.outcome)
                if not item.settled:
                    self.settle(item)
                item.finish()
                self.on_recorded(item)
        for item in group:
            if isinstance(item, Commit) and item.spare is not None:
                self._spare(item)

    def _keep_for_retry(self, group: list[Commit | Event], gens: list[int]) -> None:
        """The journal could not take the group: the next flush tries it again, after what
        was kept before it. Its waiting writers look again (``submit``)."""
        for item in group:
            if isinstance(item, Commit):
                item.failed += 1
                item.nudge()
        self._retry += group
        self._retry_gens += gens

    def _fail_group(self, group: list[Commit | Event], why: str) -> list[Commit | Event]:
        """Nothing of the group reached the tree or the journal. Writers waiting (strict,
        fsync) are told, and their commit goes (they were never told it succeeded);
        what was acknowledged is returned, to be retried."""
        retry: list[Commit | Event] = []
        for item in group:
            if isinstance(item, Commit) and item.info.get("wait"):
                item.outcome = "error"
                item.error = journal_unavailable(item.path, why)
                item.discard = True  # nothing was prepared: its stage goes
                self.settle(item)
                item.finish()
            else:
                retry.append(item)
        return retry

    def _apply_group(
        self,
        group: list[Commit | Event],
        gens: list[int],
        progress: dict[str, bool],
        loop: trio.lowlevel.TrioToken,
        before: tuple[list[Commit | Event], list[int]],
        record: bool,
        unsynced: bool,
    ) -> None:
        """Make a group durable: stages synced, receipts, renames, one round of syncs,
        commit records (thread). The records of ``before`` (the group applied last, not
        recorded) go in the receipts' transaction, after the syncfs of this group's stages
        that makes its renames durable too (``unsynced``: they are not yet), or with this
        group's records if it has no receipts. Without ``record``, this group's records
        and syncfs wait for the next group, unless it has no receipts (``progress`` says
        what was done).

        ``gens`` are the intent-log generations that hold the group's records (more than
        one for a retried group). A retried group's commits that were already replaced
        only get their records."""
        before_items, before_gens = before
        commits = [c for c in group if isinstance(c, Commit) and not c.replaced]
        t = time.perf_counter()
        if commits:
            if len(commits) > 8 or unsynced:
                # One round of syncs for the whole group, and for the renames of the
                # groups before it, which must be durable before their records.
                syncfs(self.staging_fd)
                unsynced = False
            else:
                for c in commits:
                    os.fsync(c.stage.fd)
            faults.point("after_stage_sync")
            t = self._step("group.stage_sync", t)

        linked = self.linked([c for c in commits if not c.superseded])

        def prepare(txn: Any) -> None:
            if before_items:  # (synced above): its records go first
                self._write_records(txn, before_items, before_gens)
            for c in commits:
                rid = txn.new_receipt(
                    {
                        "batch": None,
                        "path": fsdecode(c.path),
                        "expected": c.stage.expected,
                        "intended": c.intended,
                        "stage": c.stage.name.decode(),
                        "intent": c.id,
                        **({"in_place": True} if c.id in linked else {}),
                        **({"as": fsdecode(c.journal_path)} if c.journal_path else {}),
                        **({"superseded": True} if c.superseded else {}),
                    }
                )
                c.info["receipt"] = rid
            txn.set_meta_int(b"prepared_gen", gens[-1])

        if commits:
            self.store.write(prepare)
            t = self._step("group.prepare", t)
            if before_items:
                progress["recorded_before"] = True
                self._recorded_gens(before_gens)
        progress["prepared"] = True
        if commits:
            faults.point("after_prepare")
        for c in commits:
            if c.superseded:
                self._keep_superseded(c)
            else:
                self._replace(c)
            c.replaced = True
        kept: dict[str, dict[str, Any]] = {}
        for item in group:
            if isinstance(item, Event) and not item.settled:
                if fields := self._settle_event_digests(item):
                    kept[item.id] = fields
                item.settled = True
        if kept:
            # Their kept files now have digest names: a recovery before the records would
            # not find them by their incoming names.
            assert self.intents is not None
            self.intents.append_to(gens[-1], {"kind": "digests", "events": kept})
        # Each commit is durable now: after a crash its receipt is there, and the live
        # file holds the intended bytes, or the expected ones beside a synced stage that
        # recovery renames (SPEC §6.2). So a writer waiting in fsync is answered now,
        # while this thread goes on (not waiting for the loop to take the call).
        loop.run_sync_soon(_set_durable, commits)
        if group:
            t = self._step("group.replace", t)
        if record or not commits:
            if group or unsynced:
                # The renames, the namespace operations and the kept objects are durable
                # before their records: one round of syncs for the whole group, and for
                # the group before if its records are the ones to write.
                syncfs(self.root_fd)
                t = self._step("group.syncfs", t)
            unsynced = False
        else:
            unsynced = True  # the next group's first syncfs covers this one's renames
        progress["synced"] = not unsynced
        if commits:
            faults.point("before_commit_record")
        if record or not commits:
            # (A group of namespace events alone has no receipts to wait with.)
            owed = [] if progress["recorded_before"] else before_items
            owed_gens = [] if progress["recorded_before"] else before_gens
            if owed or group:
                self.store.write(self._write_records, owed + group, owed_gens + gens)
                self._step("group.record", t)
                progress["recorded_before"] = progress["recorded"] = True
                self._recorded_gens(owed_gens + gens)

    def _write_records(self, txn: Any, items: list[Commit | Event], gens: list[int]) -> None:
        """The commit records of applied groups, in the journal's order (in ``txn``)."""
        for item in items:
            if isinstance(item, Commit):
                record_commit(txn, item)
            else:
                item.lsn = record_event(txn, dict(item.event), self.policy)
        txn.set_meta_int(b"applied_gen", gens[-1])

    def _recorded_gens(self, gens: list[int]) -> None:
        """The intent-log generations whose records are all journaled now go."""
        faults.point("after_commit_record")
        assert self.intents is not None
        for g in gens:
            self.intents.drop(g)

    def _step(self, name: str, since: float) -> float:
        """Sample the time a step of the group commit took (``.rw/stats``); returns now."""
        now = time.perf_counter()
        self.stats.sample(name, now - since)
        return now

    def _keep_superseded(self, c: Commit) -> None:
        """A commit whose file a rename or an unlink took away before it landed: its bytes
        are a version of the path (the event's ``expected``): its synced stage becomes the
        object. The FUSE layer then lets go of the stage's name, and reads it still for
        descriptors open on the replaced file (``Files._superseded``)."""
        c.outcome = "landed"
        assert c.intended is not None
        self.objects.keep_link(self.staging_fd, c.stage.name, c.intended)

    def _settle_event_digests(self, item: Event) -> dict[str, Any]:
        """Hash what the event's digests are taken from; returns the fields taken from its
        removed bytes, once they are moved to their digest name."""
        kept: dict[str, Any] = {}
        if item.incoming is not None:
            got = self.objects.settle_incoming(item.incoming)
            if got is not None and item.event.get("supersedes"):
                # The tree's file the rename replaced was older than what the mount showed
                # there (a commit still queued, kept on its own): kept too.
                kept = {"replaced": got[0]}
            elif got is not None:
                kept = {"expected": got[0], "size": got[1]}
            item.event.update(kept)
        if item.hash_fd is not None:
            try:
                item.event["intended"] = self.digest_of_fd(item.hash_fd)
            finally:
                os.close(item.hash_fd)
            item.hash_fd = None
        if any(c.outcome not in ("committed", "landed") for c in item.carried):
            # A write the rename moved did not land (the tree's file changed meanwhile):
            # the rename put at its destination what the tree holds there.
            try:
                item.event["intended"] = self.live_digest(os.fsencode(item.event["dest"]))[0]
            except TooLarge:  # (past max_journaled_bytes: not hashed)
                item.event["intended"] = None
        return kept

    def _replace(self, c: Commit) -> None:
        """Step 7 of SPEC §3.2 for one commit: check the live file, keep it, rename the stage
        (or, for a batch's deletion, unlink the file). The file's directory is opened once,
        beneath the root (``beneath``): every step acts on that directory, so a directory
        on the path swapped for a symlink meanwhile is never followed."""
        try:
            with contextlib.ExitStack() as held:
                try:
                    d, name = held.enter_context(beneath.parent(self.root_fd, c.path))
                except FileNotFoundError:  # its directory is gone: the file is absent
                    d, name = -1, b""
                self._replace_at(c, held, d, name)
        except beneath.Escape:
            c.outcome, c.error = "error", _type_swap(c.path)
            self._keep_intended(c)
        except TooLarge:
            c.outcome, c.error = "error", too_large(c.path, self.policy.max_journaled_bytes)
            self._keep_intended(c)
        except OSError as exc:
            c.outcome = "error"
            c.error = RwfsError(
                exc.errno or errno.EIO,
                "journal_unavailable",
                "io",
                f"The commit could not replace the file ({exc.strerror}); the file is unchanged "
                "and the receipt stays pending until the next mount retries it.",
                path=fsdecode(c.path),
            )

    def _replace_at(self, c: Commit, held: contextlib.ExitStack, d: int, name: bytes) -> None:
        """``_replace`` on ``name`` in directory ``d`` (-1: the directory is missing)."""
        live, st = self._live_at(d, name) if d >= 0 else (None, None)
        if st is not None and not stat.S_ISREG(st.st_mode):
            c.outcome, c.error = "error", _type_swap(c.path)
            self._keep_intended(c)
            return
        if live == c.intended:
            c.outcome = "landed"
            self._keep_intended(c)  # nothing to keep: it is in the tree
            self.landed_links(c, st)
            return
        if live != c.stage.expected:
            c.outcome = "conflict"
            c.info["actual"] = live
            self._keep_intended(c)
            return
        # A hard-linked file is written in place, unless the commit stands for a rename
        # onto the name (a batch's), which replaces the name as rename(2) would.
        linked = st is not None and not c.info.get("replace") and self.hard_linked(st, live)
        if live is not None:
            assert st is not None
            if live == EMPTY_DIGEST and c.owner is not None and self.objects.exists(live):
                c.spare = self._spare_link(d, name, st)
            elif linked:
                # Another name shares the inode and changes it in place: linked, the
                # object would change with it. A copy is kept; if the bytes moved since
                # the check, the commit is a conflict like any other.
                kept = self._keep_copy(d, name)
                if kept != live:
                    c.outcome = "conflict"
                    c.info["actual"] = kept
                    self._keep_intended(c)
                    return
            else:
                self.objects.keep_link(d, name, live)
            c.info["kept"] = True
        faults.point("after_preimage")
        if c.intended is None:
            if st is not None:  # the mode of the file removed: undo, restore use it
                c.info["mode"] = stat.S_IMODE(st.st_mode)
                os.unlink(name, dir_fd=d)
            c.outcome = "committed"
            return
        if linked:
            assert st is not None
            self._write_in_place(c, st, d, name)
            return
        if d < 0:  # a file restored where a whole directory was removed
            head = c.path.rpartition(b"/")[0]
            beneath.makedirs(self.root_fd, head)
            d, name = held.enter_context(beneath.parent(self.root_fd, c.path))
        # A plain filesystem leaves a directory's times alone when a file in it is
        # rewritten (and tar and cp -a set them after writing the files): the rename
        # moves them, so they are put back.
        kw: dict[str, Any] = {"dir_fd": d, "follow_symlinks": False}
        dir_st = os.stat(b".", **kw) if live is not None else None
        os.rename(c.stage.name, name, src_dir_fd=self.staging_fd, dst_dir_fd=d)
        if dir_st is not None:
            os.utime(b".", ns=(dir_st.st_atime_ns, dir_st.st_mtime_ns), **kw)
        faults.point("after_rename")
        got = os.stat(name, **kw)
        mine = os.fstat(c.stage.fd)
        if (got.st_dev, got.st_ino) != (mine.st_dev, mine.st_ino):
            c.outcome = "error"
            c.error = RwfsError(
                errno.EIO,
                "write_corruption",
                "verify",
                "The file did not hold the committed bytes after the rename; "
                "read it again before editing.",
                path=fsdecode(c.path),
            )
            return
        self._remember(mine, c.intended)
        c.info["mode"] = stat.S_IMODE(mine.st_mode)  # journaled: undo, restore use it
        c.new_ino = mine.st_ino
        c.outcome = "committed"

    def landed_links(self, c: Commit, st: os.stat_result | None) -> None:
        """A commit whose bytes a hard-linked file already holds (a copy into it that a
        crash interrupted after it was done): its other names are journaled with it."""
        if c.intended is not None and st is not None and self.hard_linked(st, c.stage.expected):
            c.info["links"] = self.journaled_links(c, st)

    def linked(self, commits: list[Commit]) -> set[str]:
        """The commits whose file is hard-linked now: ``_replace`` will write them in
        place, and their receipts say so, for recovery."""
        out = set()
        for c in commits:
            try:
                st = beneath.stat(self.root_fd, c.path)
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and not c.info.get("replace")
                and self.hard_linked(st, c.stage.expected)
            ):
                out.add(c.id)
        return out

    def hard_linked(self, st: os.stat_result, kept: str | None) -> bool:
        """Whether other names share the file: not just the link rwfs made itself when it
        kept the file's bytes as object ``kept`` (``_replace``; a crash before the rename
        leaves it for recovery). An object is never changed in place."""
        if st.st_nlink == 1:
            return False
        if st.st_nlink == 2 and kept is not None:
            try:
                fd = self.objects.open(kept)
            except OSError:
                return True
            try:
                obj = os.fstat(fd)
            finally:
                os.close(fd)
            return (obj.st_dev, obj.st_ino) != (st.st_dev, st.st_ino)
        return True

    def _write_in_place(self, c: Commit, st: os.stat_result, dir_fd: int, name: bytes) -> None:
        """Commit a hard-linked file: its other names must go on naming it, which a rename
        of the stage over one name would undo, so the stage's bytes are copied into the
        live inode. Not atomic, unlike a rename: the receipt says ``in_place`` and the
        stage stays until the commit record, so recovery finishes a copy a crash cut
        short (recovery.py). The names it changes besides ``c.path`` are journaled with
        the write (``links``)."""
        how = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, how, dir_fd=dir_fd)
        try:
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "the file was replaced during the commit")
            size = os.fstat(c.stage.fd).st_size
            copy_range(c.stage.fd, fd, size)
            faults.point("in_place_copied")
            os.ftruncate(fd, size)
            got = os.fstat(fd)
        finally:
            os.close(fd)
        c.info["links"] = self.journaled_links(c, got)
        c.info["in_place"] = True
        c.info["mode"] = stat.S_IMODE(got.st_mode)
        self._remember(got, str(c.intended))
        c.new_ino = got.st_ino
        c.discard = True  # the live inode holds the bytes now: the stage goes
        c.outcome = "committed"

    def journaled_links(self, c: Commit, st: os.stat_result) -> list[str]:
        """The other names a commit in place changes, that the journal follows: not the
        passthrough ones, whose removal or change it never hears of (the path index would
        go on claiming their bytes). The names are the tree's as the commit lands, which are
        the names at its place in the journal: nothing that moves a name of a hard-linked
        file is done while its commit is queued (``Files.rename`` waits for it)."""
        names = self.other_names(c.path, st, c.aliases)
        return [fsdecode(p) for p in names if not self.policy.is_passthrough(p)]

    def other_names(
        self, path: bytes, st: os.stat_result, hints: tuple[bytes, ...] = ()
    ) -> list[bytes]:
        """The workspace's other names of the file at ``path`` (hard links): looked for in
        the directories of ``path`` and of ``hints`` first, then, if the link count says
        some are still missing, in the whole tree, once per file and link count, and again
        when a name found before has moved (a name outside the workspace is never found:
        the walk is not made again for it)."""
        key, want = (st.st_dev, st.st_ino), st.st_nlink - 1
        seen = self._links_seen.get(key, set())
        found = set(seen)
        for d in {p.rpartition(b"/")[0] for p in (path, *hints)}:
            found |= self._scan(d, st)
        found = {p for p in found if p != path and self._same(p, st)}
        # A name found before that no longer names the file moved (a rename of it or of
        # a directory above it: the link count stays) or went: walk again for it.
        moved = any(p != path and p not in found for p in seen)
        if len(found) < want and (moved or self._walked.get(key) != st.st_nlink):
            found |= {p for p in self._walk(b"", st) if p != path}
            self._walked[key] = st.st_nlink
        self._links_seen[key] = found | {path}
        if len(self._links_seen) > 10_000:
            self._links_seen.clear()
            self._walked.clear()
        return sorted(found)

    def _same(self, path: bytes, st: os.stat_result) -> bool:
        try:
            got = beneath.stat(self.root_fd, path)
        except OSError:
            return False
        return (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino)

    def _entries(self, d: bytes) -> list[tuple[bytes, os.DirEntry[str]]]:
        """The entries of directory ``d`` of the tree, with their paths (none if it is
        gone or not a directory)."""
        try:
            dfd = beneath.opendir(self.root_fd, d)
        except OSError:
            return []
        try:
            with os.scandir(dfd) as it:
                return [
                    (d + b"/" + os.fsencode(e.name) if d else os.fsencode(e.name), e) for e in it
                ]
        finally:
            os.close(dfd)

    def _scan(self, d: bytes, st: os.stat_result) -> set[bytes]:
        """The names in directory ``d`` of the file ``st`` (by the entries' inode numbers)."""
        return {p for p, e in self._entries(d) if e.inode() == st.st_ino}

    def _walk(self, top: bytes, st: os.stat_result) -> set[bytes]:
        """``_scan`` of every directory below ``top`` (the state directory excepted)."""
        found: set[bytes] = set()
        todo = [top]
        while todo:
            for p, e in self._entries(todo.pop()):
                if p == b".rw":
                    continue
                if e.is_dir(follow_symlinks=False):
                    todo.append(p)
                elif e.inode() == st.st_ino and self._same(p, st):
                    found.add(p)
        return found

    def _keep_copy(self, dir_fd: int, path: bytes) -> str:
        fd, _ = open_regular(dir_fd, path)
        if fd < 0:
            raise OSError(errno.EPERM, "not a regular file", os.fsdecode(path))
        try:
            return self.objects.keep_fd_copy(fd)
        finally:
            os.close(fd)

    def _keep_intended(self, c: Commit) -> None:
        """Keep the bytes of a commit that did not replace its file; its stage is to go."""
        if c.stage.fd < 0:  # a deletion: no bytes of its own
            return
        if c.outcome != "landed" and c.intended is not None:
            self.objects.keep_fd_copy(c.stage.fd, c.intended)
        c.discard = True

    def settle(self, c: Commit) -> None:
        """On the loop, once a commit is settled: drop the stage it left (``discard``), or
        close one that recovery still needs (an error: the receipt stays pending), then
        tell the FUSE layer (``on_committed``), in the same step."""
        c.settled = True
        if c.discard:
            self.drop_stage(c.stage)
        elif c.outcome == "error" and c.stage.fd >= 0:
            _close_quietly(c.stage.fd)
            c.stage.fd = -1
        self.on_committed(c)


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


def _set_durable(commits: list[Commit]) -> None:
    for c in commits:
        c.durable.set()
        c.nudge()


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    """What changes whenever a file's bytes do (ctime cannot be set by anyone)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def conflict_error(c: Commit) -> RwfsError:
    """ESTALE for a writer whose commit met a version of the file it did not expect."""
    where = f".rw/conflicts/{c.info['conflict']}/" if c.info.get("conflict") else ".rw/conflicts/"
    return RwfsError(
        errno.ESTALE,
        "stale_precondition",
        "conflict",
        f"{fsdecode(c.path)} changed outside this write before it was committed, so rwfs kept "
        f"that version and did not write yours; your bytes and a merge are in {where}: read "
        "the file again and re-apply your edit, or settle the conflict there.",
        path=fsdecode(c.path),
        expected=c.stage.expected,
        intended=c.intended,
        actual=c.info.get("actual"),
        batch=c.batch,
        lsn=c.lsn or None,
    )


class TooLarge(OSError):
    """The live file is past ``max_journaled_bytes``: rwfs does not hash it."""


def too_large(path: bytes, limit: int) -> RwfsError:
    return RwfsError(
        errno.EFBIG,
        "quota_exceeded",
        "max_journaled_bytes",
        f"{fsdecode(path)} is past max_journaled_bytes ({limit} bytes): it is not journaled, "
        "and rwfs does not read all of it to compare it with the journal, so nothing was "
        "changed. Remove it, or truncate it under the limit, and try again.",
        path=fsdecode(path),
    )


def escaped(exc: beneath.Escape) -> RwfsError:
    """The envelope of a path that meets a symlink or leaves the workspace (a verb's)."""
    return RwfsError(
        errno.EPERM,
        "policy_violation",
        "symlink",
        f"A directory on the path {exc.filename} is a symlink (or the path leaves the "
        "workspace), and rwfs follows no symlink in a path it resolves itself; nothing was "
        "changed. Name the file by the path of its real directory, or move the symlink away.",
        path=str(exc.filename or ""),
    )


def _type_swap(path: bytes) -> RwfsError:
    return RwfsError(
        errno.EPERM,
        "policy_violation",
        "symlink",
        "The path, or a directory on it, became a symlink or another kind of file before the "
        "commit, so rwfs did not write through it; the path is unchanged and your bytes are "
        "kept as an object.",
        path=fsdecode(path),
    )


def record_commit(txn: Any, c: Commit) -> None:
    """The commit record: receipt settled, event appended and path index updated, at once."""
    receipt = txn.receipt(c.info["receipt"])
    written = c.outcome in ("committed", "landed")
    if written and c.info.get("folded"):
        # Recovery of a write a rename moved or replaced before it landed: the rename's
        # event, journaled already, tells of its bytes (recovery.py, "moved files").
        receipt["state"] = "committed"
        if c.info.get("kept"):
            txn.add_object(c.stage.expected, 0, txn.next_lsn())
        txn.put_receipt(receipt)
        return
    # A write is journaled where it was made; a conflict where the file is now.
    path = (c.journal_path or c.path) if written else c.path
    ev: dict[str, Any] = {
        "op": "conflict" if not written else ("unlink" if c.intended is None else "write"),
        "path": fsdecode(path),
        "batch": c.batch or f"auto-{receipt['id']}",
        "expected": c.stage.expected,
        "intended": c.intended,
        "size": c.size,
        **{k: c.info[k] for k in ("pid", "comm", "uid", "session") if k in c.info},
    }
    if c.info.get("warnings"):
        ev["warnings"] = c.info["warnings"]
        txn.bump("warnings")
    if c.info.get("allowed") and written:  # let through by an allowance (allowances.py)
        ev["allowed"] = c.info["allowed"]
    if c.outcome == "conflict":
        ev["actual"] = c.info.get("actual")
    if c.info.get("recovered"):
        ev["recovered"] = True
    if c.info.get("put_back"):  # rwfs's own write, after the refusal of a save (files.py)
        ev["put_back"] = True
        if c.info.get("refused_lsn"):
            ev["refused_lsn"] = c.info["refused_lsn"]
    if "mode" in c.info and c.outcome == "committed":
        ev["mode"] = c.info["mode"]
    links = c.info.get("links") if c.outcome in ("committed", "landed") else None
    if links:
        ev["links"] = links  # the file's other names, changed with it (in place)
    if c.outcome == "error":
        receipt["state"] = "pending"
        receipt["error"] = c.error.envelope["message"] if c.error else "error"
        txn.put_receipt(receipt)
        return
    lsn = txn.append_event(ev)
    c.lsn = lsn
    receipt["lsn"] = lsn
    receipt["batch"] = ev["batch"]
    if c.outcome == "conflict":
        receipt["state"] = "conflict"
        c.info["conflict"] = receipt["conflict"] = txn.new_conflict(
            {
                "path": ev["path"],
                "batch": ev["batch"],
                "receipt": receipt["id"],
                "lsn": lsn,
                "expected": c.stage.expected,
                "intended": c.intended,
                "actual": ev["actual"],
                "reason": c.info.get("reason", "conflict"),
            }
        )
    else:
        receipt["state"] = "committed"
        receipt["path"] = ev["path"]  # (settled: it names the write as the journal does)
        receipt.pop("as", None)
        txn.set_path(path, c.intended, lsn)
        for other in links or ():
            txn.set_path(os.fsencode(other), c.intended, lsn)
        if c.info.get("kept"):  # not popped: a retried record writes it again
            txn.add_object(c.stage.expected, 0, lsn)
        txn.bump("commits")
    txn.put_receipt(receipt)


def record_event(txn: Any, ev: dict[str, Any], policy: Policy | None = None) -> int:
    """Journal a namespace event and its effect on the path index; returns its LSN.

    A rename that puts a file's bytes at a path is a commit of that path: it gets a
    receipt (expected = the replaced bytes or null, intended = the moved bytes). A path
    a rename puts where ``policy`` journals nothing (a passthrough name), and a file that
    left journaling (``unjournaled``), leave the path index: rwfs does not journal what
    happens to them next (an ``rm -rf .pytest_cache``), so it claims nothing about them.
    """
    op = ev["op"]
    path = os.fsencode(ev["path"])
    tracked = None if policy is None else (lambda p: not policy.is_passthrough(p))
    receipt = None
    if op == "rename" and ev.get("intended") and not ev.get("exchange"):
        rid = txn.new_receipt(
            {
                "batch": None,
                "path": ev["dest"],
                "expected": ev.get("expected"),
                "intended": ev["intended"],
                "source": ev["path"],
            }
        )
        receipt = txn.receipt(rid)
        ev["batch"] = f"auto-{rid}"
    elif op in ("unlink", "create") and not ev.get("batch"):
        # A batch of one, like every commit's, so that `undo` can name it.
        ev["batch"] = f"auto-e{txn.next_lsn()}"
    lsn: int = txn.append_event(ev)
    if ev.get("expected") and op in ("unlink", "rename"):  # the removed bytes were kept
        txn.add_object(ev["expected"], ev.get("size", 0), lsn)
    if ev.get("replaced"):  # the tree's older bytes a rename replaced (``supersedes``)
        txn.add_object(ev["replaced"], 0, lsn)
    if op == "refuse":  # the refused draft is kept
        txn.add_object(ev["intended"], 0, lsn)
    if op == "unjournaled" and ev.get("expected"):  # its last journaled bytes were kept
        txn.add_object(ev["expected"], 0, lsn)
    if op == "unlink":
        txn.set_path(path, None, lsn)
    elif op == "unjournaled":
        txn.forget_paths(path)
    elif op == "rename":
        dest = os.fsencode(ev["dest"])
        if ev.get("exchange"):
            txn.swap_paths(path, dest, lsn, tracked)
        else:
            txn.move_paths(path, dest, lsn, tracked)
            if ev.get("intended") and (tracked is None or tracked(dest)):
                txn.set_path(dest, ev["intended"], lsn)
    elif op == "create":
        txn.set_path(path, ev.get("intended"), lsn)
    elif op == "link" and ev.get("intended"):
        # A new name of a file: it holds the file's bytes (commits of it are in place and
        # journal every name they change: ``links``).
        txn.set_path(path, ev["intended"], lsn)
    if receipt is not None:
        receipt.update(state="committed", lsn=lsn, batch=ev["batch"])
        txn.put_receipt(receipt)
        txn.bump("commits")
    counter = {"noop": "noops", "refuse": "refusals"}.get(op)
    if counter:
        txn.bump(counter)
    return lsn


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
