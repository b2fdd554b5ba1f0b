"""The errors the core raises to a writer: an errno with a SPEC §7.2 envelope, and the
envelopes several modules build."""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Any

from .. import beneath
from .syscalls import fsdecode

if TYPE_CHECKING:
    from .commits import Commit


class RwfsError(Exception):
    """A refusal or failure with an errno and a SPEC §7.2 envelope."""

    def __init__(
        self, errno_: int, error: str, reason_hint: str, message: str, **extra: Any
    ) -> None:
        super().__init__(message)
        self.errno = errno_
        self.envelope = {
            "ok": False,
            "error": error,
            "reason_hint": reason_hint,
            "errno": errno.errorcode.get(errno_, str(errno_)),
            "message": message,
            **extra,
        }


def journal_unavailable(path: bytes, why: str) -> RwfsError:
    return RwfsError(
        errno.EIO,
        "journal_unavailable",
        "journal",
        f"The journal could not record this write ({why}), so nothing was written and "
        "the file is unchanged; free space in the workspace's filesystem and retry.",
        path=fsdecode(path),
        suggested_action="free disk space, then retry the write",
    )


def conflict_error(c: Commit) -> RwfsError:
    """ESTALE for a writer whose commit met a version of the file it did not expect."""
    where = f".rw/conflicts/{c.info['conflict']}/" if c.info.get("conflict") else ".rw/conflicts/"
    return RwfsError(
        errno.ESTALE,
        "stale_precondition",
        "conflict",
        f"{fsdecode(c.path)} changed outside this write before it was committed, so rwfs kept "
        f"that version and did not write yours; your bytes and a merge are in {where}: read "
        "the file again and re-apply your edit, or settle the conflict there.",
        path=fsdecode(c.path),
        expected=c.stage.expected,
        intended=c.intended,
        actual=c.info.get("actual"),
        batch=c.batch,
        lsn=c.lsn or None,
    )


class TooLarge(OSError):
    """The live file is past ``max_journaled_bytes``: rwfs does not hash it."""


def too_large(path: bytes, limit: int) -> RwfsError:
    return RwfsError(
        errno.EFBIG,
        "quota_exceeded",
        "max_journaled_bytes",
        f"{fsdecode(path)} is past max_journaled_bytes ({limit} bytes): it is not journaled, "
        "and rwfs does not read all of it to compare it with the journal, so nothing was "
        "changed. Remove it, or truncate it under the limit, and try again.",
        path=fsdecode(path),
    )


def escaped(exc: beneath.Escape) -> RwfsError:
    """The envelope of a path that meets a symlink or leaves the workspace (a verb's)."""
    return RwfsError(
        errno.EPERM,
        "policy_violation",
        "symlink",
        f"A directory on the path {exc.filename} is a symlink (or the path leaves the "
        "workspace), and rwfs follows no symlink in a path it resolves itself; nothing was "
        "changed. Name the file by the path of its real directory, or move the symlink away.",
        path=str(exc.filename or ""),
    )


def type_swap(path: bytes) -> RwfsError:
    return RwfsError(
        errno.EPERM,
        "policy_violation",
        "symlink",
        "The path, or a directory on it, became a symlink or another kind of file before the "
        "commit, so rwfs did not write through it; the path is unchanged and your bytes are "
        "kept as an object.",
        path=fsdecode(path),
    )


def refused(code: int) -> OSError:
    # The FUSE layer answers an OSError with its errno (fs._guard).
    return OSError(code, os.strerror(code))
