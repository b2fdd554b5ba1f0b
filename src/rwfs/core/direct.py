"""Which opens need no rwfs decision: the one test, and what it forbids while they last.

An open file whose every read and write rwfs would pass to the backing file unchanged can
be handed to the kernel (FUSE passthrough: fs.py, kernelflags): its reads, writes and
mappings then reach neither Python nor the daemon. That is safe only while nothing rwfs
decides could apply to it, and the kernel cannot take a passthrough open back. So:

- ``undecided(files, inode, st)`` is the test, at each open: a regular file, every name
  of which is known and passthrough by policy (written in place, never journaled: no
  stage, gate, digest or history), with no stage or queued commit, not an open batch's,
  not removed. A file with a name rwfs has not seen (a hard link not looked up) fails it.
- While such opens last (``Inode.direct``; ``Files.passed``), the file must keep only
  passthrough names: ``journaled_name`` finds the name a rename, a link or a new policy
  would journal, which is refused for it (EBUSY), since a journaled name's writes must
  reach a stage.

The kernel's own rule (Linux's fs/fuse/iomode.c) is that while one open of an inode is
passed through, every other open of it must be, with the same backing file, and none may
be while an open that is not lasts: ``mode`` says which an open must be.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import RwfsError
from .syscalls import fsdecode

if TYPE_CHECKING:
    from .files import Files
    from .inodes import Inode


def undecided(files: Files, inode: Inode, st: os.stat_result) -> bool:
    """Whether rwfs has nothing to decide about any read or write of this open file."""
    if inode.is_dir or inode.virtual or inode.unlinked or not inode.paths:
        return False
    if inode.stage is not None or inode.pending is not None or files.held(inode) is not None:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != len(inode.paths):
        return False
    return not any(files.journaled(p) or p in files.hidden for p in inode.paths)


def mode(files: Files, inode: Inode, st: os.stat_result, others: int) -> bool | None:
    """True: this open must be passed through (the inode's others are); False: it must
    not be (``others``, the inode's other open handles, are not); None: either."""
    if inode.direct:
        return True
    if others:
        return False
    return None if undecided(files, inode, st) else False


def journaled_name(
    files: Files,
    src: bytes,
    dst: bytes | None,
    exchange: bool = False,
    journaled: Callable[[bytes], bool] | None = None,
) -> bytes | None:
    """The first journaled name that a rename of ``src`` to ``dst`` (a directory's moves
    its files), or a link of ``src`` at ``dst``, would give a file that has passed-through
    opens; None if none would. ``dst`` None: the names stay, and ``journaled`` (a new
    policy's) says which are journaled."""
    journaled = journaled or files.journaled
    files.let_go()  # (a release already answered must not refuse this)
    for inode in files.passed.values():
        for p in inode.paths:
            new = p
            if dst is not None and (p == src or p.startswith(src + b"/")):
                new = dst + p[len(src) :]
            elif dst is not None and exchange and (p == dst or p.startswith(dst + b"/")):
                new = src + p[len(dst) :]
            elif dst is not None:
                continue
            if journaled(new):
                return new
    return None


def keep_passthrough_names(
    files: Files,
    src: bytes,
    dst: bytes | None,
    what: str,
    exchange: bool = False,
    journaled: Callable[[bytes], bool] | None = None,
) -> None:
    """Refuse (EBUSY, and nothing changes) the rename, link or policy that
    ``journaled_name`` finds would journal a file whose open is passed through."""
    name = journaled_name(files, src, dst, exchange, journaled)
    if name is None:
        return
    raise RwfsError(
        errno.EBUSY,
        "policy_violation",
        "passthrough_open",
        f"The {what} was refused and nothing changed: it would make {fsdecode(name)} a "
        "journaled name while that file is open with its reads and writes passed to the "
        f"kernel; close the file (or wait for the program using it), then retry the {what}.",
        path=fsdecode(name),
        suggested_action="close the open file, then retry",
    )
