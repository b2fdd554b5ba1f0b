"""What a batch or a run session changed, read back from the journal's events: the plan
of an undo (``changes_in``) and the mode bits of each file at a point (``modes_at``).

Pure functions over events: no store, no event loop, so that ``rwfs run``'s summary can
use them without loading the daemon's modules.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..journal.objects import EMPTY_DIGEST


def changes_in(
    events: Iterable[dict[str, Any]], name: str, key: str = "batch"
) -> dict[bytes, tuple[str | None, str | None]]:
    """What undoing batch ``name`` means: path -> (bytes it holds after the batch,
    bytes it held before); None stands for an absent file. With ``key="session"``,
    ``name`` is a run session (sessions.py): the events it wrote, in any batch.

    The source of a rename that the renaming process made itself, and that only it
    wrote, is its temporary file (an editor's or ``sed -i``'s write-then-rename): the
    undo does not make it again.

    A save that removes the file (``unlink``, or a rename away: ``git checkout``, vim's
    backup rename, ``rm`` then a new file), makes it again and writes it, three events
    in a row, is one edit: undoing that write gives back the bytes before the removal,
    not the empty file the ``create`` made."""
    before: dict[bytes, str | None] = {}
    after: dict[bytes, str | None] = {}
    made_by: dict[bytes, Any] = {}  # path -> pid of the process that made the file
    remade = _Remade()
    for ev in events:
        op = ev["op"]
        if not ev.get("path"):  # (a gc)
            continue
        path = os.fsencode(ev["path"])
        was = remade.follow(op, path, ev)
        if ev.get(key) == name and op in ("write", "create", "unlink"):
            base = was if op == "write" and was is not None else ev.get("expected")
            before.setdefault(path, None if op == "create" else base)
            after[path] = None if op == "unlink" else ev.get("intended")
        elif ev.get(key) == name and op == "rename" and ev.get("intended"):
            if not ev.get("exchange"):  # (nor is a directory's rename undone)
                dest = os.fsencode(ev["dest"])
                before.setdefault(dest, ev.get("expected"))
                after[dest] = ev["intended"]
                pid = ev.get("pid")
                temporary = pid is not None and made_by.get(path) == pid
                before.setdefault(path, None if temporary else ev["intended"])
                after[path] = None
        _track_maker(made_by, op, path, ev)
    return {p: (after[p], before[p]) for p in after if after[p] != before[p]}


def modes_at(
    events: Iterable[dict[str, Any]],
    lsn: int | None = None,
    batch: str | None = None,
    key: str = "batch",
) -> dict[bytes, int]:
    """The mode bits of each file at a point of the journal: after event ``lsn``, or just
    before the first event of ``batch``. A file has the mode its last ``create``, ``write``
    or ``setattr`` recorded up to that point, carried along renames. A file with no mode
    recorded by then (it predates rwfs, or rwfs recorded no modes yet) has the mode its
    first ``unlink`` or ``write`` after that point recorded, if that is its first event
    since: the mode it kept until then, since nothing journaled changed it."""
    modes: dict[bytes, int] = {}
    later: dict[bytes, int] = {}
    touched: set[bytes] = set()  # paths with an event after the point
    after = False
    for ev in events:
        op = ev["op"]
        path = os.fsencode(ev.get("path") or "")
        dest = os.fsencode(ev["dest"]) if op == "rename" and ev.get("dest") else None
        after = (
            after
            or (lsn is not None and ev["lsn"] > lsn)
            or (batch is not None and ev.get(key) == batch)
        )
        if after:
            mode = ev.get("mode")
            prior = op == "unlink" or (op == "write" and ev.get("expected") is not None)
            if path not in touched and path not in modes and prior and mode is not None:
                later[path] = mode
            touched.update(p for p in (path, dest) if p is not None)
            continue
        if op in ("create", "write", "setattr") and ev.get("mode") is not None:
            modes[path] = ev["mode"]
        elif op == "unlink":
            modes.pop(path, None)
        elif dest is not None:
            moved = {}
            for src, dst in ((path, dest), (dest, path)) if ev.get("exchange") else ((path, dest),):
                for p in [p for p in modes if p == src or p.startswith(src + b"/")]:
                    moved[dst + p[len(src) :]] = modes.pop(p)
            if not ev.get("exchange"):  # what the rename replaced is gone
                for p in [p for p in modes if p == dest or p.startswith(dest + b"/")]:
                    del modes[p]
            modes.update(moved)
    return {**later, **modes}


class _Remade:
    """Follows, for ``changes_in``, a save that removes a file and makes it again: the
    removal (an unlink, or a rename away), the ``create`` and the first write, each the
    journal's very next event, by the same user. That first write is an edit of the bytes
    the name held before the removal. Anything else in between (another event of any
    path) and the create is a new file of its own."""

    def __init__(self) -> None:
        self.removed: tuple[bytes, str, Any, int] | None = None  # (path, bytes, uid, lsn)
        self.remade: tuple[bytes, str, int] | None = None  # (path, bytes, lsn)

    def follow(self, op: str, path: bytes, ev: dict[str, Any]) -> str | None:
        """Record the event; for the first write of a file made again, the bytes its name
        held before the removal (else None)."""
        lsn, removed, remade = ev["lsn"], self.removed, self.remade
        self.removed = self.remade = None
        if op == "write" and ev.get("expected") == EMPTY_DIGEST:
            if remade is not None and remade[0] == path and remade[2] == lsn - 1:
                return remade[1]
        elif op == "create":
            if removed is not None and removed[0] == path and removed[3] == lsn - 1:
                if removed[2] == ev.get("uid"):
                    self.remade = (path, removed[1], lsn)
        elif op == "unlink" and ev.get("expected"):
            self.removed = (path, ev["expected"], ev.get("uid"), lsn)
        elif op == "rename" and not ev.get("exchange") and ev.get("intended"):
            self.removed = (path, ev["intended"], ev.get("uid"), lsn)  # moved away
        return None


def _track_maker(made_by: dict[bytes, Any], op: str, path: bytes, ev: dict[str, Any]) -> None:
    """Follow which process made the file now at each path (for ``changes_in``); "" once
    another process wrote it."""
    if op == "create" or (op == "write" and ev.get("expected") is None):
        made_by[path] = ev.get("pid")
    elif op == "write" and made_by.get(path) != ev.get("pid"):
        made_by[path] = ""
    elif op == "unlink":
        made_by.pop(path, None)
    elif op == "rename" and ev.get("dest"):
        dest = os.fsencode(ev["dest"])
        moved = made_by.pop(path, None)
        if ev.get("exchange"):
            made_by[path] = made_by.pop(dest, None)
        if moved is not None:
            made_by[dest] = moved
        else:
            made_by.pop(dest, None)
