"""The history index's rows in LMDB, kept by every ``append_event`` in the transaction that
journals the event (store.py lists the databases; history.py says what they mean).

A path's rows are keyed by ``key(path)``: the path itself, or ``LONG_PATH`` + its SHA-256
when the path and an LSN would not fit in an LMDB key. Short keys keep a directory's paths
in one range (a rename moves a prefix range, a listing reads one); long ones sort together
at the front, and a scan of a prefix reads their range too and filters by the path each
row names (long paths are rare).

- ``hist_paths``: key(path) → ``{"m": [owner, mode], "l": last version, "a": 1 (its file
  was renamed away), "w": where it went, "p": path (long keys)}``. A path with ``l`` has
  a timeline; one with only ``m`` has a recorded owner and mode and nothing else.
- ``hist_versions``: key(path) + NUL + u64 LSN → a version (``Version.pack``): its timeline.
- ``hist_origins``: key(path) + NUL + u64 LSN → the path whose file was renamed to it then.
- ``hist_holders``: digest + 16 bytes of SHA-256(path) → path: the paths whose timeline
  ends in that digest (what the file holds now, as far as the journal knows).
- ``hist_held``: the same keys → path: every path whose timeline ever held that digest
  (not counting a new file's empty start).
- ``hist_modes``: key(path) + NUL + u64 LSN → ``{"s": [mode]}`` where the event set the
  mode ``changes.modes_at`` gives the path (null: none), ``{"n": [prior, mode]}`` where
  it named the path (``prior``: an unlink or a write of an existing file, which records
  the mode the file kept), or both: ``mode_at`` answers for one path what ``modes_at``
  answers for all by reading every event. The row's ``mm`` holds the current one.

Every read costs what one path's rows cost: O(log n) in the journal, never a scan of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import codec
from .objects import EMPTY_DIGEST

LONG_PATH = b"\0#"  # as the ``paths`` database's long keys (store.py)
_SEP = b"\0"  # no path holds a NUL byte
HOPS = 16  # renames followed to find where a file went
HOLDERS = 64  # paths looked at for one digest before it is taken as not kept elsewhere
DBS = (
    b"hist_paths",
    b"hist_versions",
    b"hist_origins",
    b"hist_holders",
    b"hist_held",
    b"hist_modes",
)


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

    def pack(self) -> list[Any]:
        owner = list(self.owner) if self.owner else None
        return [self.lsn, self.ts, self.digest, int(self.made), owner, self.mode]

    @staticmethod
    def unpack(x: list[Any]) -> Version:
        owner = (int(x[4][0]), int(x[4][1])) if x[4] else None
        return Version(x[0], x[1], x[2], bool(x[3]), owner, x[5])


Meta = tuple[tuple[int, int] | None, int | None]


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _digest_key(digest: str, path: bytes) -> bytes:
    return digest.encode() + hashlib.sha256(path).digest()[:16]


class Rows:
    """The index read (and, in a write transaction, kept) through one LMDB transaction."""

    def __init__(self, txn: Any, dbs: dict[bytes, Any], max_key: int) -> None:
        self.t = txn
        self.db = dbs
        self.max_key = max_key

    # ---- reads ----

    def key(self, path: bytes) -> bytes:
        if len(path) + 9 <= self.max_key:
            return path
        return LONG_PATH + hashlib.sha256(path).digest()

    def row(self, path: bytes) -> dict[str, Any] | None:
        if not path:
            return None  # (the top has no row: no event gives it bytes)
        raw = self.t.get(self.key(path), db=self.db[b"hist_paths"])
        return codec.loads(raw) if raw else None

    @staticmethod
    def last_of(row: dict[str, Any] | None) -> Version | None:
        return Version.unpack(row["l"]) if row and "l" in row else None

    def last(self, path: bytes) -> Version | None:
        return self.last_of(self.row(path))

    def has(self, path: bytes) -> bool:
        """Has ``path`` a timeline?"""
        return self.last(path) is not None

    def meta(self, path: bytes) -> Meta:
        return _meta_of(self.row(path))

    def _range(self, db: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        cur = self.t.cursor(db=self.db[db])
        if not cur.set_range(prefix):
            return
        for k, v in cur:
            k = bytes(k)
            if not k.startswith(prefix):
                return
            yield k, bytes(v)

    def timeline(self, path: bytes) -> list[Version]:
        return [
            Version.unpack(codec.loads(v))
            for _, v in self._range(b"hist_versions", self.key(path) + _SEP)
        ]

    def _at(self, db: bytes, head: bytes, lsn: int) -> Any:
        """A cursor of ``db`` on the last key of ``head`` at or before ``lsn`` (None: it
        has none)."""
        cur = self.t.cursor(db=self.db[db])
        # The last key before the first one past ``lsn``.
        placed = cur.prev() if cur.set_range(head + _u64(lsn + 1)) else cur.last()
        return cur if placed and bytes(cur.key()).startswith(head) else None

    def version_at(self, path: bytes, lsn: int) -> Version | None:
        """The version of ``path``'s timeline at ``lsn`` (None: no event gave it bytes)."""
        cur = self._at(b"hist_versions", self.key(path) + _SEP, lsn)
        return Version.unpack(codec.loads(cur.value())) if cur is not None else None

    def mode_at(self, path: bytes, lsn: int) -> int | None:
        """``changes.modes_at(events, lsn).get(path)``, from ``path``'s rows: the mode the
        last event up to ``lsn`` gave it; if none, the mode the first event after ``lsn``
        that names it recorded, if that is an unlink or a write of the file it kept."""
        head = self.key(path) + _SEP
        cur = self._at(b"hist_modes", head, lsn)
        while cur is not None and bytes(cur.key()).startswith(head):
            entry = codec.loads(cur.value())
            if "s" in entry:
                if entry["s"][0] is not None:
                    return int(entry["s"][0])
                break
            if not cur.prev():
                break
        cur = self.t.cursor(db=self.db[b"hist_modes"])
        if cur.set_range(head + _u64(lsn + 1)):
            for k, v in cur:
                if not bytes(k).startswith(head):
                    break
                entry = codec.loads(v)
                if "n" in entry:
                    prior, mode = entry["n"]
                    return int(mode) if prior and mode is not None else None
        return None

    def timelines(
        self, start: bytes, n: int
    ) -> tuple[list[tuple[bytes, list[Version]]], bytes | None]:
        """The timelines of up to ``n`` paths, in key order from key ``start`` on, and the
        key to go on from (None: no more)."""
        out: list[tuple[bytes, list[Version]]] = []
        cur = self.t.cursor(db=self.db[b"hist_versions"])
        if not cur.set_range(start):
            return out, None
        head, versions = b"", list[Version]()
        for k, v in cur:
            k = bytes(k)
            if k[:-9] != head:
                if versions:
                    out.append((self._path_of(head), versions))
                    if len(out) == n:
                        return out, head + b"\x01"  # (past every key of ``head``)
                head, versions = k[:-9], []
            versions.append(Version.unpack(codec.loads(v)))
        if versions:
            out.append((self._path_of(head), versions))
        return out, None

    def _path_of(self, key: bytes) -> bytes:
        """The path a row key stands for."""
        if not key.startswith(LONG_PATH):
            return key
        raw = self.t.get(key, db=self.db[b"hist_paths"])
        return os.fsencode(codec.loads(raw)["p"])

    def origins(self, path: bytes) -> list[tuple[int, bytes]]:
        head = self.key(path) + _SEP
        return [
            (int.from_bytes(k[len(head) :], "big"), v)
            for k, v in self._range(b"hist_origins", head)
        ]

    def holders(self, digest: str, db: bytes = b"hist_holders") -> Iterator[bytes]:
        for _, path in self._range(db, digest.encode()):
            yield path

    def rows_below(self, top: bytes) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """``(path, row)`` of every path below ``top`` (b"": every path), short keys in
        order, then the long ones."""
        prefix = top + b"/" if top else b""
        if len(prefix) + 9 <= self.max_key:
            cur = self.t.cursor(db=self.db[b"hist_paths"])
            if cur.set_range(prefix or b"\x01"):
                for k, v in cur:
                    k = bytes(k)
                    if not k.startswith(prefix):
                        break
                    yield k, codec.loads(v)
        for p, row in self._long_rows():
            if p.startswith(prefix):
                yield p, row

    def below(self, top: bytes) -> list[bytes]:
        """``top`` and the paths below it that have a timeline (b"": every path)."""
        out = [top] if top and self.has(top) else []
        return out + [p for p, row in self.rows_below(top) if "l" in row]

    def children(self, prefix: bytes) -> Iterator[tuple[bytes, Iterator[tuple[bytes, dict]]]]:
        """Each name directly below ``prefix`` (b"": the top) with the rows of its path and
        of the paths below it, read only as far as the caller reads them: one seek a name
        and one a subtree, not a scan of the subtrees."""
        start = prefix + b"/" if prefix else b""
        seen = set()
        if len(start) + 9 <= self.max_key:
            cur = self.t.cursor(db=self.db[b"hist_paths"])
            at = start or b"\x01"  # (short keys never start with NUL)
            while cur.set_range(at):
                k = bytes(cur.key())
                if not k.startswith(start):
                    break
                name, slash, _ = k[len(start) :].partition(b"/")
                # Past this key: past the whole subtree ('0' follows '/'), or to the next
                # key (``name-x`` sorts between ``name`` and ``name/``).
                at = start + name + b"0" if slash else k + b"\0"
                if name not in seen:
                    seen.add(name)
                    yield name, self._subtree(start + name)
        longs: dict[bytes, list[tuple[bytes, dict]]] = {}
        for p, row in self._long_rows():
            if p.startswith(start) and len(p) > len(start):
                name = p[len(start) :].split(b"/", 1)[0]
                if name not in seen:
                    longs.setdefault(name, []).append((p, row))
        for name, rows in longs.items():
            yield name, iter(rows)

    def _subtree(self, path: bytes) -> Iterator[tuple[bytes, dict]]:
        row = self.row(path)
        if row is not None:
            yield path, row
        yield from self.rows_below(path)

    def _long_rows(self) -> Iterator[tuple[bytes, dict]]:
        for _, v in self._range(b"hist_paths", LONG_PATH):
            row = codec.loads(v)
            yield os.fsencode(row["p"]), row

    def lineage(self, path: bytes) -> list[Version]:
        """Every version of ``path``'s own timeline and of the files that moved to it, each
        before it moved."""
        bound = {path: 1 << 62}
        todo = [path]
        while todo:
            p = todo.pop()
            for lsn, src in self.origins(p):
                if lsn < bound[p] and bound.get(src, -1) < lsn:
                    bound[src] = lsn
                    todo.append(src)
        return [v for p, b in bound.items() for v in self.timeline(p) if v.lsn < b]

    def versions(self, path: bytes) -> list[Version]:
        """The versions of ``path`` that had bytes, with those of the files renamed to it,
        oldest first; a run of the same bytes once (its first)."""
        last = self.last(path)
        out: list[Version] = []
        for v in sorted(self.lineage(path), key=lambda v: v.lsn):
            if v.digest is None:
                continue
            if v.made and v != last:
                continue  # a new file's empty start, superseded
            if out and out[-1].digest == v.digest:
                continue
            out.append(v)
        return out

    def listed(self, path: bytes, row: dict[str, Any]) -> bool:
        """Does ``history/`` list ``path``? Every path that exists; a removed one only if
        it held bytes that are nowhere else (docs/history.md): not a file renamed to a
        name that exists or was removed since (whose versions are this one's too), and not
        one whose every version another path holds — a path that exists, one a file went
        to that exists, or a removed path that ranks before it (not renamed away, or else
        its name sorts first)."""
        last = self.last_of(row)
        if last is None:
            return False
        if last.digest is not None:
            return True
        # Where the file went lists this path's versions with its own (``lineage``), or,
        # removed there and not listed, holds none that a listed path does not. (Not in
        # ``_kept``: that removed path could then count this one, and neither be listed.)
        if row.get("a") and self._went_on(row, removed=True):
            return False
        away = bool(row.get("a"))
        for d in {v.digest for v in self.versions(path)}:
            if not self._kept(str(d), path, away):
                return True
        return False

    def _went_on(self, row: dict[str, Any], removed: bool = False) -> bool:
        """Did the file renamed away from this row's path reach a path that exists (with
        ``removed``: or one where it was removed, not renamed away again)?"""
        for _ in range(HOPS):
            if not row.get("w"):
                return False
            nxt = self.row(os.fsencode(row["w"]))
            last = self.last_of(nxt)
            if last is not None and last.digest is not None:
                return True
            if not (nxt and nxt.get("a")):
                return removed and last is not None
            row = nxt
        return False

    def _kept(self, digest: str, path: bytes, away: bool) -> bool:
        for n, q in enumerate(self.holders(digest, b"hist_held")):
            if n == HOLDERS:
                return False  # (listed, then: rather one entry too many than bytes hidden)
            if q == path:
                continue
            row = self.row(q)
            last = self.last_of(row)
            if row is None or last is None:
                continue
            if last.digest is not None:
                return True
            if row.get("a"):
                if self._went_on(row):
                    return True
            elif away or q < path:
                return True
        return False

    # ---- the writer: one event at a time, in the event's own transaction ----

    def _put_row(self, path: bytes, row: dict[str, Any]) -> None:
        key = self.key(path)
        if key != path:
            row["p"] = os.fsdecode(path)
        self.t.put(key, codec.dumps(row), db=self.db[b"hist_paths"])

    def _set_meta(self, path: bytes, meta: Meta) -> None:
        row = self.row(path) or {}
        owner, mode = meta
        row["m"] = [list(owner) if owner else None, mode]
        self._put_row(path, row)

    def _put_version(self, path: bytes, row: dict[str, Any], v: Version) -> None:
        """Add ``v`` to ``path``'s timeline (or replace the version at its LSN); ``row`` is
        updated, the caller writes it."""
        head = self.key(path) + _SEP
        self.t.put(head + _u64(v.lsn), codec.dumps(v.pack()), db=self.db[b"hist_versions"])
        old = self.last_of(row)
        if old is not None and old.digest and old.digest != v.digest:
            self.t.delete(_digest_key(old.digest, path), db=self.db[b"hist_holders"])
        if v.digest:
            self.t.put(_digest_key(v.digest, path), path, db=self.db[b"hist_holders"])
            if not v.made:  # (a new file's empty start is no version history/ shows)
                self.t.put(_digest_key(v.digest, path), path, db=self.db[b"hist_held"])
        row["l"] = v.pack()

    @staticmethod
    def _meta_after(row: dict[str, Any], ev: dict[str, Any]) -> Meta:
        """The owner and mode of a path's file after ``ev`` (kept in its ``row``): what it
        records, else what was known before. (A rename's event records neither: the moved
        file keeps its.)"""
        owner, mode = _meta_of(row)
        if ev["op"] != "rename":
            if ev.get("mode") is not None:
                mode = ev["mode"]
            if ev.get("owner") is not None:
                owner = (int(ev["owner"][0]), int(ev["owner"][1]))
        row["m"] = [list(owner) if owner else None, mode]
        return owner, mode

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
        row = self.row(path) or {}
        owner, mode = self._meta_after(row, ev)
        last = self.last_of(row)
        if last is None and before:
            last = Version(0, ev["ts"], before, False, owner, mode)
            self._put_version(path, row, last)
        if last is None or last.digest != digest:
            self._put_version(path, row, Version(ev["lsn"], ev["ts"], digest, made, owner, mode))
        elif (last.owner, last.mode) != (owner, mode):
            self._put_version(path, row, dataclasses.replace(last, owner=owner, mode=mode))
        row.pop("a", None)
        row.pop("w", None)
        self._put_row(path, row)

    def _start(self, path: bytes, v: Version) -> None:
        """A path's first version, before any event of its own (a rename names it)."""
        row = self.row(path) or {}
        self._put_version(path, row, v)
        self._put_row(path, row)

    def _now(self, path: bytes) -> str | None:
        last = self.last(path)
        return last.digest if last else None

    def apply(self, ev: dict[str, Any]) -> None:
        op = ev["op"]
        path = os.fsencode(ev.get("path") or "")
        if not path:
            return
        self._modes(ev, path)
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
            got = self.last(path)
            if got and got.digest is not None:
                self._add(path, ev, got.digest)
            else:
                row = self.row(path) or {}
                self._meta_after(row, ev)
                self._put_row(path, row)
        elif op == "rename" and ev.get("dest"):
            dest = os.fsencode(ev["dest"])
            if ev.get("exchange"):
                self._exchange(path, dest, ev)
            else:
                self._rename(path, dest, ev)

    def _modes(self, ev: dict[str, Any], path: bytes) -> None:
        """``changes.modes_at``'s walk, one event at a time: what it names, and the modes it
        sets (``hist_modes``, and ``mm`` in the rows)."""
        op, mode = ev["op"], ev.get("mode")
        dest = os.fsencode(ev["dest"]) if op == "rename" and ev.get("dest") else None
        prior = op == "unlink" or (op == "write" and ev.get("expected") is not None)
        entries: dict[bytes, dict[str, Any]] = {path: {"n": [int(prior), mode]}}
        if dest is not None:
            entries[dest] = {"n": [0, None]}
        sets: dict[bytes, int | None] = {}
        if op in ("create", "write", "setattr") and mode is not None:
            sets[path] = mode
        elif op == "unlink":
            sets[path] = None
        elif dest is not None:
            moved: dict[bytes, int] = {}
            pairs = ((path, dest), (dest, path)) if ev.get("exchange") else ((path, dest),)
            for src, dst in pairs:
                for p, m in self._modes_below(src):
                    if p not in sets:  # (not taken already by the other side)
                        moved[dst + p[len(src) :]] = m
                        sets[p] = None
            if not ev.get("exchange"):  # what the rename replaced is gone
                for p, _ in self._modes_below(dest):
                    sets[p] = None
            sets.update(moved)
        for p, now in sets.items():
            row = self.row(p) or {}
            if row.get("mm") == now:
                continue
            if now is None:
                row.pop("mm", None)
            else:
                row["mm"] = now
            self._put_row(p, row)
            entries.setdefault(p, {})["s"] = [now]
        for p, entry in entries.items():
            key = self.key(p) + _SEP + _u64(ev["lsn"])
            self.t.put(key, codec.dumps(entry), db=self.db[b"hist_modes"])

    def _modes_below(self, top: bytes) -> list[tuple[bytes, int]]:
        """``top`` and the paths below it that have a mode (``mm``)."""
        row = self.row(top)
        out = [(top, int(row["mm"]))] if row and "mm" in row else []
        return out + [(p, int(r["mm"])) for p, r in self.rows_below(top) if "mm" in r]

    def _move(self, moves: dict[bytes, tuple[bytes, str | None]], ev: dict[str, Any]) -> None:
        """``moves``: destination -> (source, the bytes it gets; None: nothing came)."""
        # The sources' owners and modes before any moves (an exchange swaps them).
        before = {src: self.meta(src) for src, _ in moves.values()}
        went = {src: d for d, (src, digest) in moves.items() if digest is not None and src != d}
        for d, (src, digest) in moves.items():
            if digest is None:
                # A path removed before (below a directory moved) loses nothing now: its
                # row keeps how it went, a removal or a rename and where to, which the
                # listing rule reads (the save's temporary, renamed onto its target).
                if self._now(d) is not None:
                    self._add(d, ev, None)
                    row = self.row(d) or {}
                    row["a"] = 1
                    if d in went:
                        row["w"] = os.fsdecode(went[d])
                    self._put_row(d, row)
                continue
            key = self.key(d) + _SEP + _u64(ev["lsn"])
            self.t.put(key, src, db=self.db[b"hist_origins"])
            self._set_meta(d, before.get(src, (None, None)))
            self._add(d, ev, digest)

    def _rename(self, src: bytes, dest: bytes, ev: dict[str, Any]) -> None:
        # The moved file's bytes: the event's own digest, else what the journal last saw
        # (None: a directory, whose files move below it).
        moved = ev.get("intended") or self._now(src)
        if ev.get("mode") is not None and ev.get("owner") is not None:  # the moved file's
            self._set_meta(src, ((int(ev["owner"][0]), int(ev["owner"][1])), ev["mode"]))
        if moved is not None:
            if not self.has(dest) and ev.get("expected"):  # the file it replaced
                self._start(dest, Version(0, ev["ts"], ev["expected"]))
            if not self.has(src):  # a file rwfs had not journaled before it moved
                self._start(src, Version(0, ev["ts"], moved, False, *self.meta(src)))
        moves: dict[bytes, tuple[bytes, str | None]] = {}
        if ev.get("untracked"):
            # Onto a passthrough name: the files leave the journal, which does not hear
            # of them there (their removal, say), so no version stands for them there.
            for p in self.below(src) + self.below(dest):
                moves[p] = (p, None)
            self._move(moves, ev)
            return
        for p in self.below(src):
            moves[dest + p[len(src) :]] = (p, moved if p == src else self._now(p))
            moves.setdefault(p, (p, None))
        self._move(moves, ev)

    def _exchange(self, a: bytes, b: bytes, ev: dict[str, Any]) -> None:
        moves: dict[bytes, tuple[bytes, str | None]] = {}
        for x, y in ((a, b), (b, a)):
            for p in self.below(x):
                moves[y + p[len(x) :]] = (p, self._now(p))
        for x in (a, b):
            for p in self.below(x):
                moves.setdefault(p, (p, None))  # nothing came back to it
        self._move(moves, ev)


def _meta_of(row: dict[str, Any] | None) -> Meta:
    if not row or "m" not in row:
        return None, None
    owner, mode = row["m"]
    return (tuple(owner) if owner else None), mode  # type: ignore[return-value]
