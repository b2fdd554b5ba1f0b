"""The virtual control directory ``.rw/`` (SPEC §5), rendered from the core.

Each entry is a ``CFile`` (``render()`` makes its bytes fresh at every open; ``write`` takes
the whole written text at close and raises ``RwfsError`` to refuse it) or a ``CDir``.
A file whose bytes are fixed (an object, a live file) also has ``stat``, its size and
mtime found without rendering it; any other file is sized by rendering it (SPEC §5: every
entry reports its true ``st_size``).
Later features add entries with ``Control.add``; nothing here knows about FUSE. The
views that mirror the journal (``batches/``, ``conflicts/``, ``history/``,
``snapshots/``) are views.py's, the verbs of ``ctl`` verbs.py's, the nodes nodes.py's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from .. import beneath
from ..checks import gates, parsers, secrets
from ..core.errors import RwfsError
from ..core.workspace import Workspace
from ..features import conflicts, gc
from ..features.history import History
from ..features.sessions import Sessions
from ..journal.objects import open_regular
from ..journal.store import JournalUnavailable, now_iso
from . import chunks, handoff, scratch
from .nodes import (
    CDir,
    CFile,
    CNode,
    Perm,
    Verb,
    Writer,
    as_dir,
    json_bytes,
    live_stat,
    object_stat,
    stamp_ns,
    verb_file,
)
from .verbs import CtlVerbs
from .views import BatchViews, ConflictViews, HistoryViews, SnapshotViews

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
        self.ctl = CtlVerbs(self)  # the verbs of .rw/ctl, allow and the policy's writes (verbs.py)
        self.nodes: dict[int, CNode] = {}
        self.root = CDir(allocate(), b".rw")
        self.nodes[self.root.ino] = self.root
        self.mtime = time.time_ns()
        self.last_error: dict[str, Any] | None = None
        # Figures only the mounting layer knows (e.g. how many inodes the kernel holds).
        self.live: dict[str, Callable[[], Any]] = {}
        # Whether a path names a file only an open batch has (the FUSE layer knows).
        self.virtual: Callable[[bytes], bool] = lambda path: False
        # Refuses (EBUSY) a policy that would journal a file whose open the kernel passes
        # through (core/direct.py); given the new policy's test of a journaled path.
        self.keep_passthrough: Callable[[Callable[[bytes], bool]], None] = lambda j: None
        self.add(
            self.root,
            b"README",
            lambda: resources.files("rwfs.control").joinpath("README.rw.md").read_bytes(),
        )
        for name, render in (
            (b"status", lambda: json_bytes(self.status())),
            (b"journal", self._journal),
            (b"stats", lambda: json_bytes(self.ws.stats.report())),
        ):
            node = self.add(self.root, name, render)
            node.fresh, node.perm = True, self.private
        # The workspace owner's to change (0644): the kernel refuses anyone else's write.
        self.add(
            self.root, b"policy.toml", lambda: ws.policy.text.encode(), self.ctl.write_policy
        ).perm = lambda: (*self.ws_owner(), 0o444)
        self.add(
            self.root, b"last-error", lambda: json_bytes(self.last_error or NO_ERROR)
        ).perm = self.private
        self.verbs: dict[str, Verb] = {"sync": self.ctl.sync}
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
        self.verbs["undo"] = self.ctl.undo
        self.sessions = Sessions()
        self.verbs["session"] = self.ctl.session
        self.verbs["restore"] = self.ctl.restore
        self.verbs["gc"] = self.ctl.gc
        self.verbs["allow"] = self.ctl.allow  # a deliberate change, let through once
        self.add(self.root, b"allowed", lambda: json_bytes(self.ctl.allowed())).perm = self.private
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
            node = self.add(parent, name, lambda: json_bytes(self._diagnose(view, path)))
            node.slow = node.fresh = True
            node.shows = path
            node.render_shown = lambda fd: json_bytes(self._diagnose(view, path, fd))
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
            return secrets.risk(data)
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

    def holders(self, digest: str, path: bytes) -> list[bytes]:
        """The paths the journal says hold ``digest`` now, ``path`` first: where an old
        version's bytes are when rwfs kept no object of them (a rename moved the file)."""
        return sorted(self.history.holders(digest), key=lambda p: p != path)

    def _holder(self, digest: str, path: bytes) -> bytes | None:
        """The first of ``_holders`` whose live file really holds ``digest``."""
        for p in self.holders(digest, path):
            with contextlib.suppress(OSError):  # (unreadable, or too large to hash)
                if self.ws.digests.live(p)[0] == digest:
                    return p
        return None

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
            for p in self.holders(digest, path):
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
        body = json_bytes(shown)
        self._put(self.why, name, lambda: body, self._perm_of(name))

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

    async def reclaim(self, removals: bool = True) -> bool:
        """The disk is full: give up the kept bytes of removed files (``removals``: some
        were removed since the last time), or else the oldest versions (a ``gc`` event with
        ``reason: disk_full`` says so). True if any went."""
        try:
            return await self.retention.reclaim(removals)
        except (OSError, JournalUnavailable) as exc:
            log.warning("no room made on a full disk: %s", exc)
            return False


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
