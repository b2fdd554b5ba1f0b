"""The scratchpad (SPEC §8, the paper's L4): ``.rw/scratch/``.

A file written there is stored by the digest of its bytes in the object store, outside the
tree (the same bytes under two names are stored once), and listed by the name it was
given. Reading hashes the bytes again, so a damaged object reads as EIO, never as wrong
bytes. With ``scratch_readable = false`` in the policy it is a deposit box: writes work,
reads are refused.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

import trio

from ..core.errors import RwfsError
from ..core.syscalls import WORKERS
from ..journal.store import now_iso

if TYPE_CHECKING:
    from .nodes import CDir, CFile
    from .tree import Control

MAX_BYTES = 64 << 20
_DB = b"scratch"


def install(control: Control) -> None:
    top = control.mkdir(control.root, b"scratch")
    top.perm = lambda: (*control.ws_owner(), 0o755)  # the workspace owner makes files here
    Scratch(control, top)


class Scratch:
    def __init__(self, control: Control, top: CDir) -> None:
        self.c = control
        self.top = top
        self.nodes: dict[bytes, CFile] = {}
        self.new: set[bytes] = set()  # created, not yet written: listed until written
        top.refresh, top.create, top.unlink = self.refresh, self.create, self.unlink

    def refresh(self) -> None:
        names = {os.fsencode(r["name"]) for r in self.c.ws.store.records(_DB)}
        for gone in [n for n in self.nodes if n not in names and n not in self.new]:
            self.c.remove(self.top, gone)
            del self.nodes[gone]
        for name in names - set(self.nodes):
            self._node(name)

    def _node(self, name: bytes) -> CFile:
        node = self.c.add(self.top, name, lambda: self._read(name), self._writer(name))
        node.perm = lambda: self._perm(name)
        node.max_bytes = MAX_BYTES
        node.slow = True
        self.nodes[name] = node
        return node

    def create(self, name: bytes) -> CFile:
        if name not in self.nodes:
            self.new.add(name)
            self._node(name)
        return self.nodes[name]

    def _perm(self, name: bytes) -> tuple[int, int, int]:
        """A scratch file is its writer's alone (SPEC §3.3b): what it holds is theirs."""
        record = next(
            (r for r in self.c.ws.store.records(_DB) if os.fsencode(r["name"]) == name), None
        )
        if record is None or "uid" not in record:  # (not written yet, or before owners)
            return (*self.c.ws_owner(), 0o400)
        return record["uid"], record.get("gid", record["uid"]), 0o400

    def _read(self, name: bytes) -> bytes:
        ws = self.c.ws
        if not ws.policy.scratch_readable:
            raise RwfsError(
                errno.EACCES,
                "policy_violation",
                "scratch",
                "The scratchpad is write-only here (scratch_readable = false), so its files "
                "cannot be read back; what was deposited is kept.",
                path=f".rw/scratch/{os.fsdecode(name)}",
            )
        record = next((r for r in ws.store.records(_DB) if os.fsencode(r["name"]) == name), None)
        return b"" if record is None else ws.objects.read(record["digest"])

    def _writer(self, name: bytes) -> Any:
        async def write(data: bytes, who: dict[str, Any]) -> None:
            ws = self.c.ws

            def keep() -> None:
                digest = ws.objects.keep_bytes(data)
                record = {
                    "name": os.fsdecode(name),
                    "digest": digest,
                    "size": len(data),
                    "ts": now_iso(),
                    **who,
                }
                ws.store.write(lambda txn: txn.put(_DB, name, record))

            async with ws.committer.exclusive():  # the object and its record, together, for gc
                await trio.to_thread.run_sync(keep, limiter=WORKERS)
            self.new.discard(name)

        return write

    async def unlink(self, name: bytes) -> None:
        ws = self.c.ws
        await trio.to_thread.run_sync(
            ws.store.write, lambda txn: txn.delete(_DB, name), limiter=WORKERS
        )
        self.new.discard(name)
        self.c.remove(self.top, name)
        self.nodes.pop(name, None)
