"""Garbage collection of the object store (SPEC §8): retention that runs by itself,
``rwfs gc`` and ``.rw/ctl gc``.

An object is kept when something still needs it (``pinned``, ``Seen.current``): a pending
receipt, an open conflict, an unfinished batch, the scratchpad, a chunk session, a handoff
note, a refused draft, a snapshot (every path's bytes at the snapshot's LSN), the newest
version of each path. Those never go. The other history versions (``Seen.recent``, read
with the rest in one pass over the history index: ``read_history``) are kept by the retention
policy: one replaced less than ``retain_days`` ago stays while the store (what is always
kept included) fits its budget (``budget``: ``retain_ratio`` times the tree, at least
``retain_min_bytes``, at most ``retain_bytes``); over it, the oldest go first. When the
disk is short of room, the bytes of removed files go first, then the oldest versions, until
enough is free (``plan``'s ``goal``).

Objects are counted by the bytes they alone hold on disk (``own_bytes``): where the
filesystem shares extents (XFS, Btrfs: a stage is a reflink of the file), a version of a
large file costs the blocks a change gave it, not its size.

Whoever keeps an object and journals what refers to it does both under
``Committer.commit_lock`` (``Committer.exclusive``). The daemon's collection
(``Retention``) lists the store and measures the tree outside that lock, in a worker
thread, and decides there too, from the journal as it stands at an LSN (``plan``: it reads
every path's timeline, which takes seconds on a large journal). Then, under the lock,
after a flush, it takes back from what goes whatever became needed since (``confirm``:
what the events after that LSN name, and the records that pin objects: unsettled
receipts, conflicts, batches, the scratchpad, chunks, handoffs, refused drafts, the
commits not yet recorded), journals a ``gc`` event and moves what goes to
``objects/trash/``; the unlinks, which free the space, come after the lock is released.
So writers wait for it no longer than for a commit of the group committer plus a read of
those records and events. A collection because the disk is short of room (``low_space``)
decides under the lock, as one on a full disk does: there the writers had better wait for
the room than fill the disk while the decision is made. On a full disk
(``Retention.reclaim``: a writer's ENOSPC) all of it is done under the lock, without a
flush (the queued commits may need the room), unlinks included: the writer waits for the
room anyway. The CLI runs ``collect`` directly on an unmounted workspace.
"""

from __future__ import annotations

import bisect
import calendar
import contextlib
import dataclasses
import fcntl
import functools
import logging
import math
import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import beneath
from ..journal.objects import ObjectStore
from ..journal.store import JournalUnavailable, Store
from ..policy import Policy
from .history import History

if TYPE_CHECKING:
    from ..control.tree import Control

log = logging.getLogger("rwfs.gc")

TRASH = b"trash"  # objects/trash/: collected objects whose removal is journaled, to unlink
POLL_SECONDS = 1.0  # how often the daemon looks whether retention is due (cheap: counters)
# The first collection waits this long after the mount (or for a policy change or the
# verb): a mount's first writes are often a burst (an agent's, a checkout's), and that
# collection only sets what the next ones compare with.
FIRST_AFTER_S = 10.0


@functools.lru_cache(maxsize=1 << 16)  # (a journal's events share their seconds)
def _epoch(ts: str) -> float:
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))


# ---- what an object costs ----

FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_SHARED = 0x2000
_EXTENTS = 128
_HEAD = struct.Struct("=QQIIII")  # struct fiemap
_EXTENT = struct.Struct("=QQQ16xI12x")  # struct fiemap_extent (56 bytes)


def shared_bytes(fd: int) -> int:
    """Bytes of the file's extents that it shares with other files (FIEMAP's
    FIEMAP_EXTENT_SHARED: a reflink's); 0 where the filesystem cannot tell."""
    shared, start = 0, 0
    while True:
        buf = bytearray(_HEAD.size + _EXTENT.size * _EXTENTS)
        _HEAD.pack_into(buf, 0, start, (1 << 64) - 1 - start, 0, 0, _EXTENTS, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
        except OSError:
            return shared
        mapped = _HEAD.unpack_from(buf, 0)[3]
        if not mapped:
            return shared
        for k in range(mapped):
            logical, _, length, flags = _EXTENT.unpack_from(buf, _HEAD.size + _EXTENT.size * k)
            if flags & _FIEMAP_EXTENT_SHARED:
                shared += length
            if flags & _FIEMAP_EXTENT_LAST:
                return shared
            start = logical + length


# Files smaller than this are counted by their allocated blocks without asking FIEMAP.
_SHARING_WORTH_ASKING = 64 << 10


def own_bytes(dir_fd: int, name: bytes) -> int:
    """What removing the file ``name`` would free: its allocated bytes (holes cost
    nothing), less the extents it shares with other files (a reflinked version shares
    all but what changed with the file it was made from)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    allocated = st.st_blocks * 512
    if allocated < _SHARING_WORTH_ASKING:
        return allocated
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return allocated
    try:
        return max(0, allocated - shared_bytes(fd))
    finally:
        os.close(fd)


def survey(objects: ObjectStore, progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Every object of the store -> its own bytes. Blocking; needs no lock: only gc removes
    objects, and one added meanwhile is simply not a candidate."""
    say = progress or (lambda msg: None)
    found: dict[str, int] = {}
    for sub in sorted(os.listdir(objects.fd)):
        if sub in ("incoming", TRASH.decode()):
            continue
        fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=objects.fd)
        try:
            for name in os.listdir(fd):
                try:
                    found[f"sha256:{sub}{name}"] = own_bytes(fd, os.fsencode(name))
                except FileNotFoundError:
                    continue
                if len(found) % 1000 == 0:
                    say(f"gc: {len(found)} objects looked at")
        finally:
            os.close(fd)
    return found


def tree_bytes(root_fd: int) -> int:
    """The bytes the workspace's files (``.rw`` aside) take on disk: allocated blocks of
    every regular file, a hard-linked file once. Blocking. The walk is rwfs's, not a
    reader's: it moves no directory's access time (O_NOATIME where the daemon may)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    todo = [b""]  # directories to list, relative to the top (one descriptor at a time)
    while todo:
        top = todo.pop()
        try:
            dfd = beneath.opendir(root_fd, top or b".")
        except OSError:  # (gone, moved, or not the daemon's to read)
            continue
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(dfd, fcntl.F_SETFL, fcntl.fcntl(dfd, fcntl.F_GETFL) | os.O_NOATIME)
            with os.scandir(dfd) as it:
                names = [os.fsencode(e.name) for e in it]
            entries = []
            for name in names:
                with contextlib.suppress(OSError):  # (gone since the listing)
                    entries.append((name, os.stat(name, dir_fd=dfd, follow_symlinks=False)))
        except OSError:
            continue
        finally:
            os.close(dfd)
        for name, st in entries:
            if stat.S_ISDIR(st.st_mode):
                if top or name != b".rw":
                    todo.append(top + b"/" + name if top else name)
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def budget(policy: Policy, tree: int | None) -> int | None:
    """What the object store may hold (None: no cap): ``retain_ratio`` times the tree, but
    not under ``retain_min_bytes``; and not above ``retain_bytes``. A 0 turns its cap off.
    ``tree`` None (not measured): the ratio does not apply."""
    caps = []
    if policy.retain_ratio and tree is not None:
        caps.append(max(int(policy.retain_ratio * tree), policy.retain_min_bytes))
    if policy.retain_bytes:
        caps.append(policy.retain_bytes)
    return min(caps) if caps else None


def short_of_room(state_fd: int, policy: Policy) -> int:
    """How many bytes the state directory's filesystem lacks to have ``min_free_ratio``
    of it free (0: none)."""
    st = os.fstatvfs(state_fd)
    want = policy.min_free_ratio * st.f_blocks * st.f_frsize
    return max(0, math.ceil(want - st.f_bavail * st.f_frsize))


# ---- what to keep ----


@dataclass
class Seen:
    """What one read of every path's timeline tells a collection."""

    current: set[str]  # the newest bytes of each path, and what each snapshot shows of it
    recent: dict[str, tuple[float, int]]  # kept by the policy -> when it stopped being current
    removed: set[str]  # the last bytes of a path an unlink removed


def read_history(store: Store, history: History, cutoff: float) -> Seen:
    """Every path's timeline, read once (in LMDB, a thousand paths to a read transaction):
    its newest bytes and each snapshot's, the versions replaced since ``cutoff`` (the
    time, to the second, and the LSN of the event that replaced them: the newest are the
    first to be kept under the budget), and the bytes removals took."""
    points = sorted({int(s["lsn"]) for s in store.snapshots()})
    current: set[str | None] = set()
    soft: dict[str, tuple[float, int]] = {}
    gone: set[str] = set()
    for _, versions in history.timelines():
        current.add(versions[-1].digest)
        if points:
            lsns = [v.lsn for v in versions]
            for lsn in points:  # what each snapshot's tree shows of this path
                i = bisect.bisect_right(lsns, lsn)
                if i:
                    current.add(versions[i - 1].digest)
        for old, new in zip(versions, versions[1:], strict=False):
            if not old.digest:
                continue
            if new.digest is None:
                gone.add(old.digest)
            when = (_epoch(new.ts[:19]), new.lsn)
            if when[0] >= cutoff:
                soft[old.digest] = max(soft.get(old.digest, when), when)
    return Seen({d for d in current if d and isinstance(d, str)}, soft, gone)


def pinned(store: Store) -> set[str]:
    """Digests the journal's records (not its history) keep: cheap to read again."""
    keep: set[str | None] = set()
    for r in store.unsettled():
        keep |= {r.get("expected"), r.get("intended")}
    for c in store.conflicts():
        if c["state"] == "open":  # (conflicts/ID/actual is read from its object)
            keep |= {c.get("expected"), c.get("intended"), c.get("actual")}
    for b in store.batches():
        if b["state"] not in ("committed", "aborted", "conflicted"):
            for e in b["entries"].values():
                keep |= {e.get("expected"), e.get("intended"), e.get("actual")}
    for r in store.records(b"scratch"):
        keep.add(r["digest"])
    for session in store.records(b"chunks"):
        keep |= set(session["parts"].values())
    for h in store.records(b"handoffs"):
        keep.add(h["note"])
    for r in store.refusals():  # a refused draft is never lost (SPEC I5)
        keep.add(r["intended"])
    return {d for d in keep if d and isinstance(d, str)}


def confirm(store: Store, p: Plan, found: dict[str, int], lsn: int, spare: frozenset[str]) -> Plan:
    """Under the commit lock, after a flush: ``p``, decided from the journal at ``lsn``,
    without the objects that became needed since — named by an event after ``lsn`` (a
    write back to old bytes, an undo, a snapshot's files), pinned by a record, or named by
    a commit not yet recorded (``spare``)."""
    keep = pinned(store) | set(spare)
    for ev in store.events(since=lsn):
        keep |= {d for d in (ev.get("expected"), ev.get("intended")) if isinstance(d, str)}
    drop = [d for d in p.drop if d not in keep]
    freed = sum(found[d] for d in drop)
    return dataclasses.replace(p, drop=drop, freed=freed, kept=p.kept + p.freed - freed)


@dataclass
class Plan:
    drop: list[str]  # the objects that go
    freed: int  # their own bytes
    kept: int  # the own bytes of what stays
    budget: int | None
    oldest: float  # when the oldest version kept by retention alone stopped being current
    spare: int  # the own bytes of versions that could still go (kept by retention alone)


def plan(
    store: Store,
    history: History,
    policy: Policy,
    found: dict[str, int],
    now: float,
    tree: int | None = None,
    spare: frozenset[str] = frozenset(),
    goal: int = 0,
    removed_only: bool = False,
) -> Plan:
    """Which objects go. Always those nothing needs and the policy keeps no more (older
    than ``retain_days``); then, oldest first, if the store is over its budget, until it
    holds seven eighths of it. With
    ``goal`` (the disk is short of that many bytes): also the bytes of removed files, then
    the oldest versions, until ``goal`` bytes are freed. ``removed_only``: only the bytes of
    removed files go (nothing else). ``spare``: digests to keep besides (what the daemon
    has not journaled yet)."""
    seen = read_history(store, history, now - policy.retain_days * 86400)
    keep, soft, gone = pinned(store) | seen.current | spare, seen.recent, seen.removed
    cap = budget(policy, tree)
    if removed_only:
        drop = [d for d in found if d not in keep and d in gone]
    else:
        drop = [d for d in found if d not in keep and d not in soft]
    dropped = set(drop)
    freed = sum(found[d] for d in drop)
    kept = sum(found.values()) - freed
    left = sorted((d for d in found if d in soft and d not in keep), key=soft.__getitem__)
    # Over the budget, down to seven eighths of it: the next collection then waits for an
    # eighth of it more, rather than running at every commit under churn.
    low = None if cap is None else cap - cap // 8 if kept > cap else cap
    if goal and not removed_only:
        left = [d for d in left if d in gone] + [d for d in left if d not in gone]
    if not removed_only:
        for d in left:
            if (low is None or kept <= low) and freed >= goal:
                break
            drop.append(d)
            dropped.add(d)
            freed += found[d]
            kept -= found[d]
    rest = [d for d in left if d not in dropped]
    return Plan(
        drop=drop,
        freed=freed,
        kept=kept,
        budget=cap,
        oldest=min((soft[d][0] for d in rest), default=math.inf),
        spare=sum(found[d] for d in rest),
    )


def record(store: Store, p: Plan, found: dict[str, int], reason: str | None) -> None:
    """Journal the collection: the objects' records go, and a ``gc`` event says how many
    and why (``reason``: absent for the verb)."""

    def write(txn: Any) -> None:
        for digest in p.drop:
            txn.delete_object(digest)
        txn.append_event(
            {
                "op": "gc",
                "path": "",
                "removed": len(p.drop),
                "freed_bytes": p.freed,
                "kept": len(found) - len(p.drop),
                "kept_bytes": p.kept,
                **({"budget": p.budget} if p.budget is not None else {}),
                **({"reason": reason} if reason else {}),
            }
        )

    store.write(write)


def _unlink(objects: ObjectStore, drop: list[str], say: Callable[[str], None]) -> None:
    for n, digest in enumerate(drop, 1):
        try:
            os.unlink(objects.name(digest), dir_fd=objects.fd)
        except FileNotFoundError:
            pass
        if n % 1000 == 0:
            say(f"gc: {n}/{len(drop)} objects removed")


def _trash_fd(objects: ObjectStore) -> int:
    try:
        os.mkdir(TRASH, 0o700, dir_fd=objects.fd)
    except FileExistsError:
        pass
    return os.open(TRASH, os.O_RDONLY | os.O_DIRECTORY, dir_fd=objects.fd)


def take_out(objects: ObjectStore, drop: list[str]) -> None:
    """Move the collected objects to ``objects/trash/`` (a rename each: cheap), so that
    one kept again from now on is a new file, not one about to be unlinked."""
    trash = _trash_fd(objects)
    try:
        for digest in drop:
            name = objects.name(digest)
            try:
                os.rename(name, name.replace(b"/", b""), src_dir_fd=objects.fd, dst_dir_fd=trash)
            except FileNotFoundError:
                pass
    finally:
        os.close(trash)


def empty_trash(objects: ObjectStore) -> None:
    """Unlink what ``take_out`` moved (and what a crash left there). Blocking."""
    try:
        trash = os.open(TRASH, os.O_RDONLY | os.O_DIRECTORY, dir_fd=objects.fd)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(trash):
            try:
                os.unlink(name, dir_fd=trash)
            except FileNotFoundError:
                pass
    finally:
        os.close(trash)


def collect(
    store: Store,
    objects: ObjectStore,
    policy: Policy,
    progress: Callable[[str], None] | None = None,
    now: float | None = None,
    removed_only: bool = False,
    spare: frozenset[str] = frozenset(),
    root_fd: int | None = None,
) -> dict[str, Any]:
    """One collection, start to end, for a workspace nothing else is changing (the CLI on
    an unmounted workspace; tests). ``root_fd``: the tree, measured for ``retain_ratio``
    (None: that cap does not apply). The journal gets the ``gc`` event first: if it cannot
    take it, nothing goes."""
    say = progress or (lambda msg: None)
    empty_trash(objects)
    found = survey(objects, say)
    tree = tree_bytes(root_fd) if root_fd is not None else None
    history = History(store)
    p = plan(
        store, history, policy, found, now or time.time(), tree, spare, removed_only=removed_only
    )
    record(store, p, found, "disk_full" if removed_only else None)
    _unlink(objects, p.drop, say)
    return {"objects": len(found), "removed": len(p.drop), "freed_bytes": p.freed}


# ---- the daemon's retention ----


class Retention:
    """Runs collections in the mounted daemon: by itself (``run``: the budget, the age,
    low free space), for the ``gc`` verb, and for a writer that met ENOSPC (``reclaim``).
    One at a time. Between them it keeps what the last one found, and the bytes the store
    took since (``ObjectStore.added``), to tell cheaply whether the next one is due."""

    def __init__(self, control: Control) -> None:
        import trio

        self.c = control
        self.ws = control.ws
        self.history = History(self.ws.store)
        self.lock = trio.Lock()
        self.kept: int | None = None  # own bytes the store kept after the last collection
        self.added_at = 0  # ObjectStore.added then
        self.tree: int | None = None
        self.oldest = math.inf
        self.spare = 0
        self.last = 0.0
        self._wake = trio.Event()

    def wake(self) -> None:
        """Look now whether a collection is due (the policy changed)."""
        self._wake.set()

    def added(self) -> int:
        return self.ws.objects.added - self.added_at

    def due(self) -> str | None:
        """Why a collection should run now, or None."""
        if self.kept is None:
            return "mount"
        policy = self.ws.policy
        added = self.added()
        cap = budget(policy, self.tree)
        if cap is not None and added and self.kept + added > cap:
            # Over the budget: at once, unless what is always kept alone was over it at
            # the last collection; then again after an eighth of it more.
            if self.kept <= cap or added >= cap // 8:
                return "budget"
        now = time.time()
        days = policy.retain_days * 86400
        if now >= self.oldest + days or (added and now >= self.last + days):
            return "age"
        if (self.spare or added) and short_of_room(self.ws.state_fd, policy):
            return "low_space"
        return None

    def stuck(self) -> bool:
        """Whether the journal cannot commit and the disk has no room (its pages need
        some) while versions could still go."""
        if self.ws.journal.ok or not (self.spare or self.added()):
            return False
        st = os.fstatvfs(self.ws.state_fd)
        return st.f_bavail * st.f_frsize < max(st.f_blocks * st.f_frsize // 64, 1 << 20)

    async def relieve(self) -> None:
        """The group committer found no room on the disk for the journal: make some as for
        a writer's ENOSPC (``reclaim``), with the reserve's room for the ``gc`` event."""
        import trio

        self.ws.reserve.release()
        try:
            await self.c.reclaim(removals=True)
        finally:
            await trio.to_thread.run_sync(self.ws.reserve.make)

    async def run(self) -> None:
        """The daemon's task: a collection when one is due, looked at every POLL_SECONDS
        and when the policy changes."""
        import trio

        with trio.move_on_after(FIRST_AFTER_S):
            await self._wake.wait()
        while True:
            if self.stuck():
                await self.relieve()
            why = self.due()
            if why is not None:
                try:
                    await self.collect(why)
                except (OSError, JournalUnavailable) as exc:
                    log.warning("retention (%s) did not run: %s", why, exc)
                    self.kept, self.added_at = self.kept or 0, self.ws.objects.added
                    self.last = time.time()
                except Exception:  # a bug: said in the log, and the mount goes on serving
                    log.exception("retention (%s) failed", why)
                    self.kept, self.added_at = self.kept or 0, self.ws.objects.added
                    self.last = time.time()
            with trio.move_on_after(POLL_SECONDS):
                await self._wake.wait()
            self._wake = trio.Event()

    async def collect(self, reason: str | None) -> dict[str, Any]:
        """A collection for the verb (``reason`` None: EIO if the journal cannot take it)
        or by the policy (``reason``: why; its ``gc`` event is journaled only if something
        goes). Blocks no writer for longer than a group commit (see the module)."""
        import trio

        objects = self.ws.objects
        async with self.lock:
            added_at = objects.added
            await trio.to_thread.run_sync(empty_trash, objects)
            found = await trio.to_thread.run_sync(survey, objects)
            tree = await trio.to_thread.run_sync(tree_bytes, self.ws.root_fd)
            goal = short_of_room(self.ws.state_fd, self.ws.policy) if reason else 0
            at = self.ws.store.meta_int(b"lsn")  # (what the plan reads is at least this)
            spare = frozenset(self.ws.committer.unrecorded_digests())

            def decide(spare: frozenset[str]) -> Plan:
                args = (self.ws.store, self.history, self.ws.policy, found, time.time(), tree)
                return plan(*args, spare, goal=goal)

            # Without the lock: the decision reads for long. Not when the disk is short of
            # room: then the writers wait for it, rather than fill the disk meanwhile.
            planned = None if goal else await trio.to_thread.run_sync(decide, spare)
            if planned is not None:
                # What became needed while it decided (a busy writer's thousands of events
                # at a large journal), read without the lock too: under it, only the rest.
                since, at = at, self.ws.store.meta_int(b"lsn")
                spare = frozenset(self.ws.committer.unrecorded_digests())
                store = self.ws.store
                planned = await trio.to_thread.run_sync(
                    confirm, store, planned, found, since, spare
                )
            async with self.ws.committer.exclusive():
                await self.ws.committer.flush_locked()  # every reference to an object is journaled
                if not self.ws.journal.ok:
                    # Not journaled yet: a queued commit's kept bytes would look unreferenced.
                    if reason is None:
                        raise self.ws.journal.still_queued(b"")
                    # (Looked at again once more is kept, or when the journal has no room.)
                    self.kept, self.added_at, self.last = sum(found.values()), added_at, time.time()
                    return {"objects": len(found), "removed": 0, "freed_bytes": 0}
                spare = frozenset(self.ws.committer.unrecorded_digests())

                def finish() -> Plan:
                    if planned is None:
                        p = decide(frozenset())
                    else:
                        p = confirm(self.ws.store, planned, found, at, spare)
                    if p.drop or reason is None:
                        record(self.ws.store, p, found, reason)
                        take_out(objects, p.drop)
                    return p

                p = await trio.to_thread.run_sync(finish)
            self._measured(p, tree, added_at)
            if p.drop:
                self._forget_views()
                await trio.to_thread.run_sync(empty_trash, objects)
        return {"objects": len(found), "removed": len(p.drop), "freed_bytes": p.freed}

    async def reclaim(self, removals: bool) -> bool:
        """The disk is full (a writer's ENOSPC): make room, under the commit lock, without
        flushing (the queued commits may need that room; what they name is kept).
        ``removals``: files were removed since the last time; then, first, only their
        bytes go (their history is given up, so that deleting files frees space). If that
        frees nothing, the oldest versions go, until a 64th of the disk (at least 2 MiB;
        or what ``min_free_ratio`` lacks, if more) is freed. The ``gc`` event, with ``reason:
        disk_full``, is journaled first: if it cannot be, nothing goes. True if anything
        went."""
        import trio

        objects = self.ws.objects
        async with self.lock:
            added_at = objects.added
            found = await trio.to_thread.run_sync(survey, objects)
            async with self.ws.committer.exclusive():
                spare = frozenset(self.ws.committer.unrecorded_digests())
                st = os.fstatvfs(self.ws.state_fd)
                # What the write needs is not known: room for it and for the journal's
                # pages after it (a 64th of the disk, at least 2 MiB).
                goal = max(
                    short_of_room(self.ws.state_fd, self.ws.policy),
                    st.f_blocks * st.f_frsize // 64,
                    2 << 20,
                )

                def make_room() -> Plan:
                    now = time.time()
                    args = (self.ws.store, self.history, self.ws.policy, found, now)
                    p = plan(*args, self.tree, spare, removed_only=True)
                    if not (removals and p.drop):
                        p = plan(*args, self.tree, spare, goal=goal)
                    if p.drop:
                        record(self.ws.store, p, found, "disk_full")
                        _unlink(objects, p.drop, lambda msg: None)
                    return p

                p = await trio.to_thread.run_sync(make_room)
            self._measured(p, self.tree, added_at)
        if p.drop:
            self._forget_views()
        return bool(p.drop)

    def _measured(self, p: Plan, tree: int | None, added_at: int) -> None:
        self.kept, self.tree, self.added_at = p.kept, tree, added_at
        self.oldest, self.spare, self.last = p.oldest, p.spare, time.time()

    def _forget_views(self) -> None:
        """``history/`` is listed again from what is left."""
        c = self.c
        for name in list(c.history_dir.children):
            c.remove(c.history_dir, name)
