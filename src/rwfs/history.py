"""History (SPEC §8): every version of every journaled path, read from the journal.

Two things are kept per path, because snapshots and a person browsing ``history/`` ask
different questions:

- its **timeline**: exactly which bytes the *name* held after each LSN (``paths``). A
  ``write`` gives it its ``intended`` digest, an ``unlink`` takes it away, a ``rename`` takes
  it away from the source and gives the destination the moved bytes, as one new version —
  the destination's earlier versions stay its own, and the source's do not become the
  destination's (a rename onto a passthrough name, ``untracked``, only takes the files
  away: the journal does not follow them there). The first event of a path also names the
  bytes it held before rwfs journaled it (version 0): a write's or unlink's ``expected``, a rename's ``expected`` for
  the destination it replaced and its ``intended`` for the source that moved. ``state_at``
  reads timelines only: snapshots and restore see a file saved by write-a-temporary-then-
  rename as existing throughout, with its old bytes before the rename.
- its **lineage**: a file renamed to a name keeps the versions it had under its old name
  (``origins``). ``versions`` lists them together with the name's own, oldest first, each
  run of the same bytes once: a temporary written once and renamed over its target adds
  one version to the target's list.

``listed`` is the set of paths ``history/`` shows: every path that exists now, and a removed
path only if it held bytes that no listed path's versions hold. A temporary file an editor
or ``sed -i`` wrote and renamed over its target held nothing but the target's new version,
so it is not listed (it can still be looked up by name). The empty version a ``create``
gives a new file is not listed once the file has other bytes.

Each version also carries the file's owner and mode bits while it held those bytes, as far
as the journal tells them (``write``, ``create``, ``unlink``, ``rename`` and ``setattr``
events record ``mode``; all but ``write`` record ``owner``, ``setattr`` after a chown):
``.rw/`` shows a version with them, so that no one reads through it what they could not
read in the tree (SPEC §3.3b). A ``chmod`` or ``chown`` applies to the version the file
holds then; renames carry them along.

Bytes of old versions live in the object store (the pre-images every commit keeps); the
newest is the live file. ``History`` is an index over the events, brought up to date
incrementally.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .objects import EMPTY_DIGEST
from .store import Store

F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """The index is read by the event loop and by control files rendered in worker
    threads: one at a time."""

    @functools.wraps(fn)
    def run(self: History, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return fn(self, *args, **kwargs)

    return run  # type: ignore[return-value]


@dataclass(frozen=True)
class Version:
    lsn: int  # the event that gave the path these bytes (0: before rwfs journaled it)
    ts: str
    digest: str | None  # None: the path did not exist from this LSN on
    made: bool = False  # the empty file a create made
    owner: tuple[int, int] | None = None  # (uid, gid); None: not recorded
    mode: int | None = None  # permission bits; None: not recorded

    @property
    def name(self) -> str:
        """A file name that ``ls`` sorts by time: ``000042-2026-11-30T10:12:03Z-3fa9c1d2``."""
        assert self.digest is not None
        return f"{self.lsn:06d}-{self.ts[:19]}Z-{self.digest[7:15]}"


class History:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.lsn = 0
        self.paths: dict[bytes, list[Version]] = {}  # timelines
        # path -> [(lsn, source)]: at lsn, the file at source was renamed to path.
        self.origins: dict[bytes, list[tuple[int, bytes]]] = {}
        self._listed: tuple[int, set[bytes]] | None = None
        self._holding: tuple[int, dict[str, list[bytes]]] | None = None  # digest -> paths
        self.moved_away: set[bytes] = set()  # paths whose file was last renamed elsewhere
        # path -> (owner, mode) last recorded for its file (Version.owner, Version.mode)
        self.meta: dict[bytes, tuple[tuple[int, int] | None, int | None]] = {}
        self.lock = threading.RLock()

    @_locked
    def refresh(self) -> None:
        last = self.store.meta_int(b"lsn")
        if last == self.lsn:
            return
        for ev in self.store.events(since=self.lsn):
            self._apply(ev)
            self.lsn = ev["lsn"]

    def _add(
        self,
        path: bytes,
        ev: dict[str, Any],
        digest: str | None,
        before: str | None = None,
        made: bool = False,
    ) -> None:
        """Give ``path`` these bytes from this event on; ``before``: the bytes it held
        before rwfs journaled it, if this is its first event (version 0)."""
        owner, mode = self._meta(path, ev)
        got = self.paths.get(path)
        if got is None:
            got = self.paths[path] = (
                [Version(0, ev["ts"], before, False, owner, mode)] if before else []
            )
        if not got or got[-1].digest != digest:
            got.append(Version(ev["lsn"], ev["ts"], digest, made, owner, mode))
        elif (got[-1].owner, got[-1].mode) != (owner, mode):
            got[-1] = dataclasses.replace(got[-1], owner=owner, mode=mode)
        self.moved_away.discard(path)

    def _meta(self, path: bytes, ev: dict[str, Any]) -> tuple[tuple[int, int] | None, int | None]:
        """The owner and mode of ``path``'s file after ``ev``: what it records, else what
        was known before. (A rename's event records neither: the moved file keeps its.)"""
        owner, mode = self.meta.get(path, (None, None))
        if ev["op"] != "rename":  # (its owner and mode are the moved file's: _rename)
            if ev.get("mode") is not None:
                mode = ev["mode"]
            if ev.get("owner") is not None:
                owner = (int(ev["owner"][0]), int(ev["owner"][1]))
        self.meta[path] = (owner, mode)
        return owner, mode

    def _now(self, path: bytes) -> str | None:
        got = self.paths.get(path)
        return got[-1].digest if got else None

    def _apply(self, ev: dict[str, Any]) -> None:
        op = ev["op"]
        path = os.fsencode(ev.get("path") or "")
        if op == "create" and ev.get("intended"):
            made = ev["intended"] == EMPTY_DIGEST
            self._add(path, ev, ev["intended"], ev.get("expected"), made)
        elif op in ("write", "resolve") and ev.get("intended"):
            self._add(path, ev, ev["intended"], ev.get("expected"))
            for other in ev.get("links", ()):  # the file's other names, written with it
                self._add(os.fsencode(other), ev, ev["intended"], ev.get("expected"))
        elif op == "link" and ev.get("intended"):
            self._add(path, ev, ev["intended"])  # a new name of a file, with its bytes
        elif op == "unlink":
            self._add(path, ev, None, ev.get("expected"))
        elif op == "setattr":  # a chmod or chown: of the bytes the file holds now
            got = self.paths.get(path)
            if got and got[-1].digest is not None:
                self._add(path, ev, got[-1].digest)
            else:
                self._meta(path, ev)
        elif op == "rename":
            dest = os.fsencode(ev["dest"])
            if ev.get("exchange"):
                self._exchange(path, dest, ev)
            else:
                self._rename(path, dest, ev)

    def _below(self, top: bytes) -> list[bytes]:
        return [p for p in self.paths if p == top or p.startswith(top + b"/")]

    def _move(self, moves: dict[bytes, tuple[bytes, str | None]], ev: dict[str, Any]) -> None:
        """``moves``: destination -> (source, the bytes it gets; None: nothing came)."""
        # The sources' owners and modes before any moves (an exchange swaps them).
        before = {src: self.meta.get(src, (None, None)) for src, _ in moves.values()}
        for d, (src, digest) in moves.items():
            if digest is None:
                if d in self.paths:
                    self._add(d, ev, None)
                    self.moved_away.add(d)
                continue
            self.origins.setdefault(d, []).append((ev["lsn"], src))
            self.meta[d] = before.get(src, (None, None))
            self._add(d, ev, digest)

    def _rename(self, src: bytes, dest: bytes, ev: dict[str, Any]) -> None:
        # The moved file's bytes: the event's own digest, else what the journal last saw
        # (None: a directory, whose files move below it).
        moved = ev.get("intended") or self._now(src)
        if ev.get("mode") is not None and ev.get("owner") is not None:  # the moved file's
            self.meta[src] = ((int(ev["owner"][0]), int(ev["owner"][1])), ev["mode"])
        if moved is not None:
            if dest not in self.paths and ev.get("expected"):  # the file it replaced
                self.paths[dest] = [Version(0, ev["ts"], ev["expected"])]
            if src not in self.paths:  # a file rwfs had not journaled before it moved
                self.paths[src] = [
                    Version(0, ev["ts"], moved, False, *self.meta.get(src, (None, None)))
                ]
        moves: dict[bytes, tuple[bytes, str | None]] = {}
        if ev.get("untracked"):
            # Onto a passthrough name: the files leave the journal, which does not hear
            # of them there (their removal, say), so no version stands for them there.
            for p in self._below(src) + self._below(dest):
                moves[p] = (p, None)
            self._move(moves, ev)
            return
        for p in self._below(src):
            moves[dest + p[len(src) :]] = (p, moved if p == src else self._now(p))
            moves.setdefault(p, (p, None))
        self._move(moves, ev)

    def _exchange(self, a: bytes, b: bytes, ev: dict[str, Any]) -> None:
        moves: dict[bytes, tuple[bytes, str | None]] = {}
        for x, y in ((a, b), (b, a)):
            for p in self._below(x):
                moves[y + p[len(x) :]] = (p, self._now(p))
        for x in (a, b):
            for p in self._below(x):
                moves.setdefault(p, (p, None))  # nothing came back to it
        self._move(moves, ev)

    def _lineage(self, path: bytes) -> list[Version]:
        """Every version of ``path``'s own timeline and of the files that moved to it,
        each before it moved."""
        bound = {path: self.lsn + 1}
        todo = [path]
        while todo:
            p = todo.pop()
            for lsn, src in self.origins.get(p, []):
                if lsn < bound[p] and bound.get(src, -1) < lsn:
                    bound[src] = lsn
                    todo.append(src)
        return [v for p, b in bound.items() for v in self.paths.get(p, []) if v.lsn < b]

    @_locked
    def versions(self, path: bytes) -> list[Version]:
        """The versions of ``path`` that had bytes, with those of the files renamed to it,
        oldest first; a run of the same bytes once (its first)."""
        self.refresh()
        own = self.paths.get(path, [])
        out: list[Version] = []
        every = sorted(self._lineage(path), key=lambda v: v.lsn)
        for v in every:
            if v.digest is None:
                continue
            if v.made and v is not (own[-1] if own else None):
                continue  # a new file's empty start, superseded
            if out and out[-1].digest == v.digest:
                continue
            out.append(v)
        return out

    @_locked
    def listed(self) -> set[bytes]:
        """The paths ``history/`` lists: those that exist, and removed ones that held
        bytes no listed path's versions hold (of two removed paths with the same bytes, the
        one a file was renamed to)."""
        self.refresh()
        if self._listed is not None and self._listed[0] == self.lsn:
            return self._listed[1]
        live = {p for p, got in self.paths.items() if got and got[-1].digest is not None}
        kept = {v.digest for p in live for v in self.versions(p)}
        removed = {p: {v.digest for v in self.versions(p)} for p in self.paths if p not in live}
        gone = set()
        # A file renamed away is seen last: where it went, if removed too, holds its bytes.
        for p in sorted(removed, key=lambda p: (p in self.moved_away, -len(removed[p]), p)):
            if removed[p] - kept:
                gone.add(p)
                kept |= removed[p]
        self._listed = (self.lsn, live | gone)
        return live | gone

    @_locked
    def holders(self, digest: str) -> list[bytes]:
        """The paths whose file the journal last saw holding ``digest``."""
        self.refresh()
        if self._holding is None or self._holding[0] != self.lsn:
            # One pass per change of the journal, not one per version listed.
            index: dict[str, list[bytes]] = {}
            for p, got in self.paths.items():
                if got and got[-1].digest is not None:
                    index.setdefault(got[-1].digest, []).append(p)
            self._holding = (self.lsn, index)
        return list(self._holding[1].get(digest, ()))

    @_locked
    def children(self, prefix: bytes, listed: bool = False) -> set[bytes]:
        """Names directly below ``prefix`` (b"" for the top) of paths with a history (with
        ``listed``: of the paths ``history/`` lists)."""
        self.refresh()
        start = prefix + b"/" if prefix else b""
        return {
            p[len(start) :].split(b"/", 1)[0]
            for p in (self.listed() if listed else self.paths)
            if p.startswith(start) and len(p) > len(start)
        }

    @_locked
    def version_at(self, path: bytes, lsn: int) -> Version | None:
        """The version of ``path``'s timeline at ``lsn`` (None: no event gave it bytes)."""
        self.refresh()
        got = self.paths.get(path, [])
        i = bisect.bisect_right([v.lsn for v in got], lsn)
        return got[i - 1] if i else None

    @_locked
    def state_at(self, path: bytes, lsn: int) -> tuple[bool, str | None]:
        """(changed since ``lsn``, the digest ``path`` held at ``lsn``; None if absent)."""
        self.refresh()
        got = self.paths.get(path, [])
        if not got or got[-1].lsn <= lsn:
            return False, got[-1].digest if got else None
        i = bisect.bisect_right([v.lsn for v in got], lsn)
        return True, got[i - 1].digest if i else None
