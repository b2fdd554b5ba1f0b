"""Allowances: a deliberate change let through the gates, once (``rwfs allow PATH``).

A gate cannot tell a deliberate big change (dropping most of a test file, keeping its first
100 lines, removing deprecated code) from a write cut short or elided by accident. An
allowance is a writer's word that its next write of one file is deliberate. ``allow PATH``
written to ``.rw/ctl`` (``rwfs allow PATH``) grants one to the caller's uid; the next
commit of PATH by a process of that uid that changes its bytes uses it up, whatever the
gates find:

- a write (its commit at ``close()``/``fsync()``), the rename of a temporary onto PATH, a
  chunk session's ``compose``, or that user's draft of PATH in a batch (at the write into
  the batch, and again at the batch's ``commit``: the allowance goes with the batch's
  change of PATH);
- the gates in ``WAIVES`` do not refuse it; what they found is journaled in the event's
  ``allowed`` record (``waived``), with the grant's LSN and who granted it;
- never the ``secrets`` gate: a secret in a file is not a broken file but a leak, the
  policy that refuses it is the workspace owner's (``policy.toml``, which only the owner
  changes), and an agent told "allow and write again" at every refusal must not be able to
  wave a key into the tree. A write the secrets gate refuses leaves the allowance unused.

One user's allowance never lets another user's write through: allowances are keyed by
(uid, path), and the writer's uid is the one each FUSE request carries. An allowance lasts
until it is used, cancelled (``allow --cancel PATH``), ``ALLOW_S`` seconds have passed, or
the mount ends: it lives in this daemon's memory only (its grant is journaled, as an
``op: "allow"`` event). A write it let through that then fails for another reason (a stale
write's conflict, a journal that cannot commit, a rename that fails) gives it back.

Nothing here blocks or does I/O; a batch's dry run reads allowances from a worker thread,
so every access holds ``Allowances.lock``.
"""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .findings import Finding

# The gates an allowance waives: those that judge whether a file was broken. Not "secrets".
WAIVES = ("truncation", "elision", "stub", "duplication", "syntax", "cannot_judge")
# How long an unused allowance lasts (seconds): long enough for an agent to think and write
# again, short enough that a forgotten one does not let an accident through hours later.
ALLOW_S = 600.0
# Allowances open at once per user (each names a path: memory stays bounded).
PER_USER = 256


@dataclass(eq=False)
class Allowance:
    path: bytes
    uid: int
    lsn: int  # the grant's event
    granted: str  # RFC 3339 UTC
    expires: str
    deadline: float  # time.monotonic() when it expires
    by: dict[str, Any] = field(default_factory=dict)  # the granter: pid, comm, uid
    waived: list[dict[str, Any]] = field(default_factory=list)  # set when it is used

    def view(self) -> dict[str, Any]:
        """What ``.rw/allowed`` shows of it."""
        return {
            "path": self.path.decode("utf-8", "surrogateescape"),
            "uid": self.uid,
            "lsn": self.lsn or None,
            "granted": self.granted,
            "expires": self.expires,
            "pid": self.by.get("pid"),
            "comm": self.by.get("comm"),
            "waives": list(WAIVES),
        }

    def record(self) -> dict[str, Any]:
        """The ``allowed`` record of the event of the write it let through."""
        return {
            "lsn": self.lsn or None,
            "uid": self.uid,
            "pid": self.by.get("pid"),
            "comm": self.by.get("comm"),
            "granted": self.granted,
            "waived": self.waived,
        }


def waivable(findings: list[Finding]) -> bool:
    """Whether an allowance could let a write with these findings through: every gate that
    refuses it is one an allowance waives."""
    return all(f.gate in WAIVES for f in findings if f.action == "reject")


def waive(findings: list[Finding], allowance: Allowance) -> list[Finding]:
    """The findings left once ``allowance`` waived what it may (every refusal, when
    ``waivable``); the waived ones are recorded in ``allowance.waived``."""
    kept = []
    for f in findings:
        if f.action == "reject" and f.gate in WAIVES:
            allowance.waived.append({"gate": f.gate, "message": f.message, **f.details})
        else:
            kept.append(f)
    return kept


class Allowances:
    """The allowances open in this mount, by (uid, path)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._by: dict[tuple[int, bytes], Allowance] = {}

    def _expire(self) -> None:  # (lock held)
        now = time.monotonic()
        for key in [k for k, a in self._by.items() if a.deadline <= now]:
            del self._by[key]

    def room(self, uid: int, paths: list[bytes]) -> bool:
        """Whether ``uid`` may hold allowances of ``paths`` too (``PER_USER``)."""
        with self.lock:
            self._expire()
            held = {p for u, p in self._by if u == uid}
            return len(held | set(paths)) <= PER_USER

    def grant(self, allowance: Allowance) -> None:
        """Open (or renew) the allowance of its (uid, path)."""
        with self.lock:
            self._by[(allowance.uid, allowance.path)] = allowance

    def cancel(self, uid: int, path: bytes) -> Allowance | None:
        with self.lock:
            self._expire()
            return self._by.pop((uid, path), None)

    def peek(self, uid: int, path: bytes) -> Allowance | None:
        with self.lock:
            self._expire()
            return self._by.get((uid, path))

    def take(self, uid: int, path: bytes) -> Allowance | None:
        """Use up ``uid``'s allowance of ``path``: None if it has none."""
        with self.lock:
            self._expire()
            return self._by.pop((uid, path), None)

    def give_back(self, allowance: Allowance) -> None:
        """An allowance used by a write that then failed: open again, unless a newer one
        of the same (uid, path) was granted meanwhile."""
        allowance.waived = []
        with self.lock:
            self._by.setdefault((allowance.uid, allowance.path), allowance)

    def views(self) -> list[dict[str, Any]]:
        with self.lock:
            self._expire()
            found = sorted(self._by.values(), key=lambda a: (a.path, a.uid))
            return [a.view() for a in found]


def writer_uid(who: dict[str, Any]) -> int | None:
    """The uid of a writer (a FUSE request's caller); None for rwfs's own writes."""
    uid = who.get("uid")
    return int(uid) if uid is not None else None


def allow_hint(name: str, draft: str, mountpoint: str | None) -> dict[str, str]:
    """How a refusal the gates in ``WAIVES`` made can be let through on purpose: the
    command (``rwfs allow``, with the file's absolute path when the mount point is known,
    so that it works from any directory), the same verb for ``.rw/ctl``, and a command that
    writes the refused draft (``draft``: ``.rw/rejected/ID``) over the file."""
    plain = "./" + name if name.startswith("-") else name  # (not read as an option)
    ctl = "allow " + shlex.quote(plain)
    if mountpoint is None:
        where, shown = shlex.quote(plain), shlex.quote(draft)
    else:
        top = mountpoint.rstrip("/")
        where, shown = shlex.quote(f"{top}/{name}"), shlex.quote(f"{top}/{draft}")
    return {"command": f"rwfs allow {where}", "ctl": ctl, "then": f"cp {shown} {where}"}
