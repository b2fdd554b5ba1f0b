"""The views of ``.rw/`` that mirror the journal and the tree: ``batches/`` (each open or
past batch's files and ``ctl``), ``conflicts/``, ``history/`` (each path's versions) and
``snapshots/`` (each snapshot's tree). Each refreshes its directory from the journal when
it is looked up or listed, once per change; ``Control`` (tree.py) builds them."""

from __future__ import annotations

import bisect
import errno
import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath
from ..core.errors import RwfsError
from ..features import conflicts
from ..features.history import Version
from ..journal.store import now_iso, plain_name
from .nodes import (
    CDir,
    CFile,
    CNode,
    Perm,
    Verb,
    constant,
    json_bytes,
    live_stat,
    no_args,
    object_stat,
    stamp_ns,
    verb_error,
    verb_file,
)

if TYPE_CHECKING:
    from .tree import Control


class BatchViews:
    """``.rw/batches/``: ``mkdir NAME`` opens a batch; ``NAME/status``, ``diff``, ``ctl``."""

    def __init__(self, control: Control, top: CDir) -> None:
        self.c = control
        self.top = top
        top.refresh, top.mkdir, top.rmdir = self.refresh, self.mkdir, self.rmdir
        top.taken = lambda name: self.c.batches.taken(name.decode("utf-8", "replace"))

    def refresh(self) -> None:
        names = {n.encode() for n, b in self.c.batches.all.items() if not b.record.get("removed")}
        for gone in set(self.top.children) - names:
            self.c.remove(self.top, gone)
        for name in names - set(self.top.children):
            self._add(name.decode())

    def _add(self, name: str) -> None:
        b = self.c.batches
        d = self.c.mkdir(self.top, name.encode())
        status = self.c.add(d, b"status", lambda: json_bytes(b.status(b.all[name])))
        diff = self.c.add(d, b"diff", lambda: b.diff(b.all[name]))
        diff.slow = True
        status.perm = diff.perm = functools.partial(self._opener, name)
        where = f".rw/batches/{name}/ctl"

        def plain(run: Callable[[Any], Awaitable[None]], verb: str) -> Verb:
            async def verb_fn(args: list[str], who: dict[str, Any]) -> None:
                no_args(args, verb, where)
                b.may_steer(b.all[name], who)
                await run(b.all[name])

            return verb_fn

        async def scope(args: list[str], who: dict[str, Any]) -> None:
            await b.set_scope(b.all[name], args, who)

        verbs: dict[str, Verb] = {
            "commit": plain(b.commit, "commit"),
            "abort": plain(b.abort, "abort"),
            "resume": plain(self._resume, "resume"),
            "rollback": plain(self._rollback, "rollback"),
            "scope": scope,
        }
        self.c.add(d, b"ctl", lambda: b"", verb_file(verbs, where), verbs=True)

    def _opener(self, name: str) -> Perm:
        """A batch's status and diff (its files' names, digests and bytes): its opener's
        alone; the workspace owner's for a batch rwfs opened itself (recovery)."""
        batch = self.c.batches.all.get(name)
        who = batch.record.get("opened_by") or {} if batch is not None else {}
        if isinstance(who.get("uid"), int) and isinstance(who.get("gid"), int):
            return who["uid"], who["gid"], 0o400
        if isinstance(who.get("uid"), int):  # (opened before gids were recorded)
            return who["uid"], self.c.ws_owner()[1], 0o400
        return (*self.c.ws_owner(), 0o400)

    async def _resume(self, batch: Any) -> None:
        await self.c.batches.protocol.resume(batch)

    async def _rollback(self, batch: Any) -> None:
        await self.c.batches.protocol.rollback(batch)

    async def mkdir(self, name: bytes, who: dict[str, Any]) -> None:
        await self.c.batches.open(name, who)
        self.refresh()

    async def rmdir(self, name: bytes) -> None:
        await self.c.batches.forget(name.decode("utf-8", "replace"))
        self.refresh()


class ConflictViews:
    """``.rw/conflicts/<id>/``: ``info``, ``base``, ``intended``, ``actual``, ``merged``,
    ``ctl`` for each open conflict (SPEC §6.3)."""

    def __init__(self, control: Control, top: CDir) -> None:
        self.c = control
        self.top = top
        top.refresh = self.refresh

    def refresh(self) -> None:
        found = {
            str(c["id"]).encode(): c for c in self.c.ws.store.conflicts() if c["state"] == "open"
        }
        for gone in set(self.top.children) - set(found):
            self.c.remove(self.top, gone)
        for key in set(found) - set(self.top.children):
            self._add(found[key])

    def _add(self, info: dict[str, Any]) -> None:
        ws = self.c.ws
        d = self.c.mkdir(self.top, str(info["id"]).encode())
        # Every file but ctl shows the file's bytes or digests: it has the file's owner and
        # mode (the directory's names are fixed, and ctl stays the daemon's).
        perm = self.c._perm_of(info.get("path") or "")
        self.c.add(d, b"info", constant(json_bytes({**info, "time": info["ts"]}))).perm = perm
        for name, digest in ((b"base", info["expected"]), (b"intended", info["intended"])):
            node = self.c.add(d, name, functools.partial(conflicts.object_bytes, ws, digest))
            node.slow, node.perm = True, perm
            if digest is not None:  # (an absent file reads as empty)
                node.stat = functools.partial(object_stat, ws, digest)
        # The live file, or a batch's draft kept as an object: sized by rendering it.
        for name, render in (
            (b"actual", lambda: conflicts.actual_bytes(ws, info)),
            (b"merged", lambda: conflicts.merged(ws, info)),
        ):
            node = self.c.add(d, name, render)
            node.slow, node.perm = True, perm
        where = f".rw/conflicts/{info['id']}/ctl"

        def settle(verb: str) -> Verb:
            async def verb_fn(args: list[str], who: dict[str, Any]) -> None:
                no_args(args, verb, where)
                await conflicts.resolve(ws, info["id"], verb, who)
                self.refresh()

            return verb_fn

        verbs = {v: settle(v) for v in conflicts.VERBS}
        self.c.add(d, b"ctl", lambda: b"", verb_file(verbs, where), verbs=True)


class HistoryViews:
    """``.rw/history/<path>/``: one read-only file per version of each journaled path,
    oldest first (SPEC §8); directories mirror the paths that have a history."""

    def __init__(self, control: Control, node: CDir, prefix: bytes) -> None:
        self.c = control
        self.node = node
        self.prefix = prefix
        self.at = -1  # the journal's LSN at the last refresh
        node.refresh, node.settle, node.find = self.refresh, True, self.find
        node.perm = functools.partial(control.history_perm, prefix)

    def _path(self, name: bytes) -> bytes:
        return self.prefix + b"/" + name if self.prefix else name

    def _child(self, name: bytes) -> CDir:
        child = self.c.mkdir(self.node, name)
        if child.refresh is None:
            HistoryViews(self.c, child, self._path(name))
        return child

    def find(self, name: bytes) -> CNode | None:
        """A path ``history/`` does not list (a temporary file renamed over its target, a
        removed copy of bytes another path keeps) is still there by name."""
        if not self.c.history.has_below(self._path(name)):
            return None
        self.node.unlisted.add(name)
        return self._child(name)

    def refresh(self) -> None:
        # Every lookup below refreshes its directory: what it shows changes only with the
        # journal (commits, removals, gc's event), so once per LSN, not once per entry.
        at = self.c.ws.store.meta_int(b"lsn")
        if at == self.at:
            return
        h = self.c.history
        listed = h.children(self.prefix, listed=True)
        for name in listed:
            self._child(name)
        dirs = {n for n, c in self.node.children.items() if isinstance(c, CDir)}
        self.node.unlisted = dirs - listed
        wanted = {}
        for v in h.versions(self.prefix) if self.prefix else []:
            # Readable: kept as an object, or a live file holds it (this one, or the one
            # it was renamed to).
            if self.c.ws.objects.exists(str(v.digest)) or h.holders(str(v.digest)):
                wanted[v.name.encode()] = v
        for key in [k for k, c in self.node.children.items() if isinstance(c, CFile)]:
            if key not in wanted:  # gone by gc, or no longer a version of this path
                self.c.remove(self.node, key)
        for key, v in wanted.items():
            node = self.node.children.get(key)
            if not isinstance(node, CFile):
                node = self.c.add(self.node, key, self._reader(v))
                node.slow, node.stat = True, self._stat(v)
            # The version's owner and mode (a later chmod of these bytes included).
            node.perm = functools.partial(self.c.file_perm, self.prefix, v.owner, v.mode)
        self.at = at

    def _stat(self, v: Version) -> Callable[[], tuple[int, int]]:
        """The size of a version's bytes (the object's, or the live file's that holds
        them) and the time of the version."""
        digest = str(v.digest)
        return lambda: (self.c.version_stat(digest, self.prefix)[0], stamp_ns(v.ts))

    def _reader(self, v: Version) -> Callable[[], bytes]:
        digest, where = str(v.digest), b".rw/history/" + self.prefix + b"/" + v.name.encode()
        return lambda: self.c.version_bytes(digest, self.prefix, where)


class SnapshotViews:
    """``.rw/snapshots/``: ``mkdir NAME`` names the journal's current point; ``NAME/tree/``
    is the workspace as it was then, read-only (SPEC §8)."""

    def __init__(self, control: Control, top: CDir) -> None:
        self.c = control
        self.top = top
        top.refresh, top.mkdir, top.rmdir = self.refresh, self.mkdir, self.rmdir
        top.taken = self.taken
        # name -> snapshot, read from the store once, then kept up to date by mkdir and
        # rmdir (nothing else writes the snapshots while the mount is served): a lookup
        # under snapshots/ reads no record, so each operation costs the same at 10 or
        # 10,000 snapshots, and a listing reading each info is linear.
        self._snaps: dict[bytes, dict[str, Any]] | None = None

    def _all(self) -> dict[bytes, dict[str, Any]]:
        if self._snaps is None:
            self._snaps = {s["name"].encode(): s for s in self.c.ws.store.snapshots()}
            for key, snap in self._snaps.items():
                self._show(key, snap)
        return self._snaps

    def get(self, name: str) -> dict[str, Any] | None:
        return self._all().get(name.encode())

    def taken(self, raw: bytes) -> RwfsError | None:
        if raw not in self._all():
            return None
        return RwfsError(
            errno.EEXIST,
            "policy_violation",
            "verb",
            f"No snapshot was made because snapshot {raw.decode('utf-8', 'replace')} exists "
            "already; choose another name.",
            path=".rw/snapshots",
        )

    def refresh(self) -> None:
        self._all()

    def _show(self, key: bytes, snap: dict[str, Any]) -> None:
        d = self.c.mkdir(self.top, key)
        self.c.add(d, b"info", constant(json_bytes(snap)))
        TreeView(
            self.c,
            self.c.mkdir(d, b"tree"),
            int(snap["lsn"]),
            b"",
            b".rw/snapshots/" + key + b"/tree",
        )

    async def mkdir(self, raw: bytes, who: dict[str, Any]) -> None:
        name = plain_name(raw)
        if name is None:
            raise verb_error(
                f"No snapshot was made because {raw.decode('utf-8', 'replace')[:40]!r} is not a snapshot name: use 1 to "
                "64 letters, digits, dots, dashes or underscores, not starting with a dash.",
                ".rw/snapshots",
            )
        taken = self.taken(raw)
        if taken is not None:
            raise taken
        await self.c.ws.committer.sync()  # the point named includes every write acknowledged so far
        snap = {"name": name, "lsn": self.c.ws.store.meta_int(b"lsn"), "ts": now_iso(), **who}
        await trio.to_thread.run_sync(self.c.ws.store.write, lambda txn: txn.put_snapshot(snap))
        self._all()[name.encode()] = snap
        self._show(name.encode(), snap)

    async def rmdir(self, raw: bytes) -> None:
        name = raw.decode("utf-8", "replace")
        if self.get(name) is None:
            raise RwfsError(
                errno.ENOENT,
                "policy_violation",
                "verb",
                f"There is no snapshot {name}.",
                path=".rw/snapshots",
            )
        await trio.to_thread.run_sync(self.c.ws.store.write, lambda txn: txn.delete_snapshot(name))
        self._all().pop(name.encode(), None)
        self.c.remove(self.top, name.encode())

    def changes_since(
        self, snap: dict[str, Any], paths: list[bytes]
    ) -> dict[bytes, tuple[str | None, str | None]]:
        """What restoring ``snap`` (or those paths, and what is below them) means: path ->
        (what the journal says it holds now, what it held then)."""
        out = {}
        lsn = int(snap["lsn"])
        for path, versions in self.c.history.timelines(paths or None):
            i = bisect.bisect_right([v.lsn for v in versions], lsn)
            then = versions[i - 1].digest if i else None
            if versions[-1].lsn > lsn and versions[-1].digest != then:
                out[path] = (versions[-1].digest, then)
        return out


class TreeView:
    """One directory of a snapshot's tree: the live tree's entries, with every journaled
    path that changed since the snapshot shown as it was then (or hidden, if it did not
    exist then)."""

    def __init__(self, control: Control, node: CDir, lsn: int, prefix: bytes, top: bytes) -> None:
        self.c = control
        self.node = node
        self.lsn = lsn
        self.prefix = prefix
        self.top = top  # .rw/snapshots/NAME/tree, for error envelopes
        self.at: tuple[int, tuple[int, int, int]] | None = None  # what the last refresh saw
        node.refresh, node.settle = self.refresh, True
        node.perm = functools.partial(control.dir_perm, prefix)

    def _seen(self) -> tuple[int, tuple[int, int, int]] | None:
        """What this directory's entries depend on: the journal's LSN and the live
        directory's identity and times. None while the directory changed less than a
        second ago (its times may not have moved for a change made in the same tick)."""
        try:
            fd = self.c.ws.root_fd
            st = beneath.stat(fd, self.prefix) if self.prefix else os.fstat(fd)
        except OSError:
            return None
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < 1_000_000_000:
            return None
        return self.c.ws.store.meta_int(b"lsn"), (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def _entries(self) -> dict[bytes, str | None]:
        """name -> "dir", or the digest of a file as it was ("live": unchanged since)."""
        ws, h = self.c.ws, self.c.history
        out: dict[bytes, str | None] = {}
        try:
            fd = beneath.opendir(ws.root_fd, self.prefix)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                for entry in os.scandir(fd):
                    name = os.fsencode(entry.name)
                    if not self.prefix and name == b".rw":
                        continue
                    out[name] = "dir" if entry.is_dir(follow_symlinks=False) else "live"
            finally:
                os.close(fd)
        for name in h.children(self.prefix):
            path = self.prefix + b"/" + name if self.prefix else name
            changed, then = h.state_at(path, self.lsn)
            if changed:  # (a path with no timeline never changed)
                if then is None:
                    out.pop(name, None)
                else:
                    out[name] = then
            if h.exists_below_at(path, self.lsn):
                out[name] = "dir"
        return out

    def refresh(self) -> None:
        # Every lookup below refreshes its directory: once per change, not once per entry.
        seen = self._seen()
        if seen is not None and seen == self.at:
            return
        entries = self._entries()
        for gone in set(self.node.children) - set(entries):
            self.c.remove(self.node, gone)
        for name, what in entries.items():
            path = self.prefix + b"/" + name if self.prefix else name
            node = self.node.children.get(name)
            if what == "dir":
                if not isinstance(node, CDir):
                    self.c.remove(self.node, name)
                    TreeView(self.c, self.c.mkdir(self.node, name), self.lsn, path, self.top)
                continue
            if not isinstance(node, CFile):
                self.c.remove(self.node, name)
                node = self.c.add(self.node, name, lambda: b"")
                node.slow = True
            node.render = self._reader(path, what)
            node.stat = self._stat(path, what)
            node.perm = self._perm(path, what)
        self.at = seen

    def _perm(self, path: bytes, what: str | None) -> Callable[[], Perm]:
        """A file unchanged since: the live file's owner and mode; one changed since: those
        of its version then."""
        v = None if what == "live" else self.c.history.version_at(path, self.lsn)
        if v is None:
            return functools.partial(self.c.file_perm, path)
        return functools.partial(self.c.file_perm, path, v.owner, v.mode)

    def _reader(self, path: bytes, what: str | None) -> Callable[[], bytes]:
        ws = self.c.ws
        if what == "live":
            return lambda: conflicts.live_bytes(ws, os.fsdecode(path))
        return lambda: self.c.version_bytes(str(what), path, self.top + b"/" + path)

    def _stat(self, path: bytes, what: str | None) -> Callable[[], tuple[int, int]]:
        ws = self.c.ws
        if what == "live":
            return lambda: live_stat(ws, path)
        return lambda: self.c.version_stat(str(what), path)
