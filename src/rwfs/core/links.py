"""Hard links: the other names of a file that a commit in place changes too, found in the
tree (its directories first, a walk of the whole tree when the link count says more)."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from .. import beneath
from .syscalls import fsdecode

if TYPE_CHECKING:
    from .commits import Commit
    from .workspace import Workspace


class Links:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        # Each file's names last found, and the link count at which the whole tree was
        # last walked for them (``other_names``).
        self._links_seen: dict[tuple[int, int], set[bytes]] = {}
        self._walked: dict[tuple[int, int], int] = {}

    def landed(self, c: Commit, st: os.stat_result | None) -> None:
        """A commit whose bytes a hard-linked file already holds (a copy into it that a
        crash interrupted after it was done): its other names are journaled with it."""
        if c.intended is not None and st is not None and self.hard_linked(st, c.stage.expected):
            c.info["links"] = self.journaled(c, st)

    def linked(self, commits: list[Commit]) -> set[str]:
        """The commits whose file is hard-linked now: ``Landing.replace`` will write them in
        place, and their receipts say so, for recovery."""
        out = set()
        for c in commits:
            try:
                st = beneath.stat(self.ws.root_fd, c.path)
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and not c.info.get("replace")
                and self.hard_linked(st, c.stage.expected)
            ):
                out.add(c.id)
        return out

    def hard_linked(self, st: os.stat_result, kept: str | None) -> bool:
        """Whether other names share the file: not just the link rwfs made itself when it
        kept the file's bytes as object ``kept`` (``Landing.replace``; a crash before the rename
        leaves it for recovery). An object is never changed in place."""
        if st.st_nlink == 1:
            return False
        if st.st_nlink == 2 and kept is not None:
            try:
                fd = self.ws.objects.open(kept)
            except OSError:
                return True
            try:
                obj = os.fstat(fd)
            finally:
                os.close(fd)
            return (obj.st_dev, obj.st_ino) != (st.st_dev, st.st_ino)
        return True

    def journaled(self, c: Commit, st: os.stat_result) -> list[str]:
        """The other names a commit in place changes, that the journal follows: not the
        passthrough ones, whose removal or change it never hears of (the path index would
        go on claiming their bytes). The names are the tree's as the commit lands, which are
        the names at its place in the journal: nothing that moves a name of a hard-linked
        file is done while its commit is queued (``Renames.rename`` waits for it)."""
        names = self.other_names(c.path, st, c.aliases)
        return [fsdecode(p) for p in names if not self.ws.policy.is_passthrough(p)]

    def other_names(
        self, path: bytes, st: os.stat_result, hints: tuple[bytes, ...] = ()
    ) -> list[bytes]:
        """The workspace's other names of the file at ``path`` (hard links): looked for in
        the directories of ``path`` and of ``hints`` first, then, if the link count says
        some are still missing, in the whole tree, once per file and link count, and again
        when a name found before has moved (a name outside the workspace is never found:
        the walk is not made again for it)."""
        key, want = (st.st_dev, st.st_ino), st.st_nlink - 1
        seen = self._links_seen.get(key, set())
        found = set(seen)
        for d in {p.rpartition(b"/")[0] for p in (path, *hints)}:
            found |= self._scan(d, st)
        found = {p for p in found if p != path and self._same(p, st)}
        # A name found before that no longer names the file moved (a rename of it or of
        # a directory above it: the link count stays) or went: walk again for it.
        moved = any(p != path and p not in found for p in seen)
        if len(found) < want and (moved or self._walked.get(key) != st.st_nlink):
            found |= {p for p in self._walk(b"", st) if p != path}
            self._walked[key] = st.st_nlink
        self._links_seen[key] = found | {path}
        if len(self._links_seen) > 10_000:
            self._links_seen.clear()
            self._walked.clear()
        return sorted(found)

    def _same(self, path: bytes, st: os.stat_result) -> bool:
        try:
            got = beneath.stat(self.ws.root_fd, path)
        except OSError:
            return False
        return (got.st_dev, got.st_ino) == (st.st_dev, st.st_ino)

    def _entries(self, d: bytes) -> list[tuple[bytes, os.DirEntry[str]]]:
        """The entries of directory ``d`` of the tree, with their paths (none if it is
        gone or not a directory)."""
        try:
            dfd = beneath.opendir(self.ws.root_fd, d)
        except OSError:
            return []
        try:
            with os.scandir(dfd) as it:
                return [
                    (d + b"/" + os.fsencode(e.name) if d else os.fsencode(e.name), e) for e in it
                ]
        finally:
            os.close(dfd)

    def _scan(self, d: bytes, st: os.stat_result) -> set[bytes]:
        """The names in directory ``d`` of the file ``st`` (by the entries' inode numbers)."""
        return {p for p, e in self._entries(d) if e.inode() == st.st_ino}

    def _walk(self, top: bytes, st: os.stat_result) -> set[bytes]:
        """``_scan`` of every directory below ``top`` (the state directory excepted)."""
        found: set[bytes] = set()
        todo = [top]
        while todo:
            for p, e in self._entries(todo.pop()):
                if p == b".rw":
                    continue
                if e.is_dir(follow_symlinks=False):
                    todo.append(p)
                elif e.inode() == st.st_ino and self._same(p, st):
                    found.add(p)
        return found
