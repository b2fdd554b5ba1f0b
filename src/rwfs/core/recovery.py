"""Recovery at every mount, before the mount is served (SPEC §6.2, docs/recovery.md).

1. Intent-log generations LMDB has not applied become receipts (commits) and events
   (namespace operations): these writers were told they succeeded.
2. Every unsettled receipt is classified by comparing the live file with its digests:
   intended → committed, nothing written; expected → the owed write is performed;
   neither → a conflict, nothing written; unreadable → stays pending. Explicit batches
   are settled by ``batch_recovery.recover``: an owed write of theirs waits for ``resume``.
3. Once per store written before rwfs kept it so, the path index is repaired where the
   journal's model of the tree went wrong (``_repair_index``).
4. Removed bytes left in ``objects/incoming`` are hashed into place; orphaned stages go.

Blocking; runs before trio starts.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from typing import Any

import lmdb

from .. import beneath
from ..journal.intents import IntentLog
from ..journal.objects import digest_fd
from ..journal.store import JournalUnavailable, Txn, u64
from .batch import is_explicit
from .batch_recovery import recover as recover_batches
from .batches import Batches
from .commits import Commit, record_commit, record_event
from .errors import TooLarge
from .stages import Stage
from .syscalls import syncfs
from .workspace import Workspace


def recover(
    ws: Workspace, batches: Batches | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Settle what the last run left; returns the counts of the summary.

    An exception while settling one item (a receipt, an intent record, a batch) never
    stops the mount: the item stays unsettled, is retried at the next mount, is named on
    stderr, in one notice and in ``ws.recovery_left`` (``.rw/status``), and counts as
    ``failed``."""
    say = progress or (lambda msg: None)
    summary = {
        "intents": 0,
        "committed": 0,
        "performed": 0,
        "conflicts": 0,
        "pending": 0,
        "failed": 0,
    }
    log = IntentLog(ws.state_fd)
    try:
        _retry_held(ws, summary)
        _replay_intents(ws, log, summary, say)
    finally:
        log.close()
    unsettled = [r for r in ws.store.unsettled() if not is_explicit(r)]
    chains = _chains(unsettled)
    for n, receipt in enumerate(unsettled, 1):
        if n % 500 == 0:
            say(f"recovery: {n}/{len(unsettled)} receipts")
        try:
            outcome = _settle(ws, receipt, chains[receipt["id"]])
        except Exception as exc:
            _failed(ws, summary, f"receipt {receipt.get('id')} for {receipt.get('path')}", exc)
            continue
        summary[outcome] += 1
        if outcome == "pending":
            ws.recovery_left.append(f"receipt {receipt['id']} for {receipt['path']}: pending")
    recover_batches(
        ws, batches or Batches(ws), summary, lambda what, exc: _failed(ws, summary, what, exc)
    )
    try:
        _repair_index(ws, summary, say)
    except Exception as exc:
        _failed(ws, summary, "the path index's repair", exc)
    for adopted in ws.objects.incoming():
        try:
            ws.objects.settle_incoming(adopted)
        except OSError as exc:  # left in incoming/: hashed again at the next mount
            _failed(ws, summary, f"removed bytes objects/incoming/{os.fsdecode(adopted)}", exc)
    live_stages = {r["stage"].encode() for r in ws.store.unsettled() if r.get("stage")}
    live_stages |= {  # the bytes of a held commit are its stage
        os.fsencode(h["record"]["stage"])
        for h in _held(ws)
        if isinstance(h["record"], dict) and isinstance(h["record"].get("stage"), str)
    }
    for name in os.listdir(ws.staging_fd):
        if os.fsencode(name) not in live_stages:
            try:
                os.unlink(name, dir_fd=ws.staging_fd)
            except OSError as exc:
                _failed(ws, summary, f"stage {name}", exc)
    if any(summary.values()):
        try:
            ws.store.write(lambda txn: txn.append_event({"op": "recover", "path": "", **summary}))
        except JournalUnavailable as exc:
            print(f"rwfs: recovery: the recover event was not journaled: {exc}", file=sys.stderr)
    return summary


def _failed(ws: Workspace, summary: dict[str, int], what: str, exc: BaseException) -> None:
    """One item recovery could not settle: it stays as it was, and is reported."""
    summary["failed"] += 1
    message = (
        f"{what}: recovery could not settle it ({type(exc).__name__}: {exc}); it is left "
        "unsettled and retried at the next mount"
    )
    ws.recovery_left.append(message)
    print(f"rwfs: recovery: {message}", file=sys.stderr)
    try:
        if not any(
            n.get("kind") == "recovery_failed" and n.get("item") == what for n in ws.store.notices()
        ):
            ws.store.write(
                lambda txn: txn.new_notice(
                    {"kind": "recovery_failed", "batch": None, "item": what, "message": message}
                )
            )
    except Exception as exc2:  # the journal itself may be what failed: stderr has it
        print(f"rwfs: recovery: the notice was not journaled: {exc2}", file=sys.stderr)


def _held(ws: Workspace) -> list[dict[str, Any]]:
    return ws.store.records(b"held")


def _retry_held(ws: Workspace, summary: dict[str, int]) -> None:
    """Intent records an earlier recovery could not apply: try each again."""
    held = _held(ws)
    if not held:
        return
    failed: dict[int, BaseException] = {}

    def retry(txn: Txn) -> int:
        failed.clear()
        applied = 0
        for row in held:
            try:
                with txn.nested() as sub:
                    _apply(ws, sub, row["record"])
            except lmdb.MapFullError:
                raise  # the whole transaction is retried in a larger map
            except Exception as exc:
                failed[row["id"]] = exc
                continue
            txn.delete(b"held", u64(row["id"]))
            applied += 1
        return applied

    summary["intents"] += ws.store.write(retry)
    for row in held:
        if row["id"] in failed:
            _failed(ws, summary, _held_name(row), failed[row["id"]])


def _held_name(row: dict[str, Any]) -> str:
    rec = row["record"]
    if not isinstance(rec, dict):
        return f"intent record {row['id']} (unreadable) of generation {row['gen']}"
    event: dict[str, Any] = rec["event"] if isinstance(rec.get("event"), dict) else {}
    kind = event.get("op") if rec.get("kind") == "event" else rec.get("kind")
    what = rec.get("path") or event.get("path")
    return f"intent record {row['id']} ({kind} {what}) of generation {row['gen']}"


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
        if records:  # (a clean mount says nothing)
            say(f"recovery: intent log generation {gen}: {len(records)} records")
        owed, bad = _owed(ws, records, gen > prepared)
        applied_n, held = ws.store.write(_replay, ws, gen, max(prepared, gen), owed, bad)
        summary["intents"] += applied_n
        log.drop(gen)
        for hid, rec, exc in held:
            _failed(ws, summary, _held_name({"id": hid, "gen": gen, "record": rec}), exc)


def _replay(
    txn: Txn,
    ws: Workspace,
    gen: int,
    prepared: int,
    owed: list[dict[str, Any]],
    bad: list[tuple[Any, BaseException]],
) -> tuple[int, list[tuple[int, Any, BaseException]]]:
    """Journal one generation's owed records in one transaction: each in a nested one, so
    that a record that cannot be applied is undone alone and held (the ``held``
    database) for the next mount. Returns how many were applied, and the held ones."""
    failed = list(bad)
    applied = 0
    for rec in owed:
        try:
            with txn.nested() as sub:
                _apply(ws, sub, rec)
            applied += 1
        except lmdb.MapFullError:
            raise  # the whole transaction is retried in a larger map
        except Exception as exc:
            failed.append((rec, exc))
    held = [(txn.hold_intent(gen, rec, repr(err)), rec, err) for rec, err in failed]
    txn.set_meta_int(b"prepared_gen", prepared)
    txn.set_meta_int(b"applied_gen", gen)
    return applied, held


def _owed(
    ws: Workspace, records: list[Any], commits_owed: bool
) -> tuple[list[dict[str, Any]], list[tuple[Any, BaseException]]]:
    """The records of one generation to journal, and those that cannot even be read.

    Commits are owed unless LMDB prepared their receipts (``commits_owed``). Namespace
    events: applied if confirmed; one in flight at the crash only if the tree shows it
    happened."""
    owed: list[dict[str, Any]] = []
    bad: list[tuple[Any, BaseException]] = []
    done, cancelled = set(), set()
    for r in records:
        if isinstance(r, dict) and (r.get("kind") == "done" or r.get("done")):
            done.add(r.get("id"))
        if isinstance(r, dict) and r.get("kind") == "cancel":
            cancelled.add(r.get("id"))
    events: list[dict[str, Any]] = []
    for r in records:
        try:
            if r["kind"] == "commit" and commits_owed:
                owed.append(r)
            elif (
                r["kind"] == "event"
                and r["id"] not in cancelled
                and (r["id"] in done or _landed(ws, r["event"]))
            ):
                owed.append(r)
                events.append(r["event"])
        except Exception as exc:  # damaged, or the tree cannot be asked: held
            bad.append((r, exc))
    moved = _moved(events)
    for r in records:  # the kept files the committer had moved to their digest names
        if isinstance(r, dict) and r.get("kind") == "digests" and isinstance(r.get("events"), dict):
            for eid, fields in r["events"].items():
                moved.setdefault(eid, {})["kept"] = fields
    return [dict(r, **moved[r["id"]]) if r.get("id") in moved else r for r in owed], bad


def _moved(events: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Commits a rename or an unlink that reached the tree moved or replaced while they
    were queued (``Renames.rename``, ``Namespace.remove``: the event ``carries`` or
    ``supersedes`` them; both are always in one generation): commit id -> what changes
    in its record. A moved commit's receipt
    names the file where the tree has it now, and the path it was written at (``as``); a
    replaced one only has its bytes kept (``superseded``)."""
    out: dict[Any, dict[str, Any]] = {}
    for ev in events:
        if ev.get("op") not in ("rename", "unlink"):
            continue
        for cid in ev.get("carries") or ():
            first = out.get(cid, {}).get("as")
            out[cid] = {"path": ev["dest"], "as": first or ev["path"]}
        for cid in ev.get("supersedes") or ():
            out[cid] = dict(out.get(cid, {}), superseded=True)
    return out


def _apply(ws: Workspace, txn: Txn, rec: dict[str, Any]) -> None:
    """Journal one owed intent record (its writer was told it succeeded)."""
    if rec["kind"] == "commit":
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
                **{k: rec[k] for k in ("as", "superseded") if k in rec},
            }
        )
        return
    ev = dict(rec["event"], recovered=True)
    if ev["op"] == "rename" and not ev.get("exchange") and "intended" not in ev:
        try:
            ev["intended"] = ws.digests.live(os.fsencode(ev["dest"]))[0]
        except TooLarge:  # (past max_journaled_bytes: not hashed)
            ev["intended"] = None
    if rec.get("incoming"):
        got = ws.objects.settle_incoming(rec["incoming"].encode())
        if got is not None and ev.get("supersedes"):
            ev["replaced"] = got[0]  # (its ``expected`` is a commit still queued then)
        elif got is not None:
            ev["expected"], ev["size"] = got
        else:  # already moved to its digest name by the group the crash cut short
            ev.update(rec.get("kept") or {})
    record_event(txn, ev, ws.policy)


def _exists(ws: Workspace, path: str) -> bool:
    try:
        beneath.stat(ws.root_fd, os.fsencode(path))
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


Chain = tuple[dict[str, int], int]  # (digest -> its last place in a chain of receipts, a place)


def _chains(receipts: list[dict[str, Any]]) -> dict[int, Chain]:
    """Each receipt's chain and place in it: the receipts of a path each built on the one
    before (its expected the previous one's intended: rewrites of a file, each begun while
    the one before was queued), in the order they were made, which is the order they were
    queued and applied. A file that holds the intended digest of a later place shows that
    a receipt landed and a later one replaced it."""
    out: dict[int, Chain] = {}
    tips: dict[tuple[str, str | None], Chain] = {}  # (path, the digest a chain ends at)
    for r in receipts:
        if r.get("superseded"):  # (no longer at its path: _settle keeps its bytes)
            out[r["id"]] = ({}, 0)
            continue
        chain, place = tips.pop((r["path"], r.get("expected")), ({}, 0))
        place += 1
        if r.get("intended") is not None:
            chain[r["intended"]] = place
        tips[(r["path"], r.get("intended"))] = out[r["id"]] = (chain, place)
    return out


def _settle(ws: Workspace, receipt: dict[str, Any], chain: Chain = ({}, 0)) -> str:
    """Classify one unsettled receipt by the live file (the §6.2 table) and act on it;
    ``chain``: its place among the receipts of its path that built on each other."""
    path = os.fsencode(receipt["path"])
    try:
        live, st = ws.digests.live(path)
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
    if receipt.get("as") or receipt.get("superseded"):
        # A rename moved or replaced the file before this commit landed; the rename's
        # event (replayed, or recorded by its group) tells of these bytes already.
        c.info["folded"] = True
    if receipt.get("superseded"):
        return _settle_superseded(ws, c, stage_fd)
    # A directory, symlink, FIFO, socket or device node (never opened) holds neither
    # version, even where one of them is "absent" (a null digest): a conflict.
    special = st is not None and not stat.S_ISREG(st.st_mode)
    # (A later receipt of its chain wrote the live bytes: this one landed before it.)
    later = live is not None and chain[0].get(live, 0) > chain[1]
    if (live == receipt["intended"] or later) and not special:
        c.outcome = "landed"
        c.info["kept"] = ws.objects.exists(receipt["expected"])
        ws.links.landed(c, st)
        if stage_fd is not None:
            ws.stages.drop(stage)
        result = "committed"
    elif (
        live == receipt["expected"]
        and not special
        and stage_fd is not None
        and c.intended is not None
        and _holds(stage_fd, c.intended)
    ):
        os.fsync(stage_fd)  # a stage is durable before it is renamed into place
        ws.landing.replace(c)
        syncfs(ws.root_fd)
        result = {"committed": "performed", "landed": "committed"}.get(c.outcome, c.outcome)
        if c.outcome == "error":
            result = "pending"
    elif (
        receipt.get("in_place")
        and st is not None
        and stat.S_ISREG(st.st_mode)
        and stage_fd is not None
        and c.intended is not None
        and _holds(stage_fd, c.intended)
    ):
        # A copy into a hard-linked file (Landing.write_in_place) that the crash cut
        # short: the file holds neither digest, and the synced stage holds what the
        # writer was told it wrote. Its old bytes were kept before the copy began.
        c.info["kept"] = ws.objects.exists(receipt["expected"])
        with beneath.parent(ws.root_fd, c.path) as (d, name):
            ws.landing.write_in_place(c, st, d, name)
        syncfs(ws.root_fd)
        result = "performed"
    elif live == receipt["expected"] and not special:
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
            ws.landing.keep_intended(c)
        result = "conflicts"
    if c.discard:  # its bytes are kept (a conflict, a type swap): the stage goes
        ws.stages.drop(stage)
        stage_fd = None
    if result == "pending":
        if stage_fd is not None:
            os.close(stage_fd)
        return result
    ws.store.write(record_commit, c)
    if c.outcome == "committed" and stage_fd is not None:
        os.close(stage_fd)
    return result


def _settle_superseded(ws: Workspace, c: Commit, stage_fd: int | None) -> str:
    """A commit whose file a rename replaced before it landed: its bytes are a version
    of the path the rename's event names as replaced, kept as an object; the tree is not
    touched. Pending if the stage no longer holds them."""
    if not ws.objects.exists(str(c.intended)):
        if stage_fd is None or not _holds(stage_fd, str(c.intended)):
            if stage_fd is not None:
                os.close(stage_fd)
            print(
                f"rwfs: recovery: {os.fsdecode(c.path)}: the bytes of a version a rename "
                "replaced are gone or damaged; the receipt stays pending",
                file=sys.stderr,
            )
            return "pending"
        os.fsync(stage_fd)
        ws.objects.keep_link(ws.staging_fd, c.stage.name, str(c.intended))
    c.outcome = "landed"
    if stage_fd is not None:
        ws.stages.drop(c.stage)
    ws.store.write(record_commit, c)
    return "committed"


def _holds(fd: int, digest: str) -> bool:
    return digest_fd(fd)[0] == digest


def _open_stage(ws: Workspace, name: str | None) -> int | None:
    if not name:
        return None
    try:
        return os.open(name, os.O_RDWR | os.O_NOFOLLOW, dir_fd=ws.staging_fd)
    except FileNotFoundError:
        return None


def _repair_index(ws: Workspace, summary: dict[str, int], say: Callable[[str], None]) -> None:
    """Once per store (``meta`` ``index:links``): repair the path index where rwfs before
    it was kept true left drift that fsck reports for good, each repair an event of its
    own (``repair``, ``recovered``), so that the journal replayed still gives the index:

    - a hard-linked file's write journaled with a name of a later rename of its
      directory (the rename then gave the name the old bytes): when the name's file
      holds other bytes than the index says, and another of its names is journaled with
      those bytes, a ``write`` gives the name them;
    - a file that left journaling (``unjournaled``, past ``max_journaled_bytes``) kept its
      row, and its removal, unjournaled, was never told: an ``unjournaled`` event takes
      the row away."""
    if ws.store.meta_int(b"index:links"):
        return
    linked: set[bytes] = set()  # names writes journaled as their links
    left: dict[bytes, int] = {}  # files that left journaling, followed by renames -> LSN
    for n, ev in enumerate(ws.store.events(), 1):
        if n % 100_000 == 0:
            say(f"recovery: checking the path index, {n} events")
        op, path = ev["op"], os.fsencode(ev.get("path") or "")
        if op == "write":
            linked.update(os.fsencode(p) for p in ev.get("links") or ())
        if op == "unjournaled":
            left[path] = ev["lsn"]
        elif op in ("write", "create", "link", "unlink", "resolve"):
            left.pop(path, None)
        elif op == "rename" and not ev.get("exchange") and left:
            dest, top = os.fsencode(ev["dest"]), path + b"/"
            left.pop(dest, None)
            for p in [p for p in left if p == path or p.startswith(top)]:
                del left[p]
                left[dest + p[len(path) :]] = ev["lsn"]
    paths = ws.store.paths()
    gone = sorted(
        p for p, lsn in left.items() if paths.get(p, {}).get("digest") and paths[p]["lsn"] <= lsn
    )
    relinks = []
    for name in sorted(linked):
        want = paths.get(name, {}).get("digest")
        if want is None or ws.policy.is_passthrough(name):
            continue
        try:
            have, st = ws.digests.live(name)
        except (OSError, TooLarge):
            continue
        if have is None or have == want or st is None or st.st_nlink < 2:
            continue
        if any(paths.get(p, {}).get("digest") == have for p in ws.links.other_names(name, st)):
            relinks.append((name, want, have, st))

    def repair(txn: Txn) -> None:
        for name, want, have, st in relinks:
            ev = {
                "op": "write",
                "path": os.fsdecode(name),
                "batch": f"auto-e{txn.next_lsn()}",
                "expected": want,
                "intended": have,
                "size": st.st_size,
                "mode": stat.S_IMODE(st.st_mode),
                "recovered": True,
                "repair": "links",
            }
            txn.set_path(name, have, txn.append_event(ev))
        for name in gone:
            record_event(
                txn,
                {
                    "op": "unjournaled",
                    "path": os.fsdecode(name),
                    "batch": None,
                    "recovered": True,
                    "repair": "index",
                },
                ws.policy,
            )
        txn.set_meta_int(b"index:links", 1)

    ws.store.write(repair)
    if relinks or gone:
        summary["repaired"] = len(relinks) + len(gone)
        for name in [n for n, *_ in relinks] + gone:
            print(
                f"rwfs: recovery: repaired the path index at {os.fsdecode(name)}", file=sys.stderr
            )
