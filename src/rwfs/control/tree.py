"""The virtual control directory ``.rw/`` (SPEC §5), rendered from the core.

Each entry is a ``CFile`` (``render()`` makes its bytes fresh at every open; ``write`` takes
the whole written text at close and raises ``RwfsError`` to refuse it) or a ``CDir``.
A file whose bytes are fixed (an object, a live file) also has ``stat``, its size and
mtime found without rendering it; any other file is sized by rendering it (SPEC §5: every
entry reports its true ``st_size``).
Later features add entries with ``Control.add``; nothing here knows about FUSE.
"""

from __future__ import annotations

import bisect
import calendar
import contextlib
import errno
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath
from ..checks import gates, parsers
from ..checks.allowances import ALLOW_S, PER_USER, WAIVES, Allowance
from ..core import rights
from ..core.changes import modes_at
from ..core.errors import RwfsError, escaped, journal_unavailable
from ..core.workspace import Workspace
from ..features import conflicts, gc
from ..features.history import History, Version
from ..features.sessions import Sessions
from ..journal.objects import open_regular
from ..journal.store import JournalUnavailable, now_iso, plain_name
from ..policy import Policy, PolicyError
from . import chunks, handoff, scratch
from .nodes import (
    CDir,
    CFile,
    CNode,
    Perm,
    Verb,
    Writer,
    no_args,
    verb_error,
    verb_file,
)

if TYPE_CHECKING:
    from ..core.batches import Batches

log = logging.getLogger("rwfs.control")


# last-error before the first error: a JSON document like every other (SPEC §5).
NO_ERROR = {"ok": True, "message": "No error since rwfs mounted this workspace."}
# How many earlier refusals of a path its why/ entry lists ("recent"), newest first.
WHY_RECENT = 5


@dataclass
class Why:
    """What ``why/PATH`` shows: the path's refusals, newest first (the shown one and
    ``WHY_RECENT`` before it), and the success that superseded the newest, if one did."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    ok: dict[str, Any] | None = None


class Control:
    def __init__(
        self,
        ws: Workspace,
        batches: Batches,
        info: dict[str, Any],
        allocate: Callable[[], int],
    ) -> None:
        self.ws = ws
        self.batches = batches
        self.info = info
        self._allocate = allocate
        self.nodes: dict[int, CNode] = {}
        self.root = CDir(allocate(), b".rw")
        self.nodes[self.root.ino] = self.root
        self.mtime = time.time_ns()
        self.last_error: dict[str, Any] | None = None
        # Figures only the mounting layer knows (e.g. how many inodes the kernel holds).
        self.live: dict[str, Callable[[], Any]] = {}
        # Whether a path names a file only an open batch has (the FUSE layer knows).
        self.virtual: Callable[[bytes], bool] = lambda path: False
        self.add(
            self.root,
            b"README",
            lambda: resources.files("rwfs.control").joinpath("README.rw.md").read_bytes(),
        )
        for name, render in (
            (b"status", lambda: _json(self.status())),
            (b"journal", self._journal),
            (b"stats", lambda: _json(self.ws.stats.report())),
        ):
            node = self.add(self.root, name, render)
            node.fresh, node.perm = True, self.private
        # The workspace owner's to change (0644): the kernel refuses anyone else's write.
        self.add(
            self.root, b"policy.toml", lambda: ws.policy.text.encode(), self._write_policy
        ).perm = lambda: (*self.ws_owner(), 0o444)
        self.add(
            self.root, b"last-error", lambda: _json(self.last_error or NO_ERROR)
        ).perm = self.private
        self.verbs: dict[str, Verb] = {"sync": self._sync}
        self.add(self.root, b"ctl", lambda: b"", verb_file(self.verbs, ".rw/ctl"), verbs=True)
        top = functools.partial(self.dir_perm, b"")  # views of the workspace's top
        for view in ("validate", "risk"):
            d = self.mkdir(self.root, view.encode())
            d.mirror, d.perm = (view, b""), top
        self.rejected = self.mkdir(self.root, b"rejected")
        # Listed by the workspace owner only (a draft's id holds a prefix of its digest);
        # a writer finds its own draft's id in the refusal's envelope.
        self.rejected.perm = lambda: (*self.ws_owner(), 0o711)
        self.why = self.mkdir(self.root, b"why")
        self.why.perm = top
        self._why: dict[str, Why] = {}  # what each why/ entry shows
        self.add(self.root, b"notices", self._notices).perm = self.private
        self.batches_dir = BatchViews(self, self.mkdir(self.root, b"batches"))
        self.conflicts_dir = ConflictViews(self, self.mkdir(self.root, b"conflicts"))
        self.history = History(ws.store)
        self.history_dir = self.mkdir(self.root, b"history")
        HistoryViews(self, self.history_dir, b"")
        self.snapshots = SnapshotViews(self, self.mkdir(self.root, b"snapshots"))
        self.verbs["undo"] = self._undo
        self.sessions = Sessions()
        self.verbs["session"] = self._session
        self.verbs["restore"] = self._restore
        self.verbs["gc"] = self._gc
        self.verbs["allow"] = self._allow  # a deliberate change, let through once
        self.add(self.root, b"allowed", lambda: _json(self._allowed())).perm = self.private
        self.retention = gc.Retention(self)  # collections, by the policy and the verb
        for layer in (scratch, chunks, handoff):  # the paper's other layers (SPEC §8)
            layer.install(self)
        # The handoff note's last_good_state names files and their digests.
        for name in (b"handoff", b"handoffs"):
            entry = self.root.children.get(name)
            if isinstance(entry, CFile):
                entry.perm = self.private
            elif isinstance(entry, CDir):
                entry.perm = lambda: as_dir(self.private())
        for r in ws.store.refusals():  # drafts refused in earlier mounts stay listed
            if r["draft"]:
                self._add_rejected(r["draft"], r["intended"], r.get("uid"), r.get("gid"))

    # ---- who may read what (SPEC §3.3b; docs/security.md) ----

    def ws_owner(self) -> tuple[int, int]:
        """The workspace owner: the owner and group of the workspace's top directory. A
        daemon not run by root stands for its own user, who reads all of rwfs's state in
        the real ``.rw/`` anyway (and may not own the top directory)."""
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid()
        st = os.fstat(self.ws.root_fd)
        return st.st_uid, st.st_gid

    def private(self) -> Perm:
        """The journal and what is made from it (status, stats, last-error, notices, the
        handoff note): the workspace owner's, unless ``journal_readable_by = "all"``."""
        shared = self.ws.policy.journal_readable_by == "all"
        return (*self.ws_owner(), 0o444 if shared else 0o400)

    def _lstat(self, path: bytes) -> os.stat_result | None:
        try:
            return beneath.stat(self.ws.root_fd, path)
        except OSError:
            return None

    def _dir_of(self, st: os.stat_result | None) -> Perm:
        """The owner, group and mode of a live directory; one that is gone (or is no
        directory now): the workspace owner's alone."""
        if st is not None and stat.S_ISDIR(st.st_mode):
            return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o777
        return (*self.ws_owner(), 0o700)

    def dir_perm(self, path: bytes) -> Perm:
        """A directory of ``.rw/`` that stands for the workspace directory ``path``."""
        return self._dir_of(self._lstat(path))

    def file_perm(
        self, path: bytes, owner: tuple[int, int] | None = None, mode: int | None = None
    ) -> Perm:
        """An entry that shows the bytes or metadata of the file at ``path``: the owner and
        mode recorded for them (a version's), else the live file's, else the last ones
        the journal knows; the workspace owner's alone when nothing is known. Read-only."""
        if owner is None or mode is None:
            st = self._lstat(path)
            if st is not None and stat.S_ISREG(st.st_mode):
                owner = owner or (st.st_uid, st.st_gid)
                mode = stat.S_IMODE(st.st_mode) if mode is None else mode
            else:
                known, last = self.history.meta(path)
                owner, mode = owner or known, last if mode is None else mode
        if owner is None:
            owner = self.ws_owner()
        return (*owner, (0o600 if mode is None else mode) & 0o444)

    def history_perm(self, path: bytes) -> Perm:
        """``history/PATH/``: a directory's owner and mode; for a file's versions (their
        names hold a prefix of their digests) the file's, listable by who may read it."""
        st = self._lstat(path)
        if not (st is not None and stat.S_ISDIR(st.st_mode)) and self.history.has(path):
            return as_dir(self.file_perm(path))
        return self._dir_of(st)

    def add(
        self,
        parent: CDir,
        name: bytes,
        render: Callable[[], bytes],
        write: Writer | None = None,
        verbs: bool = False,
    ) -> CFile:
        node = CFile(self._allocate(), name, render, write, verbs)
        parent.children[name] = node
        self.nodes[node.ino] = node
        return node

    def listing(self, parent: CDir) -> list[bytes]:
        if parent.refresh is not None:
            parent.refresh()
        return sorted(set(parent.children) - parent.unlisted)

    def remove(self, parent: CDir, name: bytes) -> None:
        node = parent.children.pop(name, None)
        if node is None:
            return
        self.nodes.pop(node.ino, None)
        if isinstance(node, CDir):
            for child in list(node.children):
                self.remove(node, child)

    def child(self, parent: CDir, name: bytes) -> CNode | None:
        """The entry ``name`` of a control directory; for a view, made from the tree."""
        if parent.refresh is not None:
            parent.refresh()
        node = parent.children.get(name)
        if node is None and parent.find is not None and name not in (b".", b".."):
            return parent.find(name)
        if node is not None or parent.mirror is None or name in (b".", b".."):
            return node
        view, top = parent.mirror
        path = top + b"/" + name if top else name
        if path == b".rw":
            return None
        try:
            mode = beneath.stat(self.ws.root_fd, path).st_mode
        except OSError:
            if not self.virtual(path):
                return None
            mode = stat.S_IFREG  # a new file of an open batch: only its draft exists
        if stat.S_ISDIR(mode):
            node = self.mkdir(parent, name)
            node.mirror = (view, path)
            node.perm = functools.partial(self.dir_perm, path)
        elif stat.S_ISREG(mode):
            node = self.add(parent, name, lambda: _json(self._diagnose(view, path)))
            node.slow = node.fresh = True
            node.shows = path
            node.render_shown = lambda fd: _json(self._diagnose(view, path, fd))
            node.perm = functools.partial(self.file_perm, path)
        return node

    def _diagnose(self, view: str, path: bytes, shown: int = -1) -> dict[str, Any]:
        """The gates' diagnostics of a file as the mount shows it (``shown``: a descriptor
        of its stage or draft; -1: the tree's file), without writing (SPEC §5)."""
        try:
            fd = os.dup(shown) if shown >= 0 else open_regular(self.ws.root_fd, path)[0]
        except OSError as exc:
            return {"error": exc.strerror, "path": os.fsdecode(path)}
        if fd < 0:
            return {"error": "not a regular file", "path": os.fsdecode(path)}
        try:
            data = os.pread(fd, gates.MAX_GATED_BYTES + 1, 0)
        finally:
            os.close(fd)
        if view == "risk":
            return gates.risk(data)
        try:
            fmt, errors = parsers.parse_errors(path, data)
        except parsers.CannotJudge as exc:  # (nested deeper than its parser goes)
            return {
                "valid": None,
                "format": parsers.language(path),
                "errors": [],
                "cannot_judge": str(exc),
            }
        return {"valid": not errors, "format": fmt, "errors": errors}

    def mkdir(self, parent: CDir, name: bytes) -> CDir:
        node = parent.children.get(name)
        if isinstance(node, CDir):
            return node
        node = CDir(self._allocate(), name)
        parent.children[name] = node
        self.nodes[node.ino] = node
        return node

    def _put(
        self,
        top: CDir,
        path: str,
        render: Callable[[], bytes],
        perm: Callable[[], Perm] | None = None,
    ) -> None:
        """Add (or refresh) a read-only file at ``top/path``, making directories on the way;
        with ``perm``, those directories mirror the workspace's (why/)."""
        *dirs, name = os.fsencode(path).split(b"/")
        where = b""
        for d in dirs:
            top = self.mkdir(top, d)
            where = where + b"/" + d if where else d
            if perm is not None:
                top.perm = functools.partial(self.dir_perm, where)
        node = top.children.get(name)
        if isinstance(node, CFile):
            node.render = render
        elif node is None:
            node = self.add(top, name, render)
        if isinstance(node, CFile) and perm is not None:
            node.perm = perm

    def _add_rejected(
        self, draft_id: str, digest: str, uid: int | None = None, gid: int | None = None
    ) -> None:
        def render() -> bytes:
            fd = self.ws.objects.open(digest)
            try:
                return os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)

        self._put(self.rejected, draft_id, render)
        node = self.rejected.children[os.fsencode(draft_id)]
        assert isinstance(node, CFile)
        refused = stamp_ns(draft_id[:16], "%Y%m%dT%H%M%SZ")  # the id starts with its time
        node.stat = lambda: (object_stat(self.ws, digest)[0], refused)
        # The writer's alone (the workspace owner's, for a refusal recorded without them).
        node.perm = lambda: (
            *((uid, gid) if uid is not None and gid is not None else self.ws_owner()),
            0o400,
        )

    def _holders(self, digest: str, path: bytes) -> list[bytes]:
        """The paths the journal says hold ``digest`` now, ``path`` first: where an old
        version's bytes are when rwfs kept no object of them (a rename moved the file)."""
        return sorted(self.history.holders(digest), key=lambda p: p != path)

    def _holder(self, digest: str, path: bytes) -> bytes | None:
        """The first of ``_holders`` whose live file really holds ``digest``."""
        for p in self._holders(digest, path):
            with contextlib.suppress(OSError):  # (unreadable, or too large to hash)
                if self.ws.digests.live(p)[0] == digest:
                    return p
        return None

    def _keep_targets(self, changes: dict[bytes, tuple[str | None, str | None]]) -> None:
        """Bytes a restore or undo writes back that rwfs kept no object of (a file renamed
        elsewhere still holds them): keep a copy now, from the live file that holds them."""
        for path, (_, target) in changes.items():
            if target is None or self.ws.objects.exists(target):
                continue
            # (None found: the batch has nothing to write it from, and says so)
            for holder in self._holders(target, path):
                self.ws.stages.keep_live_copy(holder, target)

    def version_bytes(self, digest: str, path: bytes, where: bytes) -> bytes:
        """The bytes of a version of ``path`` (history/, a snapshot's tree/): its object,
        or a live file that holds them; ESTALE when neither is there any more."""
        if self.ws.objects.exists(digest):
            return conflicts.object_bytes(self.ws, digest)
        holder = self._holder(digest, path)
        if holder is not None:
            return conflicts.live_bytes(self.ws, os.fsdecode(holder))
        # Only a live file held it, and something changed that file behind rwfs (in the
        # raw tree, beside a separate mount point).
        raise RwfsError(
            errno.ESTALE,
            "stale_precondition",
            "drift",
            f"This version of {os.fsdecode(path)} is no longer anywhere: the file that "
            "held it was changed outside the mount, and rwfs kept no copy of it. Read the "
            "file itself, or another version.",
            path=os.fsdecode(where),
        )

    def version_stat(self, digest: str, path: bytes) -> tuple[int, int]:
        """(size, mtime in ns) of a version's bytes, found as ``version_bytes`` finds them."""
        try:
            return object_stat(self.ws, digest)
        except FileNotFoundError:
            for p in self._holders(digest, path):
                try:
                    return live_stat(self.ws, p)
                except FileNotFoundError:
                    continue
            return 0, 0

    def get(self, ino: int) -> CNode | None:
        return self.nodes.get(ino)

    def looked_up(self, node: CDir, name: bytes, tid: int) -> None:
        """A lookup of ``name`` in ``node`` by thread ``tid``: if it is on the way of a
        mkdir of that name that the kernel will refuse, the refusal's envelope."""
        if node.taken is not None and making_dir(tid, name):
            taken = node.taken(name)
            if taken is not None:
                self.fail(taken)

    def fail(self, exc: RwfsError) -> None:
        """Show an error envelope at ``.rw/last-error`` and, for a file, ``.rw/why/<path>``
        (with the path's earlier refusals under ``recent``)."""
        env = self.last_error = {**exc.envelope, "at": now_iso()}  # each refusal its own
        path = env.get("path") or ""
        for name in (path, env.get("source") or ""):  # (source: a refused rename's)
            if name and not name.startswith(".rw"):
                why = self._why.setdefault(name, Why())
                why.errors.insert(0, env)
                del why.errors[WHY_RECENT + 1 :]
                why.ok = None
                self._show_why(name, why)
        if env.get("draft"):
            draft = env["draft"].rsplit("/", 1)[-1]
            self._add_rejected(draft, env["intended"], env.get("uid"), env.get("gid"))

    def _perm_of(self, name: str) -> Callable[[], Perm]:
        """The file's own owner and mode, for what shows its metadata (why/, conflicts/)."""
        return functools.partial(self.file_perm, os.fsencode(name))

    def succeeded(
        self,
        path: bytes,
        intended: str | None = None,
        lsn: int = 0,
        commit: str = "",
        shown: bool = False,
    ) -> None:
        """A write of ``path`` went through: its ``why/`` entry, if it has one, says so now,
        so that an agent checking it after a write does not take an older refusal for a
        new one. Called as the writer's call returns (read-your-writes; ``commit`` names
        the commit, whose record follows), and when a commit's record is written
        (``lsn``). The record of a commit already ``shown`` so only adds its LSN: a
        refusal shown since is newer than that write, though it was recorded first."""
        name = os.fsdecode(path)
        why = self._why.get(name)
        if why is None:
            return
        if why.ok is not None:
            if shown and lsn and why.ok.get("commit") == commit and not why.ok["lsn"]:
                why.ok["lsn"] = lsn
                self._show_why(name, why)
            return
        if shown or lsn and why.errors and lsn < (why.errors[0].get("lsn") or 0):
            return  # a refusal came after this write
        why.ok = {
            "ok": True,
            "path": name,
            "intended": intended,
            "lsn": lsn or None,
            "at": now_iso(),
            "message": f"The last write of {name} succeeded; an earlier refusal of it no "
            "longer applies.",
            "commit": commit,
        }
        self._show_why(name, why)

    def _show_why(self, name: str, why: Why) -> None:
        shown = dict(why.ok) if why.ok is not None else dict(why.errors[0])
        shown.pop("commit", None)
        recent = why.errors[1:] if why.ok is None else why.errors[:WHY_RECENT]
        if recent:  # (a first refusal's entry is its envelope, as in last-error)
            shown["recent"] = recent
        body = _json(shown)
        self._put(self.why, name, lambda: body, self._perm_of(name))

    # ---- views ----

    def status(self) -> dict[str, Any]:
        counters = self.ws.store.counters()
        states = [b.state for b in self.batches.all.values()]
        return {
            **self.info,
            "durability": self.ws.policy.durability,
            "counts": {
                "commits": counters.get("commits", 0),
                "noops": counters.get("noops", 0),
                "refusals": counters.get("refusals", 0),
                "conflicts": counters.get("conflicts", 0),
                "warnings": counters.get("warnings", 0),
                "open_batches": states.count("open"),
                "interrupted_batches": states.count("interrupted"),
                "queued": self.ws.committer.queued,
            },
            "last_lsn": self.ws.store.meta_int(b"lsn"),
            # Who is capturing writes right now: open batches and run sessions.
            "open_batch": [
                self.batches.summary(b) for b in self.batches.all.values() if b.state == "open"
            ],
            "sessions": self._sessions(),
            # Open allowances (allow PATH): whose, of what, until when (also .rw/allowed).
            "allowed": self.ws.allowances.views(),
            "journal_bytes": self.ws.store.size_bytes(),
            "journal_ok": self.ws.journal.ok,
            # Whether LMDB commits, since when it does not, and the commits it still owes.
            "journal": self.ws.journal.status(),
            # What recovery at this mount could not settle (docs/recovery.md).
            "unsettled": self.ws.recovery_left,
            **{key: fn() for key, fn in self.live.items()},
        }

    def _sessions(self) -> list[dict[str, Any]]:
        self.sessions.reap()
        return [s.view() for s in self.sessions.active.values()]

    def _notices(self) -> bytes:
        return b"".join(json.dumps(n).encode() + b"\n" for n in self.ws.store.notices())

    def _journal(self) -> bytes:
        events = self.ws.store.events(last=1000)
        return b"".join(json.dumps(ev).encode() + b"\n" for ev in events)

    async def _undo(self, args: list[str], who: dict[str, Any]) -> None:
        if len(args) != 1:
            raise verb_error("undo takes one batch or session name: write 'undo NAME'.")
        await self.ws.committer.sync()  # the journal holds every acknowledged write
        # A batch's name first (an explicit batch, or a batch of one: auto-N); otherwise a
        # run session's (sessions.py): all its events. Reads the whole journal: off the
        # event loop.
        key = "batch"
        changes = await trio.to_thread.run_sync(self.batches.protocol.changes_of, args[0], key)
        if not changes and args[0] not in self.batches.all:
            key = "session"
            changes = await trio.to_thread.run_sync(self.batches.protocol.changes_of, args[0], key)
        if not changes:
            raise verb_error(
                f"Nothing was undone: the journal has no change by batch or session "
                f"{args[0]!r} (their names are in .rw/journal and .rw/batches/)."
            )
        undone = self.batches.protocol.undone_by(args[0])
        if undone is not None:  # again, it would write the before-bytes over themselves
            raise verb_error(
                f"Nothing was done: batch {args[0]} was already undone by batch {undone} "
                f"(see .rw/batches/{undone}/status). To redo {args[0]}, undo {undone} ('rwfs undo "
                f"{undone}', or 'undo {undone}' in .rw/ctl)."
            )
        await trio.to_thread.run_sync(self._keep_targets, changes)
        modes = await trio.to_thread.run_sync(
            lambda: modes_at(self.ws.store.events(), batch=args[0], key=key)
        )
        await self.batches.protocol.replay(
            f"undo-{args[0]}"[:64], changes, who, undoes=args[0], modes=modes
        )

    async def _session(self, args: list[str], who: dict[str, Any]) -> None:
        """``session begin``: the writer of the verb (``rwfs run``) opens a run session
        over its descendants; ``session end NAME [STATUS]`` closes it (sessions.py)."""
        if args == ["begin"]:
            await self.ws.committer.sync()  # the begin event's LSN follows every write acknowledged

            def begin(txn: Any) -> tuple[int, str]:
                lsn = txn.next_lsn()
                name, n = f"run-{lsn}", 1
                while name in self.batches.all or name in self.sessions.active:
                    n += 1
                    name = f"run-{lsn}-{n}"
                event = {"op": "session", "path": None, "state": "begun", "session": name}
                txn.append_event({**event, **{k: who[k] for k in ("pid", "comm", "uid")}})
                return lsn, name

            lsn, name = await trio.to_thread.run_sync(self.ws.store.write, begin)
            self.sessions.begin(name, int(who["pid"]), lsn, int(who["uid"]), {})
            return
        mine = args[1:2] and self.sessions.active.get(args[1])
        if len(args) in (2, 3) and args[0] == "end" and mine and who["uid"] in (mine.uid, 0):
            status = int(args[2]) if len(args) == 3 and args[2].lstrip("-").isdigit() else None
            await self.ws.committer.sync()  # every write of the session is journaled before its end
            self.sessions.end(args[1])
            event: dict[str, Any] = {"op": "session", "path": None, "state": "ended"}
            event["session"] = args[1]
            event |= {"exit": status, **{k: who[k] for k in ("pid", "comm", "uid")}}
            await trio.to_thread.run_sync(self.ws.store.write, lambda txn: txn.append_event(event))
            return
        raise verb_error(
            "Nothing was done: write 'session begin' (from the process whose descendants "
            "make the session) or 'session end NAME [STATUS]' for an open session."
        )

    async def _restore(self, args: list[str], who: dict[str, Any]) -> None:
        if not args:
            raise verb_error("restore takes a snapshot name and optional paths.")
        snap = self.snapshots.get(args[0])
        if snap is None:
            raise verb_error(f"Nothing was restored: there is no snapshot {args[0]!r}.")
        bad = [a for a in args[1:] if a.startswith("/") or ".." in a.split("/")]
        if bad:  # (SPEC §5: no control-file input names anything outside the workspace)
            raise verb_error(
                f"Nothing was restored: {bad[0]!r} is outside the workspace or names it "
                "through '..'; give paths relative to the workspace's top, such as src/app.py."
            )
        await self.ws.committer.sync()
        paths = [os.fsencode(os.path.normpath(a)) for a in args[1:]]
        for arg, path in zip(args[1:], paths, strict=True):
            why = self._not_journaled(arg, path)
            if why:  # (before anything is restored: all of it, or nothing)
                shown = repr(arg[:60] + ("…" if len(arg) > 60 else ""))
                raise verb_error(
                    f"Nothing was restored: {shown} {why}; give the paths of journaled "
                    "files or directories, relative to the workspace's top (each has a "
                    ".rw/history/ entry), or no path to restore the whole workspace."
                )
        if b"." in paths:  # the workspace's top: everything
            paths = []
        changes = self.snapshots.changes_since(snap, paths)
        if changes:
            await trio.to_thread.run_sync(self._keep_targets, changes)
            lsn, h = int(snap["lsn"]), self.history

            def modes_then() -> dict[bytes, int]:  # (modes_at's, for these paths only)
                got = {p: h.mode_at(p, lsn) for p in changes}
                return {p: m for p, m in got.items() if m is not None}

            modes = await trio.to_thread.run_sync(modes_then)
            await self.batches.protocol.replay(f"restore-{args[0]}"[:64], changes, who, modes=modes)

    def _not_journaled(self, arg: str, path: bytes) -> str:
        """Why a path given to ``restore`` names nothing it could restore ("" if it names
        a journaled file, or a directory holding one): a restore that silently did nothing
        would be taken for one that worked."""
        if not arg:
            return "is empty"
        if b"\0" in path:
            return "holds a NUL byte, which no file name can"
        if path == b".":
            return ""
        if len(path) > 4095 or any(len(n) > 255 for n in path.split(b"/")):  # Linux's limits
            return "is longer than a path can be (names up to 255 bytes, paths up to 4,095)"
        if path == b".rw" or path.startswith(b".rw/"):
            return "is rwfs's control directory, which has no history"
        if self.history.has_below(path):
            return ""
        return "names nothing the journal has a version of"

    async def _gc(self, args: list[str], who: dict[str, Any]) -> None:
        no_args(args, "gc", ".rw/ctl")
        await self.retention.collect(None)

    async def reclaim(self, removals: bool = True) -> bool:
        """The disk is full: give up the kept bytes of removed files (``removals``: some
        were removed since the last time), or else the oldest versions (a ``gc`` event with
        ``reason: disk_full`` says so). True if any went."""
        try:
            return await self.retention.reclaim(removals)
        except (OSError, JournalUnavailable) as exc:
            log.warning("no room made on a full disk: %s", exc)
            return False

    # ---- allowances (allowances.py) ----

    def _allowed(self) -> dict[str, Any]:
        return {"allowed": self.ws.allowances.views(), "expires_after_s": ALLOW_S}

    async def _allow(self, args: list[str], who: dict[str, Any]) -> None:
        """``allow PATH…``: the caller's next write of each PATH is let through the gates
        that judge whether a file was broken; ``allow --cancel PATH…`` takes that back.
        Every PATH is checked first: one bad PATH, and nothing is done."""
        cancel = bool(args) and args[0] == "--cancel"
        names = args[1:] if cancel else args
        if not names:
            raise verb_error(
                "Nothing was allowed: allow takes the paths of files, relative to the "
                "workspace's top ('allow src/app.py'; 'allow --cancel src/app.py' takes it back)."
            )
        for arg in names:
            if arg.startswith("-"):
                raise verb_error(
                    f"Nothing was allowed: {_shown(arg)} is not an option of allow (its only "
                    f"one is --cancel, first); to name a file whose name starts with '-', "
                    f"write ./{_shown(arg)[1:-1]}."
                )
        uid = who.get("uid")
        if uid is None:
            raise verb_error("Nothing was allowed: the caller's user is not known.")
        paths = [self._allowable(arg, who, cancel) for arg in names]
        if cancel:
            mine = [p for p in paths if self.ws.allowances.peek(int(uid), p) is None]
            if mine:
                raise verb_error(
                    f"Nothing was cancelled: you hold no allowance of "
                    f"{_shown(os.fsdecode(mine[0]))} (it was used, it expired, or it was "
                    "never granted; .rw/allowed lists the open ones)."
                )
        else:
            rights.require(self.ws.root_fd, dict.fromkeys(paths, False), who)
            if not self.ws.allowances.room(int(uid), paths):
                raise verb_error(
                    f"Nothing was allowed: a user may hold {PER_USER} allowances at once; "
                    "write the files allowed already, or cancel some ('allow --cancel PATH')."
                )
        await self.ws.committer.sync()  # (the grant follows the refusal it answers in the journal)
        now = time.time()
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + ALLOW_S))
        by: dict[str, Any] = {k: who[k] for k in ("pid", "comm", "uid") if k in who}
        events = [
            {
                "op": "allow",
                "path": os.fsdecode(p),
                "batch": None,
                "state": "cancelled" if cancel else "granted",
                **({} if cancel else {"expires": expires, "waives": list(WAIVES)}),
                **by,
                **({"session": who["session"]} if who.get("session") else {}),
            }
            for p in paths
        ]

        def journal(txn: Any) -> list[int]:
            return [txn.append_event(ev) for ev in events]

        try:
            lsns = await trio.to_thread.run_sync(self.ws.store.write, journal)
        except JournalUnavailable as exc:
            raise journal_unavailable(b".rw/ctl", str(exc)) from None
        deadline = time.monotonic() + ALLOW_S
        for p, lsn in zip(paths, lsns, strict=True):
            if cancel:
                self.ws.allowances.cancel(int(uid), p)
                continue
            self.ws.allowances.grant(
                Allowance(p, int(uid), lsn, now_iso(), expires, deadline, by=by)
            )

    def _allowable(self, arg: str, who: dict[str, Any], cancel: bool) -> bytes:
        """The workspace path ``arg`` names, if an allowance of it makes sense: a regular
        file (or one an open batch shows), or a name the caller could create in a
        directory that exists (a file saved by removal and re-creation is judged against
        the one removed). Anything else is refused, with nothing done."""

        def bad(why: str, code: int = errno.EINVAL) -> RwfsError:
            return RwfsError(
                code,
                "policy_violation",
                "verb",
                f"Nothing was allowed: {_shown(arg)} {why}.",
                path=".rw/ctl",
            )

        raw = os.fsencode(arg)
        if not raw:
            raise bad("is empty; give the path of a file, relative to the workspace's top")
        if b"\0" in raw:
            raise bad("holds a NUL byte, which no file name can")
        if raw.startswith(b"/") or b".." in raw.split(b"/"):
            raise bad(
                "is outside the workspace, or names it through '..'; give the path relative "
                "to the workspace's top, such as src/app.py (rwfs allow turns a path into that)"
            )
        path = os.path.normpath(raw)
        if len(path) > 4095 or any(len(n) > 255 for n in path.split(b"/")):
            raise bad("is longer than a path can be (names up to 255 bytes, paths up to 4,095)")
        if path == b".rw" or path.startswith(b".rw/"):
            raise bad("is in rwfs's control directory, which no gate judges")
        if path == b".":
            raise bad("is the workspace's top, a directory; an allowance is for one file")
        if cancel:
            return path
        try:
            st: os.stat_result | None = beneath.stat(self.ws.root_fd, path)
        except beneath.Escape as exc:
            raise escaped(exc) from None
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise bad(f"cannot name a file ({exc.strerror})") from None
        if st is None and self.virtual(path):
            return path  # a new file of an open batch: only its draft exists
        if st is None:
            parent = os.path.dirname(path)
            try:
                pst = beneath.stat(self.ws.root_fd, parent)
            except beneath.Escape as exc:
                raise escaped(exc) from None
            except OSError:
                pst = None
            if pst is None or not stat.S_ISDIR(pst.st_mode):
                raise bad(
                    f"does not exist, and cannot be created: {os.fsdecode(parent)} is not a "
                    "directory"
                )
            return path  # rights.require: the caller could create it there
        if stat.S_ISDIR(st.st_mode):
            raise bad(
                "is a directory; an allowance is for one file: name each file (allow takes "
                "several paths)"
            )
        if stat.S_ISLNK(st.st_mode):
            raise bad("is a symlink, which rwfs does not follow; name the file it points to")
        if not stat.S_ISREG(st.st_mode):
            raise bad("is not a regular file, and no gate judges it")
        return path

    async def _sync(self, args: list[str], who: dict[str, Any]) -> None:
        no_args(args, "sync", ".rw/ctl")
        await self.ws.committer.sync()

    async def _write_policy(self, data: bytes, who: dict[str, Any]) -> None:
        owner = self.ws_owner()[0]
        if who.get("uid") not in (0, owner):
            raise RwfsError(
                errno.EACCES,
                "policy_violation",
                "permission",
                f"The policy was not changed: only the workspace's owner (uid {owner}) or root "
                "may change it.",
                path=".rw/policy.toml",
            )
        try:
            policy = Policy.parse(data.decode("utf-8"))
        except (UnicodeDecodeError, PolicyError) as exc:
            raise RwfsError(
                errno.EINVAL,
                "policy_violation",
                "policy",
                f"The policy was not changed because the new text is invalid ({exc}); "
                "fix it and write the whole file again.",
                path=".rw/policy.toml",
                details=getattr(exc, "details", None) or None,
            ) from None
        write_state_file(self.ws.state_fd, b"policy.toml", data)
        self.ws.policy = policy
        self.retention.wake()  # a tighter retention takes effect now


def _shown(arg: str) -> str:
    """A path given to a verb, quoted (and cut short) for a message."""
    return repr(arg[:60] + ("…" if len(arg) > 60 else ""))


def as_dir(perm: Perm) -> Perm:
    """A directory that stands for a file: whoever may read the file may list it."""
    uid, gid, mode = perm
    return uid, gid, (mode & 0o444) | ((mode & 0o444) >> 2)


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def object_stat(ws: Workspace, digest: str) -> tuple[int, int]:
    """(size, mtime in ns) of a kept object: one stat, no read."""
    st = os.stat(ws.objects.name(digest), dir_fd=ws.objects.fd, follow_symlinks=False)
    return st.st_size, st.st_mtime_ns


def live_stat(ws: Workspace, path: bytes) -> tuple[int, int]:
    """(size, mtime in ns) of a file of the tree as ``conflicts.live_bytes`` reads it:
    anything but a regular file reads as empty."""
    st = beneath.stat(ws.root_fd, path)
    return (st.st_size if stat.S_ISREG(st.st_mode) else 0), st.st_mtime_ns


def stamp_ns(text: str, fmt: str = "%Y-%m-%dT%H:%M:%S") -> int:
    """A UTC time at the start of ``text`` (a journal ``ts``, a draft id), in ns; the
    milliseconds of a ``ts`` (``2026-11-30T10:12:03.123Z``) included. 0 if none is there."""
    width = len(time.strftime(fmt, time.gmtime(0)))
    try:
        ns = calendar.timegm(time.strptime(text[:width], fmt)) * 10**9
    except ValueError:
        return 0
    ms = text[width + 1 : width + 4]
    return ns + int(ms) * 10**6 if text[width : width + 1] == "." and ms.isdigit() else ns


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def write_state_file(state_fd: int, name: bytes, data: bytes) -> None:
    """Atomically replace a file of the state directory (write, fsync, rename)."""
    tmp = name + b".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=state_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=state_fd, dst_dir_fd=state_fd)


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
        status = self.c.add(d, b"status", lambda: _json(b.status(b.all[name])))
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


# mkdir(2) and mkdirat(2) by syscall number, with the index of their path argument, per
# machine (asm/unistd.h); elsewhere ``making_dir`` cannot tell.
_MKDIR_CALLS = {
    "x86_64": {83: 0, 258: 1},
    "aarch64": {34: 1},
    "riscv64": {34: 1},
    "i686": {39: 0, 296: 1},
}.get(os.uname().machine, {})


def making_dir(tid: int, name: bytes) -> bool:
    """Is thread ``tid``, the caller of a FUSE request, in a mkdir(2) of a path whose
    last component is ``name``? Read from /proc (its current syscall and the path in its
    memory; both need the right to trace it, as the daemon of its own user or root has);
    False whenever that cannot be read."""
    try:
        with open(f"/proc/{tid}/syscall", "rb") as f:
            fields = f.read().split()
        arg = _MKDIR_CALLS.get(int(fields[0]))
        if arg is None:
            return False
        where = int(fields[1 + arg], 16)
        fd = os.open(f"/proc/{tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            path = b""
            while b"\0" not in path and len(path) <= 4096:  # (PATH_MAX, a page at a time)
                chunk = os.pread(fd, 4096 - (where + len(path)) % 4096, where + len(path))
                if not chunk:
                    return False
                path += chunk
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return False
    return path.split(b"\0", 1)[0].rstrip(b"/").rsplit(b"/", 1)[-1] == name


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
        self.c.add(d, b"info", _constant(_json({**info, "time": info["ts"]}))).perm = perm
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
        self.c.add(d, b"info", _constant(_json(snap)))
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
