"""Run sessions: everything a program started by ``rwfs run`` and its descendants write.

A session is opened by the ``rwfs run`` process itself (``session begin`` on ``.rw/ctl``):
that process is the session's *runner*. It makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``) before it starts COMMAND, so every descendant of COMMAND,
even one that calls ``setsid()`` or double-forks to daemonize, stays a descendant of the
runner for as long as the runner lives. A writer belongs to the session when the runner
(its pid *and* its start time, so a reused pid is not mistaken for it) is among its
ancestors. COMMAND keeps the caller's terminal as its controlling terminal (no new Linux
session is made, so a shell under ``rwfs run`` keeps job control).

While a session is open, the daemon tags the ``who`` of each request (``fs.Operations._who``)
with ``session: NAME``; the tag travels into every event that request journals (the
``session`` key of SPEC §7.1's events, absent outside sessions); a batch opened for the
session (scope ``run``: ``rwfs run --batch``, ``--review``) gives every event of its commit
the session's name, whoever made the change (``batch.owner_session``). ``undo NAME``
then replays the inverse of all the events tagged ``NAME`` (``changes.changes_in``) as one
batch of rwfs's own, ``undo-NAME``, which can itself be undone.

The journal holds a ``session`` event when a session begins (its name is ``run-<LSN of that
event>``: unique for the life of the journal) and one when it ends (``state: "ended"``,
with COMMAND's exit status). The set of open sessions lives in the daemon's memory only:
a session does not outlive the mount (``rwfs run`` mounts and unmounts around it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# How many (pid, start time) -> session answers are remembered before the cache is cleared.
_CACHE = 4096
# The longest chain of parents followed (a deeper process is taken as outside any session).
_DEPTH = 128


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process or thread, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold blanks or ")".
    rest = data.rsplit(b")", 1)[-1].split()
    try:
        return int(rest[1]), int(rest[19])  # fields 4 (ppid) and 22 (starttime)
    except (IndexError, ValueError):
        return None


@dataclass
class Session:
    name: str
    pid: int  # the runner
    start: int  # the runner's start time (clock ticks since boot)
    lsn: int  # the LSN of the session's begin event
    opened: str
    uid: int
    info: dict[str, Any] = field(default_factory=dict)  # command, cwd: as the runner said

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runner_pid": self.pid,
            "begin_lsn": self.lsn,
            "opened": self.opened,
            **self.info,
        }


class Sessions:
    """The open sessions of this mount, and which session a writer belongs to."""

    def __init__(self) -> None:
        self.active: dict[str, Session] = {}
        self._known: dict[tuple[int, int], str] = {}  # (pid, start) -> session name or ""

    def tag(self, pid: int) -> dict[str, Any]:
        """``{"session": NAME}`` for a writer (a pid or thread id) inside an open session,
        else ``{}``. No /proc read at all while no session is open."""
        if not self.active:
            return {}
        name = self.member(pid)
        return {"session": name} if name else {}

    def member(self, pid: int) -> str:
        """The open session whose runner is ``pid`` or one of its ancestors, or ""."""
        chain: list[tuple[int, int]] = []
        name = ""
        p = pid
        for _ in range(_DEPTH):
            st = proc_stat(p)
            if st is None:
                break
            key = (p, st[1])
            if key in self._known:
                name = self._known[key]
                break
            chain.append(key)
            found = [s.name for s in self.active.values() if s.pid == p and s.start == st[1]]
            if found:
                name = found[0]
                break
            if p <= 1:
                break
            p = st[0]
        if len(self._known) > _CACHE:
            self._known.clear()
        # Every process on the chain has the same answer: the runner is an ancestor of
        # all of them, or of none.
        for key in chain:
            self._known[key] = name
        return name

    def begin(self, name: str, pid: int, lsn: int, uid: int, info: dict[str, Any]) -> Session:
        st = proc_stat(pid)
        session = Session(
            name,
            pid,
            st[1] if st else -1,
            lsn,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            uid,
            info,
        )
        self.active[name] = session
        self._known.clear()  # the runner itself may have been seen outside any session
        return session

    def end(self, name: str) -> Session | None:
        self._known.clear()
        return self.active.pop(name, None)

    def reap(self) -> None:
        """Forget sessions whose runner is gone (killed before it could end them)."""
        for s in list(self.active.values()):
            st = proc_stat(s.pid)
            if st is None or st[1] != s.start:
                self.end(s.name)
