"""Opens the kernel reads and writes itself: FUSE passthrough (Linux 6.9 and later).

When ``core.direct`` finds nothing for rwfs to decide about an open file (a file of
passthrough paths only: ``.git/``, ``node_modules/``, ``*.sqlite``, …), its OPEN or
CREATE is answered with a backing id: the kernel then reads, writes and maps that open
file on the backing file itself, and no READ, WRITE or FLUSH of it reaches the daemon.

This module keeps the kernel's side of it: one backing id per inode while any of its opens
is passed through (the kernel requires every open of an inode in passthrough to use the
same backing file), registered at the first such open and let go at the last release.
It is on unless the mount says ``-o fastpath=off``; off when the kernel did not offer
passthrough at INIT, and from the first time the kernel refuses a backing file (EPERM:
the daemon lacks CAP_SYS_ADMIN, which Linux requires for it); the mount then works as
before, each request answered by rwfs.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable

from ..core import direct
from ..core.files import Files
from ..core.inodes import Inode
from . import kernelflags

log = logging.getLogger(__name__)


class Passthrough:
    def __init__(self, files: Files, enabled: bool) -> None:
        self.files = files
        self.enabled = enabled and kernelflags.ACTIVE
        self.refused = ""  # why the kernel would not take a backing file, once it did not
        self._ids: dict[int, int] = {}  # Inode.serial -> backing id, while Inode.direct

    @property
    def on(self) -> bool:
        return self.enabled and not self.refused and kernelflags.passthrough_ready()

    def open(self, inode: Inode, fh: int, stat: Callable[[], os.stat_result]) -> int:
        """The handle number to answer this open of ``inode`` with: ``fh`` marked for the
        kernel to pass the open file through, or ``fh`` as it is. Call it last in the
        open, once its handle counts in ``inode.handles``."""
        if not inode.direct and (not self.on or inode.fd < 0):
            return fh
        must = direct.mode(self.files, inode, stat(), inode.handles - 1)
        if must is False:
            return fh
        backing = self._ids.get(inode.serial)
        if backing is None:
            try:
                backing = kernelflags.backing_open(inode.fd, inode.ino)
            except OSError as exc:
                if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTTY):
                    self.refused = os.strerror(exc.errno or errno.EPERM)
                    log.info("FUSE passthrough is off for this mount: %s", self.refused)
                return fh  # (no other open of it is passed through: none needs the id)
            self._ids[inode.serial] = backing
        marked = kernelflags.passthrough(fh, backing)
        inode.direct += 1
        self.files.passed[inode.serial] = inode
        return marked | kernelflags.NOFLUSH  # (a close commits nothing: no FLUSH)

    def release(self, inode: Inode) -> None:
        """One passed-through open of ``inode`` was released."""
        inode.direct -= 1
        if inode.direct:
            return
        self.files.passed.pop(inode.serial, None)
        backing = self._ids.pop(inode.serial, None)
        if backing is not None:
            try:
                kernelflags.backing_close(backing, inode.ino)
            except OSError as exc:  # (the kernel holds its own reference: nothing leaks)
                log.info("closing backing id %d: %s", backing, exc)

    def counts(self) -> dict[str, object]:
        return {
            "on": self.on,
            "opens": kernelflags.passthrough_opens(),
            "files": len(self._ids),
            "capability_answers": kernelflags.direct_answers(),
            "attr_answers": kernelflags.direct_attrs(),
            "release_answers": kernelflags.release_answers(),
            "refused": self.refused or None,
        }
