"""Conflicts (SPEC §6.3): a commit met a version of its file it did not expect.

rwfs never overwrites such a version by itself. The conflict is a record in the journal
(``store.py``: ``conflicts``) with the digests of the three versions: ``base`` (what the
writer started from), ``intended`` (its bytes, kept as an object) and ``actual`` (what the
file holds). ``merged`` is git's three-way merge of them. A verb settles it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
from typing import Any

import trio

from ..core import rights
from ..core.commits import Commit
from ..core.errors import RwfsError, conflict_error
from ..core.syscalls import WORKERS
from ..core.workspace import Workspace
from ..journal.objects import open_regular

VERBS = ("keep-actual", "take-intended", "resolved")


def object_bytes(ws: Workspace, digest: str | None) -> bytes:
    """An object's bytes; empty for an absent file, or bytes rwfs did not keep."""
    if digest is None or not ws.objects.exists(digest):
        return b""
    fd = ws.objects.open(digest)
    try:
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def live_bytes(ws: Workspace, path: str) -> bytes:
    """A regular file's bytes as they are now; empty for anything else. Opened without
    blocking: a FIFO (in a snapshot's tree/, say) must not hold a worker thread until a
    writer comes, and a device node is never read."""
    try:
        fd, st = open_regular(ws.root_fd, path)  # (beneath the root, never a FIFO's)
    except OSError:
        return b""
    if fd < 0:
        return b""
    try:  # (a file past max_journaled_bytes is not read whole either: it shows empty)
        return os.pread(fd, st.st_size, 0) if st.st_size <= ws.policy.max_journaled_bytes else b""
    finally:
        os.close(fd)


def actual_bytes(ws: Workspace, info: dict[str, Any]) -> bytes:
    """The version the conflicting write met: its object if one is kept (a stale write
    keeps what the mount showed, which the tree may never have held: a batch's draft, a
    commit still queued), else the live file."""
    if info.get("actual") and ws.objects.exists(info["actual"]):
        return object_bytes(ws, info["actual"])
    return live_bytes(ws, info["path"])


def merged(ws: Workspace, info: dict[str, Any]) -> bytes:
    """A three-way merge of actual and intended from their base, by ``git merge-file``:
    the agreed changes merged, conflict markers where the two disagree."""
    texts = {
        "actual": actual_bytes(ws, info),
        "base": object_bytes(ws, info["expected"]),
        "intended": object_bytes(ws, info["intended"]),
    }
    if any(b"\0" in t for t in texts.values()):
        return b"(binary files: no merge; compare actual and intended)\n"
    with tempfile.TemporaryDirectory(prefix="rwfs-merge-") as tmp:
        names = []
        for label, data in texts.items():
            name = os.path.join(tmp, label)
            # A named mode: the daemon runs with umask 0 (mount.py).
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                f.write(data)
            names.append(name)
        try:
            got = subprocess.run(
                ["git", "merge-file", "-p", "-L", "actual", "-L", "base", "-L", "intended", *names],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            got = None
    if got is None or got.returncode < 0 or got.returncode > 127:
        return (
            b"<<<<<<< actual\n"
            + texts["actual"]
            + b"=======\n"
            + texts["intended"]
            + b">>>>>>> intended\n"
        )
    return got.stdout


async def resolve(ws: Workspace, cid: int, verb: str, who: dict[str, Any]) -> None:
    """Settle a conflict: ``keep-actual`` and ``resolved`` write nothing; ``take-intended``
    commits the intended bytes over the file, if it still holds the actual ones."""
    info = ws.store.conflict(cid)
    where = f".rw/conflicts/{cid}/ctl"
    if info is None or info["state"] != "open":
        raise RwfsError(
            errno.EINVAL,
            "policy_violation",
            "verb",
            f"Conflict {cid} is not open (it was resolved already), so nothing was done.",
            path=where,
        )
    if verb == "take-intended" and info["intended"] is None:
        raise RwfsError(
            errno.EINVAL,
            "policy_violation",
            "verb",
            f"The intended change to {info['path']} was its deletion: delete the file "
            "yourself if you want that, then write 'resolved'; nothing was done.",
            path=where,
        )
    path = os.fsencode(info["path"])
    rights.require(ws.root_fd, {path: False}, who)  # settling it is the file's writers'
    if verb == "take-intended":
        await _take_intended(ws, info)
    # The file's bytes now are the ones the journal accepts for it (the other version's,
    # the intended ones, or a merge made by hand).
    now = (await trio.to_thread.run_sync(ws.digests.live, path, limiter=WORKERS))[0]

    def settle(txn: Any) -> None:
        txn.put_conflict({**info, "state": "resolved", "resolution": verb})
        lsn = txn.append_event(
            {
                "op": "resolve",
                "path": info["path"],
                "batch": info.get("batch"),
                "conflict": cid,
                "resolution": verb,
                "intended": now,
                **who,
            }
        )
        txn.set_path(path, now, lsn)

    await trio.to_thread.run_sync(ws.store.write, settle, limiter=WORKERS)


async def _take_intended(ws: Workspace, info: dict[str, Any]) -> None:
    path = os.fsencode(info["path"])
    await ws.committer.sync()  # the actual bytes may be a commit still queued: the tree first

    def stage() -> Any:
        live, _ = ws.digests.live(path)
        if live != info["actual"]:
            return None
        fd = ws.objects.open(info["intended"])
        try:
            s = ws.stages.make(fd, truncate=False)
        finally:
            os.close(fd)
        s.expected = info["actual"]
        return s

    s = await trio.to_thread.run_sync(stage, limiter=WORKERS)
    if s is None:
        raise RwfsError(
            errno.ESTALE,
            "stale_precondition",
            "conflict",
            f"{info['path']} changed again since the conflict was recorded, so the intended "
            "bytes were not written; read .rw/conflicts/"
            f"{info['id']}/actual and merged again and decide anew.",
            path=info["path"],
        )
    size = os.fstat(s.fd).st_size
    c = Commit(path, s, info["intended"], size, {"resolution": "take-intended"})
    await ws.committer.submit(c, wait=True)
    if c.outcome not in ("committed", "landed"):
        raise conflict_error(c)
