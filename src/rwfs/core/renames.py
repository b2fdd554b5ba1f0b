"""What a rename becomes (``rename``): gated onto a journaled file the mount shows
(``gate_rename``), journaled around its syscall, moving the commits still queued at
its names or keeping them as versions (``movable``); an open batch's new file renamed
(``rename_virtual``)."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING, Any

from ..checks.allowances import Allowance
from . import direct
from .batch import COMMITTING
from .commits import Commit
from .errors import RwfsError, refused
from .inodes import Inode
from .syscalls import borrowed, fsdecode, renameat2

if TYPE_CHECKING:
    from .files import Files

# rename(2) flags (linux/fs.h), as the kernel passes them to FUSE.
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


class Renames:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.ws = files.ws

    async def rename(self, src: bytes, dst: bytes, flags: int, who: dict[str, Any]) -> None:
        """rename(2): a rename onto a journaled file is a commit of it (gated first), the
        replaced bytes are kept, the moved file's digest journaled; an open batch's files
        are renamed within the batch, and a rename a batch would have to take is EXDEV
        (mv and most tools then copy and delete, which the batch holds)."""
        while await self.sealing(src) or await self.sealing(dst):
            pass  # (a commit point under way may go to a batch: decided below)
        if src in self.files.virtual or dst in self.files.virtual:
            await self.rename_virtual(src, dst, flags, who)
            return
        if self.files.names.batch_rename(src, dst, who):
            raise refused(errno.EXDEV)
        exchange = bool(flags & RENAME_EXCHANGE)
        allowance: Allowance | None = None  # the writer's, of dst, that this rename uses
        batch_waited = False
        # A commit names its path, which the rename would make stale (a conflict, ESTALE
        # to a writer waiting in fsync). A regular file's commits still queued move with
        # it (``carry``: the save of a temporary file renamed over its target) or, at the
        # name it replaces, become kept versions (``sup``); anything else queued at either
        # name lands first. Writers can queue more while this waits or gates: again.
        while True:
            if await self.sealing(src) or await self.sealing(dst):
                continue  # its commit is queued now: carried or kept, below
            sst = os.stat(src, dir_fd=self.ws.root_fd, follow_symlinks=False)
            try:
                dst_st: os.stat_result | None = os.stat(
                    dst, dir_fd=self.ws.root_fd, follow_symlinks=False
                )
            except FileNotFoundError:
                dst_st = None
            same = dst_st is not None and (sst.st_dev, sst.st_ino) == (dst_st.st_dev, dst_st.st_ino)
            if same and not flags & RENAME_NOREPLACE:
                return  # two names of one file: rename(2) does nothing and succeeds
            is_dir = stat.S_ISDIR(sst.st_mode)
            journaled = self.files.journaled(src, sst, is_dir) or self.files.journaled(
                dst, dst_st, is_dir
            )
            carry = self.movable(src, sst, dst_st, exchange)
            sup = self.movable(dst, dst_st, exchange=exchange)
            if carry is None or sup is None or (not journaled and (carry or sup)):
                for p in (src, dst):
                    await self.files.settle_below(p)
                continue
            if journaled and (is_dir or (dst_st is not None and stat.S_ISDIR(dst_st.st_mode))):
                # A hard-linked file's commit journals its other names as the tree has
                # them when it lands: a directory's rename may move one the inode table
                # does not know (not looked up since the mount), and the commit would be
                # journaled before the rename with the name the rename gave. It lands
                # first, so that its names are those of its place in the journal. (No
                # await from here to the syscall for a directory.)
                if linked := [
                    c for c in self.ws.committer.unsettled() if c.linked and not c.superseded
                ]:
                    await self.ws.committer.settle_commit(linked[0])
                    continue
                if not batch_waited and any(
                    b.state == COMMITTING for b in self.files.batches.all.values()
                ):
                    # A batch's commit (an undo, a restore) writes hard-linked files in
                    # place in its thread, under commit_lock, and journals their names
                    # ahead of this rename's event: once, it ends first.
                    batch_waited = True
                    async with self.ws.committer.commit_lock:
                        pass
                    continue
            if (
                journaled
                and not flags
                and dst_st is not None
                and stat.S_ISREG(dst_st.st_mode)
                and stat.S_ISREG(sst.st_mode)
            ):
                shown = (carry[-1].stage.fd if carry else -1, sup[-1].stage.fd if sup else -1)
                allowance = await self.gate_rename(src, dst, who, *shown, taken=allowance)
            if (
                self._same(carry, self.movable(src, sst, dst_st, exchange))
                and self._same(sup, self.movable(dst, dst_st, exchange=exchange))
                and self._commit_point(src) is None
                and self._commit_point(dst) is None
            ):
                break
        if journaled:
            moved = None if exchange else self.files.inodes.by_path.get(src)
            self.files.reads.path_leaves(src, who["pid"])
            if dst_st is not None:
                self.files.reads.path_leaves(dst, who["pid"], moved)
        # (No await from here to the syscall: the commits carried stay queued.)
        incoming = None
        # A file past max_journaled_bytes is neither kept nor hashed, on either side:
        # its cost would be its size (docs/policy.md).
        if (
            journaled
            and not exchange
            and dst_st is not None
            and stat.S_ISREG(dst_st.st_mode)
            and self.files.journaled(dst, dst_st)
        ):
            incoming = await self.ws.keep_removed(dst, dst_st)  # keep the replaced bytes
            # (A hard-linked file is copied in a thread: a writer may have queued a commit
            # at either name meanwhile, which the rename would leave at a name that no
            # longer holds its file. Then all of it again.)
            if not (
                self._same(carry, self.movable(src, sst, dst_st, exchange))
                and self._same(sup, self.movable(dst, dst_st, exchange=exchange))
                and self._commit_point(src) is None
                and self._commit_point(dst) is None
            ):
                os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
                if allowance is not None:  # (gated again there)
                    self.ws.allowances.give_back(allowance)
                await self.rename(src, dst, flags, who)
                return
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        moved_fd = None
        if journaled and stat.S_ISREG(sst.st_mode) and not carry and self.files.journaled(dst, sst):
            moved_fd = os.open(src, how, dir_fd=self.ws.root_fd)
        # A file renamed away may be made again at its name (vim's default save).
        removed = None
        if carry and carry[-1].size and not exchange:
            removed = os.open(carry[-1].stage.name, how, dir_fd=self.ws.staging_fd)
        elif moved_fd is not None and sst.st_size and not exchange:
            removed = os.dup(moved_fd)
        extra: dict[str, Any] = {}
        if carry:  # the moved bytes are the last carried commit's, not the tree's yet
            extra.update(intended=carry[-1].intended, carries=[c.id for c in carry])
        if sup:  # the replaced bytes are the last superseded commit's
            extra.update(expected=sup[-1].intended, size=sup[-1].size)
            extra["supersedes"] = [c.id for c in sup]
        if stat.S_ISREG(sst.st_mode) and not exchange:  # .rw/ shows its versions with them
            extra.update(mode=stat.S_IMODE(sst.st_mode), owner=[sst.st_uid, sst.st_gid])
        if allowance is not None:  # let through by an allowance (allowances.py)
            extra["allowed"] = allowance.record()
        if journaled and not exchange and self.ws.policy.is_passthrough(dst, is_dir):
            # Onto a name rwfs does not journal (pytest's cache made as a temporary
            # directory, then renamed onto .pytest_cache): what it moves leaves the
            # journal there, whose model would otherwise keep files removed untold.
            extra["untracked"] = True
        try:
            direct.keep_passthrough_names(self.files, src, dst, "rename", exchange)
            with self.ws.committer.operation(
                journaled,
                who,
                "rename",
                src,
                incoming,
                dest=fsdecode(dst),
                exchange=exchange or None,
                **extra,
            ) as late:
                renameat2(self.ws.root_fd, src, self.ws.root_fd, dst, flags)
                late["hash_fd"], late["carried"] = moved_fd, carry
                for c in carry:
                    c.journal_path = c.journal_path or c.path
                    c.path = dst
                for c in sup:
                    c.superseded = True
        except (OSError, RwfsError):
            if incoming is not None:
                os.unlink(incoming, dir_fd=self.ws.objects.incoming_fd)
            if allowance is not None:  # nothing was renamed: the allowance stays
                self.ws.allowances.give_back(allowance)
            for fd in (moved_fd, removed):
                if fd is not None:
                    os.close(fd)
            raise
        self.files.baselines.forget_removed(dst)
        if exchange or is_dir:
            # (A directory's: what was cut below either name is at another path now.)
            for p in [
                p
                for p in self.files.baselines.cuts
                if p == src or p.startswith((src + b"/", dst + b"/"))
            ]:
                self.files.baselines.drop_cut(p)
        else:
            removed = self.files.baselines.cut_removed(src, who, removed)
        if removed is not None:
            self.files.baselines.path_removed(src, who, removed)
        if incoming is not None:
            self.files.removals += 1
        if exchange:
            self.files.inodes.exchange(src, dst)  # a directory's children move with it
        else:
            gone = self.files.inodes.detach(dst) if dst_st is not None else None
            # Moved before any wait: an open meanwhile must see the file's new name (under
            # its old one it could be passed through the kernel: core/direct.py).
            self.files.inodes.move(src, dst)
            if gone is not None and dst_st is not None and stat.S_ISDIR(dst_st.st_mode):
                # An empty directory replaced: removed, as by rmdir (a descriptor or a cwd
                # may still hold it, and its fstat must not fail).
                self.files.inodes.orphan(gone)
                gone.removed = dst_st
            elif gone is not None and dst_st is not None:
                if dst_st.st_nlink == 1:
                    self.files.inodes.orphan(gone)
                else:
                    await self.files.names.other_names(gone, dst, dst_st)

    def _commit_point(self, path: bytes) -> Inode | None:
        """The inode at ``path`` if a commit point of it is under way: its stage sealed
        (hashed and gated, under ``inode.lock``) and not queued yet. A rename then would
        move the tree's file without the bytes the writer wrote before it (an empty
        temporary, for a save by rename), and journal those; the commit would follow as
        a write of the new name. A rename over it, or an unlink, would drop the commit (its
        file gone) and keep the bytes from before it."""
        inode = self.files.inodes.by_path.get(path)
        if inode is None or inode.virtual or not inode.lock.locked():
            return None
        stage = inode.stage
        if stage is None or not stage.sealed:
            return None
        if inode.pending is not None and inode.pending.stage is stage:
            return None  # queued (or a batch's draft): ``movable`` decides
        return inode

    async def sealing(self, path: bytes) -> bool:
        """Wait for a commit point of the file at ``path`` under way (``_commit_point``),
        if there is one: True if it waited."""
        inode = self._commit_point(path)
        if inode is None:
            return False
        async with inode.lock:
            pass
        return True

    def movable(
        self,
        path: bytes,
        st: os.stat_result | None,
        dst_st: os.stat_result | None = None,
        exchange: bool = False,
    ) -> list[Commit] | None:
        """The commits queued at ``path`` if a rename can move its file (or, for the name a
        rename replaces, replace it) without waiting for them: [] if none is queued; None
        if they must land first (a directory's, a hard-linked file's, an exchange, ones a
        group has taken: ``Committer.movable``). ``dst_st``: the file a moved one replaces,
        whose bytes must be kept without an await (not hard-linked)."""
        busy = self.files.queued(path)
        inode = self.files.inodes.by_path.get(path)
        if not busy:
            # (A commit whose submit has not queued it yet lands first, as ``settle`` does.)
            held = inode is not None and inode.pending is not None and not inode.pending.held
            return None if held else []
        if (
            exchange
            or inode is None
            or inode.virtual
            or len(inode.paths) != 1
            or inode.pending is not busy[-1]
            or st is None
            or not stat.S_ISREG(st.st_mode)
            or st.st_nlink != 1
            or (dst_st is not None and not (stat.S_ISREG(dst_st.st_mode) and dst_st.st_nlink == 1))
        ):
            return None
        for c in busy:
            if not (
                c.owner is inode
                and c.path == path
                and not c.held
                and c.intended is not None
                and c.stage.fd >= 0
                and self.ws.committer.movable(c)
            ):
                return None
        return busy

    @staticmethod
    def _same(was: list[Commit], now: list[Commit] | None) -> bool:
        return (
            now is not None
            and len(was) == len(now)
            and all(a is b for a, b in zip(was, now, strict=True))
        )

    async def rename_virtual(self, src: bytes, dst: bytes, flags: int, who: dict[str, Any]) -> None:
        """Rename of a file an open batch created: within the batch, the draft now stands
        for ``dst`` (a new file there, or new bytes for the file there: the write-a-temp-
        then-rename pattern). Anything else involving such a file is EXDEV, which makes
        mv and most tools copy instead."""
        inode = self.files.virtual.get(src)
        if inode is None or flags & RENAME_EXCHANGE:
            raise refused(errno.EXDEV)
        target = self.files.virtual.get(dst)
        real = None
        if target is None:
            try:
                real = os.stat(dst, dir_fd=self.ws.root_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
        shown = target is not None or (real is not None and dst not in self.files.hidden)
        if shown and flags & RENAME_NOREPLACE:
            raise refused(errno.EEXIST)
        if real is not None and not (
            stat.S_ISREG(real.st_mode) and self.files.journaled(dst, real)
        ):
            raise refused(errno.EXDEV)
        if inode.pending is None or not inode.pending.held:
            await self.files.commit(inode, who)  # its bytes join the batch first
        held = inode.pending
        if held is None or not held.held or self.files.virtual.get(src) is not inode:
            raise refused(errno.EXDEV)
        old = target or self.files.inodes.by_path.get(dst)
        if old is not None and target is None:
            await self.files.settle(old)  # the batch's base is the file's committed bytes
        old_held = self.files.held(old) if old is not None else None
        base = None
        if old_held is not None:
            base = old_held.stage.expected  # the batch's base of dst
        elif real is not None:
            fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.ws.root_fd)
            try:
                base = await self.ws.digests.of(fd)
            finally:
                os.close(fd)
        if shown:
            # As outside a batch, a rename onto a file is a commit of it: the gates judge
            # the draft against what the mount shows there.
            await self._gate_virtual_rename(held, dst, old_held, base, who)
            if (
                self.files.virtual.get(src) is not inode
                or inode.pending is not held
                or not held.held
            ):
                raise refused(errno.EXDEV)  # the batch ended meanwhile
        batch = self.files.batches.all[str(held.batch)]
        src_base = held.stage.expected  # not None: src was a file of the tree, deleted
        if old is not None and old_held is not None:
            heir = await self.files.names.heir(old, dst, real)
            if heir is not None:
                # A hard-linked file's draft: the file's other names keep it (held under
                # one of them), and dst alone gets the new file.
                if old_held.path == dst:
                    await self.files.batches.move_entry(batch, old_held, heir)
                old_held = None
        if old is not None and old_held is not None:
            with self.files.letting_go(old, old_held):  # its open descriptors keep its draft
                await self.files.batches.retarget(batch, held, dst, base)
        else:
            await self.files.batches.retarget(batch, held, dst, base)
        if old is not None:
            self.files.virtual.pop(dst, None)
            self.files.inodes.detach(dst)
            self.files.inodes.orphan(old)
        self.files.hidden.discard(dst)
        del self.files.virtual[src]
        self.files.inodes.move(src, dst)
        self.files.virtual[dst] = inode
        if src_base is not None:
            # The file the batch made at src replaced one of the tree (removed, then
            # created again): moving it away leaves that one deleted.
            await self.files.batches.hide(batch, src, src_base, who)
            self.files.hidden.add(src)

    async def _gate_virtual_rename(
        self,
        held: Commit,
        dst: bytes,
        old_held: Commit | None,
        base: str | None,
        who: dict[str, Any],
    ) -> None:
        """``gate_rename`` for a batch's draft renamed onto a file the mount shows: its
        own draft, or the tree's file."""
        fd = -1
        if old_held is None and dst not in self.files.virtual:  # (a new file of the batch: empty)
            fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.ws.root_fd)
        try:
            old_fd = old_held.stage.fd if old_held is not None else fd
            findings = await self.ws.gating.run(dst, old_fd, held.stage.fd)
            findings, allowance = self.ws.gating.let_through(dst, who, findings)
            if allowance is not None:  # (the batch's change of dst, from now on)
                held.info["allowed"] = allowance.record()
            if any(f.action == "reject" for f in findings):
                shown = old_held.intended if old_held is not None else base
                with borrowed(held.stage.fd) as (new_fd,):
                    raise await self.ws.refusals.refuse(
                        dst, new_fd, shown, str(held.intended), findings, who
                    )
        finally:
            if fd >= 0:
                os.close(fd)

    async def gate_rename(
        self,
        src: bytes,
        dst: bytes,
        who: dict[str, Any],
        src_fd: int = -1,
        dst_fd: int = -1,
        taken: Allowance | None = None,
    ) -> Allowance | None:
        """A rename onto a journaled file is a commit of it: the gates see the moved bytes,
        and a refusal fails the rename() with both files as they were. ``src_fd``,
        ``dst_fd``: the bytes the mount shows there when the tree does not hold them yet
        (a commit still queued). Returns the writer's allowance of ``dst`` this rename used
        (``taken``: the one it used when it was gated before, applied again). Onto a file
        the same user just cut by an explicit truncation, the moved bytes are judged
        against the bytes from before the cut (``Baselines.cut_before``), and a refusal
        puts those back at ``dst``."""
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

        def shown(fd: int, path: bytes) -> int:
            return os.dup(fd) if fd >= 0 else os.open(path, how, dir_fd=self.ws.root_fd)

        cut = self.files.baselines.cuts.get(dst)
        if cut is not None and (
            not self.files.baselines.cut_stands(cut, who)
            or self.files.batches.for_writer(who) is not None
        ):
            cut = None
        new_fd = shown(src_fd, src)
        try:
            if cut is not None and await self.ws.digests.of(new_fd) == cut.intended:
                cut = None  # the bytes the cut left again (sed -i of the empty file): no edit
            old_fd = os.dup(cut.fd) if cut is not None else shown(dst_fd, dst)
            try:
                findings = await self.ws.gating.run(dst, old_fd, new_fd)
                findings, taken = self.ws.gating.let_through(dst, who, findings, taken)
                if any(f.action == "reject" for f in findings):
                    expected, intended = (
                        await self.ws.digests.of(old_fd),
                        await self.ws.digests.of(new_fd),
                    )
                    err = await self.ws.refusals.refuse(
                        dst, new_fd, expected, intended, findings, who
                    )
                    # The writer names its temporary (sed: "cannot rename sedX: Bad
                    # message"): why/ has the envelope under that name too.
                    err.envelope["source"] = fsdecode(src)
                    if cut is not None:
                        await self.files.baselines.cut_put_back(dst, cut, expected, who, err)
                    raise err
            finally:
                os.close(old_fd)
        finally:
            os.close(new_fd)
        return taken
