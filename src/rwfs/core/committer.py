"""The group committer (SPEC §3.2): a queue of sealed commits and namespace events, taken
as one group every ``commit_interval_ms`` (or at once for a writer that waits), applied
in a worker thread (landing.py) and recorded in the journal; the intent log that keeps
what was acknowledged before it is journaled; retries while the journal cannot commit;
the flush at unmount.

Concurrency (trio: tasks interleave only at ``await``):

- ``flush_locked`` takes the queue and rotates the intent log with no await between: every
  record of generation G belongs to the group that applies G. A group taken is applied
  whatever happens to the task that took it: ``_attempt`` shields its wait for the thread
  (a cancelled gc at unmount had left a group in no queue, unapplied).
- In ``operation``, the namespace syscall between ``announce`` and ``confirm``/``cancel``
  is synchronous: its records land in one generation, where recovery matches them.
- ``commit_lock`` serialises the groups and every other writer of the journal's records
  (a batch's commit, undo, restore, gc, a kept object and its record); all but the
  committer take it through ``exclusive``, which first writes the records of the group
  applied last, so theirs follow it in the journal.
- A group's blocking work (landing.py) runs in one worker thread, on the group it was
  given: the queue, ``_retry``, ``_unrecorded`` and ``Stages.unsynced`` are read and
  changed on the loop only (the thread is told by an argument whether the group before
  is synced). Of the intent log, the thread only writes to, and drops, the generations
  of its group and of the one before, which the loop no longer appends to."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio

from .. import faults
from ..journal.intents import IntentLog
from ..journal.objects import unique_id
from ..journal.store import now_iso
from .commits import Commit, Event
from .errors import conflict_error, journal_unavailable
from .syscalls import WORKERS, close_quietly, fsdecode

if TYPE_CHECKING:
    from .workspace import Workspace

log = logging.getLogger("rwfs.commit")
# A queued commit holds its stage's descriptor, and the FUSE layer keeps the file's own
# open until it lands. With this many items queued the committer starts a group at once
# instead of at the end of commit_interval_ms; with QUEUE_MAX, a writer's commit waits
# until a group has taken the queue. So descriptors stay bounded (SPEC §1: this machine
# allows 20,000) however fast files are written and however long the interval.
QUEUE_URGENT = 512
QUEUE_MAX = 2048
# At unmount, how long the daemon keeps trying a failing journal before it exits and leaves
# the acknowledged commits to the intent log (the next mount finishes them).
CLOSE_WAIT = 5.0
# How long the records of a group just applied wait for the next group, to be written in
# its receipts' transaction (one durable LMDB commit for both; seconds). The next fsync of
# a writer that fsyncs file after file comes well within it.
RECORD_WAIT = 0.005


class Committer:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.intents: IntentLog | None = None
        self._queue: list[Commit | Event] = []
        self._takings = 0  # how many times a group took the queue (``Commit.taking``)
        self._has_work = trio.Event()
        self._urgent = trio.Event()
        self._taken = trio.Event()  # set when a group takes the queue (QUEUE_MAX)
        self.commit_lock = trio.Lock()  # one writer of the tree's commits at a time
        self._closing = False
        self._inflight: list[Commit | Event] = []  # the group being applied
        # The group applied last, whose records wait to join the next group's receipts
        # (one durable LMDB transaction for both, ``_attempt``): its items, its
        # intent-log generations.
        self._unrecorded: tuple[list[Commit | Event], list[int]] | None = None
        # A group the journal could not take, tried again before anything newer, with the
        # intent-log generations that hold its records: while it fails, no generation is
        # added for it (nothing else of the queue is taken meanwhile).
        self._retry: list[Commit | Event] = []
        self._retry_gens: list[int] = []
        self.on_committed: Callable[[Commit], None] = lambda c: None  # settled
        self.on_recorded: Callable[[Commit], None] = lambda c: None  # and its record written

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
            self.ws.journal.ok
            and not self._retry
            and not commit.info.get("wait")
            and commit.taking == self._takings  # (in ``_queue``: no group took it yet)
        )

    @property
    def queued(self) -> int:
        """Items waiting for the journal: commits and namespace events."""
        return len(self._queue) + len(self._retry)

    def owed_commits(self) -> int:
        """Commits acknowledged or applied to the tree whose record is not in the journal."""
        return sum(1 for c in self.unsettled() if not c.done.is_set())

    def open_intents(self) -> None:
        """Start a fresh intent-log generation (after recovery has read the old ones)."""
        self.intents = IntentLog(self.ws.state_fd)
        self.intents.start(self.ws.store.meta_int(b"applied_gen"))

    async def submit(self, commit: Commit, wait: bool) -> Commit:
        """Queue a sealed commit; in strict mode (or ``wait``) return once it is durable.

        While the journal cannot commit, a new commit is refused (EIO, nothing written):
        the commits already acknowledged go first, and the writer is told at once rather
        than after commits that cannot land. A writer that waits and whose group then
        fails gets EIO too, and its commit is dropped (``_fail_group``)."""
        if not self.ws.journal.ok:
            if self._retry:
                raise self.ws.journal.refusal(commit.path)
            # Nothing acknowledged is owed: see whether LMDB commits again.
            try:
                await trio.to_thread.run_sync(self.ws.journal.probe, limiter=WORKERS)
            except Exception as exc:
                self.ws.journal.failed(str(exc))
                raise self.ws.journal.refusal(commit.path) from None
            self.ws.journal.back()
        while commit.owner is not None and len(self._queue) >= QUEUE_MAX:
            # A writer through the mount (rwfs's own commits may hold commit_lock here).
            self._urgent.set()
            await self._taken.wait()
        wait = wait or self.ws.policy.durability == "strict"
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
                    raise self.ws.journal.still_queued(commit.path)
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

    async def sync(self) -> None:
        """Make everything queued so far durable; EIO (``JournalHealth.still_queued``) if the journal
        cannot: the queued commits stay queued."""
        self._urgent.set()
        await self.flush()
        if not self.ws.journal.ok and (self._retry or self._queue):
            raise self.ws.journal.still_queued(b"")

    async def settle_commit(self, c: Commit) -> None:
        """Wait until a queued commit is recorded; EIO (``JournalHealth.still_queued``) if the journal
        cannot record it now (it stays queued)."""
        if c.done.is_set():
            return
        self._urgent.set()
        await self.flush()  # after a group in progress, if any: it holds commit_lock
        if not c.done.is_set() and not self.ws.journal.ok:
            raise self.ws.journal.still_queued(c.path)
        await c.done.wait()

    async def run(self) -> None:
        while True:
            if not self.ws.journal.ok:
                # Try the failed group again (or probe LMDB) after a delay that doubles up
                # to RETRY_MAX; a sync, an fsync or an unmount tries at once on its own.
                await trio.sleep(self.ws.journal.state.retry_in)
            else:
                # The group applied last is recorded with the next one's receipts if that
                # comes soon (an fsync after an fsync), else alone.
                with trio.move_on_after(RECORD_WAIT if self._unrecorded else math.inf):
                    await self._has_work.wait()
                if self._has_work.is_set() and not self._closing:
                    with trio.move_on_after(self.ws.policy.commit_interval_ms / 1000):
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
            if self.ws.journal.ok and not self._retry:
                if not self._queue:
                    break
                continue
            left_s = deadline - trio.current_time()
            if left_s <= 0:
                break
            await trio.sleep(min(self.ws.journal.state.retry_in, left_s))
        if self.intents is not None and self.ws.journal.ok and not self._queue and not self._retry:
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
                self.ws.journal.state.failing_since,
                self.ws.journal.state.last_error,
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
        if not self.ws.journal.ok:
            # First what the journal could not take, in the generations that hold it.
            if self._retry:
                group, gens, self._retry, self._retry_gens = self._retry, self._retry_gens, [], []
                if not await self._attempt(group, gens):
                    return
            else:
                try:
                    await trio.to_thread.run_sync(self.ws.journal.probe, limiter=WORKERS)
                except Exception as exc:
                    self.ws.journal.failed(str(exc))
                    return
                self.ws.journal.back()
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
            # Shielded: the group is in no queue any more, so a caller cancelled now (gc's
            # collection at unmount) must not leave it unapplied. (The thread, once it
            # runs, is never cancelled; this covers the wait for it to start.)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(
                    self.ws.landing.apply_group,
                    group,
                    gens,
                    progress,
                    trio.lowlevel.current_trio_token(),
                    (before, before_gens),
                    record,
                    self.ws.stages.unsynced is not None,
                    limiter=WORKERS,
                )
        except Exception as exc:  # LMDB or the disk failed: never let it stop the daemon
            self._inflight = []
            self.ws.journal.failed(str(exc))
            log.info("group commit of %d items failed: %s", len(group), exc)
            if progress["recorded_before"]:
                self._recorded(before)
            elif before:  # applied already: its retry writes only its records
                self._keep_for_retry(before, before_gens)
            if progress["prepared"] and self.ws.stages.unsynced is None:
                self.ws.stages.unsynced = []  # (it may have renamed: the retry syncs first)
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
        self.ws.journal.back()
        if group:
            self.ws.stats.count("groups")
            self.ws.stats.sample("group_commit", time.perf_counter() - started)
        if progress["synced"]:
            self._synced()
        elif self.ws.stages.unsynced is None:
            self.ws.stages.unsynced = []  # this group's renames wait for the next group's syncfs
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
        names, self.ws.stages.unsynced = self.ws.stages.unsynced or [], None
        for name in names:
            self.ws.stages.unlink(name)

    def _recorded(self, group: list[Commit | Event]) -> None:
        """A group's records are in the journal: wake whoever waits for them."""
        for item in group:
            if isinstance(item, Commit):
                if item.outcome == "committed":
                    self.ws.stats.commit(item.path)
                else:
                    self.ws.stats.count(item.outcome)
                if not item.settled:
                    self.settle(item)
                item.finish()
                self.on_recorded(item)
        for item in group:
            if isinstance(item, Commit) and item.spare is not None:
                self.ws.stages.pool_spare(item)

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

    def settle(self, c: Commit) -> None:
        """On the loop, once a commit is settled: drop the stage it left (``discard``), or
        close one that recovery still needs (an error: the receipt stays pending), then
        tell the FUSE layer (``on_committed``), in the same step."""
        c.settled = True
        if c.discard:
            self.ws.stages.drop(c.stage)
        elif c.outcome == "error" and c.stage.fd >= 0:
            close_quietly(c.stage.fd)
            c.stage.fd = -1
        self.on_committed(c)
