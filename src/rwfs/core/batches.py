"""Explicit batches: multi-file edits that commit all or nothing (SPEC §6.1-6.2).

While a batch is open, the commits of writers in its scope are *held*: sealed and
gate-checked like any other, shown by the mount, but not queued for the group committer,
so the real tree does not change. Each held draft is recorded in the batch's LMDB record
(``entries``), so a crash never loses it. ``commit`` then runs the batch protocol
(batch_protocol.py):

1. dry run: every path still holds its expected digest, is a regular file (or absent, as
   expected), and passes the gates; if anything fails, nothing is written, the batch stays
   open and ``status`` says why;
2. every stage is synced and every receipt prepared, in one durable transaction;
3. paths are replaced in first-written order (the same check-keep-rename as a single commit);
4. one durable transaction records every commit and the batch's new state.

Recovery (batch_recovery.py) classifies an interrupted batch's receipts by the §6.2
table and leaves one notice per batch, in the transaction that classifies it. A batch's
states and record are batch.py's. Nothing here knows
about FUSE; the FUSE layer learns about settled drafts through ``Committer.settle``.
"""

from __future__ import annotations

import difflib
import errno
import os
from typing import Any

import trio

from .. import beneath
from ..checks.allowances import WAIVES, allow_hint
from . import rights
from .batch import (
    ABORTED,
    COMMITTED,
    CONFLICTED,
    INTERRUPTED,
    OPEN,
    Batch,
    batch_error,
    check_name,
    new_record,
    session_of,
    writer_of,
)
from .batch_protocol import BatchProtocol
from .commits import Commit
from .errors import RwfsError
from .stages import Stage
from .syscalls import WORKERS, borrowed, fsdecode
from .workspace import Workspace


class Batches:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.all: dict[str, Batch] = {r["name"]: Batch(r) for r in ws.store.batches()}
        # The protocol of a batch's commit, and the batches rwfs writes itself (undo,
        # restore, resume, rollback): batch_protocol.py.
        self.protocol = BatchProtocol(self)

    def taken(self, name: str) -> RwfsError | None:
        """The refusal of ``mkdir batches/NAME`` for a name a batch has, else None."""
        if name not in self.all:
            return None
        gone = self.all[name].record.get("removed")
        now = "existed before: the journal keeps its name" if gone else f"is {self.all[name].state}"
        return batch_error(
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
        batch = self.all[name] = Batch(new_record(name, OPEN, who, "uid", {}))
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
            raise batch_error(f"There is no batch {name}.", None, errno.ENOENT)
        if batch.state not in (COMMITTED, ABORTED, CONFLICTED):
            raise batch_error(
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
            raise batch_error(
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
            raise batch_error(
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
                self.settled(replaced, "replaced")

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
                self.settled(replaced, "replaced")

    async def unhold(self, batch: Batch, path: bytes) -> None:
        """The file is back to the batch's base bytes: the batch no longer changes it."""
        async with batch.lock:
            batch.record["entries"].pop(fsdecode(path), None)
            commit = batch.held.pop(path, None)
            await self._save(batch)
            if commit is not None:
                self.ws.stages.drop(commit.stage)
                self.settled(commit, "noop")

    async def commit(self, batch: Batch) -> None:
        async with batch.lock:
            if batch.state != OPEN:
                raise batch_error(
                    f"Batch {batch.name} is {batch.state}, so there is nothing to commit.",
                    batch.name,
                )
            commits = sorted(batch.held.values(), key=lambda c: self.protocol.order(batch, c))
            await self.ws.committer.sync()  # commits queued before the batch's go first
            async with self.ws.committer.exclusive():
                reasons = await trio.to_thread.run_sync(
                    self.protocol.apply, batch, commits, True, limiter=WORKERS
                )
            if reasons:
                for c in commits:
                    c.outcome = ""
                batch.record["reasons"] = reasons
                await self._save(batch)
                first = reasons[0]
                raise batch_error(
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
            self.protocol.finish(batch, commits)

    async def abort(self, batch: Batch) -> None:
        async with batch.lock:
            if batch.state not in (OPEN, INTERRUPTED):
                raise batch_error(
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
                self.settled(commit, ABORTED)
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

    def settled(self, commit: Commit, outcome: str) -> None:
        commit.outcome = outcome
        commit.held = False
        self.ws.committer.settle(commit)
        commit.finish()

    async def _save(self, batch: Batch) -> None:
        await trio.to_thread.run_sync(
            self.ws.store.write, lambda txn: txn.put_batch(batch.record), limiter=WORKERS
        )

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
            got = self.protocol.live_fd(live)
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
