"""Recovery of interrupted batches, before the mount is served: each batch's receipts
classified by the §6.2 table, one notice per batch in the transaction that classifies
it, and what is owed resumed (``BatchProtocol.resume_now``)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .batch import COMMITTED, COMMITTING, CONFLICTED, INTERRUPTED, OPEN, Batch
from .commits import Commit, record_commit
from .stages import Stage
from .syscalls import fsdecode
from .workspace import Workspace

if TYPE_CHECKING:
    from .batches import Batches


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
        entry = batch.record["entries"].get(r["path"], {})
        # A rename onto one name of a hard-linked file whose bytes it shares is owed
        # while the name still shares the file (Landing._replace_at).
        shared = (
            st is not None
            and entry.get("replace")
            and live == r["expected"]
            and ws.links.hard_linked(st, live)
        )
        if live == r["intended"] and not special and not shared:
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
        for c in batches.protocol.resume_now(batch):
            ws.committer.settle(c)  # before the mount is served: only drops what is to go
        summary["performed"] += owed - unreadable
