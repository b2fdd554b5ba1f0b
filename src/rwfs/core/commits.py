"""What the group committer's queue holds — a sealed stage to commit (``Commit``), a
namespace event (``Event``) — and the journal records they become (``record_commit``,
``record_event``), written in the committer's transaction or by recovery's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ..journal.objects import unique_id
from ..policy import Policy
from .errors import RwfsError
from .syscalls import fsdecode

if TYPE_CHECKING:
    from .stages import Stage


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
    # The replaced empty file, linked into staging (``Stages.spare_link``).
    spare: bytes | None = None
    # Its bytes are kept as an object and its stage is to go (a conflict, a landed commit,
    # a path that is no longer a file): dropped by ``settle`` on the loop, never by the
    # committer's thread, because until then the FUSE layer may still read the stage.
    discard: bool = False
    lsn: int = 0
    batch: str | None = None  # an explicit batch's name (batches.py); None: a batch of one
    held: bool = False  # held by an open batch: not queued, the tree waits for its commit
    # Other names the writer's inode is known by (hard links): where ``Landing.write_in_place``
    # looks first for the names a commit in place changes too.
    aliases: tuple[bytes, ...] = ()
    # The file had other names when it was sealed (hard links), known to the inode table
    # or not: a rename of a directory waits for it (``Renames.rename``), since the names it
    # journals (``links``) are found in the tree when it lands, and must be the names the
    # file had at its place in the journal.
    linked: bool = False
    # The replace step ran (``outcome`` is decided) but the commit record could not be
    # written: a retry of its group only records it.
    replaced: bool = False
    settled: bool = False  # ``Committer.settle`` ran: the FUSE layer knows the outcome
    # Its success was shown as its writer's call returned (``Files.on_written``), before
    # its record: the record only adds its LSN to ``.rw/why/``.
    shown: bool = False
    failed: int = 0  # attempts of its group that failed (the journal could not commit)
    wake: trio.Event = field(default_factory=trio.Event)  # set on durable, done or a failure
    # A rename moved the file while this commit was queued (``Renames.rename``): ``path`` is
    # where the tree has the file now, ``journal_path`` where it was written (its event's
    # path: the journal tells the write, then the rename, as they happened).
    journal_path: bytes | None = None
    # A rename over the file, or its unlink, took it away while this commit was queued:
    # its bytes were the mount's at ``path`` until then, so they are kept as an object;
    # the tree is not touched.
    superseded: bool = False
    taking: int = -1  # ``Committer._takings`` when it was queued (``Committer.movable``)

    def finish(self) -> None:
        """Settled and recorded: wake whoever waits for it, durable or done."""
        self.durable.set()
        self.done.set()
        self.nudge()

    def nudge(self) -> None:
        """Wake whoever waits for this commit (``Committer.submit``) to look at it again."""
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
    settled: bool = False  # its digests are in ``event`` (``Landing._settle_event_digests``)
    carried: tuple[Commit, ...] = ()  # a rename's: the queued commits it moved (``carries``)


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
