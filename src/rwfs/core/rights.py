"""The caller's rights (SPEC §3.3b): a verb that a user writes to a control file changes only
files that user could change through the mount without rwfs.

The daemon may run as root, or as the workspace owner on behalf of other users
(``allow_other``); either way it could write what the caller could not. So before a verb
acts on a path for a caller, rwfs asks the question the kernel would ask if the caller made
the change itself, from the tree's own owners and modes: search permission on every
directory on the way, write permission on a file it rewrites, write and search permission
on the directory where it makes or removes a name (and the sticky bit's rule there).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from .. import beneath
from .errors import RwfsError, escaped


def _ids(who: dict[str, Any]) -> tuple[int, set[int]] | None:
    """(uid, group ids) of the caller; None for root or for rwfs itself (no uid)."""
    uid = who.get("uid")
    if uid is None or uid == 0:
        return None
    groups: set[int] = set()
    try:
        with open(f"/proc/{int(who.get('pid') or 0)}/status", "rb") as f:
            for line in f:  # its gids (real, effective, saved, fs) and supplementary groups
                if line.startswith((b"Gid:", b"Groups:")):
                    groups.update(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass  # the caller is gone: only its uid counts
    return int(uid), groups


def _allows(st: os.stat_result, ids: tuple[int, set[int]], want: int) -> bool:
    """The permission bits ``want`` (4 read, 2 write, 1 search) of ``st`` for ``ids``."""
    uid, groups = ids
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid in groups:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def _reach(
    root_fd: int, path: bytes, ids: tuple[int, set[int]]
) -> tuple[os.stat_result, os.stat_result | None] | None:
    """Walk to ``path`` as ``ids`` would: (the directory that holds its last existing
    component, that component's stat, or None where the walk stopped at a missing name);
    None when a directory on the way may not be searched or is not a directory."""
    parts = path.split(b"/")
    here = beneath.stat(root_fd, b"")
    for i in range(len(parts)):
        if not stat.S_ISDIR(here.st_mode) or not _allows(here, ids, 1):
            return None
        try:
            st = beneath.stat(root_fd, b"/".join(parts[: i + 1]))
        except FileNotFoundError:
            return here, None  # the caller would make the name (and what is missing) here
        if i == len(parts) - 1:
            return here, st
        here = st
    return None


def may_change(root_fd: int, path: bytes, who: dict[str, Any], remove: bool = False) -> bool:
    """Whether the caller ``who`` could write ``path`` (make it, if it is absent), or with
    ``remove``, unlink it."""
    ids = _ids(who)
    if ids is None:
        return True
    reached = _reach(root_fd, path, ids)
    if reached is None:
        return False
    here, st = reached
    if st is None:
        return _allows(here, ids, 3)
    if not remove:
        return stat.S_ISREG(st.st_mode) and _allows(st, ids, 2)
    sticky = here.st_mode & stat.S_ISVTX and ids[0] not in (st.st_uid, here.st_uid)
    return _allows(here, ids, 3) and not sticky


def may_read(root_fd: int, path: bytes, who: dict[str, Any]) -> bool:
    """Whether the caller ``who`` could read the file at ``path`` in the tree now."""
    ids = _ids(who)
    if ids is None:
        return True
    reached = _reach(root_fd, path, ids)
    st = reached[1] if reached is not None else None
    return st is not None and stat.S_ISREG(st.st_mode) and _allows(st, ids, 4)


def require(root_fd: int, paths: dict[bytes, bool], who: dict[str, Any]) -> None:
    """Refuse the verb unless the caller could change every path (path -> whether the verb
    removes it): EACCES, or EPERM for a path through a symlink, with nothing done."""
    denied = []
    for path, remove in paths.items():
        try:
            beneath.stat(root_fd, path)  # (for root too: a directory on it is a symlink)
        except beneath.Escape as exc:
            raise escaped(exc) from None
        except OSError:
            pass  # absent, or unreadable: the verb itself settles it
        try:
            if not may_change(root_fd, path, who, remove):
                denied.append(os.fsdecode(path))
        except OSError:
            pass
    if denied:
        raise RwfsError(
            errno.EACCES,
            "policy_violation",
            "permission",
            f"Nothing was done, because you may not write {denied[0]}"
            + (f" (and {len(denied) - 1} more paths)" if len(denied) > 1 else "")
            + ": a verb acts only on files its caller could change; name only paths you may "
            "write, or ask their owner or root.",
            path=denied[0],
            details={"denied": denied[:100]},
        )
