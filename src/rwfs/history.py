"""History (SPEC §8): every version of every journaled path, read from the journal.

The journal's events say which bytes each path held after each LSN: a ``write`` gives it
its ``intended`` digest, an ``unlink`` takes it away, a ``rename`` moves a path's (or a
directory's) history to its destination, which keeps its own earlier versions too. The
first event of a path also names the bytes it held before rwfs journaled it (the
``expected`` digest of that event). Bytes of old versions live in the object store (the
pre-images every commit keeps); the newest is the live file.

``History`` is an index over the events, brought up to date incrementally; ``state_at``
answers what a path held at a given LSN (snapshots, restore).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Any

from .store import Store


@dataclass(frozen=True)
class Version:
    lsn: int  # the event that gave the path these bytes (0: before rwfs journaled it)
    ts: str
    digest: str | None  # None: the path did not exist from this LSN on

    @property
    def name(self) -> str:
        """A file name that ``ls`` sorts by time: ``000042-2026-11-30T10:12:03Z-3fa9c1d2``."""
        assert self.digest is not None
        return f"{self.lsn:06d}-{self.ts[:19]}Z-{self.digest[7:15]}"


class History:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.lsn = 0
        self.paths: dict[bytes, list[Version]] = {}

    def refresh(self) -> None:
        last = self.store.meta_int(b"lsn")
        if last == self.lsn:
            return
        for ev in self.store.events(since=self.lsn):
            self._apply(ev)
            self.lsn = ev["lsn"]

    def _add(self, path: bytes, ev: dict[str, Any], digest: str | None) -> None:
        got = self.paths.setdefault(path, [])
        if not got and ev.get("expected"):  # the bytes it held before this first event
            got.append(Version(0, ev["ts"], ev["expected"]))
        if not got or got[-1].digest != digest:
            got.append(Version(ev["lsn"], ev["ts"], digest))

    def _apply(self, ev: dict[str, Any]) -> None:
        op = ev["op"]
        path = os.fsencode(ev.get("path") or "")
        if op in ("write", "create", "resolve") and ev.get("intended"):
            self._add(path, ev, ev["intended"])
        elif op == "unlink":
            self._add(path, ev, None)
        elif op == "rename":
            dest = os.fsencode(ev["dest"])
            if ev.get("exchange"):
                self._swap(path, dest)
                return
            for src in [p for p in self.paths if p == path or p.startswith(path + b"/")]:
                moved = self.paths[src]
                dst = dest + src[len(path) :]
                here = self.paths.get(dst, [])
                self.paths[dst] = sorted(here + moved, key=lambda v: v.lsn)
                self._add(dst, ev, moved[-1].digest)
                self._add(src, ev, None)
            if ev.get("intended"):
                self._add(dest, ev, ev["intended"])

    def _swap(self, a: bytes, b: bytes) -> None:
        moves = {}
        for p in list(self.paths):
            for src, dst in ((a, b), (b, a)):
                if p == src or p.startswith(src + b"/"):
                    moves[dst + p[len(src) :]] = self.paths.pop(p)
        self.paths.update(moves)

    def versions(self, path: bytes) -> list[Version]:
        """The versions of ``path`` that had bytes, oldest first."""
        self.refresh()
        return [v for v in self.paths.get(path, []) if v.digest is not None]

    def children(self, prefix: bytes) -> set[bytes]:
        """Names directly below ``prefix`` (b"" for the top) of paths with a history."""
        self.refresh()
        start = prefix + b"/" if prefix else b""
        return {
            p[len(start) :].split(b"/", 1)[0]
            for p in self.paths
            if p.startswith(start) and len(p) > len(start)
        }

    def state_at(self, path: bytes, lsn: int) -> tuple[bool, str | None]:
        """(changed since ``lsn``, the digest ``path`` held at ``lsn``; None if absent)."""
        self.refresh()
        got = self.paths.get(path, [])
        if not got or got[-1].lsn <= lsn:
            return False, got[-1].digest if got else None
        i = bisect.bisect_right([v.lsn for v in got], lsn)
        return True, got[i - 1].digest if i else None
