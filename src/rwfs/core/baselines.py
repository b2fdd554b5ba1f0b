"""What a write is judged against when its file's own bytes were just removed or cut: a
removal is remembered for a while (``path_removed``), and a new file made there by the
same user is gated as a save of the removed one (``recreated``); a commit that is an
explicit truncation alone is remembered too (``cuts``, ``keep_cut``), and the same
user's next write of the file (or a rename onto it) is gated against the bytes from before
it (``cut_before``). A refusal of either puts those bytes back (``put_back``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ..journal.objects import EMPTY_DIGEST, copy_fd
from .commits import Commit
from .errors import RwfsError
from .inodes import Inode, nlink
from .stages import Stage
from .syscalls import WORKERS, borrowed, copy_metadata

if TYPE_CHECKING:
    from .files import Files

# A new file made where the same user removed a journaled file this many seconds before is
# a save of that file (``recreated``); at most REMOVED_MAX removals are remembered. The
# same window and bound serve a write after an explicit truncation (``cut_before``).
RECREATE_S = 10.0
REMOVED_MAX = 64


@dataclass(eq=False, slots=True)
class Removed:
    """The bytes of a file its path stopped naming, for ``Baselines.recreated``."""

    fd: int
    uid: int
    at: float  # time.monotonic()


@dataclass(eq=False, slots=True)
class Cut:
    """A file cut short by an explicit truncation alone (truncate(2), ftruncate(2), no
    write), for ``Baselines.cut_before``: a descriptor of its bytes before the cut, who cut
    it, when, the commits of the cut (the path's last) and the digest it left."""

    fd: int
    uid: int
    at: float  # time.monotonic()
    commits: list[Commit]  # the cut's, and those of later cuts by the same user
    intended: str
    earlier: list[Commit]  # queued at the path before the cut, to land before it


class Baselines:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.ws = files.ws
        # path -> the journaled file a save removed there, for a while (``recreated``).
        self.removed: dict[bytes, Removed] = {}
        # path -> its bytes before an explicit truncation, while that is its last commit.
        self.cuts: dict[bytes, Cut] = {}

    def path_removed(self, path: bytes, who: dict[str, Any], fd: int) -> None:
        """``path`` stopped naming a journaled file (an unlink, or a rename away), whose
        bytes ``fd`` holds (this takes it): a new file made there soon after by the same
        user is that file saved again (``recreated``)."""
        old = self.removed.pop(path, None)
        if old is not None:
            os.close(old.fd)
        self.removed[path] = Removed(fd, who.get("uid", -1), time.monotonic())
        while len(self.removed) > REMOVED_MAX:  # the oldest goes
            os.close(self.removed.pop(next(iter(self.removed))).fd)

    def let_go_kept(self) -> bool:
        """The disk is full: close every descriptor kept of removed, cut or replaced files
        (for ``recreated``, ``cut_before`` and stale writes: those checks then find
        nothing, never a false refusal), so that a removed file no object keeps frees its
        space. True if any."""
        had = bool(self.removed or self.files.reads.gone_fds or self.cuts)
        for rec in self.removed.values():
            os.close(rec.fd)
        self.removed.clear()
        for cut in self.cuts.values():
            os.close(cut.fd)
        self.cuts.clear()
        for gone in self.files.reads.gone_fds:
            os.close(gone.fd)
            gone.fd = -1
        self.files.reads.gone_fds.clear()
        return had

    def forget_removed(self, path: bytes) -> None:
        """``path`` names another file now (a rename onto it, a new directory)."""
        old = self.removed.pop(path, None)
        if old is not None:
            os.close(old.fd)
        self.drop_cut(path)

    def cut_stands(self, rec: Cut, who: dict[str, Any]) -> bool:
        return rec.uid == who.get("uid", -1) and time.monotonic() - rec.at <= RECREATE_S

    async def keep_cut(
        self, path: bytes, commit: Commit, base_fd: int, who: dict[str, Any]
    ) -> Cut | None:
        """``commit`` cuts ``path`` by an explicit truncation alone (nothing written), or
        empties it: a change the gates let through, but a write that follows it is judged
        against the bytes from before it, as within one open (``ftruncate`` then
        ``write``), so that truncating a file and writing it again puts no cut or elided
        file in place unseen. Remembers ``base_fd``'s bytes (copied first when a commit in place, of a
        hard-linked file, would change them), or, after an earlier cut of the same user's
        still standing, the bytes from before that one; None if nothing is kept."""
        rec = self.cuts.get(path)
        now = time.monotonic()
        if rec is not None and self.cut_stands(rec, who) and rec.intended == commit.stage.expected:
            rec.at, rec.intended = now, str(commit.intended)
            rec.commits.append(commit)
            return rec
        self.drop_cut(path)
        if base_fd < 0 or os.fstat(base_fd).st_size <= commit.size:
            return None  # nothing cut away (a file made longer)
        if commit.linked:

            def copy(src: int) -> int:
                how = os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC
                out = os.open(".", how, 0o600, dir_fd=self.ws.staging_fd)
                try:
                    copy_metadata(src, out, os.fstat(src))  # (a put-back copies them)
                    copy_fd(src, out)
                except BaseException:
                    os.close(out)
                    raise
                return out

            try:
                with borrowed(base_fd) as (src,):
                    fd = await trio.to_thread.run_sync(copy, src, limiter=WORKERS)
            except OSError:
                return None  # (no O_TMPFILE, no room: judged as ever)
        else:
            fd = os.dup(base_fd)  # the replaced inode keeps its bytes (an object now)
        earlier = self.files.queued(path)
        rec = Cut(fd, who.get("uid", -1), now, [commit], str(commit.intended), earlier)
        self.cuts[path] = rec
        while len(self.cuts) > REMOVED_MAX:  # the oldest goes
            os.close(self.cuts.pop(next(iter(self.cuts))).fd)
        return rec

    def drop_cut(self, path: bytes) -> None:
        rec = self.cuts.pop(path, None)
        if rec is not None:
            os.close(rec.fd)

    def cut_landed(self, c: Commit) -> None:
        """A commit settled: a cut remembered at its path stands only while the path's
        last commit is that cut (another write, a restore, an undo end it; not one queued
        before it, which lands first)."""
        for p in (c.path, *c.aliases):
            rec = self.cuts.get(p)
            if rec is None or c in rec.earlier:
                continue
            if not (c.outcome == "committed" and c in rec.commits):
                self.drop_cut(p)

    def cut_before(self, inode: Inode, stage: Stage, who: dict[str, Any]) -> int | None:
        """A write (written text, not a truncation again) of a file the same user cut by an
        explicit truncation alone within RECREATE_S, onto what the cut left: its gates
        judge it against the bytes from before the cut, and a refusal puts those back;
        returns a descriptor of them (the caller closes it), else None. Not inside an open
        batch: its commit judges its drafts against the tree's file anyway."""
        rec = self.cuts.get(inode.path) if inode.paths else None
        if rec is None or not stage.written:
            return None
        del self.cuts[inode.path]
        if (
            not self.cut_stands(rec, who)
            or stage.expected != rec.intended
            or inode.virtual
            or self.files.held(inode) is not None
            or self.files.batches.for_writer(who) is not None
        ):
            os.close(rec.fd)
            return None
        return rec.fd

    async def cut_put_back(
        self, path: bytes, cut: Cut, digest: str, who: dict[str, Any], err: RwfsError
    ) -> None:
        """A rename onto ``path`` right after its cut was refused: the bytes from before
        the cut come back, as for a refused write (``put_back``), unless the file is being
        written meanwhile (a stage open on it) or a batch holds it."""
        inode = self.files.inodes.by_path.get(path)
        if inode is None:
            return
        async with inode.lock:
            if (
                self.cuts.get(path) is not cut
                or inode.virtual
                or self.files.held(inode) is not None
                or (inode.stage is not None and inode.stage is not self.files.beneath(inode))
            ):
                return
            del self.cuts[path]
            try:
                refused = err.envelope.get("lsn") or 0
                await self.put_back(inode, path, cut.fd, digest, cut.intended, who, refused)
            finally:
                os.close(cut.fd)
        self.files.kernel.invalidate(inode)  # (the rename holds the kernel's lock on it)

    def cut_removed(self, path: bytes, who: dict[str, Any], fd: int | None) -> int | None:
        """``path`` stops naming its file (removed, renamed away), which ``fd`` holds: if
        the same user cut it a moment before, a save that makes it again is judged against
        the bytes from before the cut (``recreated``): a descriptor of those, else ``fd``."""
        rec = self.cuts.pop(path, None)
        if rec is None:
            return fd
        if not self.cut_stands(rec, who):
            os.close(rec.fd)
            return fd
        if fd is not None:
            os.close(fd)
        return rec.fd

    def recreated(self, inode: Inode, stage: Stage, who: dict[str, Any]) -> int | None:
        """A save by removal and re-creation (``git checkout``, ``git stash``, vim's default
        save, ``rm f`` then a new ``f``): the first commit of a new, still empty file at a
        path whose journaled file the same user removed within RECREATE_S. Its gates judge
        the new bytes against the removed ones, as they would an edit of that file; returns
        a descriptor of them (the caller closes it), else None."""
        if stage.expected != EMPTY_DIGEST or inode.virtual or self.files.held(inode) is not None:
            return None
        if not inode.paths:
            return None
        rec = self.removed.pop(inode.path, None)
        if rec is None:
            return None
        if rec.uid != who.get("uid", -1) or time.monotonic() - rec.at > RECREATE_S:
            os.close(rec.fd)
            return None
        return rec.fd

    async def put_back(
        self,
        inode: Inode,
        path: bytes,
        removed: int,
        digest: str,
        expected: str,
        who: dict[str, Any],
        refused: int,
    ) -> None:
        """A refused save by removal and re-creation: the new file (``expected``: empty)
        gets the removed bytes back, so the path holds what it held before the save, as a
        refused edit leaves it. The same for a refused write after an explicit truncation
        (``expected``: what the truncation left): the bytes from before it come back.
        It is a commit of rwfs's own, journaled as a write by rwfs (the daemon's pid, comm
        ``rwfs``, ``put_back``, and ``refused_lsn``, the refusal it follows), in the
        writer's name only as far as its uid and session go (an undo of the session takes
        it back with the save); it is no success of the writer's, so ``why/`` keeps the
        refusal."""
        with borrowed(removed) as (fd,):
            stage = await self.ws.stages.new(fd, truncate=False)
        stage.expected = expected
        stage.sealed = True
        size = os.fstat(stage.fd).st_size
        info = {**who, "pid": os.getpid(), "comm": "rwfs", "put_back": True}
        if refused:
            info["refused_lsn"] = refused
        commit = Commit(path, stage, digest, size, info, owner=inode)
        if len(inode.paths) > 1:  # hard links: committed in place, every name journaled
            commit.aliases = tuple(sorted(inode.paths - {path}))
        commit.linked = bool(commit.aliases) or nlink(self.ws.root_fd, inode) > 1
        self.files.reads.new_version(inode, expected, digest, who)
        inode.stage, inode.pending = stage, commit
        await self.ws.committer.submit(commit, wait=False)
