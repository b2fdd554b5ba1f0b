"""The core's root: a workspace's backing tree, its state directory, and the parts that
act on them (SPEC §3). Nothing in core/ knows about FUSE.

The tree is reached only through ``root_fd`` with ``*at()`` calls and no-follow flags;
paths are bytes relative to the workspace root (``b""`` is the root itself). Each part
is a module of its own and holds the workspace (``ws``) to reach the others:

- ``digests``: live files' digests, cached by stat (digests.py);
- ``stages``: a writer's private copy until its commit point (stages.py);
- ``gating``: where the gates run and allowances waive (gating.py);
- ``refusals``: a refused write, a lost update refused as a conflict (refusals.py);
- ``links``: a hard-linked file's other names (links.py);
- ``committer``: the queue, group commits, the intent log, unmount (committer.py),
  whose groups ``landing`` applies to the tree in a worker thread (landing.py);
- ``journal``: whether the journal commits, and what a writer is told when not
  (health.py).

Concurrency (trio): handlers interleave only at ``await``. Blocking work — hashing, copies,
fsync, LMDB commits, renames of a group — runs in worker threads. Invariants that rely on
"no await here" are marked ``# atomic:`` where they occur.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from .. import beneath
from ..checks.allowances import Allowances
from ..journal.objects import ObjectStore, Reserve
from ..journal.store import Store
from ..policy import Policy
from .committer import Committer
from .digests import Digests
from .gating import Gating
from .health import JournalHealth
from .landing import Landing
from .links import Links
from .refusals import Refusals
from .stages import Stages
from .stats import Stats
from .syscalls import WORKERS


class Workspace:
    def __init__(self, root_fd: int, state_fd: int, store: Store, policy: Policy) -> None:
        self.root_fd = root_fd
        self.state_fd = state_fd
        self.store = store
        self.policy = policy
        # Where the mount shows the workspace (the daemon sets it): paths an envelope gives
        # a writer to open resolve from any directory through it.
        self.mountpoint: str | None = None
        self.objects = ObjectStore(state_fd)
        self.reserve = Reserve(state_fd)
        self.reserve.make()
        try:
            os.mkdir(b"staging", 0o700, dir_fd=state_fd)
        except FileExistsError:
            pass
        self.staging_fd = os.open(b"staging", os.O_RDONLY | os.O_DIRECTORY, dir_fd=state_fd)
        self.allowances = Allowances()  # deliberate changes, let through once (allowances.py)
        self.stats = Stats()
        self.recovery_left: list[str] = []  # what recovery at this mount left unsettled
        self.on_gone: Callable[[bytes], None] = lambda path: None  # rwfs removed a path
        self.digests = Digests(self)
        self.stages = Stages(self)
        self.gating = Gating(self)
        self.refusals = Refusals(self)
        self.links = Links(self)
        self.journal = JournalHealth(self)
        self.committer = Committer(self)
        self.landing = Landing(self)

    async def keep_removed(self, path: bytes, st: os.stat_result) -> bytes:
        """Keep the bytes of the file at ``path`` before an unlink or a rename removes
        that name: its inode goes into ``objects/incoming`` (hashed with the group), or,
        for a hard-linked file whose other names go on changing it in place, a copy made
        in a worker thread. Returns the incoming name."""
        if st.st_nlink == 1:
            with beneath.parent(self.root_fd, path) as (d, name):
                return self.objects.adopt(d, name)

        def copy() -> bytes:
            with beneath.parent(self.root_fd, path) as (d, name):
                return self.objects.adopt_copy(d, name)

        return await trio.to_thread.run_sync(copy, limiter=WORKERS)
