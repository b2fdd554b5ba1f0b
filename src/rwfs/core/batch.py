"""A batch (SPEC §6.1): its states, its LMDB record (store.py documents the fields), its
name's rules, the writer it remembers, and the envelope of a batch verb's refusal."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

import trio

from ..journal.store import now_iso, plain_name
from .commits import Commit
from .errors import RwfsError

OPEN, COMMITTING, COMMITTED = "open", "committing", "committed"
ABORTED, INTERRUPTED, CONFLICTED = "aborted", "interrupted", "conflicted"


def batch_error(
    message: str, batch: str | None, errno_: int = errno.EINVAL, **extra: Any
) -> RwfsError:
    error, hint = {
        errno.ESTALE: ("stale_precondition", "conflict"),
        errno.EACCES: ("policy_violation", "permission"),
        errno.EBADMSG: ("blocked", "gate"),
        errno.EIO: ("journal_unavailable", "io"),
    }.get(errno_, ("policy_violation", "verb"))
    where = extra.pop("where", None) or (f".rw/batches/{batch}/ctl" if batch else ".rw/batches")
    return RwfsError(
        errno_,
        extra.pop("error", None) or error,  # (a reason may name none: its errno's)
        extra.pop("hint", None) or hint,
        message,
        path=where,
        batch=batch,
        **extra,
    )


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # the process is gone
        return None


# What a batch's entry remembers of the writer of its latest change, and what the events of
# the batch's commit then carry (SPEC §7.1's pid, comm, uid; the run session's name).
WRITER_KEYS = ("pid", "comm", "uid", "session")


def writer_of(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in WRITER_KEYS if info.get(k) is not None}


def owner_session(batch: Batch) -> str | None:
    """The run session a batch of scope ``run`` was opened for (``rwfs run --batch`` and
    ``--review``), else None: every change such a batch commits is that session's."""
    scope = batch.record.get("scope") or {}
    return str(scope["session"]) if scope.get("kind") == "run" and scope.get("session") else None


def is_explicit(receipt: dict[str, Any]) -> bool:
    """Does a receipt belong to an explicit batch (not a batch of one)?"""
    batch = receipt.get("batch")
    return bool(batch) and not str(batch).startswith("auto-")


def check_name(raw: bytes) -> str:
    """A batch name as SPEC §6.1 allows it, or EINVAL saying why."""
    name = plain_name(raw)
    if name is None or name.startswith("auto-"):
        shown = raw.decode("utf-8", "replace")[:40] + ("…" if len(raw) > 40 else "")
        raise batch_error(
            f"No batch was opened because {shown!r} is not a batch name: use 1 to 64 letters, "
            "digits, dots, dashes or underscores, not starting with a dash or 'auto-'.",
            None,
        )
    return name


def new_record(
    name: str, state: str, who: dict[str, Any], scope: str, entries: dict[str, Any]
) -> dict[str, Any]:
    """A new batch's LMDB record (store.py documents its fields)."""
    return {
        "name": name,
        "state": state,
        "opened": now_iso(),
        "opened_by": who,
        "scope": {"kind": scope},
        "entries": entries,
        "reasons": [],
        "noticed": False,
    }


@dataclass(eq=False)
class Batch:
    record: dict[str, Any]
    held: dict[bytes, Commit] = field(default_factory=dict)  # drafts this mount holds
    lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def name(self) -> str:
        return str(self.record["name"])

    @property
    def state(self) -> str:
        return str(self.record["state"])
