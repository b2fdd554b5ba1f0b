"""Namespace operations on journaled paths, and an open batch's side of them: what an
unlink or rmdir (``remove``), a ``link`` and a ``create`` in an open batch
(``create_in_batch``) become, each journaled around its syscall
(``Committer.operation``); an unlink a batch takes (``hide``), of its new file
(``drop_virtual``), and EXDEV for a rename a batch would have to take
(``batch_rename``). Renames are renames.py's."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import TYPE_CHECKING, Any

import trio

from .. import faults
from ..journal.objects import open_regular
from . import direct
from .errors import refused
from .inodes import Inode
from .syscalls import WORKERS, fsdecode, rel

if TYPE_CHECKING:
    from .files import Files


def _exists(root_fd: int, path: bytes) -> bool:
    try:
        os.stat(path, dir_fd=root_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


class Namespace:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.ws = files.ws

    async def drop_virtual(self, inode: Inode, who: dict[str, Any]) -> None:
        """Unlink of a file the open batch created: the batch forgets it, or, if it stood
        in for a file of the tree (removed and made again, or a temporary file renamed
        over it), deletes that file; descriptors still open keep reading and writing its
        stage until their last close."""
        held = inode.pending
        async with inode.lock:
            path = inode.path
            for p in list(inode.paths):
                self.files.virtual.pop(p, None)
                self.files.inodes.detach(p)
            inode.virtual = False
            self.files.inodes.orphan(inode)
            if held is not None and held.held:
                batch = self.files.batches.all[str(held.batch)]
                with self.files.letting_go(inode, held):
                    if held.stage.expected is None:
                        await self.files.batches.unhold(batch, held.path)
                    else:
                        await self.files.batches.hide(batch, held.path, held.stage.expected, who)
                        self.files.hidden.add(held.path)
            elif (deleting := self.files.batches.holding(path)) is not None:
                if deleting.held[path].intended is None:  # made where the batch deletes one
                    self.files.hidden.add(path)
            self.files.orphan_stage(inode)

    async def hide(self, path: bytes, inode: Inode | None, who: dict[str, Any]) -> bool:
        """Unlink by a writer an open batch takes (or of a file it holds): the deletion
        waits for the batch's commit, the file is gone from the view now. False if the
        unlink is not the batch's."""
        held = inode.pending if inode is not None and inode.pending is not None else None
        batch = self.files.batches.all.get(str(held.batch)) if held and held.held else None
        batch = batch or self.files.batches.for_writer(who)
        if batch is None or path in self.files.hidden:
            return False
        if inode is not None and not (held and held.held):
            await self.files.settle(inode)  # the batch's base is the file's committed bytes
        st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        if not (stat.S_ISREG(st.st_mode) and self.files.journaled(path, st)):
            return False
        if held is not None and held.held and held.path == path:
            assert inode is not None
            heir = await self.heir(inode, path, st)
            if heir is not None:
                # One name of a hard-linked file whose draft the batch holds under this
                # name: the file's other names keep the draft, which moves to one of them.
                await self.files.batches.move_entry(batch, held, heir)
                await self.files.batches.hide(batch, path, held.stage.expected, who)
            else:
                with self.files.letting_go(inode, held):
                    await self.files.batches.hide(batch, path, held.stage.expected, who)
        elif held is not None and held.held:
            # One name of a hard-linked file whose draft the batch holds under another:
            # that name keeps the draft; this one's base is the file's committed bytes.
            await self.files.batches.hide(batch, path, held.stage.expected, who)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.ws.root_fd)
            try:
                base = await self.ws.digests.of(fd)
            finally:
                os.close(fd)
            await self.files.batches.hide(batch, path, base, who)
        self.files.hidden.add(path)
        gone = self.files.inodes.detach(path)
        if gone is not None:
            self.files.inodes.orphan(gone)
        return True

    async def heir(self, inode: Inode, path: bytes, st: os.stat_result | None) -> bytes | None:
        """Another name of the file at ``path`` (stat ``st``) that the mount still shows:
        one the inode table knows, else one found in the tree; None if it has none."""
        names = sorted(inode.paths - {path})
        if not names and st is not None and st.st_nlink > 1:
            names = await trio.to_thread.run_sync(
                self.ws.links.other_names, path, st, (), limiter=WORKERS
            )
        # (Not a name the batch deleted, nor one it made a new file at since.)
        heir = next(
            (p for p in names if p not in self.files.hidden and p not in self.files.virtual),
            None,
        )
        if heir is not None:
            self.files.inodes.add_names(inode, [heir])
        return heir

    async def remove(self, path: bytes, who: dict[str, Any], is_dir: bool) -> None:
        """unlink(2) or rmdir(2) of ``path``: an open batch's new file is forgotten, a file
        a batch takes is hidden until its commit; otherwise the removal reaches the tree,
        journaled with the removed bytes kept (and remembered for a save that makes the
        file again: ``Baselines.recreated``)."""
        virtual = self.files.virtual.get(path)
        if virtual is not None:
            if is_dir:
                raise refused(errno.ENOTDIR)
            await self.drop_virtual(virtual, who)
            return
        while not is_dir and await self.files.renames.sealing(path):
            pass  # its commit is queued (or held) now: kept as a version, below
        inode = self.files.inodes.by_path.get(path)
        if not is_dir and await self.hide(path, inode, who):
            return
        # Kept for the kernel, which may still hold a directory (a shell's cwd).
        st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        # A regular file's commits still queued are kept as versions rather than written
        # into the tree first (as for the name a rename replaces: ``Files._superseded``).
        sup = (
            None
            if is_dir or not self.files.journaled(path, st)
            else self.files.renames.movable(path, st)
        )
        if sup is None:
            sup = []
            if inode is not None:
                await self.files.settle(inode)
                st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        if is_dir:
            with self.ws.committer.operation(
                self.files.journaled(path, None, True), who, "rmdir", path
            ):
                os.rmdir(path, dir_fd=self.ws.root_fd)
        else:
            self.files.reads.path_leaves(path, who["pid"])
            incoming = removed = None
            journaled = self.files.journaled(path, st)
            if journaled and stat.S_ISREG(st.st_mode):
                incoming = await self.ws.keep_removed(path, st)  # keep the bytes
                how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                # For a save that makes the file again (_recreated): what the mount shows.
                # (A regular file, by the stat above: no need to check before opening.)
                with contextlib.suppress(OSError):
                    if sup and sup[-1].size:
                        removed = os.open(sup[-1].stage.name, how, dir_fd=self.ws.staging_fd)
                    elif st.st_size and not sup:
                        removed = os.open(path, how, dir_fd=self.ws.root_fd)
            extra: dict[str, Any] = {}
            if sup:  # the removed bytes are the last superseded commit's
                extra.update(expected=sup[-1].intended, size=sup[-1].size)
                extra["supersedes"] = [c.id for c in sup]
            try:
                mode = stat.S_IMODE(st.st_mode)  # of the file removed: undo, restore use it
                extra["owner"] = [st.st_uid, st.st_gid]  # and .rw/ shows its versions with it
                with self.ws.committer.operation(
                    journaled, who, "unlink", path, incoming, mode=mode, **extra
                ):
                    os.unlink(path, dir_fd=self.ws.root_fd)
                    for c in sup:
                        c.superseded = True
                    faults.point("after_unlink")
            except OSError:
                if incoming is not None:
                    os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
                if removed is not None:
                    os.close(removed)
                raise
            removed = self.files.baselines.cut_removed(path, who, removed)
            if removed is not None:
                self.files.baselines.path_removed(path, who, removed)
            if incoming is not None:
                self.files.removals += 1
        gone = self.files.inodes.detach(path)
        # Its backing inode number is free for reuse now (a directory has no other name).
        if gone is not None and (is_dir or st.st_nlink == 1):
            self.files.inodes.orphan(gone)
            if is_dir:
                gone.removed = st
        elif gone is not None:
            await self.other_names(gone, path, st)

    async def other_names(self, inode: Inode, path: bytes, st: os.stat_result) -> None:
        """One name of a hard-linked file went away and the inode table knew no other:
        find the file's other names in the workspace, so that its commits have a path
        and stay journaled (a name outside the workspace is not found: the file is then
        written in place, unjournaled, as ``fs._in_place`` says)."""
        if inode.paths:
            return
        names = await trio.to_thread.run_sync(
            self.ws.links.other_names, path, st, (), limiter=WORKERS
        )
        self.files.inodes.add_names(inode, names)

    async def unseen_names(self, inode: Inode, st: os.stat_result) -> None:
        """Before a change to a regular file whose link count says it has names the inode
        table has not seen (a mount knows the names looked up since it began), while none
        it knows is journaled: find them. One may be journaled, and then every change to
        the file is, through any name (in place, it would go around that name's journal).
        The walk is made once per file and link count (``Links.other_names``)."""
        if not stat.S_ISREG(st.st_mode) or st.st_nlink <= len(inode.paths) or not inode.paths:
            return
        if any(self.files.journaled(p) for p in inode.paths):
            return
        names = await trio.to_thread.run_sync(
            self.ws.links.other_names, inode.path, st, tuple(inode.paths), limiter=WORKERS
        )
        self.files.inodes.add_names(inode, names)

    async def link(self, src: Inode, path: bytes, who: dict[str, Any]) -> None:
        """link(2): a new name of a file, journaled with the file's digest. Not of a file
        whose bytes are an open batch's (its draft, or a name it deletes): EXDEV."""
        if src.virtual or self.files.held(src) is not None or path in self.files.hidden:
            # The tree does not hold what the mount shows at one of the two names: a link
            # there would not link it.
            raise refused(errno.EXDEV)
        # The new name must reach the bytes every reader sees: commit an open stage (say,
        # a truncate(2) while a descriptor is open) before linking the backing file, again
        # if a writer opened another meanwhile.
        journaled = self.files.journaled(path)
        while True:
            before = src.stage
            await self.files.commit(src, who, wait=True)
            await self.files.settle(src)
            if not (src.stage is None or src.stage is before or not src.paths):
                continue  # (a stage that stays is a batch's draft, or an unlinked file's)
            if self.files.held(src) is not None:  # the commit went to an open batch
                raise refused(errno.EXDEV)
            digest = None  # the new name's bytes, for its history and the path index
            with contextlib.suppress(OSError):
                fd, st = open_regular(self.ws.root_fd, rel(src.path)) if journaled else (-1, None)
                if fd >= 0 and not self.files.journaled(path, st):  # too large to hash
                    os.close(fd)
                    fd = -1
                if fd >= 0:
                    try:
                        digest = await self.ws.digests.of(fd)
                    finally:
                        os.close(fd)
            # No commit of the file may be queued across the link: it would be journaled
            # before the link while it reaches the tree after it, and the link's digest
            # would then stand for the new name in place of the bytes it holds.
            if self.files.held(src) is not None:
                raise refused(errno.EXDEV)
            if src.pending is None:
                break
        direct.keep_passthrough_names(self.files, src.path, path, "link")
        with self.ws.committer.operation(
            journaled, who, "link", path, source=fsdecode(src.path), intended=digest
        ):
            os.link(
                rel(src.path),
                path,
                src_dir_fd=self.ws.root_fd,
                dst_dir_fd=self.ws.root_fd,
                follow_symlinks=False,
            )
        batch = self.files.batches.for_writer(who) if journaled else None
        if batch is not None:  # an abort removes it again
            st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
            await self.files.batches.made_link(batch, path, st.st_ino)

    async def create_in_batch(
        self, path: bytes, mode: int, who: dict[str, Any], owner: tuple[int, int]
    ) -> Inode | None:
        """create(2) by a writer of an open batch, or where a batch deletes a file: the new
        file is only a stage until the batch commits (a virtual inode, returned); None if
        the new file is the tree's."""
        if not self.files.journaled(path) or path in self.files.virtual:
            return None
        # A file an open batch deletes is the batch's, whoever makes it again.
        held = self.files.batches.holding(path) if path in self.files.hidden else None
        batch = held or self.files.batches.for_writer(who)
        if batch is None or not (path in self.files.hidden or not _exists(self.ws.root_fd, path)):
            return None
        self.files.hidden.discard(path)
        stage = await self.ws.stages.empty(mode, *owner)
        inode = self.files.inodes.add_virtual(path)
        inode.stage = stage
        inode.lookups += 1
        self.files.virtual[path] = inode
        return inode

    def batch_rename(self, src: bytes, dst: bytes, who: dict[str, Any]) -> bool:
        if src in self.files.hidden or dst in self.files.hidden:
            return True
        held = [self.files.inodes.by_path.get(p) for p in (src, dst)]
        if any(i is not None and i.pending is not None and i.pending.held for i in held):
            return True
        try:
            st = os.stat(src, dir_fd=self.ws.root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            # A batch's changes below it are held by their paths, which a commit resolves:
            # they would stay at the old ones (and a symlink put there would take them).
            return self._held_below(src)
        if self.files.batches.for_writer(who) is None:
            return False
        return stat.S_ISREG(st.st_mode) and self.files.journaled(src, st)

    def _held_below(self, d: bytes) -> bool:
        """Whether an open batch holds a draft, a deletion or a new file below ``d``."""
        top = d + b"/"
        return any(
            p.startswith(top)
            for paths in (
                self.files.hidden,
                self.files.virtual,
                *(b.held for b in self.files.batches.all.values()),
            )
            for p in paths
        )
