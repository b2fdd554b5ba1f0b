"""Where the core runs the gates (checks/): on the loop when that costs less than a thread
hop, and where an allowance waives what it may of their findings."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import trio

from ..checks import gates, parsers
from ..checks.allowances import Allowance, waivable, waive, writer_uid
from ..checks.findings import Finding
from ..journal.objects import open_regular
from .syscalls import WORKERS, borrowed, rel

if TYPE_CHECKING:
    from .workspace import Workspace

# Gates run on the loop too, in the seal or for a rename, when the old and the new bytes
# are both this small and the syntax gate's parse of the old bytes is kept (only the edit
# is parsed again): a rewrite of a 100-line module took 80 µs of gates here, against the
# 120-200 µs of a thread hop; a full parse of 4 KiB would take about 0.5 ms.
GATES_ON_LOOP = 4 << 10


class Gating:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    async def run(self, path: bytes, base_fd: int, new_fd: int, cut: bool = False) -> list[Finding]:
        """The gates' findings on new bytes (a sealed stage, a file renamed onto ``path``)
        against the bytes they replace. ``cut``: their last change is an explicit
        truncation by the caller (``Stage.cut_last``; ``gates.check``)."""
        if self.quick(path, base_fd, new_fd):
            return self.run_now(path, base_fd, new_fd, cut)
        with borrowed(base_fd, new_fd) as (base, new):
            return await trio.to_thread.run_sync(
                self.run_now, path, base, new, cut, limiter=WORKERS
            )

    def quick(self, path: bytes, base_fd: int, new_fd: int) -> bool:
        """Whether the gates of these bytes cost less than a thread hop (GATES_ON_LOOP)."""
        if os.fstat(new_fd).st_size > GATES_ON_LOOP:
            return False
        if base_fd < 0:
            return True
        size = os.fstat(base_fd).st_size
        return size <= GATES_ON_LOOP and parsers.quick(path, lambda: os.pread(base_fd, size, 0))

    def run_now(self, path: bytes, base_fd: int, stage_fd: int, cut: bool = False) -> list[Finding]:
        t = time.perf_counter()
        limit = gates.MAX_GATED_BYTES + 1
        if os.fstat(stage_fd).st_size >= limit or (
            base_fd >= 0 and os.fstat(base_fd).st_size >= limit
        ):
            return []  # gates leave large files alone: no need to read them
        old = os.pread(base_fd, limit, 0) if base_fd >= 0 else b""  # -1: a new file
        new = os.pread(stage_fd, limit, 0)
        findings = gates.check(path, old, new, self.ws.policy.gate, cut=cut)
        self.ws.stats.sample("gates", time.perf_counter() - t)
        for f in findings:
            self.ws.stats.count(f"gate.{f.gate}.{'refused' if f.action == 'reject' else 'warned'}")
        return findings

    def prime(self, path: bytes) -> None:
        """In a worker thread: parse a file the way its next commit will (see
        ``parsers.prime``), so that commit's syntax gate parses only around the edit."""
        try:
            fd, _ = open_regular(self.ws.root_fd, rel(path))  # never a FIFO's or a device's
        except OSError:
            return
        if fd < 0:
            return
        try:
            data = os.pread(fd, gates.MAX_GATED_BYTES + 1, 0)
        finally:
            os.close(fd)
        if parsers.prime(path, data):
            self.ws.stats.count("gates.primed")

    def let_through(
        self,
        path: bytes,
        who: dict[str, Any],
        findings: list[Finding],
        taken: Allowance | None = None,
    ) -> tuple[list[Finding], Allowance | None]:
        """Where gate findings become a refusal: the writer's allowance of ``path``, if it
        has one, is used up by this commit and waives what it may (allowances.py). Returns
        the findings left and the allowance used (its ``record()`` goes in the commit's
        event as ``allowed``). ``taken``: one this same operation used already (a rename
        gated again), applied again without taking another."""
        if taken is None:
            uid = writer_uid(who)
            if uid is None or not waivable(findings):
                return findings, None  # rwfs's own write; or refused for a secret anyway
            taken = self.ws.allowances.take(uid, path)
            if taken is None:
                return findings, None
            self.ws.stats.count("allowed")
        taken.waived = []
        return waive(findings, taken), taken
