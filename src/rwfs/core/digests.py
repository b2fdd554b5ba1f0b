"""The digests of live files, cached by inode and stat so a file is hashed again only when
it changed. Blocking (call in a worker thread), but ``of``."""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import TYPE_CHECKING

import trio

from ..journal.objects import digest_fd, open_regular
from .errors import TooLarge
from .syscalls import WORKERS, borrowed, fsdecode, rel

if TYPE_CHECKING:
    from .workspace import Workspace

# Timestamps move in ticks of the kernel's coarse clock (a few ms): a file's digest is
# cached only when its last change is older than this (``remember``).
RACY_NS = 50_000_000
# A file this small is read and hashed on the loop: 10 µs for a few KiB here, against
# 120-280 µs for a thread hop (as a small stage is sealed on the loop: SEAL_ON_LOOP).
HASH_ON_LOOP = 8 << 10


def signature(st: os.stat_result) -> tuple[int, int, int]:
    """What changes whenever a file's bytes do (ctime cannot be set by anyone)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Digests:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        # (st_dev, st_ino) -> (stat signature, digest): a file is rehashed only when changed.
        self.cache: dict[tuple[int, int], tuple[tuple[int, int, int], str]] = {}

    def of_fd(self, fd: int, st: os.stat_result | None = None) -> str:
        """The digest of an open file, from the cache when its stat says it is unchanged."""
        st = st or os.fstat(fd)
        return self.cached(st) or self._hash(fd, st)

    def _hash(self, fd: int, st: os.stat_result) -> str:
        """Read and hash the file, and cache its digest under ``st`` (taken before)."""
        digest, _ = digest_fd(fd)
        self.remember(st, digest)
        return digest

    def cached(self, st: os.stat_result) -> str | None:
        hit = self.cache.get((st.st_dev, st.st_ino))
        return hit[1] if hit is not None and hit[0] == signature(st) else None

    def remember(self, st: os.stat_result, digest: str) -> None:
        """Cache a digest under the stat its bytes were read after. Not when the file
        changed within RACY_NS of now: a change in the same timestamp tick as the last one
        leaves (size, mtime, ctime) as they were, and the cache would then vouch for bytes
        the file no longer holds (git calls such entries "racily clean")."""
        if time.time_ns() - st.st_ctime_ns < RACY_NS:
            return
        self.cache[(st.st_dev, st.st_ino)] = (signature(st), digest)
        if len(self.cache) > 200_000:
            self.cache.clear()

    def live(self, path: bytes) -> tuple[str | None, os.stat_result | None]:
        """(digest, stat) of the live file at ``path``; (None, None) when absent, and
        (None, stat) for anything but a regular file, which is not opened
        (``objects.open_regular``). ``beneath.Escape`` if a directory on the path is a
        symlink."""
        try:
            return self.live_at(self.ws.root_fd, rel(path))
        except TooLarge:
            raise TooLarge(errno.EFBIG, "past max_journaled_bytes", fsdecode(path)) from None

    def live_at(self, dir_fd: int, name: bytes) -> tuple[str | None, os.stat_result | None]:
        try:
            fd, st = open_regular(dir_fd, name)
        except FileNotFoundError:
            return None, None
        if fd < 0:
            return None, st
        try:
            if st.st_size > self.ws.policy.max_journaled_bytes:
                # An unjournaled file (passthrough by size): never hashed whole, so that a
                # verb over a sparse file of terabytes costs what a small one does.
                raise TooLarge(errno.EFBIG, "past max_journaled_bytes", fsdecode(name))
            return self.of_fd(fd, st), st
        finally:
            os.close(fd)

    async def of(self, fd: int) -> str:
        """A file's digest: from the cache when its stat is unchanged, else read and
        hashed off the loop, but a small regular file's on it (HASH_ON_LOOP)."""
        st = os.fstat(fd)
        digest = self.cached(st)
        if digest is not None:
            return digest
        if stat.S_ISREG(st.st_mode) and st.st_size <= HASH_ON_LOOP:
            return self._hash(fd, st)
        with borrowed(fd) as (dup,):
            return await trio.to_thread.run_sync(self._hash, dup, st, limiter=WORKERS)
