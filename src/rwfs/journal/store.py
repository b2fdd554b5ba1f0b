"""The LMDB journal: the one place that owns the on-disk schema.

The environment lives at ``WORKSPACE/.rw/journal/``. Every database is named; keys and
values are listed here, and this docstring is the canonical reference for them.

``meta``       — ``b"schema"`` → ASCII schema version (``SCHEMA_VERSION``).
                 ``b"lsn"`` → u64, the last log sequence number handed out.
                 ``b"receipt"`` → u64, the last receipt id handed out.
                 ``b"notice"`` / ``b"conflict"`` / ``b"handoff"`` / ``b"held"`` → u64, the
                 last notice / conflict / handoff / held intent record id.
                 ``b"prepared_gen"`` / ``b"applied_gen"`` → u64, the newest intent-log
                 generation whose receipts are prepared / whose events are all applied
                 (see ``intents.py``).
                 ``b"count:<name>"`` → u64 counters shown in ``.rw/status``.
                 ``b"index:links"`` → u64 1 once the path index is known true to the
                 journal's model (a new store, or recovery's one repair of a store that
                 rwfs wrote before it kept hard links' names and unjournaled files true:
                 ``recovery._repair_index``).
                 ``b"fsck:lsn"`` → u64, ``b"lsn"`` at the start of the last ``rwfs fsck``
                 run that completed, full or ``--changed`` (not ``--sample``): ``--changed``
                 hashes only the objects and paths whose ``lsn`` is past it (fsck.py).
``events``     — u64 LSN (big-endian) → JSON event (SPEC §7.1), append-only; every event
                 has ``lsn``, ``ts``, ``op``, ``path`` and the ``EVENT_KEYS`` (null where
                 they do not apply). An event written by a process of an ``rwfs run``
                 session also has ``session`` (its name, sessions.py); ``op: "session"``
                 events (``path`` null, ``state`` ``begun`` or ``ended``, ``exit``) mark
                 where a session begins and ends. ``op: "allow"`` events (``state``
                 ``granted``, with ``expires`` and ``waives``, or ``cancelled``) record an
                 allowance (allowances.py); a write it let through has ``allowed``.
``receipts``   — u64 receipt id → JSON receipt ``{id, batch, path, expected, intended,
                 state, stage, lsn, ts}``; ``state`` is ``prepared``, ``committed``,
                 ``conflict``, ``pending`` or ``aborted`` (an owed write an abort or a
                 rollback dropped).
``unsettled``  — u64 receipt id → empty: the receipts recovery must look at.
``paths``      — path (bytes, relative to the workspace; ``.`` for its top) → JSON
                 ``{digest, lsn}``: the last journaled content of each path (``digest``
                 null once deleted). A path longer than LMDB's largest key
                 (``env.max_key_size()``, 511 bytes; a path may have 4,095) is keyed
                 ``LONG_PATH`` (``b"\\0#"``) + the 32-byte SHA-256 of the path instead, and its
                 row also holds ``path`` (``os.fsdecode``d). Why this shape: short paths, the
                 great majority, keep their plain keys, so the keys' order still puts a
                 directory's paths in one range (a rename moves a prefix range) and a store
                 written before long paths were supported reads as it is, with no
                 migration. No path holds a NUL byte, so the long keys cannot collide with
                 a path, and they sort together: a rename or a full listing scans that
                 range too and filters by the ``path`` each row names (long paths are rare).
``objects``    — digest (ASCII ``sha256:…``) → JSON ``{size, lsn}``: objects the store
                 holds, with the LSN that first kept them.
``batches``    — batch name (ASCII) → JSON ``{name, state, opened, opened_by, scope,
                 entries, reasons, noticed, dirs?, rolled_back?, removed?}``
                 (batches.py): ``entries`` maps each path to ``{expected, intended,
                 size, order, stage, by?, receipt?, done?, outcome?}`` (``stage`` is the
                 staging file holding the draft, or null once the draft is an object;
                 ``intended`` null: a deletion; ``by``: ``{pid, comm, uid, session?}`` of
                 the latest change's writer, named by the commit's event); ``dirs``
                 lists directories the batch made; ``removed``: rmdir'd, hidden, its
                 name still taken;
                 ``state`` is ``open``, ``committing``, ``committed``, ``aborted``,
                 ``interrupted`` or ``conflicted``.
``notices``    — u64 id → JSON notice ``{id, ts, kind, batch, message, …}`` (SPEC §6.2).
``snapshots``  — snapshot name (ASCII) → JSON ``{name, lsn, ts}``: a named point of the
                 journal (history.py reconstructs the tree at ``lsn``).
``hist_paths``, ``hist_versions``, ``hist_origins``, ``hist_holders``, ``hist_held``,
``hist_modes`` — the history index (every path's timeline, where its files came from,
                 which paths hold which bytes, its mode at each point), kept by
                 ``append_event`` in the event's own transaction; keys and values:
                 timelines.py. Built from ``events`` once,
                 when a store that predates it is opened (``meta`` ``b"index:history"``:
                 1 once done; ``b"index:history_lsn"``: the last event indexed so far, so
                 that an interrupted build goes on where it stopped).
``scratch``    — name (bytes: one file name, at most 255 bytes, NAME_MAX) → JSON ``{name,
                 digest, size, ts, pid, comm, uid}``: files of ``.rw/scratch/`` (their
                 bytes are objects).
``chunks``     — session name (ASCII) → JSON ``{name, created, expect, parts}``;
                 ``parts`` maps ``part-NNN`` to the digest of its bytes (an object).
``handoffs``   — u64 id → JSON ``{id, ts, lsn, note, last_good_state}``: ``note`` is the
                 digest of the Markdown written; ``last_good_state`` lists ``{path, sha256}``.
``refused``    — u64 LSN of a ``refuse`` event → JSON ``{path, draft, intended, uid,
                 gid}``: the refused drafts (``.rw/rejected/``, kept by gc; ``draft`` may
                 be null; ``uid``, ``gid``: the writer's, when recorded),
                 so that a mount need not read every event for them. Built from
                 ``events`` once, when a store that predates it is opened (``meta``
                 ``b"index:refused"`` marks it done).
``conflicts``  — u64 id → JSON ``{id, path, batch, expected, intended, actual, reason,
                 ts, state, resolution}``; ``state`` is ``open`` or ``resolved``.
``held``       — u64 id → JSON ``{id, gen, record, error}``: an intent-log record of
                 generation ``gen`` that recovery owed to the journal but could not apply
                 (``error`` says why); retried at every mount (recovery.py).

Paths inside JSON are ``os.fsdecode``d (surrogate escapes keep any byte). File contents
never enter the journal: they live in the object store.

A write transaction is opened, used and committed within one call on one thread (py-lmdb
requires it); callers run these calls through ``trio.to_thread``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from . import codec, timelines

log = logging.getLogger("rwfs")

SCHEMA_VERSION = b"1"
EVENT_KEYS = ("batch", "expected", "intended", "size", "pid", "comm", "uid")
_U64 = struct.Struct(">Q")
_DBS = (
    b"meta",
    b"events",
    b"receipts",
    b"unsettled",
    b"paths",
    b"objects",
    b"batches",
    b"notices",
    b"conflicts",
    b"snapshots",
    b"scratch",
    b"chunks",
    b"handoffs",
    b"refused",
    b"held",
    *timelines.DBS,
)
# The ``paths`` keys of paths too long to be LMDB keys start with this: no path holds a NUL.
LONG_PATH = b"\0#"
# Events are read this many at a time, each batch in a read transaction of its own.
EVENTS_CHUNK = 10_000
# The journal's file is kept allocated this far past the pages LMDB uses: a commit on a
# disk that has just filled (a writer's stage, an object) writes into room it holds
# already, and is not the one write that fails for want of a block.
HEADROOM = 1 << 20


class JournalUnavailable(Exception):
    """LMDB could not commit (map or disk full, I/O error): nothing was recorded."""


def u64(n: int) -> bytes:
    return _U64.pack(n)


def from_u64(b: Any) -> int:
    return int(_U64.unpack(bytes(b))[0])


_NAME = re.compile(rb"[A-Za-z0-9._-]{1,64}")


def plain_name(raw: bytes) -> str | None:
    """A name for a batch, snapshot or chunk session (SPEC §6.1: ``[A-Za-z0-9._-]{1,64}``,
    not ``.`` or ``..``, and not starting with ``-``: a tool given the name, ``rwfs undo
    NAME`` itself, would read it as an option), or None."""
    if not _NAME.fullmatch(raw) or raw in (b".", b"..") or raw.startswith(b"-"):
        return None
    return raw.decode()


def _long_rows(cur: Any) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The long paths of the ``paths`` database, each ``(path, {digest, lsn})``, read with
    ``cur`` (a cursor of that database). They are rare: a scan of their range is cheap."""
    if not cur.set_range(LONG_PATH):
        return
    for key, raw in cur:
        if not bytes(key).startswith(LONG_PATH):
            break
        row = codec.loads(raw)
        yield os.fsencode(row.pop("path")), row


def now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class Txn:
    """A write transaction with the journal's vocabulary."""

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self._s = store
        self._t = txn

    def _next(self, key: bytes) -> int:
        raw = self._t.get(key, db=self._s.db[b"meta"])
        n = (from_u64(raw) if raw else 0) + 1
        self._t.put(key, u64(n), db=self._s.db[b"meta"])
        return n

    def next_lsn(self) -> int:
        """The LSN the next ``append_event`` of this transaction will hand out."""
        raw = self._t.get(b"lsn", db=self._s.db[b"meta"])
        return (from_u64(raw) if raw else 0) + 1

    def append_event(self, event: dict[str, Any]) -> int:
        lsn = self._next(b"lsn")
        # ``ts`` never goes back in LSN order: an event that carries its operation's time
        # (a create) may be recorded after one stamped at its group commit (a write).
        ts = max(event.pop("ts", None) or now_iso(), self._s.last_ts(self._t))
        self._s.newest_ts = ts
        event = {"lsn": lsn, "ts": ts, **event}
        for key in EVENT_KEYS:  # every event has them, null where they do not apply
            event.setdefault(key, None)
        self._t.put(u64(lsn), codec.dumps(event), db=self._s.db[b"events"])
        self._index(event)
        return lsn

    def _index(self, event: dict[str, Any]) -> None:
        timelines.Rows(self._t, self._s.db, self._s.max_key).apply(event)
        if event["op"] == "refuse":
            row = {k: event.get(k) for k in ("path", "draft", "intended")}
            row |= {k: event[k] for k in ("uid", "gid") if event.get(k) is not None}
            self._t.put(u64(event["lsn"]), codec.dumps(row), db=self._s.db[b"refused"])

    def new_receipt(self, receipt: dict[str, Any]) -> int:
        rid = self._next(b"receipt")
        receipt = {"id": rid, "state": "prepared", "ts": now_iso(), **receipt}
        self.put_receipt(receipt)
        return rid

    def put_receipt(self, receipt: dict[str, Any]) -> None:
        key = u64(receipt["id"])
        self._t.put(key, codec.dumps(receipt), db=self._s.db[b"receipts"])
        if receipt["state"] in ("prepared", "pending"):
            self._t.put(key, b"", db=self._s.db[b"unsettled"])
        else:
            self._t.delete(key, db=self._s.db[b"unsettled"])

    def set_path(self, path: bytes, digest: str | None, lsn: int) -> None:
        path = path or b"."
        row: dict[str, Any] = {"digest": digest, "lsn": lsn}
        key = self._s.path_key(path)
        if key != path:  # a long path: its key is a hash, so the row names it
            row["path"] = os.fsdecode(path)
        self._t.put(key, codec.dumps(row), db=self._s.db[b"paths"])

    def _get_path(self, path: bytes) -> Any:
        return self._t.get(self._s.path_key(path or b"."), db=self._s.db[b"paths"])

    def _delete_path(self, path: bytes) -> None:
        self._t.delete(self._s.path_key(path or b"."), db=self._s.db[b"paths"])

    def move_paths(
        self, src: bytes, dst: bytes, lsn: int, tracked: Callable[[bytes], bool] | None = None
    ) -> None:
        """A rename: ``src`` and every path below it now live under ``dst``. A path that
        lands where ``tracked`` says rwfs does not journal (a passthrough name) leaves the
        index: rwfs makes no claim about its bytes from then on (it is not journaled when
        it changes or goes)."""
        moved: list[tuple[bytes, Any]] = [(src, self._get_path(src))]
        moved += [(p, self._get_path(p)) for p in self._paths_under(src) if p != src]
        for path, _ in moved:
            self._delete_path(path)
        for path in self._paths_under(dst):
            self._delete_path(path)  # what the rename replaced
        for path, value in moved:
            there = dst + path[len(src) :]
            if value is not None and (tracked is None or tracked(there)):
                entry = codec.loads(value)
                self.set_path(there, entry["digest"], lsn)
        self.set_path(src, None, lsn)

    def swap_paths(
        self, a: bytes, b: bytes, lsn: int, tracked: Callable[[bytes], bool] | None = None
    ) -> None:
        """RENAME_EXCHANGE: the two paths (and what is below them) trade places."""
        tmp = b"\0swap"  # no path holds a NUL byte
        self.move_paths(a, tmp, lsn)
        self.move_paths(b, a, lsn, tracked)
        self.move_paths(tmp, b, lsn, tracked)
        self._delete_path(tmp)

    def forget_paths(self, top: bytes) -> None:
        """``top`` and every path below it leave the index: rwfs no longer journals them
        (a file past ``max_journaled_bytes``), so it makes no claim about their bytes."""
        for path in self._paths_under(top or b"."):
            self._delete_path(path)

    def _paths_under(self, top: bytes) -> list[bytes]:
        """``top`` (if indexed) and every indexed path below it."""
        db = self._s.db[b"paths"]
        out = [top] if self._get_path(top) is not None else []
        prefix = top + b"/"
        cur = self._t.cursor(db=db)
        # Short keys are the paths themselves, in order: a range scan. A prefix longer than
        # a key can be has only long paths below it.
        if len(prefix) <= self._s.max_key and cur.set_range(prefix):
            for key, _ in cur:
                key = bytes(key)
                if not key.startswith(prefix):
                    break
                out.append(key)
        out += [p for p, _ in _long_rows(cur) if p.startswith(prefix)]
        return out

    @contextlib.contextmanager
    def nested(self) -> Iterator[Txn]:
        """A child transaction: undone alone if its block raises (recovery holds what it
        cannot apply this way, without losing the rest)."""
        with self._s.env.begin(write=True, parent=self._t) as sub:
            yield Txn(self._s, sub)

    def hold_intent(self, gen: int, record: Any, error: str) -> int:
        hid = self._next(b"held")
        self.put(b"held", u64(hid), {"id": hid, "gen": gen, "record": record, "error": error})
        return hid

    def add_object(self, digest: str, size: int, lsn: int) -> None:
        db = self._s.db[b"objects"]
        if self._t.get(digest.encode(), db=db) is None:
            self._t.put(digest.encode(), codec.dumps({"size": size, "lsn": lsn}), db=db)

    def delete_object(self, digest: str) -> None:
        self._t.delete(digest.encode(), db=self._s.db[b"objects"])

    def bump(self, counter: str, by: int = 1) -> None:
        key = b"count:" + counter.encode()
        raw = self._t.get(key, db=self._s.db[b"meta"])
        self._t.put(key, u64((from_u64(raw) if raw else 0) + by), db=self._s.db[b"meta"])

    def set_meta_int(self, key: bytes, value: int) -> None:
        self._t.put(key, u64(value), db=self._s.db[b"meta"])

    def receipt(self, rid: int) -> dict[str, Any] | None:
        raw = self._t.get(u64(rid), db=self._s.db[b"receipts"])
        return codec.loads(raw) if raw else None

    def batch(self, name: str) -> dict[str, Any] | None:
        raw = self._t.get(name.encode(), db=self._s.db[b"batches"])
        return codec.loads(raw) if raw else None

    def put_batch(self, batch: dict[str, Any]) -> None:
        self._t.put(batch["name"].encode(), codec.dumps(batch), db=self._s.db[b"batches"])

    def put_snapshot(self, snap: dict[str, Any]) -> None:
        self._t.put(snap["name"].encode(), codec.dumps(snap), db=self._s.db[b"snapshots"])

    def delete_snapshot(self, name: str) -> None:
        self._t.delete(name.encode(), db=self._s.db[b"snapshots"])

    def put(self, db: bytes, key: bytes, value: dict[str, Any]) -> None:
        """A record of one of the small keyed databases (scratch, chunks)."""
        self._t.put(key, codec.dumps(value), db=self._s.db[db])

    def delete(self, db: bytes, key: bytes) -> None:
        self._t.delete(key, db=self._s.db[db])

    def new_handoff(self, handoff: dict[str, Any]) -> int:
        hid = self._next(b"handoff")
        self.put(b"handoffs", u64(hid), {"id": hid, "ts": now_iso(), **handoff})
        return hid

    def new_notice(self, notice: dict[str, Any]) -> int:
        nid = self._next(b"notice")
        notice = {"id": nid, "ts": now_iso(), **notice}
        self._t.put(u64(nid), codec.dumps(notice), db=self._s.db[b"notices"])
        return nid

    def new_conflict(self, conflict: dict[str, Any]) -> int:
        cid = self._next(b"conflict")
        self.put_conflict({"id": cid, "ts": now_iso(), "state": "open", **conflict})
        self.bump("conflicts")
        return cid

    def put_conflict(self, conflict: dict[str, Any]) -> None:
        key = u64(conflict["id"])
        self._t.put(key, codec.dumps(conflict), db=self._s.db[b"conflicts"])

    def conflict(self, cid: int) -> dict[str, Any] | None:
        raw = self._t.get(u64(cid), db=self._s.db[b"conflicts"])
        return codec.loads(raw) if raw else None


def _redact(ev: dict[str, Any]) -> None:
    """Drop the ``match`` of an old secrets warning: before SPEC §3.3b, rwfs kept the first
    16 characters of each match. Every reader of the journal (``.rw/journal``, ``rwfs
    log``, ``rwfs run``) goes through ``events``, so none shows them again; the LMDB file
    still holds them (docs/gates.md says how to be rid of them)."""
    for w in ev.get("warnings") or []:
        if isinstance(w, dict) and isinstance(w.get("matches"), list):
            for m in w["matches"]:
                if isinstance(m, dict) and m.pop("match", None) is not None:
                    m["redacted"] = True


class Store:
    """The journal environment. One per process, opened before the mount is served."""

    def __init__(self, path: str, map_size: int = 1 << 30, readonly: bool = False) -> None:
        # Modes named: the daemon runs with umask 0 (mount.py).
        os.makedirs(path, mode=0o700, exist_ok=True)
        self.path = path
        self.env = lmdb.open(
            path,
            mode=0o600,
            map_size=map_size,
            max_dbs=len(_DBS) + 2,
            subdir=True,
            sync=True,
            metasync=True,
            writemap=False,
            readonly=readonly,
            lock=True,
        )
        self.env.reader_check()
        self.max_key = self.env.max_key_size()
        self.newest_ts: str | None = None  # (append_event: see last_ts)
        self._file = -1  # data.mdb, to keep HEADROOM allocated (``_keep_room``)
        self._room = 0  # the bytes allocated to it
        self._page = self.env.stat()["psize"]
        if readonly:
            self.db = {}
            for name in _DBS:
                with contextlib.suppress(lmdb.NotFoundError):  # (a store from before it)
                    self.db[name] = self.env.open_db(name, create=False)
            return
        self.db = {name: self.env.open_db(name) for name in _DBS}
        with self.env.begin(write=True) as txn:
            found = txn.get(b"schema", db=self.db[b"meta"])
            if found is None:
                txn.put(b"schema", SCHEMA_VERSION, db=self.db[b"meta"])
                txn.put(b"index:links", u64(1), db=self.db[b"meta"])  # nothing to repair
                txn.put(b"index:history", u64(1), db=self.db[b"meta"])  # nothing to index
            elif found != SCHEMA_VERSION:
                raise RuntimeError(
                    f"journal schema {found.decode()} is not {SCHEMA_VERSION.decode()}; "
                    "this rwfs cannot read it"
                )
        if self.meta_int(b"index:refused") == 0:
            self._build_refused()
        if self.meta_int(b"index:history") == 0:
            self._build_history()
        with contextlib.suppress(OSError):
            self._file = os.open(os.path.join(path, "data.mdb"), os.O_RDWR | os.O_CLOEXEC)
            self._room = os.fstat(self._file).st_size
            self._keep_room()

    def _build_refused(self) -> None:
        """Index the refusals of a store that predates the ``refused`` database."""
        refused = [ev for ev in self.events() if ev["op"] == "refuse"]

        def build(txn: Txn) -> None:
            for ev in refused:
                txn._index(ev)
            txn.set_meta_int(b"index:refused", 1)

        self.write(build)

    def _build_history(self) -> None:
        """Index the history of a store that predates the history index, once: its events
        in order, ``EVENTS_CHUNK`` to a transaction, each recording how far it got."""
        last = self.meta_int(b"lsn")
        done = self.meta_int(b"index:history_lsn")
        log.warning("rwfs: indexing the history of %d journal events, once", last - done)
        chunk: list[dict[str, Any]] = []

        def build(txn: Txn, final: bool) -> None:
            rows = timelines.Rows(txn._t, self.db, self.max_key)
            # (Another process opening the store meanwhile may have indexed some.)
            raw = txn._t.get(b"index:history_lsn", db=self.db[b"meta"])
            done = from_u64(raw) if raw else 0
            for ev in chunk:
                if ev["lsn"] > done:
                    rows.apply(ev)
            if chunk and chunk[-1]["lsn"] > done:
                txn.set_meta_int(b"index:history_lsn", chunk[-1]["lsn"])
            if final:
                txn.set_meta_int(b"index:history", 1)

        for ev in self.events(since=done):
            if ev["lsn"] > last:
                break  # (appended since by a process whose index is built: indexed)
            chunk.append(ev)
            if len(chunk) == EVENTS_CHUNK:
                self.write(build, False)
                log.warning("rwfs: history indexed to event %d of %d", ev["lsn"], last)
                chunk = []
        self.write(build, True)

    def last_ts(self, txn: lmdb.Transaction) -> str:
        """The ``ts`` of the newest event ("" for none), read once, then kept."""
        if self.newest_ts is None:
            cur = txn.cursor(db=self.db[b"events"])
            self.newest_ts = codec.loads(cur.value()).get("ts") or "" if cur.last() else ""
        return self.newest_ts

    def close(self) -> None:
        if self._file >= 0:
            os.close(self._file)
            self._file = -1
        self.env.close()

    def _keep_room(self) -> None:
        """Keep HEADROOM allocated past the pages in use (no room: nothing to do; the
        next commit may still fit)."""
        if self._file < 0:
            return
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self._page
        if self._room - used >= HEADROOM // 2:
            return
        want = min(used + HEADROOM, info["map_size"])
        with contextlib.suppress(OSError):
            os.posix_fallocate(self._file, 0, want)
            self._room = want

    def write(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(txn, *args)`` in one durable write transaction; grow the map when full.

        Raises ``JournalUnavailable`` when LMDB cannot commit, with nothing recorded.
        """
        for _ in range(4):
            try:
                with self.env.begin(write=True) as txn:
                    out = fn(Txn(self, txn), *args)
                self._keep_room()
                return out
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except (lmdb.Error, OSError) as exc:
                raise JournalUnavailable(str(exc)) from exc
        raise JournalUnavailable("the journal's map stayed full after growing it")

    # ---- reads: short read transactions ----

    def meta_int(self, key: bytes) -> int:
        with self.env.begin() as txn:
            raw = txn.get(key, db=self.db[b"meta"])
        return from_u64(raw) if raw else 0

    def counters(self) -> dict[str, int]:
        out = {}
        with self.env.begin() as txn:
            for key, raw in txn.cursor(db=self.db[b"meta"]):
                if key.startswith(b"count:"):
                    out[key[6:].decode()] = from_u64(raw)
        return out

    def events(
        self, since: int = 0, path: str | None = None, last: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Events with LSN > ``since`` in order; only ``last`` newest ones if given.

        Read ``EVENTS_CHUNK`` at a time, each batch in a short read transaction of its own,
        so that a journal of millions of events is never all in memory (events appended
        meanwhile are read too)."""
        start = since + 1
        if last is not None and path is None:
            with self.env.begin() as txn:
                cur = txn.cursor(db=self.db[b"events"])
                if not cur.last():
                    return
                start = max(start, from_u64(cur.key()) - last + 1)
        newest: collections.deque[dict[str, Any]] = collections.deque(maxlen=last)
        while True:
            with self.env.begin() as txn:
                cur = txn.cursor(db=self.db[b"events"])
                if not cur.set_range(u64(start)):
                    break
                chunk = []
                for n, (key, raw) in enumerate(cur, 1):
                    ev = codec.loads(raw)
                    if b'"match"' in raw:
                        _redact(ev)
                    if path is None or ev.get("path") == path or ev.get("dest") == path:
                        chunk.append(ev)
                    if n == EVENTS_CHUNK:
                        start = from_u64(key) + 1
                        break
                else:
                    start = 0  # read to the end
            if last is None:
                yield from chunk
            else:
                newest.extend(chunk)
            if start == 0:
                break
        yield from newest

    def newest(
        self,
        last: int,
        since: int = 0,
        wanted: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """The ``last`` newest events with LSN > ``since`` that ``wanted`` accepts (all when
        None), oldest first. Read backwards from the journal's end, ``EVENTS_CHUNK`` at a
        time, each batch in a short read transaction of its own: the cost is the events
        read back to the oldest of those, not the journal (``rwfs log --last N``)."""
        out: list[dict[str, Any]] = []
        below: int | None = None  # read the events before this LSN (None: from the end)
        while last > 0:
            with self.env.begin() as txn:
                cur = txn.cursor(db=self.db[b"events"])
                if below is None or not cur.set_range(u64(below)):
                    placed = cur.last()
                else:
                    placed = cur.prev()
                if not placed:
                    break
                below = None
                for n, (key, raw) in enumerate(cur.iterprev(), 1):
                    lsn = from_u64(key)
                    if lsn <= since:
                        break
                    ev = codec.loads(raw)
                    if b'"match"' in raw:
                        _redact(ev)
                    if wanted is None or wanted(ev):
                        out.append(ev)
                        if len(out) == last:
                            break
                    if n == EVENTS_CHUNK:
                        below = lsn
                        break
            if below is None:
                break
        out.reverse()
        return out

    def refusals(self) -> list[dict[str, Any]]:
        """``{path, draft, intended}`` of every refused draft, oldest first."""
        return self._all(b"refused")

    def unsettled(self) -> list[dict[str, Any]]:
        with self.env.begin() as txn:
            ids = [k for k, _ in txn.cursor(db=self.db[b"unsettled"])]
            rows = [txn.get(k, db=self.db[b"receipts"]) for k in ids]
            return [codec.loads(r) for r in rows if r is not None]

    def receipts_of(self, batch: str) -> list[dict[str, Any]]:
        return [r for r in self.receipts() if r.get("batch") == batch]

    def receipts(self) -> Iterator[dict[str, Any]]:
        with self.env.begin() as txn:
            rows = [codec.loads(raw) for _, raw in txn.cursor(db=self.db[b"receipts"])]
        yield from rows

    def path_key(self, path: bytes) -> bytes:
        """The ``paths`` key of a path: itself, or a hash when too long for an LMDB key."""
        if len(path) <= self.max_key:
            return path
        return LONG_PATH + hashlib.sha256(path).digest()

    def paths(self) -> dict[bytes, dict[str, Any]]:
        """Path -> ``{digest, lsn}`` of every indexed path, long ones included."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db[b"paths"])
            out = {bytes(k): codec.loads(v) for k, v in cur if not k.startswith(LONG_PATH)}
            out.update(_long_rows(cur))
        return out

    def objects(self) -> dict[str, dict[str, Any]]:
        with self.env.begin() as txn:
            return {k.decode(): codec.loads(v) for k, v in txn.cursor(db=self.db[b"objects"])}

    def _all(self, db: bytes) -> list[dict[str, Any]]:
        with self.env.begin() as txn:
            return [codec.loads(raw) for _, raw in txn.cursor(db=self.db[db])]

    def batches(self) -> list[dict[str, Any]]:
        return self._all(b"batches")

    def batch(self, name: str) -> dict[str, Any] | None:
        with self.env.begin() as txn:
            raw = txn.get(name.encode(), db=self.db[b"batches"])
        return codec.loads(raw) if raw else None

    def conflict(self, cid: int) -> dict[str, Any] | None:
        with self.env.begin() as txn:
            raw = txn.get(u64(cid), db=self.db[b"conflicts"])
        return codec.loads(raw) if raw else None

    def records(self, db: bytes) -> list[dict[str, Any]]:
        """Every record of one of the small databases (scratch, chunks, handoffs)."""
        return self._all(db)

    def snapshots(self) -> list[dict[str, Any]]:
        return self._all(b"snapshots")

    def notices(self) -> list[dict[str, Any]]:
        return self._all(b"notices")

    def conflicts(self) -> list[dict[str, Any]]:
        return self._all(b"conflicts")

    def size_bytes(self) -> int:
        info = self.env.info()
        stat = self.env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])
