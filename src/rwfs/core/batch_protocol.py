"""A batch's commit protocol, in a worker thread (or in recovery, before the mount):
dry run, prepare, replace, record (``apply``; batches.py's docstring gives the steps);
and the batches rwfs writes itself: an interrupted batch resumed or rolled back, an undo
or a restore replayed (SPEC §6.2, §8)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath, faults
from ..checks.allowances import Allowance, waivable, waive, writer_uid
from ..checks.findings import Finding
from ..journal.objects import open_regular
from . import rights
from .batch import (
    ABORTED,
    COMMITTED,
    COMMITTING,
    CONFLICTED,
    INTERRUPTED,
    Batch,
    batch_error,
    new_record,
    owner_session,
)
from .changes import changes_in
from .commits import Commit, record_commit
from .errors import TooLarge, too_large
from .stages import Stage
from .syscalls import WORKERS, copy_metadata, fsdecode, syncfs

if TYPE_CHECKING:
    from .batches import Batches


class BatchProtocol:
    def __init__(self, batches: Batches) -> None:
        self.batches = batches
        self.ws = batches.ws

    async def resume(self, batch: Batch) -> None:
        """Perform an interrupted batch's owed writes (the §6.2 table, path by path)."""
        async with batch.lock:
            if batch.state != INTERRUPTED:
                raise batch_error(
                    f"Batch {batch.name} is {batch.state}; only an interrupted batch resumes.",
                    batch.name,
                )
            async with self.ws.committer.exclusive():
                done = await trio.to_thread.run_sync(self.resume_now, batch, limiter=WORKERS)
            for c in done:
                self.ws.committer.settle(c)  # the kernel's view of those paths is stale

    def resume_now(self, batch: Batch) -> list[Commit]:
        """``resume`` (blocking): owed entries become commits of their kept drafts."""
        commits = []
        owed = {r["path"]: r for r in self.ws.store.unsettled() if r.get("batch") == batch.name}
        for key, entry in sorted(batch.record["entries"].items(), key=lambda kv: kv[1]["order"]):
            receipt = owed.get(key)
            if entry.get("done") or (entry.get("receipt") and receipt is None):
                continue  # settled already
            c = Commit(
                os.fsencode(key),
                Stage(-1, b"", entry["expected"]),
                entry["intended"],
                entry["size"],
                {"resumed": True, **entry.get("by", {})},
                batch=batch.name,
            )
            if receipt is not None:
                c.info["receipt"] = receipt["id"]
            commits.append(c)
        self.apply(batch, commits, False)
        return commits

    async def rollback(self, batch: Batch) -> None:
        """Give an interrupted batch's paths their expected bytes back, where they hold the
        intended ones (digest-guarded); owed writes are dropped; the batch is aborted."""
        async with batch.lock:
            if batch.state != INTERRUPTED:
                raise batch_error(
                    f"Batch {batch.name} is {batch.state}; only an interrupted batch rolls "
                    "back (undo of committed batches comes with history).",
                    batch.name,
                )
            async with self.ws.committer.exclusive():
                done = await trio.to_thread.run_sync(self._rollback, batch, limiter=WORKERS)
            for c in done:
                self.ws.committer.settle(c)

    def _rollback(self, batch: Batch) -> list[Commit]:
        reverse = []
        for key, entry in batch.record["entries"].items():
            if not entry.get("done") or entry.get("outcome") != COMMITTED:
                continue
            if entry["expected"] is not None and not self.ws.objects.exists(entry["expected"]):
                continue  # the previous bytes are no longer kept
            reverse.append(
                Commit(
                    os.fsencode(key),
                    Stage(-1, b"", entry["intended"]),
                    entry["expected"],
                    0,
                    {"rollback": True, **entry.get("by", {})},
                    batch=batch.name,
                )
            )
        owed = [r for r in self.ws.store.unsettled() if r.get("batch") == batch.name]
        self.apply(batch, reverse, False, rollback=True)

        def settle(txn: Any) -> None:
            for receipt in owed:
                txn.put_receipt({**receipt, "state": ABORTED})
            batch.record["state"] = ABORTED
            batch.record["rolled_back"] = True
            txn.put_batch(batch.record)

        self.ws.store.write(settle)
        return reverse

    def changes_of(
        self, name: str, key: str = "batch"
    ) -> dict[bytes, tuple[str | None, str | None]]:
        """What undoing batch ``name`` means (``changes_in`` over the whole journal)."""
        return changes_in(self.ws.store.events(), name, key)

    def undone_by(self, name: str) -> str | None:
        """The batch that undid batch ``name`` and is still in effect (not undone in turn),
        or None."""
        for b in self.batches.all.values():
            undoes = b.record.get("undoes")
            if undoes is None and b.record.get("scope", {}).get("kind") == "rwfs":
                # (a journal from before ``undoes`` was recorded: the first undo's name)
                undoes = name if b.name == f"undo-{name}"[:64] else None
            if undoes == name and b.state != ABORTED and self.undone_by(b.name) is None:
                return b.name
        return None

    async def replay(
        self,
        base: str,
        changes: dict[bytes, tuple[str | None, str | None]],
        who: dict[str, Any],
        undoes: str | None = None,
        modes: dict[bytes, int] | None = None,
    ) -> Batch:
        """A batch of rwfs's own (an undo of batch ``undoes``, a restore): each path goes
        from its current bytes to the target ones, guarded by digests; a path changed
        meanwhile becomes a conflict (ESTALE once the rest is done). Returns the batch, which
        can itself be undone. A file brought back gets its mode from ``modes`` (path ->
        mode bits, see ``modes_at``) when it has one there."""
        # Checked first: nothing is made if one fails.
        rights.require(self.ws.root_fd, {p: t is None for p, (_, t) in changes.items()}, who)
        limit = self.ws.policy.max_journaled_bytes
        for path in changes:  # (an unjournaled file: comparing it would read all of it)
            with contextlib.suppress(OSError):
                if beneath.stat(self.ws.root_fd, path).st_size > limit:
                    raise too_large(path, limit)
        name = base
        n = 1
        while name in self.batches.all:
            n += 1
            name = f"{base[:58]}-{n}"
        entries = {}
        commits = []
        for order, (path, (current, target)) in enumerate(sorted(changes.items())):
            key = fsdecode(path)
            entries[key] = {"expected": current, "intended": target, "size": 0, "order": order}
            info = dict(who)
            if modes and target is not None and path in modes:
                info["want_mode"] = modes[path]
            commits.append(Commit(path, Stage(-1, b"", current), target, 0, info, batch=name))
        batch = self.batches.all[name] = Batch(new_record(name, COMMITTING, who, "rwfs", entries))
        if undoes is not None:
            batch.record["undoes"] = undoes
        async with batch.lock:
            await self.ws.committer.sync()
            async with self.ws.committer.exclusive():
                await trio.to_thread.run_sync(self.apply, batch, commits, False, limiter=WORKERS)
            for c in commits:
                self.ws.committer.settle(c)
        conflicts = [c for c in commits if c.outcome == "conflict"]
        if conflicts or batch.state == INTERRUPTED:
            raise batch_error(
                f"Batch {name} wrote what it could, but "
                + (
                    f"{len(conflicts)} file(s) changed since and became conflicts (see "
                    ".rw/conflicts/)"
                    if conflicts
                    else "some files could not be read"
                )
                + f"; see .rw/batches/{name}/status.",
                name,
                errno.ESTALE if conflicts else errno.EIO,
                where=".rw/ctl",
            )
        return batch

    def order(self, batch: Batch, c: Commit) -> int:
        return int(batch.record["entries"][fsdecode(c.path)]["order"])

    def apply(
        self, batch: Batch, commits: list[Commit], all_or_nothing: bool, rollback: bool = False
    ) -> list[dict[str, Any]]:
        """Dry run, prepare, replace, record. With ``all_or_nothing``, any failed check
        returns the reasons with nothing written; otherwise each path is settled by the
        §6.2 table (a conflict or a pending path does not stop the others)."""
        ws = self.ws
        reasons = self._dry_run(commits, gates=all_or_nothing)
        if all_or_nothing and reasons:
            return reasons
        faults.point("batch_after_dry_run")
        todo = [c for c in commits if c.outcome != "pending"]
        owner = owner_session(batch)
        for c in todo:
            if batch.record["entries"].get(fsdecode(c.path), {}).get("replace"):
                c.info["replace"] = True
            if owner is not None:  # (``undo SESSION`` takes what its batch committed)
                c.info["session"] = owner
        for c in todo:  # a conflict found at resume can still show its base
            self._keep_base(c)
        for c in todo:
            if c.stage.fd < 0 and c.intended is not None and not self._materialize(c):
                c.outcome = "pending"
        # Deletions first, then the names that get a new file (``replace``), then the
        # writes: removing or replacing one name of a hard-linked file before another
        # name's write in place leaves that write a file of one name, and the deletion or
        # the replacement sees the bytes it expects (a write in place first would change
        # them under it).
        todo = sorted(
            (c for c in todo if c.outcome != "pending"),
            key=lambda c: (c.intended is not None, not c.info.get("replace")),
        )
        if len(todo) > 8:
            syncfs(ws.staging_fd)
        else:
            for c in todo:
                if c.stage.fd >= 0:
                    os.fsync(c.stage.fd)

        linked = ws.links.linked(todo)

        def prepare(txn: Any) -> None:
            for c in todo:
                if "receipt" in c.info:
                    txn.put_receipt(
                        {**txn.receipt(c.info["receipt"]), "stage": c.stage.name.decode()}
                    )
                    continue
                c.info["receipt"] = txn.new_receipt(
                    {
                        "batch": batch.name,
                        "path": fsdecode(c.path),
                        "expected": c.stage.expected,
                        "intended": c.intended,
                        "stage": c.stage.name.decode(),
                        "size": c.size,
                        **({"in_place": True} if c.id in linked else {}),
                    }
                )
                if not rollback:
                    batch.record["entries"][fsdecode(c.path)]["receipt"] = c.info["receipt"]
            if not rollback:
                batch.record["state"] = COMMITTING
                batch.record["reasons"] = []
            txn.put_batch(batch.record)

        ws.store.write(prepare)
        faults.point("batch_after_prepare")
        for c in todo:
            ws.landing.replace(c)
            faults.point("batch_after_rename")
        syncfs(ws.root_fd)
        faults.point("batch_before_commit_record")

        def record(txn: Any) -> None:
            for c in todo:
                record_commit(txn, c)
                if rollback:
                    continue
                entry = batch.record["entries"][fsdecode(c.path)]
                if c.outcome in ("committed", "landed", "conflict"):
                    entry["done"] = True
                    entry["outcome"] = COMMITTED if c.outcome != "conflict" else CONFLICTED
                    entry.pop("stage", None)
            if not rollback:
                entries = batch.record["entries"].values()
                if not all(e.get("done") for e in entries):
                    batch.record["state"] = INTERRUPTED
                elif any(e.get("outcome") == CONFLICTED for e in entries):
                    batch.record["state"] = CONFLICTED
                else:
                    batch.record["state"] = COMMITTED
            txn.put_batch(batch.record)

        ws.store.write(record)
        faults.point("batch_after_commit_record")
        return []

    def _dry_run(self, commits: list[Commit], gates: bool) -> list[dict[str, Any]]:
        reasons: list[dict[str, Any]] = []
        # The writers' allowances it would use, with what they would waive.
        allowing: list[tuple[Commit, Allowance, list[Finding]]] = []

        def fail(c: Commit, errno_: int, reason: str, message: str, **more: Any) -> None:
            reasons.append(
                {"path": fsdecode(c.path), "reason": reason, "errno": errno_, "message": message}
                | more
            )

        for c in commits:
            try:
                live, st = self.ws.digests.live(c.path)
            except beneath.Escape:
                c.outcome = "pending"
                fail(c, errno.EPERM, "symlink", "a directory on its path is a symlink")
                continue
            except TooLarge:
                c.outcome = "pending"
                fail(c, errno.EFBIG, "too_large", "it is past max_journaled_bytes (unjournaled)")
                continue
            except OSError as exc:
                c.outcome = "pending"
                fail(c, errno.EIO, "unreadable", f"it cannot be read ({exc.strerror})")
                continue
            if st is not None and not stat.S_ISREG(st.st_mode):
                fail(c, errno.EPERM, "symlink", "it became a symlink or another kind of file")
            elif live not in (c.stage.expected, c.intended):
                fail(
                    c,
                    errno.ESTALE,
                    "conflict",
                    "it changed outside the batch since the batch first wrote it",
                    expected=c.stage.expected,
                    actual=live,
                )
            elif gates and live not in (None, c.intended) and c.stage.fd >= 0 and c.stage.written:
                # (A draft nothing was written into holds explicit truncations: not judged.)
                fd, _ = open_regular(self.ws.root_fd, c.path)
                if fd < 0:  # swapped since the check: the replace step refuses it
                    continue
                try:
                    findings = self.ws.gating.run_now(c.path, fd, c.stage.fd, c.stage.cut_last)
                finally:
                    os.close(fd)
                refused = [f for f in findings if f.action == "reject"]
                if refused and waivable(refused):
                    # Let through by its writer's allowance (allowances.py): one used by a
                    # write into the batch goes with the batch's change of the path; one
                    # granted since is used up if the batch commits.
                    used = c.info.get("allowed")
                    if used is None:
                        uid = writer_uid(c.info)
                        mine = self.ws.allowances.peek(uid, c.path) if uid is not None else None
                        if mine is not None:
                            allowing.append((c, mine, refused))
                            used = True
                    if used:
                        refused = []
                if refused:
                    code = getattr(errno, self.ws.policy.refusal_errno)
                    fail(c, code, refused[0].gate, refused[0].message, error="blocked")
        if not reasons:
            for c, a, found in allowing:
                taken = self.ws.allowances.take(a.uid, c.path)
                if taken is not None:
                    waive(found, taken)
                    c.info["allowed"] = taken.record()
        return reasons

    def _keep_base(self, c: Commit) -> None:
        """Keep a copy of the bytes a path holds before the batch replaces them: a hard
        link (what a commit keeps) would change with an edit made by hand meanwhile."""
        if c.stage.expected is not None:
            self.ws.stages.keep_live_copy(c.path, c.stage.expected)

    def _materialize(self, c: Commit) -> bool:
        """A stage made from the kept draft (object) of an entry; False if it is gone."""
        if c.intended is None:
            return True  # a deletion needs no bytes
        try:
            fd = self.ws.objects.open(c.intended)
        except FileNotFoundError:
            return False
        try:
            stage = self.ws.stages.make(fd, truncate=False)
        finally:
            os.close(fd)
        stage.expected = c.stage.expected
        c.stage = stage
        c.size = os.fstat(stage.fd).st_size
        live = self.live_fd(c.path)
        if live is None:  # re-created: not the object's read-only mode
            os.fchmod(stage.fd, 0o644)
        else:  # the live file's mode, owner and xattrs carry over
            try:
                copy_metadata(live, stage.fd, os.fstat(live))
            finally:
                os.close(live)
        if "want_mode" in c.info:  # an undo's, a restore's: the mode the file had then
            os.fchmod(stage.fd, c.info["want_mode"])
        return True

    def live_fd(self, path: bytes) -> int | None:
        try:
            fd, _ = open_regular(self.ws.root_fd, path)
        except OSError:
            return None
        return fd if fd >= 0 else None

    def finish(self, batch: Batch, commits: list[Commit]) -> None:
        for c in commits:
            self.batches.settled(c, c.outcome)
        batch.held.clear()
        conflicts = [c for c in commits if c.outcome == "conflict"]
        if conflicts:
            raise batch_error(
                f"Batch {batch.name} committed, but {len(conflicts)} of its files changed "
                "outside it at the last moment and were not written: see .rw/conflicts/.",
                batch.name,
                errno.ESTALE,
            )
