"""The intent log: what rwfs promised before LMDB knows it.

In ``group`` durability, ``close()`` returns as soon as the commit cannot be lost by a crash
of the daemon. That moment is one ``write()`` of a JSON line to this append-only log (page
cache survives the daemon; no sync). The group committer later makes each intent durable in
LMDB. The log is split in generations, ``.rw/intents/<gen>.log``: the committer rotates to a
new generation when it takes a group, and deletes the old file once LMDB has applied it.
``meta.prepared_gen`` / ``meta.applied_gen`` in the store say how far LMDB got, so recovery
knows which records are already journaled (see recovery.py).

Records: ``{"kind": "commit", "id", "path", "stage", "expected", "intended", "size", …}``,
``{"kind": "event", "event": {...}, "incoming": name-or-null}`` followed by ``{"kind": "done"}``
or ``{"kind": "cancel"}`` with the same ``id``, ``{"kind": "event", …, "done": true}`` for
an event recorded after the fact (a noop, a setattr already applied), and ``{"kind":
"digests", "events": {id: {field: value}}}``: the removed bytes of events whose kept file the
group committer moved to its digest name before their records were written.
"""

from __future__ import annotations

import os
from typing import Any

from . import codec


class IntentLog:
    def __init__(self, state_fd: int) -> None:
        try:
            os.mkdir(b"intents", 0o700, dir_fd=state_fd)
        except FileExistsError:
            pass
        self.dir_fd = os.open(b"intents", os.O_RDONLY | os.O_DIRECTORY, dir_fd=state_fd)
        self.gen = 0
        self.fd = -1
        self._torn = False  # the current generation ends with a partial line

    def start(self, applied: int) -> None:
        """Open a new generation for appending (recovery only reads the old ones).

        Numbering continues after ``applied`` (the store's ``applied_gen``): a generation
        numbered at or below it would be taken as already applied and dropped unread.
        """
        gens = self.generations()
        self.gen = max(gens[-1] if gens else 0, applied) + 1
        self.fd = self._open(self.gen)

    def _open(self, gen: int) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        return os.open(f"{gen:016x}.log", flags, 0o600, dir_fd=self.dir_fd)

    def append(self, record: dict[str, Any]) -> None:
        # One line, ASCII (``codec.dumps`` escapes every non-ASCII character and the surrogate
        # escapes of non-UTF-8 path bytes), of any length: a rename of two 4,095-byte paths
        # is about 50 KB. A record is either wholly in the page cache or not a valid line.
        line = codec.dumps(record) + b"\n"
        if self._torn:
            # An earlier append failed part way: its caller was told so. End that partial
            # line, invalid whatever it held ("!" spoils even a complete record), so that it
            # neither counts nor swallows this record.
            line = b"!\n" + line
        done = 0
        try:
            while done < len(line):  # a regular file writes short only when (nearly) full
                done += os.write(self.fd, line[done:])
        finally:
            if done == len(line):
                self._torn = False
            elif done:
                self._torn = True

    def append_to(self, gen: int, record: dict[str, Any]) -> None:
        """Append to a generation already rotated out (the committer's thread, while it
        applies that generation's group)."""
        fd = self._open(gen)
        try:
            os.write(fd, codec.dumps(record) + b"\n")
        finally:
            os.close(fd)

    def rotate(self) -> int:
        """Start a new generation; returns the one just closed."""
        old, oldfd = self.gen, self.fd
        self.gen += 1
        self.fd = self._open(self.gen)
        self._torn = False
        os.close(oldfd)
        return old

    def drop(self, gen: int) -> None:
        try:
            os.unlink(f"{gen:016x}.log", dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass

    def generations(self) -> list[int]:
        out = []
        for name in os.listdir(self.dir_fd):
            stem, _, ext = name.partition(".")
            if ext == "log":
                try:
                    out.append(int(stem, 16))
                except ValueError:
                    continue
        return sorted(out)

    def records(self, gen: int) -> list[dict[str, Any]]:
        """The complete records of a generation (a torn last line is ignored)."""
        fd = os.open(f"{gen:016x}.log", os.O_RDONLY, dir_fd=self.dir_fd)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
        finally:
            os.close(fd)
        out = []
        for line in data.split(b"\n"):
            try:
                out.append(codec.loads(line))
            except ValueError:
                continue
        return out

    def settled(self, gen: int) -> bool:
        """Whether a generation owes nothing: it holds only operations announced and then
        cancelled (a rename that failed), which recovery skips."""
        announced: set[Any] = set()
        for r in self.records(gen):
            kind = r.get("kind") if isinstance(r, dict) else None
            if kind == "event" and not r.get("done"):
                announced.add(r.get("id"))
            elif kind == "cancel":
                announced.discard(r.get("id"))
            else:
                return False
        return not announced

    def commits_after(self, applied: int) -> int:
        """How many commit records the generations after ``applied`` hold: commits
        acknowledged to their writers that the journal has not recorded, which the next
        mount's recovery finishes (``rwfs umount`` and ``rwfs status`` report them)."""
        return sum(
            1
            for gen in self.generations()
            if gen > applied
            for r in self.records(gen)
            if isinstance(r, dict) and r.get("kind") == "commit"
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        os.close(self.dir_fd)
