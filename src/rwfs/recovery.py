"""Recovery at every mount, before the mount is served (SPEC §6.2, docs/recovery.md).

1. Intent-log generations LMDB has not applied become receipts (commits) and events
   (namespace operations): these writers were told they succeeded.
2. Every unsettled receipt is classified by comparing the live file with its digests:
   intended → committed, nothing written; expected → the owed write is performed;
   neither → a conflict, nothing written; unreadable → stays pending. Explicit batches
   are settled by ``batches.recover``: an owed write of theirs waits for ``resume``.
3. Removed bytes left in ``objects/incoming`` are hashed into place; orphaned stages go.

Blocking; runs before trio starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from .batches import Batches, is_explicit
from .batches import recover as recover_batches
from .intents import IntentLog
from .objects import digest_fd
from .workspace import Commit, Stage, Workspace, record_commit, record_event, syncfs


def recover(
    ws: Workspace, batches: Batches | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, int]:
    say = progress or (lambda msg: None)
    summary = {"intents": 0, "committed": 0, "performed": 0, "conflicts": 0, "pending": 0}
    log = IntentLog(ws.state_fd)
    try:
        _replay_intents(ws, log, summary, say)
    finally:
        log.close()
    unsettled = [r for r in ws.store.unsettled() if not is_explicit(r)]
    for n, receipt in enumerate(unsettled, 1):
        if n % 500 == 0:
            say(f"recovery: {n}/{len(unsettled)} receipts")
        summary[_settle(ws, receipt)] += 1
    recover_batches(ws, batches or Batches(ws), summary)
    for adopted in ws.objects.incoming():
        ws.objects.settle_incoming(adopted)
    live_stages = {r["stage"].encode() for r in ws.store.unsettled() if r.get("stage")}
    for name in os.listdir(ws.staging_fd):
        if os.fsencode(name) not in live_stages:
            os.unlink(name, dir_fd=ws.staging_fd)
    if any(summary.values()):
        ws.store.write(lambda txn: txn.append_event({"op": "recover", "path": "", **summary}))
    return summary


def _replay_intents(
    ws: Workspace, log: IntentLog, summary: dict[str, int], say: Callable[[str], None]
) -> None:
    applied = ws.store.meta_int(b"applied_gen")
    prepared = ws.store.meta_int(b"prepared_gen")
    for gen in log.generations():
        if gen <= applied:
            log.drop(gen)
            continue
        records = log.records(gen)
        say(f"recovery: intent log generation {gen}: {len(records)} records")
        done = {r["id"] for r in records if r["kind"] == "done" or r.get("done")}
        cancelled = {r["id"] for r in records if r["kind"] == "cancel"}
        # Commits: owed unless LMDB prepared their receipts. Namespace events: applied if
        # confirmed; one in flight at the crash only if the tree shows it happened.
        owed = [
            r
            for r in records
            if (r["kind"] == "commit" and gen > prepared)
            or (
                r["kind"] == "event"
                and r["id"] not in cancelled
                and (r["id"] in done or _landed(ws, r["event"]))
            )
        ]

        def replay(txn: Any, owed: list[dict[str, Any]] = owed, gen: int = gen) -> None:
            for rec in owed:
                if rec["kind"] == "commit":
                    # The writer was told it succeeded; the receipt is owed.
                    txn.new_receipt(
                        {
                            "batch": None,
                            "path": rec["path"],
                            "expected": rec["expected"],
                            "intended": rec["intended"],
                            "stage": rec["stage"],
                            "intent": rec["id"],
                            "info": rec.get("info", {}),
                            "size": rec["size"],
                        }
                    )
                else:
                    ev = dict(rec["event"], recovered=True)
                    if ev["op"] == "rename" and not ev.get("exchange") and "intended" not in ev:
                        ev["intended"] = ws.live_digest(os.fsencode(ev["dest"]))[0]
                    if rec.get("incoming"):
                        got = ws.objects.settle_incoming(rec["incoming"].encode())
                        if got is not None:
                            ev["expected"], ev["size"] = got
                    record_event(txn, ev)
                summary["intents"] += 1
            txn.set_meta_int(b"prepared_gen", max(prepared, gen))
            txn.set_meta_int(b"applied_gen", gen)

        ws.store.write(replay)
        log.drop(gen)


def _exists(ws: Workspace, path: str) -> bool:
    try:
        os.stat(os.fsencode(path) or b".", dir_fd=ws.root_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _landed(ws: Workspace, ev: dict[str, Any]) -> bool:
    """Did a namespace operation that was in flight at the crash reach the tree?"""
    op = ev["op"]
    if op in ("unlink", "rmdir"):
        return not _exists(ws, ev["path"])
    if op in ("create", "mkdir", "symlink", "link"):
        return _exists(ws, ev["path"])
    if op == "rename":
        return _exists(ws, ev["dest"]) and (bool(ev.get("exchange")) or not _exists(ws, ev["path"]))
    return True


def _settle(ws: Workspace, receipt: dict[str, Any]) -> str:
    """Classify one unsettled receipt by the live file (the §6.2 table) and act on it."""
    path = os.fsencode(receipt["path"])
    try:
        live, st = ws.live_digest(path)
    except OSError as exc:
        print(
            f"rwfs: recovery: {receipt['path']}: cannot read ({exc.strerror}); left pending",
            file=sys.stderr,
        )
        return "pending"
    stage_fd = _open_stage(ws, receipt.get("stage"))
    info = dict(receipt.get("info") or {}, receipt=receipt["id"], recovered=True)
    stage = Stage(
        stage_fd if stage_fd is not None else -1,
        (receipt.get("stage") or "").encode(),
        receipt["expected"],
    )
    c = Commit(path, stage, receipt["intended"], receipt.get("size", 0), info)
    if live == receipt["intended"]:
        c.outcome = "landed"
        c.info["kept"] = ws.objects.exists(receipt["expected"])
        if stage_fd is not None:
            ws.drop_stage(stage)
        result = "committed"
    elif (
        live == receipt["expected"]
        and stage_fd is not None
        and c.intended is not None
        and _holds(stage_fd, c.intended)
    ):
        os.fsync(stage_fd)  # a stage is durable before it is renamed into place
        ws._replace(c)
        syncfs(ws.root_fd)
        result = {"committed": "performed", "landed": "committed"}.get(c.outcome, c.outcome)
        if c.outcome == "error":
            result = "pending"
    elif live == receipt["expected"]:
        if stage_fd is not None:
            os.close(stage_fd)
        print(
            f"rwfs: recovery: {receipt['path']}: the staged bytes are gone or damaged; "
            "the file keeps its previous bytes and the receipt stays pending",
            file=sys.stderr,
        )
        return "pending"
    else:
        c.outcome = "conflict"
        c.info["actual"] = live
        if stage_fd is not None:
            ws._keep_intended(c)
        result = "conflicts"
    if c.discard:  # its bytes are kept (a conflict, a type swap): the stage goes
        ws.drop_stage(stage)
        stage_fd = None
    if result == "pending":
        if stage_fd is not None:
            os.close(stage_fd)
        return result
    ws.store.write(record_commit, c)
    if c.outcome == "committed" and stage_fd is not None:
        os.close(stage_fd)
    return result


def _holds(fd: int, digest: str) -> bool:
    return digest_fd(fd)[0] == digest


def _open_stage(ws: Workspace, name: str | None) -> int | None:
    if not name:
        return None
    try:
        return os.open(name, os.O_RDWR | os.O_NOFOLLOW, dir_fd=ws.staging_fd)
    except FileNotFoundError:
        return None
