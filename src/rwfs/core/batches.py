"""Explicit batches: multi-file edits that commit all or nothing (SPEC §6.1-6.2).

While a batch is open, the commits of writers in its scope are *held*: sealed and
gate-checked like any other, shown by the mount, but not queued for the group committer,
so the real tree does not change. Each held draft is recorded in the batch's LMDB record
(``entries``), so a crash never loses it. ``commit`` then runs the batch protocol:

1. dry run: every path still holds its expected digest, is a regular file (or absent, as
   expected), and passes the gates; if anything fails, nothing is written, the batch stays
   open and ``status`` says why;
2. every stage is synced and every receipt prepared, in one durable transaction;
3. paths are replaced in first-written order (the same check-keep-rename as a single commit);
4. one durable transaction records every commit and the batch's new state.

Recovery (``recover``) classifies an interrupted batch's receipts by the §6.2 table and
leaves one notice per batch, in the transaction that classifies it. Nothing here knows
about FUSE; the FUSE layer learns about settled drafts through ``Committer.settle``.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from .. import beneath, faults
from ..checks.allowances import WAIVES, Allowance, allow_hint, waivable, waive, writer_uid
from ..checks.gates import Finding
from ..journal.objects import open_regular
from ..journal.store import now_iso, plain_name
from . import rights
from .changes import changes_in
from .commits import Commit, record_commit
from .errors import RwfsError, TooLarge, too_large
from .stages import Stage
from .syscalls import WORKERS, borrowed, copy_metadata, fsdecode, syncfs
from .workspace import Workspace

OPEN, COMMITTING, COMMITTED = "open", "committing", "committed"
ABORTED, INTERRUPTED, CONFLICTED = "aborted", "interrupted", "conflicted"


def _err(message: str, batch: str | None, errno_: int = errno.EINVAL, **extra: Any) -> RwfsError:
    error, hint = {
        errno.ESTALE: ("stale_precondition", "conflict"),
        errno.EACCES: ("policy_violation", "permission"),
        errno.EBADMSG: ("blocked", "gate"),
        errno.EIO: ("journal_unavailable", "io"),
    }.get(errno_, ("policy_violation", "verb"))
    where = extra.pop("where", None) or (f".rw/batches/{batch}/ctl" if batch else ".rw/batches")
    return RwfsError(
        errno_,
        extra.pop("error", None) or error,  # (a reason may name none: its errno's)
        extra.pop("hint", None) or hint,
        message,
        path=where,
        batch=batch,
        **extra,
    )


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # the process is gone
        return None


# What a batch's entry remembers of the writer of its latest change, and what the events of
# the batch's commit then carry (SPEC §7.1's pid, comm, uid; the run session's name).
WRITER_KEYS = ("pid", "comm", "uid", "session")


def writer_of(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in WRITER_KEYS if info.get(k) is not None}


def owner_session(batch: Batch) -> str | None:
    """The run session a batch of scope ``run`` was opened for (``rwfs run --batch`` and
    ``--review``), else None: every change such a batch commits is that session's."""
    scope = batch.record.get("scope") or {}
    return str(scope["session"]) if scope.get("kind") == "run" and scope.get("session") else None


def is_explicit(receipt: dict[str, Any]) -> bool:
    """Does a receipt belong to an explicit batch (not a batch of one)?"""
    batch = receipt.get("batch")
    return bool(batch) and not str(batch).startswith("auto-")


def check_name(raw: bytes) -> str:
    """A batch name as SPEC §6.1 allows it, or EINVAL saying why."""
    name = plain_name(raw)
    if name is None or name.startswith("auto-"):
        shown = raw.decode("utf-8", "replace")[:40] + ("…" if len(raw) > 40 else "")
        raise _err(
            f"No batch was opened because {shown!r} is not a batch name: use 1 to 64 letters, "
            "digits, dots, dashes or underscores, not starting with a dash or 'auto-'.",
            None,
        )
    return name


def _record(
    name: str, state: str, who: dict[str, Any], scope: str, entries: dict[str, Any]
) -> dict[str, Any]:
    """A new batch's LMDB record (store.py documents its fields)."""
    return {
        "name": name,
        "state": state,
        "opened": now_iso(),
        "opened_by": who,
        "scope": {"kind": scope},
        "entries": entries,
        "reasons": [],
        "noticed": False,
    }


@dataclass(eq=False)
class Batch:
    record: dict[str, Any]
    held: dict[bytes, Commit] = field(default_factory=dict)  # drafts this mount holds
    lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def name(self) -> str:
        return str(self.record["name"])

    @property
    def state(self) -> str:
        return str(self.record["state"])


class Batches:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.all: dict[str, Batch] = {r["name"]: Batch(r) for r in ws.store.batches()}

    # ---- lifecycle ----

    def taken(self, name: str) -> RwfsError | None:
        """The refusal of ``mkdir batches/NAME`` for a name a batch has, else None."""
        if name not in self.all:
            return None
        gone = self.all[name].record.get("removed")
        now = "existed before: the journal keeps its name" if gone else f"is {self.all[name].state}"
        return _err(
            f"No batch was opened because the name {name} is taken (batch {name} {now}); "
            "choose another name.",
            name,
            errno.EEXIST,
        )

    async def open(self, raw_name: bytes, who: dict[str, Any]) -> Batch:
        name = check_name(raw_name)
        taken = self.taken(name)
        if taken is not None:
            raise taken
        # The opener's writes only, until a scope verb says otherwise (SPEC §3.3b).
        batch = self.all[name] = Batch(_record(name, OPEN, who, "uid", {}))
        batch.record["scope"]["uid"] = who.get("uid", 0)
        try:
            await self._save(batch)
        except BaseException:
            del self.all[name]
            raise
        return batch

    async def forget(self, name: str) -> None:
        """rmdir of a finished batch: its record goes (the journal keeps its events)."""
        batch = self.all.get(name)
        if batch is None or batch.record.get("removed"):
            raise _err(f"There is no batch {name}.", None, errno.ENOENT)
        if batch.state not in (COMMITTED, ABORTED, CONFLICTED):
            raise _err(
                f"Batch {name} is {batch.state}, so it was not removed: commit or abort it first.",
                name,
                errno.EBUSY,
            )
        # The record stays (hidden): its name stays taken, so that `undo NAME` and the
        # journal's batch names keep meaning one batch.
        batch.record["removed"] = True
        await self._save(batch)

    def may_steer(self, batch: Batch, who: dict[str, Any]) -> None:
        """Only the user who opened a batch, or root, commits, aborts, resumes or rolls
        it back (SPEC §3.3b: a verb acts with its caller's rights)."""
        opener = (batch.record.get("opened_by") or {}).get("uid")
        if who.get("uid") not in (0, None, opener) and opener is not None:
            raise _err(
                f"Batch {batch.name} was opened by another user (uid {opener}), so nothing "
                "was done: only that user or root may commit, abort, resume or roll it back.",
                batch.name,
                errno.EACCES,
            )

    def for_writer(self, who: dict[str, Any]) -> Batch | None:
        """The open batch whose scope takes this writer's commits (the newest that does)."""
        found = None
        for batch in self.all.values():
            if batch.state == OPEN and self._in_scope(batch.record["scope"], who):
                if found is None or batch.record["opened"] >= found.record["opened"]:
                    found = batch
        return found

    def holding(self, path: bytes) -> Batch | None:
        """The open batch that holds a change of ``path`` (a draft, or its deletion)."""
        for batch in self.all.values():
            if batch.state == OPEN and path in batch.held:
                return batch
        return None

    def _in_scope(self, scope: dict[str, Any], who: dict[str, Any]) -> bool:
        if scope["kind"] == "uid":
            return bool(who.get("uid") == scope["uid"])
        if scope["kind"] == "session":
            return session_of(who.get("pid", 0)) == scope["sid"]
        if scope["kind"] == "run":  # an ``rwfs run`` session's writers (sessions.py)
            return bool(who.get("session") == scope["session"])
        return True

    async def set_scope(self, batch: Batch, args: list[str], who: dict[str, Any]) -> None:
        if batch.state == OPEN and args == ["run"] and who.get("session"):
            # (from inside an ``rwfs run`` session: that session's writes, sessions.py)
            batch.record["scope"] = {"kind": "run", "session": who["session"]}
            await self._save(batch)
            return
        if batch.state != OPEN or len(args) != 1 or args[0] not in ("all", "uid", "session"):
            raise _err(
                "The scope was not changed: write 'scope all', 'scope uid' (your user's "
                "writes) or 'scope session' (your terminal session's) to an open batch.",
                batch.name,
            )
        scope: dict[str, Any] = {"kind": args[0]}
        if args[0] == "uid":
            scope["uid"] = who["uid"]
        elif args[0] == "session":
            scope["sid"] = session_of(who["pid"])
        batch.record["scope"] = scope
        await self._save(batch)

    async def hold(self, batch: Batch, commit: Commit, wait: bool) -> bool:
        """Keep a sealed, gate-checked commit in the batch instead of committing it.

        False if the batch stopped being open meanwhile (the caller commits it alone).
        """
        async with batch.lock:
            if batch.state != OPEN:
                return False
            if wait:  # fsync(): the draft itself must be on disk
                with borrowed(commit.stage.fd) as (fd,):
                    await trio.to_thread.run_sync(os.fsync, fd, limiter=WORKERS)
            entry = await self._put_entry(
                batch,
                commit.path,
                commit.stage.expected,
                commit.intended,
                commit.size,
                commit.stage.name.decode(),
                writer_of(commit.info),
            )
            commit.batch, commit.held = batch.name, True
            commit.stage.expected = entry["expected"]
            previous = batch.held.get(commit.path)
            batch.held[commit.path] = commit
            if previous is not None and previous is not commit:
                self.ws.stages.retire_draft(previous.stage, previous.intended)
            return True

    async def _put_entry(
        self,
        batch: Batch,
        path: bytes,
        expected: str | None,
        intended: str | None,
        size: int,
        stage: str | None,
        by: dict[str, Any],
    ) -> dict[str, Any]:
        """Record the batch's change of ``path`` durably. The base and the order stay those
        of the batch's first change of the path; ``by`` is its latest writer (``writer_of``),
        whom the events of the batch's commit name."""
        key = fsdecode(path)
        entries = batch.record["entries"]
        before = entries.get(key)
        entries[key] = {
            "expected": before["expected"] if before else expected,
            "intended": intended,
            "size": size,
            "order": before["order"] if before else len(entries),
            "stage": stage,
            "by": by,
            # Made again after the batch deleted it: a new file at the name (see retarget).
            **(
                {"replace": True}
                if before and (before.get("replace") or before["intended"] is None)
                else {}
            ),
        }
        try:
            await self._save(batch)
        except BaseException:
            if before is None:
                del entries[key]
            else:
                entries[key] = before
            raise
        return dict(entries[key])

    async def retarget(self, batch: Batch, commit: Commit, dst: bytes, base: str | None) -> None:
        """A held draft renamed onto ``dst``: it is now the batch's change of ``dst``, whose
        base stays what the batch first saw there (``base`` if the batch had not seen it)."""
        async with batch.lock:
            entries = batch.record["entries"]
            moved = entries.pop(fsdecode(commit.path))
            before = entries.pop(fsdecode(dst), None)
            moved["expected"] = before["expected"] if before else base
            # A file renamed onto dst: the commit replaces the name, as rename(2) does, and
            # never writes into a file dst shares with other names (Landing.replace).
            moved["replace"] = True
            entries[fsdecode(dst)] = moved
            del batch.held[commit.path]
            replaced = batch.held.pop(dst, None)
            commit.path, commit.stage.expected = dst, moved["expected"]
            batch.held[dst] = commit
            await self._save(batch)
            if replaced is not None:
                self.ws.stages.drop(replaced.stage)
                self._settled(replaced, "replaced")

    async def move_entry(self, batch: Batch, commit: Commit, path: bytes) -> None:
        """A held draft of a hard-linked file now stands under another of its names (the
        one it was held under is getting another file)."""
        async with batch.lock:
            entries = batch.record["entries"]
            entries[fsdecode(path)] = entries.pop(fsdecode(commit.path))
            del batch.held[commit.path]
            commit.path = path
            batch.held[path] = commit
            await self._save(batch)

    async def hide(self, batch: Batch, path: bytes, base: str | None, who: dict[str, Any]) -> None:
        """An unlink in the batch by ``who``: the file goes when the batch commits (a
        deletion is a held commit with no bytes: ``intended`` None). Its event names
        ``who``, as an unlink's own event does."""
        async with batch.lock:
            by = writer_of(who)
            expected = (await self._put_entry(batch, path, base, None, 0, None, by))["expected"]
            gone = Commit(path, Stage(-1, b"", expected), None, 0, by, batch=batch.name, held=True)
            replaced = batch.held.get(path)
            batch.held[path] = gone
            if replaced is not None:
                self.ws.stages.drop(replaced.stage)
                self._settled(replaced, "replaced")

    async def unhold(self, batch: Batch, path: bytes) -> None:
        """The file is back to the batch's base bytes: the batch no longer changes it."""
        async with batch.lock:
            batch.record["entries"].pop(fsdecode(path), None)
            commit = batch.held.pop(path, None)
            await self._save(batch)
            if commit is not None:
                self.ws.stages.drop(commit.stage)
                self._settled(commit, "noop")

    async def commit(self, batch: Batch) -> None:
        async with batch.lock:
            if batch.state != OPEN:
                raise _err(
                    f"Batch {batch.name} is {batch.state}, so there is nothing to commit.",
                    batch.name,
                )
            commits = sorted(batch.held.values(), key=lambda c: self._order(batch, c))
            await self.ws.committer.sync()  # commits queued before the batch's go first
            async with self.ws.committer.exclusive():
                reasons = await trio.to_thread.run_sync(
                    self._apply, batch, commits, True, limiter=WORKERS
                )
            if reasons:
                for c in commits:
                    c.outcome = ""
                batch.record["reasons"] = reasons
                await self._save(batch)
                first = reasons[0]
                raise _err(
                    f"Batch {batch.name} was not committed and nothing was written, because "
                    f"{first['path']}: {first['message']}"
                    + (f" (and {len(reasons) - 1} more reasons)" if len(reasons) > 1 else "")
                    + f"; the batch stays open: see .rw/batches/{batch.name}/status, fix it "
                    + (
                        "and commit again, or abort (if that change is deliberate, its writer "
                        "allows it with "
                        + allow_hint(first["path"], "", self.ws.mountpoint)["command"]
                        + " and you commit again)."
                        if first["reason"] in WAIVES
                        else "and commit again, or abort."
                    ),
                    batch.name,
                    first["errno"],
                    details={"reasons": reasons},
                    error=first.get("error"),
                    hint=first["reason"],
                )
            self._finish(batch, commits)

    async def abort(self, batch: Batch) -> None:
        async with batch.lock:
            if batch.state not in (OPEN, INTERRUPTED):
                raise _err(
                    f"Batch {batch.name} is {batch.state}, so it cannot be aborted.", batch.name
                )
            owed = [r for r in self.ws.store.unsettled() if r.get("batch") == batch.name]

            def settle(txn: Any) -> None:
                for receipt in owed:  # owed writes of an interrupted batch are dropped
                    txn.put_receipt({**receipt, "state": ABORTED})
                batch.record["state"] = ABORTED
                txn.put_batch(batch.record)

            await trio.to_thread.run_sync(self.ws.store.write, settle, limiter=WORKERS)
            for commit in batch.held.values():
                self.ws.stages.drop(commit.stage)
                self._settled(commit, ABORTED)
                # Each draft dropped is journaled: its writer was told its write succeeded.
                self.ws.committer.record(
                    {
                        "op": "drop",
                        "path": fsdecode(commit.path),
                        "batch": batch.name,
                        "expected": commit.stage.expected,
                        "intended": commit.intended,
                        **writer_of(commit.info),
                    }
                )
            batch.held.clear()
            for link in batch.record.get("links", []):  # made in the batch, still that file
                path = os.fsencode(link["path"])
                try:
                    with beneath.parent(self.ws.root_fd, path) as (dfd, name):
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                        if [st.st_ino, st.st_nlink > 1] != [link["ino"], True]:
                            continue  # its other names are gone: the name holds the file now
                        os.unlink(name, dir_fd=dfd)
                except OSError:
                    continue
                self.ws.committer.record(
                    {"op": "unlink", "path": link["path"], "batch": batch.name}
                )
                self.ws.on_gone(path)
            for d in reversed(batch.record.get("dirs", [])):  # made in the batch, still empty
                path = os.fsencode(d)
                try:
                    with beneath.parent(self.ws.root_fd, path) as (dfd, name):
                        os.rmdir(name, dir_fd=dfd)
                except OSError:
                    continue
                self.ws.committer.record({"op": "rmdir", "path": d, "batch": batch.name})
                self.ws.on_gone(path)

    async def made_dir(self, batch: Batch, path: bytes) -> None:
        """A directory made by a writer of the open batch: it is in the tree already (only
        files wait for the commit); an abort removes it again if it is still empty."""
        async with batch.lock:
            batch.record.setdefault("dirs", []).append(fsdecode(path))
            await self._save(batch)

    async def made_link(self, batch: Batch, path: bytes, ino: int) -> None:
        """A hard link made by a writer of the open batch: in the tree already, as a
        directory is; an abort removes it again while the file has another name."""
        async with batch.lock:
            batch.record.setdefault("links", []).append({"path": fsdecode(path), "ino": ino})
            await self._save(batch)

    async def resume(self, batch: Batch) -> None:
        """Perform an interrupted batch's owed writes (the §6.2 table, path by path)."""
        async with batch.lock:
            if batch.state != INTERRUPTED:
                raise _err(
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
        self._apply(batch, commits, False)
        return commits

    async def rollback(self, batch: Batch) -> None:
        """Give an interrupted batch's paths their expected bytes back, where they hold the
        intended ones (digest-guarded); owed writes are dropped; the batch is aborted."""
        async with batch.lock:
            if batch.state != INTERRUPTED:
                raise _err(
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
        self._apply(batch, reverse, False, rollback=True)

        def settle(txn: Any) -> None:
            for receipt in owed:
                txn.put_receipt({**receipt, "state": ABORTED})
            batch.record["state"] = ABORTED
            batch.record["rolled_back"] = True
            txn.put_batch(batch.record)

        self.ws.store.write(settle)
        return reverse

    # ---- batches rwfs writes itself: undo, restore (SPEC §8) ----

    def changes_of(
        self, name: str, key: str = "batch"
    ) -> dict[bytes, tuple[str | None, str | None]]:
        """What undoing batch ``name`` means (``changes_in`` over the whole journal)."""
        return changes_in(self.ws.store.events(), name, key)

    def undone_by(self, name: str) -> str | None:
        """The batch that undid batch ``name`` and is still in effect (not undone in turn),
        or None."""
        for b in self.all.values():
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
        while name in self.all:
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
        batch = self.all[name] = Batch(_record(name, COMMITTING, who, "rwfs", entries))
        if undoes is not None:
            batch.record["undoes"] = undoes
        async with batch.lock:
            await self.ws.committer.sync()
            async with self.ws.committer.exclusive():
                await trio.to_thread.run_sync(self._apply, batch, commits, False, limiter=WORKERS)
            for c in commits:
                self.ws.committer.settle(c)
        conflicts = [c for c in commits if c.outcome == "conflict"]
        if conflicts or batch.state == INTERRUPTED:
            raise _err(
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

    # ---- the protocol (blocking: worker thread, or recovery before the mount) ----

    def _order(self, batch: Batch, c: Commit) -> int:
        return int(batch.record["entries"][fsdecode(c.path)]["order"])

    def _apply(
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
        live = self._live_fd(c.path)
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

    def _live_fd(self, path: bytes) -> int | None:
        try:
            fd, _ = open_regular(self.ws.root_fd, path)
        except OSError:
            return None
        return fd if fd >= 0 else None

    def _finish(self, batch: Batch, commits: list[Commit]) -> None:
        for c in commits:
            self._settled(c, c.outcome)
        batch.held.clear()
        conflicts = [c for c in commits if c.outcome == "conflict"]
        if conflicts:
            raise _err(
                f"Batch {batch.name} committed, but {len(conflicts)} of its files changed "
                "outside it at the last moment and were not written: see .rw/conflicts/.",
                batch.name,
                errno.ESTALE,
            )

    def _settled(self, commit: Commit, outcome: str) -> None:
        commit.outcome = outcome
        commit.held = False
        self.ws.committer.settle(commit)
        commit.finish()

    async def _save(self, batch: Batch) -> None:
        await trio.to_thread.run_sync(
            self.ws.store.write, lambda txn: txn.put_batch(batch.record), limiter=WORKERS
        )

    # ---- views ----

    def status(self, batch: Batch) -> dict[str, Any]:
        receipts = {r["id"]: r for r in self.ws.store.receipts_of(batch.name)}
        paths = []
        for key, entry in sorted(batch.record["entries"].items(), key=lambda kv: kv[1]["order"]):
            r = receipts.get(entry.get("receipt", -1))
            paths.append(
                {
                    "path": key,
                    "expected": entry["expected"],
                    "intended": entry["intended"],
                    "state": r["state"] if r else _unreceipted.get(batch.state, "owed"),
                    **({"receipt": r["id"]} if r else {}),
                    **({"conflict": r["conflict"]} if r and r.get("conflict") else {}),
                    # The run session whose writer made the latest change (sessions.py).
                    **(
                        {"session": by["session"]}
                        if (by := entry.get("by")) and "session" in by
                        else {}
                    ),
                }
            )
        rec = batch.record
        return {
            "name": rec["name"],
            "state": rec["state"],
            "opened": rec["opened"],
            "scope": rec["scope"],
            "reasons": rec.get("reasons", []),
            "paths": paths,
            **({"rolled_back": True} if rec.get("rolled_back") else {}),
            **({"undoes": rec["undoes"]} if rec.get("undoes") else {}),
        }

    def summary(self, batch: Batch) -> dict[str, Any]:
        """One open batch in a line of ``.rw/status``: whose writes it captures, since
        when, and how many files it holds."""
        return {
            "name": batch.name,
            "opened": batch.record.get("opened"),
            "scope": batch.record.get("scope"),
            "files": len(batch.record.get("entries", {})),
        }

    def diff(self, batch: Batch) -> bytes:
        """A unified diff of the batch against its base (blocking)."""
        out = []
        opener = batch.record.get("opened_by") or {}
        for key, entry in sorted(batch.record["entries"].items(), key=lambda kv: kv[1]["order"]):
            path = os.fsencode(key)
            commit = batch.held.get(path)
            writer = commit.info.get("uid") if commit is not None else opener.get("uid")
            # The diff is its opener's (0400): another user's draft of a file the opener
            # may not read is named, not shown (a batch of scope all holds such drafts).
            if writer != opener.get("uid") and not rights.may_read(self.ws.root_fd, path, opener):
                out.append(b"--- " + path + b": another user's draft of a file you may not read\n")
                continue
            old = self._bytes(entry["expected"], live=path)
            new = (
                os.pread(commit.stage.fd, os.fstat(commit.stage.fd).st_size, 0)
                if commit is not None and commit.stage.fd >= 0
                else self._bytes(entry["intended"])
            )
            out.append(_unified(key, old, new))
        return b"".join(out)

    def _bytes(self, digest: str | None, live: bytes | None = None) -> bytes | None:
        if digest is None:
            return b""
        fd = -1
        if live is not None:  # the base of an open batch is the live file
            got = self._live_fd(live)
            if got is not None and self.ws.digests.of_fd(got) == digest:
                fd = got
            elif got is not None:
                os.close(got)
        if fd < 0:
            try:
                fd = self.ws.objects.open(digest)
            except FileNotFoundError:
                return None
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)


# A path's state before the batch prepared a receipt for it.
_unreceipted = {OPEN: "staged", ABORTED: "dropped"}


def _unified(path: str, old: bytes | None, new: bytes | None) -> bytes:
    if old is None or new is None:
        return f"--- a/{path}\n+++ b/{path}\n(the bytes are no longer kept)\n".encode()
    if b"\0" in old or b"\0" in new:
        return f"Binary files a/{path} and b/{path} differ\n".encode()
    a = old.decode("utf-8", "replace").splitlines(keepends=True)
    b = new.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"a/{path}", f"b/{path}")
    return "".join(
        ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines
    ).encode()


# ---- recovery (before the mount is served) ----


def recover(
    ws: Workspace,
    batches: Batches,
    summary: dict[str, int],
    failed: Callable[[str, Exception], None] | None = None,
) -> None:
    """Settle every explicit batch a crash interrupted (SPEC §6.2), one notice each.

    With ``failed``, a batch whose settling raises is left as it is and reported there,
    and the other batches are still settled."""
    for batch in list(batches.all.values()):
        try:
            if batch.state == OPEN:
                _recover_open(ws, batch)
            elif batch.state in (COMMITTING, INTERRUPTED):
                _recover_committing(ws, batches, batch, summary)
        except Exception as exc:
            if failed is None:
                raise
            failed(f"batch {batch.name}", exc)


def _keep_draft(ws: Workspace, stage_name: str | None, digest: str | None) -> bool:
    """Move a staged draft into the object store if it holds ``digest``."""
    if digest is None:
        return True  # a deletion: no draft
    if not stage_name:
        return ws.objects.exists(digest)
    name = stage_name.encode()
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=ws.staging_fd)
    except FileNotFoundError:
        return ws.objects.exists(digest)
    try:
        ok = ws.digests.of_fd(fd) == digest
    finally:
        os.close(fd)
    if ok:
        ws.objects._place(ws.staging_fd, name, digest, move=True)
    return ok


def _notice(txn: Any, batch: Batch, message: str) -> None:
    if not batch.record.get("noticed"):
        batch.record["noticed"] = True
        txn.new_notice({"kind": "batch_interrupted", "batch": batch.name, "message": message})


def _recover_open(ws: Workspace, batch: Batch) -> None:
    """Open when rwfs stopped: nothing reached the tree; the drafts are kept as objects."""
    lost = []
    for key, entry in batch.record["entries"].items():
        if not _keep_draft(ws, entry.pop("stage", None), entry["intended"]):
            lost.append(key)
    for key in lost:
        del batch.record["entries"][key]
    batch.record["state"] = INTERRUPTED
    n = len(batch.record["entries"])

    def write(txn: Any) -> None:
        _notice(
            txn,
            batch,
            f"Batch {batch.name} was open when rwfs stopped, so none of its {n} staged "
            "files reached the tree; their drafts are kept: write 'resume' to "
            f".rw/batches/{batch.name}/ctl to commit them, or 'abort' to drop them."
            + (f" Drafts lost: {', '.join(lost)}." if lost else ""),
        )
        txn.put_batch(batch.record)

    ws.store.write(write)


def _recover_committing(
    ws: Workspace, batches: Batches, batch: Batch, summary: dict[str, int]
) -> None:
    receipts = [r for r in ws.store.unsettled() if r.get("batch") == batch.name]
    for r in receipts:  # the drafts move to the object store: resume works from there
        if _keep_draft(ws, r.get("stage"), r["intended"]) and r.get("stage"):
            ws.store.write(lambda txn, r=r: txn.put_receipt({**r, "stage": None}))
    # Roll forward by policy only a batch whose commit had begun at this crash, never
    # one a person was already told about (interrupted at an earlier mount).
    auto = ws.policy.resume == "auto" and batch.state == COMMITTING
    # Settle what landed, open conflicts for what changed; owed writes wait (or, with
    # resume = "auto", are performed below).
    settle = []
    owed = unreadable = 0
    for r in receipts:
        path = os.fsencode(r["path"])
        try:
            live, st = ws.digests.live(path)
        except OSError:
            summary["pending"] += 1
            unreadable += 1
            owed += 1
            continue
        # A directory, symlink, FIFO, socket or device node there is not "absent" (a null
        # digest): it holds neither version, so it is a conflict below.
        special = st is not None and not stat.S_ISREG(st.st_mode)
        c = Commit(
            path,
            Stage(-1, b"", r["expected"]),
            r["intended"],
            r.get("size", 0),
            {"receipt": r["id"], "recovered": True},
            batch=batch.name,
        )
        if live == r["intended"] and not special:
            c.outcome = "landed"
            c.info["kept"] = bool(r["expected"]) and ws.objects.exists(r["expected"])
            ws.links.landed(c, st)
            settle.append(c)
            summary["committed"] += 1
        elif live == r["expected"] and not special:
            owed += 1
        else:
            c.outcome, c.info["actual"] = "conflict", live
            settle.append(c)
            summary["conflicts"] += 1

    def write(txn: Any) -> None:
        for c in settle:
            record_commit(txn, c)
            entry = batch.record["entries"].get(fsdecode(c.path))
            if entry is not None:
                entry["done"] = True
                entry["outcome"] = COMMITTED if c.outcome == "landed" else CONFLICTED
        unfinished = owed or any(not e.get("done") for e in batch.record["entries"].values())
        if unfinished and auto:
            batch.record["state"] = INTERRUPTED  # resume_now, just below, finishes it
            _notice(
                txn,
                batch,
                f"Batch {batch.name} was committing when rwfs stopped; as the policy says "
                f'resume = "auto", rwfs finished it at this mount ({owed} files were owed).',
            )
        elif unfinished:
            batch.record["state"] = INTERRUPTED
            _notice(
                txn,
                batch,
                f"Batch {batch.name} was committing when rwfs stopped: {owed} of its files "
                "still hold their old bytes. Write 'resume' to "
                f".rw/batches/{batch.name}/ctl to finish it, or 'rollback' to undo the files "
                "it already wrote.",
            )
        else:
            conflicted = any(
                e.get("outcome") == CONFLICTED for e in batch.record["entries"].values()
            )
            batch.record["state"] = CONFLICTED if conflicted else COMMITTED
        txn.put_batch(batch.record)

    ws.store.write(write)
    if auto and batch.state == INTERRUPTED:
        for c in batches.resume_now(batch):
            ws.committer.settle(c)  # before the mount is served: only drops what is to go
        summary["performed"] += owed - unreadable
