"""What each process read, so that a commit over a version it never saw is a stale write
(SPEC §6.4): the read records (``seen``, ``read_at``), kept up as paths change
(``path_made``, ``path_leaves``), and the bytes of a replaced file a process had
read, held open until it writes (``Gone``, ``keep_gone``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .inodes import Inode

if TYPE_CHECKING:
    from .files import Files

# Stale writes: the (process, file) pairs remembered before all are forgotten, and the
# replaced files whose bytes are held open, so that a process that read one can be told
# what it read (the oldest is let go first).
READS_MAX = 100_000
GONE_MAX = 256


@dataclass(eq=False, slots=True)
class Gone:
    """A file its path stopped naming (renamed over or away, removed) while another
    process had read it there: a descriptor of its bytes, hashed only if that process
    then writes the path (a stale write's ``read``, and its conflict's base)."""

    fd: int
    digest: str | None = None


@dataclass(eq=False, slots=True)
class ReadAt:
    """The file a process last opened to read at a path: its inode and version. Once the
    path stops naming that file (``replaced``), the digest the process read if it is
    known (``read``), else the replaced file's bytes (``gone``), and whether the file had
    changed since the read anyway (``changed``)."""

    serial: int  # Inode.serial: inode numbers may be handed on (inodes.py)
    version: int
    replaced: bool = False
    read: str | None = None
    gone: Gone | None = None
    changed: bool = False


class Reads:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.ws = files.ws
        # (process, Inode.serial) -> the inode's version when that process last opened it to read.
        self.seen: dict[tuple[int, int], int] = {}
        # path -> process -> what it read there: a save that replaces the file's inode (a
        # rename over it, or unlink and create) leaves the path naming another inode.
        self.read_at: dict[bytes, dict[int, ReadAt]] = {}
        self.read_at_n = 0
        self.gone_fds: list[Gone] = []  # holding a descriptor, oldest first (GONE_MAX)

    def stale_read(self, inode: Inode, who: dict[str, Any]) -> str | None:
        """A lost update (SPEC §6.4): the digest this process last read of the file ("" if
        it is no longer known), if another process changed the file since; else None."""
        if self.ws.policy.stale_write == "off":
            return None
        seen = self.seen.get((who.get("pid", 0), inode.serial))
        if seen is None or seen == inode.version:
            return None
        return inode.digests.get(seen) or ""  # "": a version too old to be remembered

    async def replaced_read(
        self, inode: Inode, path: bytes, who: dict[str, Any], shown: str | None
    ) -> tuple[str | None, int]:
        """A lost update over a replaced file (SPEC §6.4): this process read ``path``,
        then another process replaced the file there (``path_leaves``), and what it read
        is not what the path holds now. Returns (the digest it read, "" if it is no longer
        known, or None: not stale; a descriptor of those bytes or -1)."""
        if self.ws.policy.stale_write == "off":
            return None, -1
        rec = self.read_at.get(path, {}).get(who.get("pid", 0))
        if rec is None or not rec.replaced or rec.serial == inode.serial:
            return None, -1  # (the file it read may be back at its path)
        read, gone = rec.read, rec.gone
        if read is None and gone is not None:
            if gone.digest is None and gone.fd >= 0:
                try:
                    gone.digest = await self.ws.digests.of(gone.fd)  # off the loop
                except OSError:
                    pass
            read = gone.digest
        if read is not None and read == shown:
            return None, -1  # replaced by the very bytes it read: nothing is lost
        if read is None and not rec.changed:
            return None, -1  # its bytes were let go (GONE_MAX): never a false stale write
        return read or "", gone.fd if gone is not None and read is not None else -1

    def opened_to_read(self, pid: int, inode: Inode) -> None:
        """Process ``pid`` opened the file to read: remember which version it read."""
        if len(self.seen) > READS_MAX or self.read_at_n > READS_MAX:
            self._forget_reads()
        self.seen[(pid, inode.serial)] = inode.version
        self._note_read(pid, inode)

    def _note_read(self, pid: int, inode: Inode) -> None:
        at = self.read_at.setdefault(inode.path, {})
        if pid not in at:
            self.read_at_n += 1
        at[pid] = ReadAt(inode.serial, inode.version)

    def _forget_reads(self) -> None:
        """The memory of reads is bounded: past READS_MAX pairs, all are forgotten."""
        self.seen.clear()
        self.read_at.clear()
        self.read_at_n = 0
        for gone in self.gone_fds:
            os.close(gone.fd)
            gone.fd = -1
        self.gone_fds.clear()

    def path_made(self, path: bytes, ino: int, pid: int) -> None:
        """Process ``pid`` made the file at ``path``: where it had read a file another
        process removed since, writing its new file loses nothing of anyone's."""
        at = self.read_at.get(path)
        inode = self.files.inodes.get(ino)
        if at and pid in at and inode is not None:
            at[pid] = ReadAt(inode.serial, inode.version)

    def path_leaves(self, path: bytes, actor: int, now: Inode | None = None) -> None:
        """``path`` is about to stop naming its file (renamed over or away, removed; an
        exchange): a process that read the file there and then writes the path would
        write over a file it never read. Called before the syscall, while the path still
        names the file: if the syscall fails, the path names the inode each reader read
        and ``replaced_read`` finds nothing stale. The changing process's own change is
        no stale write: its record follows the file it put there (``now``), if any;
        ``actor`` is that process."""
        at = self.read_at.get(path)
        if not at:
            return
        mine = at.pop(actor, None)
        if mine is not None:
            if now is not None and not now.is_dir:
                at[actor] = ReadAt(now.serial, now.version)
            else:
                self.read_at_n -= 1
        inode = self.files.inodes.by_path.get(path)
        if inode is None:
            return
        gone: Gone | None = None
        for pid, rec in at.items():
            # Replaced once already (it keeps what it read then), or read as an inode
            # the kernel has forgotten since: not known to be this file.
            if pid == actor or rec.replaced or rec.serial != inode.serial:
                continue
            rec.replaced = True
            rec.changed = rec.version != inode.version
            rec.read = inode.digests.get(rec.version)
            if rec.read is None and not rec.changed:
                # Never committed through the mount: its bytes tell what was read.
                gone = gone or self._keep_gone(path)
                rec.gone = gone

    def _keep_gone(self, path: bytes) -> Gone | None:
        how = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            gone = Gone(os.open(path, how, dir_fd=self.ws.root_fd))
        except OSError:
            return None
        self.gone_fds.append(gone)
        if len(self.gone_fds) > GONE_MAX:
            old = self.gone_fds.pop(0)
            os.close(old.fd)
            old.fd = -1
        return gone

    def new_version(self, inode: Inode, old: str | None, new: str, who: dict[str, Any]) -> None:
        inode.digests[inode.version] = old
        inode.version += 1
        inode.digests[inode.version] = new
        inode.digests.pop(inode.version - 16, None)
        pid = who.get("pid", 0)
        key = (pid, inode.serial)
        if key in self.seen:  # a writer has seen its own bytes
            self.seen[key] = inode.version
        for path in inode.paths:
            at = self.read_at.get(path)
            if at is not None and pid in at:
                at[pid] = ReadAt(inode.serial, inode.version)
