"""Named fault points for crash tests.

``RWFS_FAULT=NAME`` makes the daemon kill itself with SIGKILL the first time it reaches the
point ``NAME`` (``RWFS_FAULT=NAME:N`` on the N-th time). Points are named after the step of
the commit protocol they follow (docs/recovery.md lists them). Unset, a point costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_seal",  # stage sealed and intent logged; close() may have returned
    "after_stage_sync",  # the group's stages are durable
    "after_prepare",  # receipts are durable in LMDB, nothing renamed yet
    "after_preimage",  # the old inode is kept as an object, stage not yet renamed
    "after_rename",  # one stage renamed over its target
    "in_place_copied",  # a hard-linked file's new bytes copied over its old, not yet cut
    "before_commit_record",  # every rename of the group done, commit records not written
    "after_commit_record",  # commit records durable, intent log not yet dropped
    "after_unlink",  # a journaled unlink reached the tree, its event not yet recorded
    "after_namespace_op",  # any journaled namespace operation reached the tree, no "done" yet
    # An explicit batch's commit (batches.py):
    "batch_after_dry_run",  # every path checked, nothing prepared
    "batch_after_prepare",  # every receipt durable, nothing renamed
    "batch_after_rename",  # one more path replaced (":N" stops after the N-th)
    "batch_before_commit_record",  # every path replaced, no commit record
    "batch_after_commit_record",  # every commit record durable
)

_armed: dict[str, int] = {}


def arm() -> None:
    """Read ``RWFS_FAULT`` (the daemon calls this at start; other commands never do)."""
    spec = os.environ.get("RWFS_FAULT", "")
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name not in POINTS or not (count or "1").isdigit():
        raise ValueError(f"RWFS_FAULT={spec!r} names no fault point; known: {', '.join(POINTS)}")
    _armed[name] = int(count or 1)


def point(name: str) -> None:
    """Die here, abruptly, if this fault point is armed and its count is reached."""
    if name in _armed:
        _armed[name] -= 1
        if _armed[name] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
