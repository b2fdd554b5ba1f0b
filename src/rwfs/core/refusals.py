"""A write refused (SPEC §4.2-4.3): its draft kept, the refusal journaled, and the writer
told what happened and what to do; and a lost update refused as a conflict (policy
``stale_write = "conflict"``)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from typing import TYPE_CHECKING, Any

import trio

from ..checks.allowances import allow_hint, waivable
from ..checks.findings import Finding
from ..journal.store import JournalUnavailable
from .errors import RwfsError
from .syscalls import WORKERS, borrowed, fsdecode

if TYPE_CHECKING:
    from .stages import Stage
    from .workspace import Workspace


class Refusals:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._budget: dict[tuple[bytes, str], int] = {}  # retries left per (path, refused bytes)

    async def refuse(
        self,
        path: bytes,
        draft_fd: int,
        expected: str | None,
        intended: str,
        findings: list[Finding],
        info: dict[str, Any],
    ) -> RwfsError:
        """Keep a refused draft, journal the refusal, and say so to the writer (SPEC §4.2-4.3)."""
        async with self.ws.committer.exclusive():  # the draft and its event, together, for gc
            with borrowed(draft_fd) as (fd,):
                await trio.to_thread.run_sync(
                    self.ws.objects.keep_fd_copy, fd, intended, limiter=WORKERS
                )
            key = (path, intended)
            left = max(self._budget.get(key, self.ws.policy.retry_budget + 1) - 1, 0)
            self._budget[key] = left
            if len(self._budget) > 10_000:
                self._budget.clear()
            first = next(f for f in findings if f.action == "reject")
            draft_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + intended[7:15]
            # Through the mount, absolute: it resolves from the writer's directory, whatever
            # it is (the envelope's ``draft`` stays relative to the workspace's top).
            draft = os.path.join(self.ws.mountpoint or "", ".rw", "rejected", draft_id)
            name = fsdecode(path)
            item = self.ws.committer.record(
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
            await self.ws.committer.sync()
        allow = None
        if not waivable(findings):  # a secret: re-applying the same edit would bring it back
            todo = (
                "take the secret out of the text, or keep it in .rw/scratch/, outside the "
                f"tree, and write the file again; your draft is at {draft}"
            )
        else:
            # A deliberate change has a way through (allowances.py), named at every such
            # refusal: the gates cannot tell it from an accident, the writer can.
            allow = allow_hint(name, f".rw/rejected/{draft_id}", self.ws.mountpoint)
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
            getattr(errno, self.ws.policy.refusal_errno),
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
                if digest is not None and self.ws.objects.exists(digest):
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
            self.ws.objects.keep_fd_copy(stage_fd, intended)
            if shown is not None and shown_fd >= 0:
                self.ws.objects.keep_fd_copy(shown_fd, shown)
            if read is not None and read_fd >= 0:
                self.ws.objects.keep_fd_copy(read_fd, read)
            if read is not None:
                self.ws.stages.keep_live_copy(path, read)

        async with (
            self.ws.committer.exclusive()
        ):  # the bytes and what refers to them, together, for gc
            with borrowed(stage.fd, actual[1]) as (fd, shown_fd):
                await trio.to_thread.run_sync(keep, fd, shown_fd, limiter=WORKERS)
            cid = await trio.to_thread.run_sync(self.ws.store.write, write, limiter=WORKERS)
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
