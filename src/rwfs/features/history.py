"""History (SPEC §8): every version of every journaled path, read from the journal.

Two things are kept per path, because snapshots and a person browsing ``history/`` ask
different questions:

- its **timeline**: exactly which bytes the *name* held after each LSN (``paths``). A
  ``write`` gives it its ``intended`` digest, an ``unlink`` takes it away, a ``rename`` takes
  it away from the source and gives the destination the moved bytes, as one new version —
  the destination's earlier versions stay its own, and the source's do not become the
  destination's (a rename onto a passthrough name, ``untracked``, only takes the files
  away: the journal does not follow them there). The first event of a path also names the
  bytes it held before rwfs journaled it (version 0): a write's or unlink's ``expected``,
  a rename's ``expected`` for the destination it replaced and its ``intended`` for the
  source that moved. ``state_at``
  reads timelines only: snapshots and restore see a file saved by write-a-temporary-then-
  rename as existing throughout, with its old bytes before the rename.
- its **lineage**: a file renamed to a name keeps the versions it had under its old name
  (``origins``). ``versions`` lists them together with the name's own, oldest first, each
  run of the same bytes once: a temporary written once and renamed over its target adds
  one version to the target's list.

``history/`` lists every path that exists now, and a removed path only if it held bytes
that are nowhere else (``Rows.listed``): not one whose file was renamed to a name that
exists or where it was removed since, and not one whose every version another path held —
one that exists, one a file went to that exists, or a removed path that ranks before it
(not renamed away, or else its name sorts first). A temporary file an editor or ``sed -i``
wrote and renamed over its target held nothing but the target's new version, so it is not
listed (it can still be looked up by name). The empty version a ``create`` gives a new
file is not listed once the file has other bytes. The rule reads only the rows of the
paths below the directory listed and of the paths that held their bytes, never the whole
index.

Each version also carries the file's owner and mode bits while it held those bytes, as far
as the journal tells them (``write``, ``create``, ``unlink``, ``rename`` and ``setattr``
events record ``mode``; all but ``write`` record ``owner``, ``setattr`` after a chown):
``.rw/`` shows a version with them, so that no one reads through it what they could not
read in the tree (SPEC §3.3b). A ``chmod`` or ``chown`` applies to the version the file
holds then; renames carry them along.

Bytes of old versions live in the object store (the pre-images every commit keeps); the
newest is the live file. The index is kept in LMDB (timelines.py), in the transaction that
journals each event, so every question here reads a few rows of it: O(log n) in the
journal, at the first listing after a mount as at any other, and nothing is held in memory.
A store written before the index existed is indexed once, when it is first opened
(``Store._build_history``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..journal.store import Store
from ..journal.timelines import Meta, Rows, Version

__all__ = ["History", "Version"]


class History:
    """The history index, read: each call in a read transaction of its own (so from any
    thread)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @contextlib.contextmanager
    def _rows(self) -> Iterator[Rows]:
        with self.store.env.begin(buffers=False) as txn:
            yield Rows(txn, self.store.db, self.store.max_key)

    def has(self, path: bytes) -> bool:
        """Has ``path`` a timeline (some event gave it bytes or took them)?"""
        with self._rows() as r:
            return r.has(path)

    def has_below(self, path: bytes) -> bool:
        """Has ``path``, or a path below it, a timeline?"""
        with self._rows() as r:
            return r.has(path) or any("l" in row for _, row in r.rows_below(path))

    def meta(self, path: bytes) -> Meta:
        """The owner and mode last recorded for ``path``'s file ((None, None): none)."""
        with self._rows() as r:
            return r.meta(path)

    def timeline(self, path: bytes) -> list[Version]:
        """Exactly what the name held after each LSN, oldest first."""
        with self._rows() as r:
            return r.timeline(path)

    def timelines(self, under: list[bytes] | None = None) -> Iterator[tuple[bytes, list[Version]]]:
        """``(path, timeline)`` of every path with one (``under``: of those paths and the
        paths below them), a thousand paths to a read transaction."""
        if under is None:  # every one: the versions in key order, no seek a path
            after: bytes | None = b""
            while after is not None:
                with self._rows() as r:
                    chunk, after = r.timelines(after, 1000)
                yield from chunk
            return
        with self._rows() as r:
            paths = sorted({p for top in under for p in r.below(top)})
        for i in range(0, len(paths), 1000):
            with self._rows() as r:
                chunk = [(p, r.timeline(p)) for p in paths[i : i + 1000]]
            yield from chunk

    def versions(self, path: bytes) -> list[Version]:
        """The versions of ``path`` that had bytes, with those of the files renamed to it,
        oldest first; a run of the same bytes once (its first)."""
        with self._rows() as r:
            return r.versions(path)

    def holders(self, digest: str) -> list[bytes]:
        """The paths whose file the journal last saw holding ``digest``."""
        with self._rows() as r:
            return sorted(r.holders(digest))

    def children(self, prefix: bytes, listed: bool = False) -> set[bytes]:
        """Names directly below ``prefix`` (b"" for the top) of paths with a history (with
        ``listed``: of the paths ``history/`` lists)."""
        out = set()
        with self._rows() as r:
            for name, rows in r.children(prefix):
                for path, row in rows:
                    if r.listed(path, row) if listed else "l" in row:
                        out.add(name)
                        break
        return out

    def version_at(self, path: bytes, lsn: int) -> Version | None:
        """The version of ``path``'s timeline at ``lsn`` (None: no event gave it bytes)."""
        with self._rows() as r:
            return r.version_at(path, lsn)

    def mode_at(self, path: bytes, lsn: int) -> int | None:
        """The mode bits ``path``'s file had at ``lsn``, as ``changes.modes_at`` tells them
        from every event (None: none recorded)."""
        with self._rows() as r:
            return r.mode_at(path, lsn)

    def state_at(self, path: bytes, lsn: int) -> tuple[bool, str | None]:
        """(changed since ``lsn``, the digest ``path`` held at ``lsn``; None if absent)."""
        with self._rows() as r:
            return _state_at(r, path, lsn)

    def exists_below_at(self, path: bytes, lsn: int) -> bool:
        """Did a path below ``path`` hold bytes at ``lsn``, by its timeline?"""
        with self._rows() as r:
            return any(
                "l" in row and _state_at(r, p, lsn)[1] is not None for p, row in r.rows_below(path)
            )


def _state_at(r: Rows, path: bytes, lsn: int) -> tuple[bool, str | None]:
    last = r.last(path)
    if last is None or last.lsn <= lsn:
        return False, last.digest if last else None
    at = r.version_at(path, lsn)
    return True, at.digest if at else None
