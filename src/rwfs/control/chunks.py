"""Chunked composition (SPEC §8, the paper's L2): ``.rw/chunks/NAME/``.

``mkdir .rw/chunks/NAME`` opens a session. Files ``part-001``, ``part-002``, … written into
it are each kept durably (an object and the session's LMDB record) as soon as they are
closed, so a crash loses at most the part being written. ``NAME/preview`` shows the
composition (or why there is none yet); ``NAME/ctl`` takes ``expect N`` (the number of
parts there must be) and ``compose PATH``, which checks that the parts run from 1 without
a gap (and number N, if expected), then commits their concatenation to PATH as one
journaled commit: the gates apply, and a refusal fails the ``compose``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath
from ..core import rights
from ..core.commits import Commit
from ..core.errors import RwfsError, conflict_error
from ..core.syscalls import WORKERS
from ..journal.store import now_iso, plain_name
from .nodes import verb_file

if TYPE_CHECKING:
    from .nodes import CDir, CFile, Verb
    from .tree import Control

_DB = b"chunks"
_PART = re.compile(rb"part-(\d{1,6})")
MAX_PART = 64 << 20


def install(control: Control) -> None:
    top = control.mkdir(control.root, b"chunks")
    top.perm = lambda: (*control.ws_owner(), 0o755)  # the workspace owner opens sessions
    Chunks(control, top)


def _bad(message: str, where: str, errno_: int = errno.EINVAL) -> RwfsError:
    return RwfsError(errno_, "policy_violation", "chunks", message, path=where)


def _number(part: bytes) -> int:
    """A part's number (part-007 -> 7); 0 for a name that is not a part's."""
    m = _PART.fullmatch(part)
    return int(m.group(1)) if m else 0


def plan(session: dict[str, Any]) -> list[str]:
    """The digests of the parts in order; EINVAL if they are not contiguous from 1 or not
    as many as ``expect`` says."""
    where = f".rw/chunks/{session['name']}/ctl"
    by_number = {_number(p.encode()): d for p, d in session["parts"].items()}
    if len(by_number) < len(session["parts"]):
        raise _bad(
            f"Nothing was composed: two parts of session {session['name']} have the same "
            "number (e.g. part-1 and part-001); remove one, then compose again.",
            where,
        )
    numbers = sorted(by_number)
    if not numbers:
        raise _bad(
            f"Chunk session {session['name']} has no parts yet; write part-001 first.", where
        )
    missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
    if missing:
        raise _bad(
            f"Nothing was composed: part {missing[0]} of session {session['name']} is missing "
            f"(parts run 1 to {numbers[-1]}); write it, then compose again.",
            where,
        )
    expect = session.get("expect")
    if expect is not None and expect != len(numbers):
        raise _bad(
            f"Nothing was composed: session {session['name']} expects {expect} parts and has "
            f"{len(numbers)}; write the rest (or 'expect {len(numbers)}'), then compose again.",
            where,
        )
    return [by_number[n] for n in numbers]


class Chunks:
    def __init__(self, control: Control, top: CDir) -> None:
        self.c = control
        self.top = top
        top.refresh, top.mkdir, top.rmdir = self.refresh, self.mkdir, self.rmdir
        top.taken = self.taken

    def _sessions(self) -> dict[bytes, dict[str, Any]]:
        return {r["name"].encode(): r for r in self.c.ws.store.records(_DB)}

    def _get(self, name: str) -> dict[str, Any]:
        session = self._sessions().get(name.encode())
        if session is None:
            raise _bad(f"There is no chunk session {name}.", ".rw/chunks", errno.ENOENT)
        return session

    async def _save(self, session: dict[str, Any]) -> None:
        ws = self.c.ws
        key = session["name"].encode()
        await trio.to_thread.run_sync(
            ws.store.write, lambda txn: txn.put(_DB, key, session), limiter=WORKERS
        )

    def refresh(self) -> None:
        sessions = self._sessions()
        for gone in set(self.top.children) - set(sessions):
            self.c.remove(self.top, gone)
        for name in set(sessions) - set(self.top.children):
            self._add(name.decode())

    def _add(self, name: str) -> None:
        d = self.c.mkdir(self.top, name.encode())
        d.perm = lambda: (*self._opener(name), 0o700)  # its parts are its opener's alone
        parts = Parts(self, d, name)
        d.refresh, d.create, d.unlink = parts.refresh, parts.create, parts.unlink
        preview = self.c.add(d, b"preview", lambda: self._preview(name))
        preview.slow, preview.perm = True, lambda: (*self._opener(name), 0o400)

        async def expect(args: list[str], who: dict[str, Any]) -> None:
            if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
                raise _bad("expect takes a number of parts: 'expect 8'.", f".rw/chunks/{name}/ctl")
            session = self._get(name)
            session["expect"] = int(args[0])
            await self._save(session)

        async def compose(args: list[str], who: dict[str, Any]) -> None:
            await self.compose(name, args, who)

        verbs: dict[str, Verb] = {"expect": expect, "compose": compose}
        self.c.add(d, b"ctl", lambda: b"", verb_file(verbs, f".rw/chunks/{name}/ctl"), verbs=True)

    def _opener(self, name: str) -> tuple[int, int]:
        session = self._sessions().get(name.encode()) or {}
        if "uid" not in session:  # (a session recorded before owners)
            return self.c.ws_owner()
        return session["uid"], session.get("gid", session["uid"])

    def _preview(self, name: str) -> bytes:
        try:
            digests = plan(self._get(name))
        except RwfsError as exc:
            return (exc.envelope["message"] + "\n").encode()
        return b"".join(self.c.ws.objects.read(d) for d in digests)

    def taken(self, raw: bytes) -> RwfsError | None:
        if raw not in self._sessions():
            return None
        return _bad(
            f"No chunk session was opened because session {raw.decode('utf-8', 'replace')} "
            "exists already; choose another name.",
            ".rw/chunks",
            errno.EEXIST,
        )

    async def mkdir(self, raw: bytes, who: dict[str, Any]) -> None:
        name = plain_name(raw)
        if name is None:
            raise _bad(
                f"No session was opened: {raw.decode('utf-8', 'replace')[:40]!r} is not a session name (1 to 64 "
                "letters, digits, dots, dashes or underscores, not starting with a dash).",
                ".rw/chunks",
            )
        taken = self.taken(raw)
        if taken is not None:
            raise taken
        await self._save({"name": name, "created": now_iso(), "expect": None, "parts": {}, **who})
        self.refresh()

    async def rmdir(self, raw: bytes) -> None:
        self._get(raw.decode("utf-8", "replace"))
        ws = self.c.ws
        await trio.to_thread.run_sync(
            ws.store.write, lambda txn: txn.delete(_DB, raw), limiter=WORKERS
        )
        self.refresh()

    async def compose(self, name: str, args: list[str], who: dict[str, Any]) -> None:
        where = f".rw/chunks/{name}/ctl"
        if len(args) != 1:
            raise _bad(
                "compose takes one path, relative to the workspace: 'compose src/big.py'.", where
            )
        path = os.fsencode(args[0])
        parts = path.split(b"/")
        if path.startswith(b"/") or b".." in parts or b"" in parts or parts[0] == b".rw":
            raise _bad(
                f"Nothing was composed: {args[0]!r} is not a path inside the workspace (give it "
                "relative to the workspace root, without '..').",
                where,
                errno.EPERM,
            )
        ws = self.c.ws
        digests = plan(self._get(name))
        rights.require(ws.root_fd, {path: False}, who)
        await ws.committer.sync()  # compose against the file's journaled bytes

        live, st = await trio.to_thread.run_sync(ws.digests.live, path, limiter=WORKERS)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _bad(
                f"Nothing was composed: {args[0]} is not a regular file.", where, errno.EPERM
            )
        base = -1
        if live is None:
            s = await ws.stages.empty(0o644, os.getuid(), os.getgid())
        else:  # its mode, owner and xattrs carry over
            base = beneath.open_beneath(ws.root_fd, path, os.O_RDONLY | os.O_NOFOLLOW)
            s = await ws.stages.new(base, truncate=True)
        s.expected = live

        def fill() -> None:
            for d in digests:
                os.write(s.fd, ws.objects.read(d))

        await trio.to_thread.run_sync(fill, limiter=WORKERS)
        try:
            intended, size, _ = await ws.stages.seal(s)
            findings = await ws.gating.run(path, base, s.fd)
            findings, allowance = ws.gating.let_through(path, who, findings)
            if any(f.action == "reject" for f in findings):
                err = await ws.refusals.refuse(path, s.fd, s.expected, intended, findings, who)
                ws.stages.drop(s)
                raise err
        finally:
            if base >= 0:
                os.close(base)
        if intended == s.expected:
            ws.stages.drop(s)
            if allowance is not None:  # (nothing changed: the allowance stays)
                ws.allowances.give_back(allowance)
            return
        c = Commit(path, s, intended, size, {**who, "chunks": name})
        if allowance is not None:
            c.info["allowed"] = allowance.record()
        await ws.committer.submit(c, wait=True)
        if c.outcome not in ("committed", "landed"):
            raise conflict_error(c)
        ws.committer.on_committed(c)


class Parts:
    """One session's directory: its ``part-NNN`` files."""

    def __init__(self, chunks: Chunks, node: CDir, name: str) -> None:
        self.chunks = chunks
        self.node = node
        self.name = name
        self.nodes: dict[bytes, CFile] = {}

    def refresh(self) -> None:
        session = self.chunks._sessions().get(self.name.encode())
        if session is None:
            return
        for part in session["parts"]:
            if part.encode() not in self.nodes:
                self._node(part.encode())

    def _node(self, part: bytes) -> CFile:
        c = self.chunks.c

        def render() -> bytes:
            digest = self.chunks._get(self.name)["parts"].get(part.decode())
            return b"" if digest is None else c.ws.objects.read(digest)

        async def write(data: bytes, who: dict[str, Any]) -> None:
            async with c.ws.committer.exclusive():  # the object and its record, together, for gc
                digest = await trio.to_thread.run_sync(
                    c.ws.objects.keep_bytes, data, limiter=WORKERS
                )
                session = self.chunks._get(self.name)
                session["parts"][part.decode()] = digest
                await self.chunks._save(session)

        node = c.add(self.node, part, render, write)
        node.max_bytes, node.slow = MAX_PART, True
        node.perm = lambda: (*self.chunks._opener(self.name), 0o400)  # (0600: writable)
        self.nodes[part] = node
        return node

    def create(self, part: bytes) -> CFile:
        if _number(part) < 1:
            raise _bad(
                f"Chunk files are named part-001, part-002, …, not {part.decode(errors='replace')!r}.",
                f".rw/chunks/{self.name}",
            )
        return self.nodes.get(part) or self._node(part)

    async def unlink(self, part: bytes) -> None:
        session = self.chunks._get(self.name)
        if session["parts"].pop(part.decode(errors="replace"), None) is None:
            raise _bad(
                f"There is no {part.decode(errors='replace')} here.",
                f".rw/chunks/{self.name}",
                errno.ENOENT,
            )
        await self.chunks._save(session)
        self.chunks.c.remove(self.node, part)
        self.nodes.pop(part, None)
