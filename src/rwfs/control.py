"""The virtual control directory ``.rw/`` (SPEC §5), rendered from the core.

Each entry is a ``CFile`` (``render()`` makes its bytes fresh at every open; ``write`` takes
the whole written text at close and raises ``RwfsError`` to refuse it) or a ``CDir``.
Later features add entries with ``Control.add``; nothing here knows about FUSE.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from . import conflicts, gates
from .history import History, Version
from .policy import Policy, PolicyError
from .workspace import RwfsError, Workspace

if TYPE_CHECKING:
    from .batches import Batches


@dataclass(eq=False)
class CNode:
    ino: int
    name: bytes


# A control file's writer: the text, and who wrote it ({"pid", "comm", "uid"}).
Writer = Callable[[bytes, dict[str, Any]], Awaitable[None]]
# A verb of a ``ctl`` file: its arguments, and who wrote it.
Verb = Callable[[list[str], dict[str, Any]], Awaitable[None]]


def verb_file(verbs: dict[str, Verb], where: str) -> Writer:
    """A ``ctl`` file: each line written is a verb and its arguments, run in order."""

    async def write(data: bytes, who: dict[str, Any]) -> None:
        try:
            lines = [ln.split() for ln in data.decode("utf-8").splitlines() if ln.strip()]
        except UnicodeDecodeError:
            lines = []
        if not lines or any(words[0] not in verbs for words in lines):
            raise RwfsError(
                errno.EINVAL,
                "policy_violation",
                "verb",
                f"Nothing was done because the text written to {where} is not a known verb; "
                f"write one of: {', '.join(sorted(verbs))}.",
                path=where,
            )
        for words in lines:
            await verbs[words[0]](words[1:], who)

    return write


def no_args(args: list[str], verb: str, where: str) -> None:
    if args:
        raise RwfsError(
            errno.EINVAL,
            "policy_violation",
            "verb",
            f"{verb} takes no argument, so nothing was done; write just '{verb}'.",
            path=where,
        )


@dataclass(eq=False)
class CFile(CNode):
    render: Callable[[], bytes]
    write: Writer | None = None
    verbs: bool = False  # each write() is a verb, run before write() returns
    slow: bool = False  # render() does I/O or parsing: run it in a worker thread


@dataclass(eq=False)
class CDir(CNode):
    children: dict[bytes, CNode] = field(default_factory=dict)
    # A view of the workspace (validate/, risk/): names are looked up in the tree.
    mirror: tuple[str, bytes] | None = None  # (view, workspace path of this directory)
    # Directories that mirror the journal (batches/, conflicts/): brought up to date
    # before every lookup and listing.
    refresh: Callable[[], None] | None = None
    mkdir: Callable[[bytes, dict[str, Any]], Awaitable[None]] | None = None
    rmdir: Callable[[bytes], Awaitable[None]] | None = None


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
        self.add(
            self.root,
            b"README",
            lambda: resources.files("rwfs").joinpath("README.rw.md").read_bytes(),
        )
        self.add(self.root, b"status", lambda: _json(self.status()))
        self.add(self.root, b"journal", self._journal)
        self.add(self.root, b"stats", lambda: _json(self.ws.stats.report()))
        self.add(self.root, b"policy.toml", lambda: ws.policy.text.encode(), self._write_policy)
        self.add(
            self.root, b"last-error", lambda: _json(self.last_error) if self.last_error else b""
        )
        self.verbs: dict[str, Verb] = {"sync": self._sync}
        self.add(self.root, b"ctl", lambda: b"", verb_file(self.verbs, ".rw/ctl"), verbs=True)
        for view in ("validate", "risk"):
            self.mkdir(self.root, view.encode()).mirror = (view, b"")
        self.rejected = self.mkdir(self.root, b"rejected")
        self.why = self.mkdir(self.root, b"why")
        self.add(self.root, b"notices", self._notices)
        self.batches_dir = BatchViews(self, self.mkdir(self.root, b"batches"))
        self.conflicts_dir = ConflictViews(self, self.mkdir(self.root, b"conflicts"))
        self.history = History(ws.store)
        HistoryViews(self, self.mkdir(self.root, b"history"), b"")
        for ev in ws.store.events():  # drafts refused in earlier mounts stay listed
            if ev["op"] == "refuse" and ev.get("draft"):
                self._add_rejected(ev["draft"], ev["intended"])

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
        return sorted(parent.children)

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
        if node is not None or parent.mirror is None or name in (b".", b".."):
            return node
        view, top = parent.mirror
        path = top + b"/" + name if top else name
        if path == b".rw":
            return None
        try:
            st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISDIR(st.st_mode):
            node = self.mkdir(parent, name)
            node.mirror = (view, path)
        elif stat.S_ISREG(st.st_mode):
            node = self.add(parent, name, lambda: _json(self._diagnose(view, path)))
            node.slow = True
        return node

    def _diagnose(self, view: str, path: bytes) -> dict[str, Any]:
        """The gates' diagnostics of a file as it is now, without writing (SPEC §5)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.ws.root_fd)
        except OSError as exc:
            return {"error": exc.strerror, "path": os.fsdecode(path)}
        try:
            data = os.pread(fd, gates.MAX_GATED_BYTES + 1, 0)
        finally:
            os.close(fd)
        if view == "risk":
            return gates.risk(data)
        fmt, errors = gates.parse_errors(path, data)
        return {"valid": not errors, "format": fmt, "errors": errors}

    def mkdir(self, parent: CDir, name: bytes) -> CDir:
        node = parent.children.get(name)
        if isinstance(node, CDir):
            return node
        node = CDir(self._allocate(), name)
        parent.children[name] = node
        self.nodes[node.ino] = node
        return node

    def _put(self, top: CDir, path: str, render: Callable[[], bytes]) -> None:
        """Add (or refresh) a read-only file at ``top/path``, making directories on the way."""
        *dirs, name = os.fsencode(path).split(b"/")
        for d in dirs:
            top = self.mkdir(top, d)
        node = top.children.get(name)
        if isinstance(node, CFile):
            node.render = render
        elif node is None:
            self.add(top, name, render)

    def _add_rejected(self, draft_id: str, digest: str) -> None:
        def render() -> bytes:
            fd = self.ws.objects.open(digest)
            try:
                return os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)

        self._put(self.rejected, draft_id, render)

    def get(self, ino: int) -> CNode | None:
        return self.nodes.get(ino)

    def fail(self, exc: RwfsError) -> None:
        """Show an error envelope at ``.rw/last-error`` and, for a file, ``.rw/why/<path>``."""
        env = self.last_error = exc.envelope
        path = env.get("path") or ""
        if path and not path.startswith(".rw"):
            body = _json(env)
            self._put(self.why, path, lambda: body)
        if env.get("draft"):
            self._add_rejected(env["draft"].rsplit("/", 1)[-1], env["intended"])

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
                "queued": self.ws.queued,
            },
            "last_lsn": self.ws.store.meta_int(b"lsn"),
            "journal_bytes": self.ws.store.size_bytes(),
            "journal_ok": self.ws.journal_ok,
            **{key: fn() for key, fn in self.live.items()},
        }

    def _notices(self) -> bytes:
        return b"".join(json.dumps(n).encode() + b"\n" for n in self.ws.store.notices())

    def _journal(self) -> bytes:
        events = self.ws.store.events(last=1000)
        return b"".join(json.dumps(ev).encode() + b"\n" for ev in events)

    async def _sync(self, args: list[str], who: dict[str, Any]) -> None:
        no_args(args, "sync", ".rw/ctl")
        await self.ws.sync()

    async def _write_policy(self, data: bytes, who: dict[str, Any]) -> None:
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
            ) from None
        write_state_file(self.ws.state_fd, b"policy.toml", data)
        self.ws.policy = policy


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

    def refresh(self) -> None:
        names = {name.encode() for name in self.c.batches.all}
        for gone in set(self.top.children) - names:
            self.c.remove(self.top, gone)
        for name in names - set(self.top.children):
            self._add(name.decode())

    def _add(self, name: str) -> None:
        b = self.c.batches
        d = self.c.mkdir(self.top, name.encode())
        self.c.add(d, b"status", lambda: _json(b.status(b.all[name])))
        self.c.add(d, b"diff", lambda: b.diff(b.all[name])).slow = True
        where = f".rw/batches/{name}/ctl"

        def plain(run: Callable[[Any], Awaitable[None]], verb: str) -> Verb:
            async def verb_fn(args: list[str], who: dict[str, Any]) -> None:
                no_args(args, verb, where)
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

    async def _resume(self, batch: Any) -> None:
        await self.c.batches.resume(batch)

    async def _rollback(self, batch: Any) -> None:
        await self.c.batches.rollback(batch)

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
        self.c.add(d, b"info", lambda: _json(info))
        self.c.add(d, b"base", lambda: conflicts.object_bytes(ws, info["expected"])).slow = True
        self.c.add(d, b"intended", lambda: conflicts.object_bytes(ws, info["intended"])).slow = True
        self.c.add(d, b"actual", lambda: conflicts.live_bytes(ws, info["path"])).slow = True
        self.c.add(d, b"merged", lambda: conflicts.merged(ws, info)).slow = True
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
        node.refresh = self.refresh

    def refresh(self) -> None:
        h = self.c.history
        for name in h.children(self.prefix) - set(self.node.children):
            child = self.c.mkdir(self.node, name)
            HistoryViews(self.c, child, self.prefix + b"/" + name if self.prefix else name)
        versions = h.versions(self.prefix) if self.prefix else []
        for v in versions:
            key = v.name.encode()
            retained = v is versions[-1] or self.c.ws.objects.exists(str(v.digest))
            if key not in self.node.children and retained:
                self.c.add(self.node, key, self._reader(v)).slow = True

    def _reader(self, v: Version) -> Callable[[], bytes]:
        path, ws = self.prefix, self.c.ws

        def render() -> bytes:
            assert v.digest is not None
            if ws.objects.exists(v.digest):
                return conflicts.object_bytes(ws, v.digest)
            if ws.live_digest(path)[0] == v.digest:  # the newest: the live file
                return conflicts.live_bytes(ws, os.fsdecode(path))
            return b""  # no longer retained

        return render
