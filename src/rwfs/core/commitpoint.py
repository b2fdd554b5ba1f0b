"""What a sealed stage becomes, carried out: decision.decide answers from the facts
gathered here (the digests, the held draft, the gates' findings after the writer's
allowance, the stale read, the batch), and run does what it answers — drops the stage
for a no-op, keeps the draft and tells the writer of a refusal or a conflict, hands the
commit to a batch or to the committer."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from ..journal.objects import EMPTY_DIGEST
from .commits import Commit
from .decision import Facts, Kind, decide
from .inodes import Inode, nlink
from .stages import Stage
from .syscalls import borrowed, fsdecode, rel

if TYPE_CHECKING:
    from .files import Files


class CommitPoint:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.ws = files.ws

    async def run(
        self,
        inode: Inode,
        stage: Stage,
        ctx_info: dict[str, Any],
        wait: bool,
        removed: int | None,
        cut: bool = False,
    ) -> None:
        """``Files.commit`` of a sealed stage, under ``inode.lock``. ``removed``: a
        descriptor of the bytes of the file a save by removal and re-creation removed
        (``Baselines.recreated``), or (``cut``) of the file's bytes before the explicit
        truncation this write follows (``Baselines.cut_before``): the gates judge against
        them, and a refusal puts them back."""
        # The gates judge the new bytes against what the mount showed: the tree's file,
        # or the draft of it an open batch holds. A new (empty) file has nothing a write
        # could break: only the secrets gate has something to look at. They judge
        # written text: a stage nothing was written into holds only truncations to
        # lengths the caller chose (truncate(2), ftruncate(2)), a deliberate
        # change, journaled and undoable like any other but never refused, so that the
        # truncate that returned success is not undone at this commit point (SPEC §3.3a,
        # §4.1). One whose last change is such a truncation is not judged by the
        # truncation and elision gates (``Stage.cut_last``, ``gates.check``).
        gated = inode.path
        held_before = self.files.held(inode)
        shown, base_fd = self.files.shown(inode, held_before, stage)
        gate = stage.written and (
            shown != EMPTY_DIGEST or self.ws.policy.gate("secrets", gated)["action"] != "off"
        )
        if shown == EMPTY_DIGEST:
            base_fd = -1  # nothing to read: judged as a new file (and sealed on the loop)
        if removed is not None and stage.written:  # judged against the file the save removed
            base_fd, gate = removed, True
        intended, size, findings = await self.ws.stages.seal(
            stage, (gated, base_fd) if gate else None
        )
        if not inode.paths:  # unlinked during the seal
            stage.sealed = False
            self.files.orphan_stage(inode)
            return
        path = inode.path
        held = self.files.held(inode)
        shown, base_fd = self.files.shown(inode, held, stage)
        # What the gates judge against: the removed file's bytes (which the new file's
        # stands for), or the bytes from before the truncation, not the tree's file.
        judged = removed if removed is not None and held is None else base_fd
        if not cut:
            base_fd = judged
        # Duplicates: a commit this one waits on below (gates off the loop, a digest, a
        # batch's hold) may land and close these (or their numbers be reused).
        with borrowed(base_fd, judged) as (base_fd, judged):
            drafted = held.intended if held is not None else None
            kind = decide(Facts(intended, stage.expected, drafted)).kind
            if kind in (Kind.DRAFT_AGAIN, Kind.BASE_AGAIN):
                assert held is not None
                self.ws.stages.drop(stage)
                inode.stage = held.stage
                if kind is Kind.BASE_AGAIN:
                    await self.files.batches.unhold(self.files.batches.all[str(held.batch)], path)
                return
            if kind is Kind.NOOP:
                self.ws.stages.drop(stage)
                inode.stage = self.files.beneath(inode)
                # A write all the same: mtime moves where it shows (atime does not: no read).
                if inode.stage is not None:
                    kept = os.fstat(inode.stage.fd).st_atime_ns
                    os.utime(inode.stage.fd, ns=(kept, time.time_ns()))
                else:
                    kw: dict[str, Any] = {"dir_fd": self.ws.root_fd, "follow_symlinks": False}
                    kept = os.stat(rel(path), **kw).st_atime_ns
                    os.utime(rel(path), ns=(kept, time.time_ns()), **kw)
                self.ws.committer.record(
                    {
                        "op": "noop",
                        "path": fsdecode(path),
                        "batch": None,
                        "intended": intended,
                        **ctx_info,
                    }
                )
                self.ws.stats.count("noops")
                self.files.on_written(path, intended, None)
                return
            if stage.written and (path != gated or held is not held_before):
                # Renamed during the seal, or the batch ended meanwhile: gate it as what it
                # is now, against what the mount shows now.
                findings = await self.ws.gating.run(path, judged, stage.fd, stage.cut_last)
            # The writer's allowance of this path, if it has one, is used up here and waives
            # what it may (allowances.py). Within a batch it goes with the batch's change. Not
            # by a truncation alone, never judged: it waits for the write after it, which is
            # judged against the bytes from before the cut (``Baselines.cut_before``).
            allowance = None
            if stage.written:
                findings, allowance = self.ws.gating.let_through(path, ctx_info, findings)
            if allowance is None and held is not None and "allowed" in held.info:
                allowance_record: dict[str, Any] | None = held.info["allowed"]
            else:
                allowance_record = allowance.record() if allowance is not None else None
            stale, read_fd = self.files.reads.stale_read(inode, ctx_info), -1
            if stale is None:
                stale, read_fd = await self.files.reads.replaced_read(inode, path, ctx_info, shown)
            # A file an open batch holds stays in it, whoever writes it (every writer
            # built on the draft); otherwise the batch whose scope the writer is in.
            batch = self.files.batches.all.get(str(held.batch)) if held else None
            if batch is None and inode.virtual:  # made again where the batch deletes a file
                batch = self.files.batches.holding(path)
            batch = batch or self.files.batches.for_writer(ctx_info)
            rejected = any(f.action == "reject" for f in findings)
            policy = self.ws.policy.stale_write
            decision = decide(
                Facts(intended, stage.expected, drafted, rejected, stale, policy, batch is not None)
            )
            if decision.kind is Kind.REFUSE:
                # Refused: the draft is kept, the stage goes, the file reads as before.
                put_back = removed is not None and held is None
                if put_back:
                    assert removed is not None
                    shown = await self.ws.digests.of(removed)
                err = await self.ws.refusals.refuse(
                    path, stage.fd, shown, intended, findings, ctx_info
                )
                await self.files.unstage(inode, held, stage)
                if put_back:
                    assert removed is not None and shown is not None
                    refused = err.envelope.get("lsn") or 0
                    base = str(stage.expected)
                    await self.files.baselines.put_back(
                        inode, path, removed, shown, base, ctx_info, refused
                    )
                if wait:
                    # fsync(): the kernel holds the inode's lock until we answer, and
                    # invalidating needs it, so it runs after the answer.
                    self.files.kernel.invalidate(inode)
                else:
                    await self.files.kernel.invalidate_now(inode)  # a reread must not see the draft
                raise err
            info = dict(ctx_info)
            if findings:
                info["warnings"] = [
                    {"gate": f.gate, "message": f.message, **f.details} for f in findings
                ]
            if allowance_record is not None:
                info["allowed"] = allowance_record
            if decision.kind is Kind.CONFLICT:
                with borrowed(read_fd) as (rfd,):  # eviction may close the original
                    err = await self.ws.refusals.stale_conflict(
                        path,
                        stage,
                        intended,
                        stale or None,
                        ctx_info,
                        actual=(shown, base_fd),
                        batch=held.batch if held is not None else None,
                        read_fd=rfd,
                    )
                await self.files.unstage(inode, held, stage)
                if allowance is not None:  # the write did not happen: the allowance stays
                    self.ws.allowances.give_back(allowance)
                if wait:
                    self.files.kernel.invalidate(inode)
                else:
                    await self.files.kernel.invalidate_now(inode)
                raise err
            if decision.stale_warning:
                info.setdefault("warnings", []).append(
                    {
                        "gate": "stale_write",
                        "message": "this process read an older version of the file than "
                        "the one it replaced: a change made meanwhile may be lost",
                        "read": stale or None,
                    }
                )
                self.ws.stats.count("stale_writes")
            self.files.reads.new_version(inode, shown, intended, ctx_info)
            commit = Commit(path, stage, intended, size, info, owner=inode)
            if len(inode.paths) > 1:  # hard links: committed in place, every name journaled
                commit.aliases = tuple(sorted(inode.paths - {path}))
            commit.linked = bool(commit.aliases) or nlink(self.ws.root_fd, inode) > 1
            if decision.kind is Kind.HOLD:
                assert batch is not None
                if held is None and inode.pending is not None:
                    # Built on a commit still queued (``Files.ensure_stage``): a batch's base is
                    # the tree's bytes, so that one lands first.
                    await self.files.settle(inode)
                if await self.files.batches.hold(batch, commit, wait):  # (False: it closed)
                    inode.pending = commit
                    commit.shown = True
                    self.files.on_written(path, intended, commit)
                    return
            remembered = None
            if ((not stage.written and stage.cut_last) or intended == EMPTY_DIGEST) and (
                not inode.virtual
            ):
                # An explicit truncation alone, or a file emptied (``: > f``, small enough to
                # pass): a write of the same user's soon after is judged against the bytes
                # from before it (``Baselines.cut_before``).
                remembered = await self.files.baselines.keep_cut(path, commit, judged, ctx_info)
            before, inode.pending = inode.pending, commit
            try:
                await self.ws.committer.submit(commit, wait)
            except BaseException:
                if remembered is not None:
                    self.files.baselines.drop_cut(path)
                # Refused before the committer took it (e.g. the journal is unavailable):
                # nothing was written, so the stage goes and the file reads as before.
                if inode.pending is commit and not self.ws.committer.is_queued(commit):
                    inode.pending = before if before is not None and not before.settled else None
                    if inode.stage is stage:
                        inode.stage = self.files.beneath(inode)
                    self.ws.stages.drop(stage)
                    self.files.kernel.invalidate(inode)
                    if allowance is not None:
                        self.ws.allowances.give_back(allowance)
                raise
            # (a submit that waited, for fsync or strict durability, saw its record already)
            commit.shown = True
            self.files.on_written(path, intended, commit)
