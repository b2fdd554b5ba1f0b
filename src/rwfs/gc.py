"""Garbage collection of the object store (SPEC §8): ``rwfs gc`` and ``.rw/ctl gc``.

An object is kept when something still needs it: a pending receipt, an open conflict, an
unfinished batch, the scratchpad, a chunk session, a handoff note, a refused draft, a
snapshot (every path's bytes at the snapshot's LSN), the newest
version of each path, or, within the retention policy, a history version replaced less
than ``retain_days`` ago. Whoever keeps an object and journals what refers to it does
both under ``Workspace.commit_lock`` (``Workspace.exclusive``), which the daemon's gc
holds, after a flush. ``retain_bytes`` (when not 0) then caps what is kept by retention
alone, dropping the oldest first. Everything else goes. Blocking: the daemon runs it in a
worker thread, the CLI directly when unmounted.
"""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Callable
from typing import Any

from .history import History
from .objects import ObjectStore
from .policy import Policy
from .store import Store


def _epoch(ts: str) -> float:
    return calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))


def needed(store: Store, history: History) -> set[str]:
    """Digests that must stay whatever the retention policy says."""
    keep: set[str | None] = set()
    for r in store.unsettled():
        keep |= {r.get("expected"), r.get("intended")}
    for c in store.conflicts():
        if c["state"] == "open":
            keep |= {c.get("expected"), c.get("intended")}
    for b in store.batches():
        if b["state"] not in ("committed", "aborted", "conflicted"):
            for e in b["entries"].values():
                keep |= {e.get("expected"), e.get("intended")}
    for r in store.records(b"scratch"):
        keep.add(r["digest"])
    for session in store.records(b"chunks"):
        keep |= set(session["parts"].values())
    for h in store.records(b"handoffs"):
        keep.add(h["note"])
    for r in store.refusals():  # a refused draft is never lost (SPEC I5)
        keep.add(r["intended"])
    history.refresh()
    for versions in history.paths.values():
        keep.add(versions[-1].digest)
    for snap in store.snapshots():
        for path in history.paths:
            keep.add(history.state_at(path, int(snap["lsn"]))[1])
    return {d for d in keep if d}


def recent(store: Store, history: History, cutoff: float) -> dict[str, float]:
    """Digests the retention policy keeps -> when they stopped being current (or were
    refused); the newest first to be kept under ``retain_bytes``."""
    out: dict[str, float] = {}
    for versions in history.paths.values():
        for old, new in zip(versions, versions[1:], strict=False):
            when = _epoch(new.ts)
            if old.digest and when >= cutoff:
                out[old.digest] = max(out.get(old.digest, 0.0), when)
    return out


def removed_bytes(history: History) -> set[str]:
    """Digests that are the last bytes of a path an unlink removed."""
    out = set()
    for versions in history.paths.values():
        for old, new in zip(versions, versions[1:], strict=False):
            if new.digest is None and old.digest:
                out.add(old.digest)
    return out


def collect(
    store: Store,
    objects: ObjectStore,
    policy: Policy,
    progress: Callable[[str], None] | None = None,
    now: float | None = None,
    removed_only: bool = False,
    spare: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Remove what nothing needs. ``removed_only``: the disk is full, and only the bytes
    of removed files go, whatever the retention policy keeps (their history is given up,
    so that deleting files frees space); the ``gc`` event says ``reason: disk_full``.
    ``spare``: digests to keep besides (what the daemon has not journaled yet)."""
    say = progress or (lambda msg: None)
    started = now or time.time()
    history = History(store)
    keep = needed(store, history) | spare
    cutoff = started - policy.retain_days * 86400
    soft = recent(store, history, cutoff)
    found: dict[str, int] = {}
    for sub in sorted(os.listdir(objects.fd)):
        if sub == "incoming":
            continue
        fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=objects.fd)
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        for name in names:
            digest = f"sha256:{sub}{name}"
            found[digest] = os.stat(objects.name(digest), dir_fd=objects.fd).st_size
            if len(found) % 1000 == 0:
                say(f"gc: {len(found)} objects looked at")
    if removed_only:
        gone = removed_bytes(history)
        drop = [d for d in found if d not in keep and d in gone]
    else:
        drop = [d for d in found if d not in keep and d not in soft]
    if policy.retain_bytes and not removed_only:
        kept = sum(size for d, size in found.items() if d not in drop)
        for d in sorted((d for d in found if d in soft and d not in keep), key=soft.__getitem__):
            if kept <= policy.retain_bytes:
                break
            drop.append(d)
            kept -= found[d]
    freed = 0

    def unlink() -> None:
        nonlocal freed
        for n, digest in enumerate(drop, 1):
            os.unlink(objects.name(digest), dir_fd=objects.fd)
            freed += found[digest]
            if n % 1000 == 0:
                say(f"gc: {n}/{len(drop)} objects removed")

    if not removed_only:
        unlink()

    def record(txn: Any) -> None:
        for digest in drop:
            txn.delete_object(digest)
        txn.append_event(
            {
                "op": "gc",
                "path": "",
                "removed": len(drop),
                "freed_bytes": freed or sum(found[d] for d in drop),
                "kept": len(found) - len(drop),
                **({"reason": "disk_full"} if removed_only else {}),
            }
        )

    store.write(record)
    if removed_only:
        # Recorded first: if the journal cannot take it, no object goes that it still
        # lists (a crash in between leaves objects nothing lists, for the next gc).
        unlink()
    return {"objects": len(found), "removed": len(drop), "freed_bytes": freed}
