"""What a group does to the tree and the journal, in the committer's worker thread (SPEC
§3.2 steps 5-8): stages synced, receipts prepared, each commit checked against the live
file and renamed over it (or written in place, for a hard-linked file), the namespace
events' digests settled, one round of syncs, the commit records.

Everything here blocks; nothing here runs on the event loop but ``_set_durable``."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from typing import TYPE_CHECKING, Any

import trio

from .. import beneath, faults
from ..journal.objects import EMPTY_DIGEST, open_regular
from .commits import Commit, Event, record_commit, record_event
from .errors import RwfsError, TooLarge, too_large, type_swap
from .syscalls import copy_range, fsdecode, syncfs

if TYPE_CHECKING:
    from .workspace import Workspace


class Landing:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def apply_group(
        self,
        group: list[Commit | Event],
        gens: list[int],
        progress: dict[str, bool],
        loop: trio.lowlevel.TrioToken,
        before: tuple[list[Commit | Event], list[int]],
        record: bool,
        unsynced: bool,
    ) -> None:
        """Make a group durable: stages synced, receipts, renames, one round of syncs,
        commit records (thread). The records of ``before`` (the group applied last, not
        recorded) go in the receipts' transaction, after the syncfs of this group's stages
        that makes its renames durable too (``unsynced``: they are not yet), or with this
        group's records if it has no receipts. Without ``record``, this group's records
        and syncfs wait for the next group, unless it has no receipts (``progress`` says
        what was done).

        ``gens`` are the intent-log generations that hold the group's records (more than
        one for a retried group). A retried group's commits that were already replaced
        only get their records."""
        before_items, before_gens = before
        commits = [c for c in group if isinstance(c, Commit) and not c.replaced]
        t = time.perf_counter()
        if commits:
            if len(commits) > 8 or unsynced:
                # One round of syncs for the whole group, and for the renames of the
                # groups before it, which must be durable before their records.
                syncfs(self.ws.staging_fd)
                unsynced = False
            else:
                for c in commits:
                    os.fsync(c.stage.fd)
            faults.point("after_stage_sync")
            t = self._step("group.stage_sync", t)

        linked = self.ws.links.linked([c for c in commits if not c.superseded])

        def prepare(txn: Any) -> None:
            if before_items:  # (synced above): its records go first
                self.write_records(txn, before_items, before_gens)
            for c in commits:
                rid = txn.new_receipt(
                    {
                        "batch": None,
                        "path": fsdecode(c.path),
                        "expected": c.stage.expected,
                        "intended": c.intended,
                        "stage": c.stage.name.decode(),
                        "intent": c.id,
                        **({"in_place": True} if c.id in linked else {}),
                        **({"as": fsdecode(c.journal_path)} if c.journal_path else {}),
                        **({"superseded": True} if c.superseded else {}),
                    }
                )
                c.info["receipt"] = rid
            txn.set_meta_int(b"prepared_gen", gens[-1])

        if commits:
            self.ws.store.write(prepare)
            t = self._step("group.prepare", t)
            if before_items:
                progress["recorded_before"] = True
                self._recorded_gens(before_gens)
        progress["prepared"] = True
        if commits:
            faults.point("after_prepare")
        for c in commits:
            if c.superseded:
                self._keep_superseded(c)
            else:
                self.replace(c)
            c.replaced = True
        kept: dict[str, dict[str, Any]] = {}
        for item in group:
            if isinstance(item, Event) and not item.settled:
                if fields := self._settle_event_digests(item):
                    kept[item.id] = fields
                item.settled = True
        if kept:
            # Their kept files now have digest names: a recovery before the records would
            # not find them by their incoming names.
            assert self.ws.committer.intents is not None
            self.ws.committer.intents.append_to(gens[-1], {"kind": "digests", "events": kept})
        # Each commit is durable now: after a crash its receipt is there, and the live
        # file holds the intended bytes, or the expected ones beside a synced stage that
        # recovery renames (SPEC §6.2). So a writer waiting in fsync is answered now,
        # while this thread goes on (not waiting for the loop to take the call).
        loop.run_sync_soon(_set_durable, commits)
        if group:
            t = self._step("group.replace", t)
        if record or not commits:
            if group or unsynced:
                # The renames, the namespace operations and the kept objects are durable
                # before their records: one round of syncs for the whole group, and for
                # the group before if its records are the ones to write.
                syncfs(self.ws.root_fd)
                t = self._step("group.syncfs", t)
            unsynced = False
        else:
            unsynced = True  # the next group's first syncfs covers this one's renames
        progress["synced"] = not unsynced
        if commits:
            faults.point("before_commit_record")
        if record or not commits:
            # (A group of namespace events alone has no receipts to wait with.)
            owed = [] if progress["recorded_before"] else before_items
            owed_gens = [] if progress["recorded_before"] else before_gens
            if owed or group:
                self.ws.store.write(self.write_records, owed + group, owed_gens + gens)
                self._step("group.record", t)
                progress["recorded_before"] = progress["recorded"] = True
                self._recorded_gens(owed_gens + gens)

    def write_records(self, txn: Any, items: list[Commit | Event], gens: list[int]) -> None:
        """The commit records of applied groups, in the journal's order (in ``txn``)."""
        for item in items:
            if isinstance(item, Commit):
                record_commit(txn, item)
            else:
                item.lsn = record_event(txn, dict(item.event), self.ws.policy)
        txn.set_meta_int(b"applied_gen", gens[-1])

    def _recorded_gens(self, gens: list[int]) -> None:
        """The intent-log generations whose records are all journaled now go."""
        faults.point("after_commit_record")
        assert self.ws.committer.intents is not None
        for g in gens:
            self.ws.committer.intents.drop(g)

    def _step(self, name: str, since: float) -> float:
        """Sample the time a step of the group commit took (``.rw/stats``); returns now."""
        now = time.perf_counter()
        self.ws.stats.sample(name, now - since)
        return now

    def _keep_superseded(self, c: Commit) -> None:
        """A commit whose file a rename or an unlink took away before it landed: its bytes
        are a version of the path (the event's ``expected``): its synced stage becomes the
        object. The FUSE layer then lets go of the stage's name, and reads it still for
        descriptors open on the replaced file (``Files._superseded``)."""
        c.outcome = "landed"
        assert c.intended is not None
        self.ws.objects.keep_link(self.ws.staging_fd, c.stage.name, c.intended)

    def _settle_event_digests(self, item: Event) -> dict[str, Any]:
        """Hash what the event's digests are taken from; returns the fields taken from its
        removed bytes, once they are moved to their digest name."""
        kept: dict[str, Any] = {}
        if item.incoming is not None:
            got = self.ws.objects.settle_incoming(item.incoming)
            if got is not None and item.event.get("supersedes"):
                # The tree's file the rename replaced was older than what the mount showed
                # there (a commit still queued, kept on its own): kept too.
                kept = {"replaced": got[0]}
            elif got is not None:
                kept = {"expected": got[0], "size": got[1]}
            item.event.update(kept)
        if item.hash_fd is not None:
            try:
                item.event["intended"] = self.ws.digests.of_fd(item.hash_fd)
            finally:
                os.close(item.hash_fd)
            item.hash_fd = None
        if any(c.outcome not in ("committed", "landed") for c in item.carried):
            # A write the rename moved did not land (the tree's file changed meanwhile):
            # the rename put at its destination what the tree holds there.
            try:
                item.event["intended"] = self.ws.digests.live(os.fsencode(item.event["dest"]))[0]
            except TooLarge:  # (past max_journaled_bytes: not hashed)
                item.event["intended"] = None
        return kept

    def replace(self, c: Commit) -> None:
        """Step 7 of SPEC §3.2 for one commit: check the live file, keep it, rename the stage
        (or, for a batch's deletion, unlink the file). The file's directory is opened once,
        beneath the root (``beneath``): every step acts on that directory, so a directory
        on the path swapped for a symlink meanwhile is never followed."""
        try:
            with contextlib.ExitStack() as held:
                try:
                    d, name = held.enter_context(beneath.parent(self.ws.root_fd, c.path))
                except FileNotFoundError:  # its directory is gone: the file is absent
                    d, name = -1, b""
                self._replace_at(c, held, d, name)
        except beneath.Escape:
            c.outcome, c.error = "error", type_swap(c.path)
            self.keep_intended(c)
        except TooLarge:
            c.outcome, c.error = "error", too_large(c.path, self.ws.policy.max_journaled_bytes)
            self.keep_intended(c)
        except OSError as exc:
            c.outcome = "error"
            c.error = RwfsError(
                exc.errno or errno.EIO,
                "journal_unavailable",
                "io",
                f"The commit could not replace the file ({exc.strerror}); the file is unchanged "
                "and the receipt stays pending until the next mount retries it.",
                path=fsdecode(c.path),
            )

    def _replace_at(self, c: Commit, held: contextlib.ExitStack, d: int, name: bytes) -> None:
        """``replace`` on ``name`` in directory ``d`` (-1: the directory is missing)."""
        live, st = self.ws.digests.live_at(d, name) if d >= 0 else (None, None)
        if st is not None and not stat.S_ISREG(st.st_mode):
            c.outcome, c.error = "error", type_swap(c.path)
            self.keep_intended(c)
            return
        # Other names share the file (not just the link of a kept object). A rename onto
        # one of them (a batch's ``replace``) goes on even when the bytes are the same:
        # the name gets a file of its own, as rename(2) gives it.
        shared = st is not None and self.ws.links.hard_linked(st, live)
        if live == c.intended and not (
            c.info.get("replace") and shared and live == c.stage.expected
        ):
            c.outcome = "landed"
            self.keep_intended(c)  # nothing to keep: it is in the tree
            self.ws.links.landed(c, st)
            return
        if live != c.stage.expected:
            c.outcome = "conflict"
            c.info["actual"] = live
            self.keep_intended(c)
            return
        # A hard-linked file is written in place, unless the commit stands for a rename
        # onto the name (a batch's), which replaces the name as rename(2) would.
        linked = shared and not c.info.get("replace")
        if live is not None:
            assert st is not None
            if live == EMPTY_DIGEST and c.owner is not None and self.ws.objects.exists(live):
                c.spare = self.ws.stages.spare_link(d, name, st)
            elif shared:
                # Other names share the inode and may change it in place: linked, the
                # object would change with it. A copy is kept; if the bytes moved since
                # the check, the commit is a conflict like any other.
                kept = self._keep_copy(d, name)
                if kept != live:
                    c.outcome = "conflict"
                    c.info["actual"] = kept
                    self.keep_intended(c)
                    return
            else:
                self.ws.objects.keep_link(d, name, live)
            c.info["kept"] = True
        faults.point("after_preimage")
        if c.intended is None:
            if st is not None:  # the mode of the file removed: undo, restore use it
                c.info["mode"] = stat.S_IMODE(st.st_mode)
                os.unlink(name, dir_fd=d)
            c.outcome = "committed"
            return
        if linked:
            assert st is not None
            self.write_in_place(c, st, d, name)
            return
        if d < 0:  # a file restored where a whole directory was removed
            head = c.path.rpartition(b"/")[0]
            beneath.makedirs(self.ws.root_fd, head)
            d, name = held.enter_context(beneath.parent(self.ws.root_fd, c.path))
        # A plain filesystem leaves a directory's times alone when a file in it is
        # rewritten (and tar and cp -a set them after writing the files): the rename
        # moves them, so they are put back.
        kw: dict[str, Any] = {"dir_fd": d, "follow_symlinks": False}
        dir_st = os.stat(b".", **kw) if live is not None else None
        os.rename(c.stage.name, name, src_dir_fd=self.ws.staging_fd, dst_dir_fd=d)
        if dir_st is not None:
            os.utime(b".", ns=(dir_st.st_atime_ns, dir_st.st_mtime_ns), **kw)
        faults.point("after_rename")
        got = os.stat(name, **kw)
        mine = os.fstat(c.stage.fd)
        if (got.st_dev, got.st_ino) != (mine.st_dev, mine.st_ino):
            c.outcome = "error"
            c.error = RwfsError(
                errno.EIO,
                "write_corruption",
                "verify",
                "The file did not hold the committed bytes after the rename; "
                "read it again before editing.",
                path=fsdecode(c.path),
            )
            return
        self.ws.digests.remember(mine, c.intended)
        c.info["mode"] = stat.S_IMODE(mine.st_mode)  # journaled: undo, restore use it
        c.new_ino = mine.st_ino
        c.outcome = "committed"

    def write_in_place(self, c: Commit, st: os.stat_result, dir_fd: int, name: bytes) -> None:
        """Commit a hard-linked file: its other names must go on naming it, which a rename
        of the stage over one name would undo, so the stage's bytes are copied into the
        live inode. Not atomic, unlike a rename: the receipt says ``in_place`` and the
        stage stays until the commit record, so recovery finishes a copy a crash cut
        short (recovery.py). The names it changes besides ``c.path`` are journaled with
        the write (``links``)."""
        how = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, how, dir_fd=dir_fd)
        try:
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "the file was replaced during the commit")
            size = os.fstat(c.stage.fd).st_size
            copy_range(c.stage.fd, fd, size)
            faults.point("in_place_copied")
            os.ftruncate(fd, size)
            got = os.fstat(fd)
        finally:
            os.close(fd)
        c.info["links"] = self.ws.links.journaled(c, got)
        c.info["in_place"] = True
        c.info["mode"] = stat.S_IMODE(got.st_mode)
        self.ws.digests.remember(got, str(c.intended))
        c.new_ino = got.st_ino
        c.discard = True  # the live inode holds the bytes now: the stage goes
        c.outcome = "committed"

    def _keep_copy(self, dir_fd: int, path: bytes) -> str:
        fd, _ = open_regular(dir_fd, path)
        if fd < 0:
            raise OSError(errno.EPERM, "not a regular file", os.fsdecode(path))
        try:
            return self.ws.objects.keep_fd_copy(fd)
        finally:
            os.close(fd)

    def keep_intended(self, c: Commit) -> None:
        """Keep the bytes of a commit that did not replace its file; its stage is to go."""
        if c.stage.fd < 0:  # a deletion: no bytes of its own
            return
        if c.outcome != "landed" and c.intended is not None:
            self.ws.objects.keep_fd_copy(c.stage.fd, c.intended)
        c.discard = True


def _set_durable(commits: list[Commit]) -> None:
    for c in commits:
        c.durable.set()
        c.nudge()
