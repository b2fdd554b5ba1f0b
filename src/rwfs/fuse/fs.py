"""The FUSE request handlers: thin, each one checks, then delegates to the core.

Only ``pyfuse3.FUSEError`` leaves a handler (``_guard``): an ``OSError`` becomes its errno,
an ``RwfsError`` its errno plus an envelope in ``.rw/last-error``, anything else is logged
and becomes EIO. ``forget`` and ``release`` never raise.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import functools
import logging
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyfuse3
import trio

from .. import beneath
from ..checks import parsers
from ..control.nodes import CDir, CFile, CNode
from ..control.tree import Control
from ..core import direct
from ..core.batches import Batches
from ..core.commits import Commit
from ..core.errors import RwfsError, TooLarge, escaped, journal_unavailable, too_large
from ..core.files import Files
from ..core.inodes import ROOT, Inode, InodeTable
from ..core.stages import Stage
from ..core.syscalls import borrowed, fsdecode, rel
from ..core.workspace import Workspace
from ..journal.objects import EMPTY_DIGEST
from ..journal.store import JournalUnavailable
from . import kernelflags, notice
from .passthrough import Passthrough

log = logging.getLogger("rwfs.fs")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# Whom the request being handled would tell of a refusal, when not the sender that ``_who``
# names (a flush or fsync: the handle's holder, with what its stderr was; notice.py).
_HOLDER: contextvars.ContextVar[notice.Writer | None] = contextvars.ContextVar(
    "rwfs_holder", default=None
)

# How long the mount must go without a request before it parses the file last read.
PRIME_AFTER_IDLE = 0.05

# fallocate(2) modes (linux/falloc.h); the kernel sends FUSE only these three.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

# Linux's longest name, and longest path a syscall takes (PATH_MAX less its NUL), in bytes.
NAME_MAX = 255
PATH_MAX = 4095


def _guard(quiet: bool = False) -> Callable[[F], F]:
    def wrap(fn: F) -> F:
        op = "op." + fn.__name__  # its latency in .rw/stats

        @functools.wraps(fn)
        async def handler(self: Operations, *args: Any) -> Any:
            started = self._last_request = time.perf_counter()
            holder = _HOLDER.set(None)  # (a request task handles one request after another)
            try:
                self._let_go()  # (every request sees the releases answered before it in C)
                return await fn(self, *args)
            except pyfuse3.FUSEError:
                if quiet:
                    return None
                raise
            except (RwfsError, beneath.Escape, TooLarge) as exc:
                if isinstance(exc, TooLarge):
                    err = too_large(
                        os.fsencode(exc.filename or ""), self.ws.policy.max_journaled_bytes
                    )
                else:
                    err = escaped(exc) if isinstance(exc, beneath.Escape) else exc
                self.control.fail(err)
                if quiet:
                    return None
                await self._tell_writer(err.envelope, _HOLDER.get())
                raise pyfuse3.FUSEError(err.errno) from None
            except OSError as exc:
                if quiet:
                    return None
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            except JournalUnavailable as exc:
                # LMDB could not commit an operation that writes it directly (a refusal's
                # record, a batch's hold): EIO, as SPEC §7.2 says, and the envelope.
                self.control.fail(journal_unavailable(b"", str(exc)))
                if quiet:
                    return None
                raise pyfuse3.FUSEError(errno.EIO) from None
            except Exception:
                log.exception("%s failed", fn.__name__)
                if quiet:
                    return None
                raise pyfuse3.FUSEError(errno.EIO) from None
            finally:
                _HOLDER.reset(holder)
                self.ws.stats.sample(op, time.perf_counter() - started)

        return handler  # type: ignore[return-value]

    return wrap


def _no_atime(fd: int) -> None:
    """Reads through ``fd`` move no access time (-o noatime, nodiratime); a daemon that
    may not (not the file's owner, no CAP_FOWNER: EPERM) reads it as it is."""
    if fd >= 0:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME)


def _drop_kernel_cache(ino: int) -> None:
    # In a worker thread: the kernel may wait on a request of ours while it drops the page
    # cache, so the event loop must never block on this.
    try:
        pyfuse3.invalidate_inode(ino)
    except OSError:
        pass


def _drop_kernel_entry(parent_ino: int, name: bytes) -> None:
    try:
        pyfuse3.invalidate_entry(parent_ino, name)
    except OSError:
        pass


def _fixed_size(node: Any) -> tuple[int, int | None]:
    """(size, mtime) of a control file whose bytes are fixed; (0, None) otherwise."""
    if isinstance(node, CFile) and node.stat is not None:
        try:
            return node.stat()
        except OSError:
            pass
    return 0, None


# The fields of a stat_result beyond its tuple (os.stat_result takes them as a dict).
_STAT_EXTRA = (
    "st_atime",
    "st_mtime",
    "st_ctime",
    "st_atime_ns",
    "st_mtime_ns",
    "st_ctime_ns",
    "st_blksize",
    "st_blocks",
    "st_rdev",
)


@dataclass(eq=False)
class Handle:
    inode: Inode
    writable: bool
    dirty: bool = False  # written since this handle's last commit point
    info: dict[str, Any] = field(default_factory=dict)
    # Opened with O_TRUNC, nothing written since: a close commits the empty file, unless
    # another descriptor of the opener's can still write it (``_only_reference``).
    truncated: bool = False
    # What the stderr of its last writer was when it began writing (or of its opener),
    # and the opener's start time when the kernel's requests do not name their sender:
    # whom a refusal at its commit point is told (notice.py).
    stderr: str = ""
    start: int = -1
    direct: bool = False  # passed through: the kernel reads and writes it (passthrough.py)


@dataclass(eq=False)
class ControlHandle:
    node: CFile
    data: bytes
    written: bytearray | None = None
    mtime_ns: int = 0  # of ``data`` (CFile.rendered): what fstat says while it is open
    dirty: bool = False  # written since the last flush applied the text
    who: dict[str, Any] = field(default_factory=dict)  # the opener (a verb's writer)
    # A verb that failed: (offset, bytes, errno). Buffered writers (Python's, for one)
    # write the same bytes again when closing after a failed write; that is no new verb.
    failed: tuple[int, bytes, int] | None = None
    over: bool = False  # a write went past the file's size limit: nothing is applied


def _where(top: CDir, node: CNode) -> str | None:
    """The ``.rw/`` path of a writable control file: at the top, in ``scratch/`` or in
    ``chunks/NAME/`` (the only places that take files)."""
    todo = [(b".rw", top)]
    while todo:
        at, d = todo.pop()
        for name, child in d.children.items():
            if child is node:
                return os.fsdecode(at + b"/" + name)
            if isinstance(child, CDir) and (d is not top or name in (b"scratch", b"chunks")):
                todo.append((at + b"/" + name, child))
    return None


def _too_large(h: ControlHandle, top: CDir) -> RwfsError:
    name = _where(top, h.node) or ".rw/" + os.fsdecode(h.node.name)
    limit = h.node.max_bytes
    size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"
    return RwfsError(
        errno.EFBIG,
        "quota_exceeded",
        "too_large",
        f"Nothing you wrote to {name} was applied, because the text is larger "
        f"than its limit of {size}; it is as it was before: write at most {size}, in full.",
        path=name,
        details={"limit": limit},
    )


@dataclass(eq=False)
class DirHandle:
    inode: Inode | None
    entries: list[bytes] | None  # None: listed at the first readdir (often none comes)
    fd: int = -1
    node: CDir | None = None  # a control directory (then inode is None)


class Handles(dict[int, "Handle | ControlHandle | DirHandle"]):
    """Open handles by number; a number may carry kernelflags' marks."""

    def __getitem__(self, fh: int) -> Handle | ControlHandle | DirHandle:
        return super().__getitem__(kernelflags.handle(fh))

    def get(self, fh: int, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(kernelflags.handle(fh), default)

    def pop(self, fh: int, *default: Any) -> Any:  # type: ignore[override]
        return super().pop(kernelflags.handle(fh), *default)


class KernelCache:
    """What the core asks of the kernel (``files.Kernel``): drop an inode's cached pages,
    a name's entry, a directory's listing. Each drop runs in a worker thread: the kernel
    may wait on a request of ours while it drops, so the event loop never blocks on it."""

    def __init__(self, inodes: InodeTable) -> None:
        self.inodes = inodes
        self._dropping = 0  # kernel-cache invalidations in flight (_soon)
        self._dropped = trio.Event()

    def invalidate(self, inode: Inode) -> None:
        """Drop the kernel's cache of an inode soon (when a request of ours may hold the
        kernel's lock on it, e.g. an fsync we have not answered yet)."""
        self._soon(_drop_kernel_cache, inode.ino)

    def _soon(self, drop: Callable[..., None], *args: Any) -> None:
        """Run a kernel-cache invalidation in a worker thread, without waiting for it."""
        self._dropping += 1

        async def run() -> None:
            try:
                await trio.to_thread.run_sync(drop, *args)
            finally:
                self._dropping -= 1
                if not self._dropping:
                    self._dropped.set()
                    self._dropped = trio.Event()

        trio.lowlevel.spawn_system_task(run)

    async def settled(self) -> None:
        """Wait until the invalidations started so far are done: a control verb that
        changed files (restore, undo, resume, a conflict's verb) returns after them, so
        that what its writer reads next is the new bytes."""
        while self._dropping:
            await self._dropped.wait()

    async def invalidate_now(self, inode: Inode) -> None:
        """Drop the kernel's cache of an inode before answering."""
        await trio.to_thread.run_sync(_drop_kernel_cache, inode.ino)

    def drop_entry(self, path: bytes) -> None:
        """Make the kernel look ``path`` up again (its cached entry, or its absence, is
        stale) and list its directory again."""
        parent, _, name = path.rpartition(b"/")
        inode = self.inodes.by_path.get(parent)
        if inode is not None:
            self._soon(_drop_kernel_entry, inode.ino, name)
            self._soon(_drop_kernel_cache, inode.ino)  # its listing (CACHE_DIR)

    def tree_changed(self, path: bytes) -> None:
        """rwfs itself wrote ``path``, and may have made the directories above it: drop
        what the kernel knows of each level."""
        while path:
            self.drop_entry(path)
            path = path.rpartition(b"/")[0]


class Operations(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(
        self,
        ws: Workspace,
        batches: Batches,
        info: dict[str, Any],
        show_control: bool,
        timeout: float,
    ) -> None:
        super().__init__()
        self.ws = ws
        self.batches = batches
        st = os.fstat(ws.root_fd)
        self.inodes = InodeTable((st.st_dev, st.st_ino))
        self.control = Control(ws, batches, info, self.inodes.allocate_control)
        self.control.live["inodes"] = lambda: len(self.inodes.by_ino)
        self.control.live["high_inodes"] = lambda: self.inodes.high
        self.control.live["open_handles"] = lambda: len(self.handles)
        self.control.live["kernel_cache_flags"] = kernelflags.flagged
        self._no_opendir = False
        self.control.live["no_opendir"] = lambda: self._no_opendir
        self.control.live["written_pages_kept"] = kernelflags.pages_kept
        self.control.live["fast_writes"] = kernelflags.fast_written
        self.show_control = show_control
        self.timeout = timeout
        # The fast path answers some attributes in C, with this timeout: a passed-through
        # file's (passthrough.py) and, over the workspace (where only rwfs changes the
        # tree, so a directory's attributes are its backing directory's, found by file
        # handle as well as by path), a directory's (kernelflags.dir_known).
        overmount = info.get("workspace") == info.get("mountpoint")
        self._dir_attrs = bool(info.get("fastpath")) and kernelflags.dir_attrs(
            ws.root_fd if overmount else -1, timeout
        )
        self.control.live["dir_attr_answers"] = kernelflags.dir_answers
        # -o noatime, -o nodiratime: the times shown are the backing files', which the
        # daemon's own reads would move, so it reads files (noatime) and lists directories
        # (both) without moving them (O_NOATIME; docs/cli.md, "atime").
        opts = set(info.get("options", ()))
        self._file_noatime = "noatime" in opts
        self._dir_noatime = self._file_noatime or "nodiratime" in opts
        self.handles = Handles()
        # Open handles of each control file, oldest first: an fstat is answered with the
        # size of the bytes that process's open rendered.
        self._control_open: dict[int, list[ControlHandle]] = {}
        self._next_fh = 1
        self._procs: dict[int, tuple[int, str]] = {}
        # The file last opened to read, parsed ahead of its edit once the mount is idle
        # (run_primer); and when the last request started.
        self._to_prime: int | None = None
        self._listings: dict[int, DirHandle] = {}  # by inode, when the kernel sends no OPENDIR
        self._read_one = trio.Event()
        self._last_request = time.perf_counter()
        # The lifecycle of each file's bytes (stages, commit points, a batch's drafts, the
        # reads a stale write is judged by) is the core's; this layer only translates.
        self.kernel = KernelCache(self.inodes)
        self.files = Files(ws, batches, self.inodes, self.kernel)
        ws.committer.on_committed = self.files.committed
        ws.committer.on_recorded = self._recorded
        self.files.on_written = self._written
        self.control.virtual = self.files.virtual.__contains__
        # (-o noatime: a read the kernel passes through would move the backing atime)
        self.passthrough = Passthrough(
            self.files, info.get("fastpath", False) and not self._file_noatime
        )
        self.control.live["passthrough"] = self.passthrough.counts
        self.files.let_go = self._let_go
        self.control.keep_passthrough = lambda journaled: direct.keep_passthrough_names(
            self.files, b"", None, "policy change", journaled=journaled
        )
        ws.on_gone = self.files.gone

    def _recorded(self, c: Commit) -> None:
        # (rwfs's own put-back after a refused save is no success of the writer's)
        if c.outcome == "committed" and c.intended is not None and not c.info.get("put_back"):
            self.control.succeeded(c.path, c.intended, c.lsn, c.id, c.shown)

    def _written(self, path: bytes, intended: str | None, c: Commit | None) -> None:
        self.control.succeeded(path, intended, commit=c.id if c is not None else "")

    async def run_primer(self) -> None:
        """Parse the file last opened to read once no request has come for a while: an
        agent or an editor reads a file before it writes it, and then that commit's syntax
        gate parses only around the edit (parsers.prime). A busy mount (grep -r, a build)
        never goes idle, so it never pays for this."""
        while True:
            await self._read_one.wait()
            self._read_one = trio.Event()
            for _ in range(20):  # a commit of the file still queued: its bytes will change
                while (quiet := time.perf_counter() - self._last_request) < PRIME_AFTER_IDLE:
                    await trio.sleep(PRIME_AFTER_IDLE - quiet)
                i = self.inodes.get(self._to_prime or 0)
                if i is None or i.virtual or i.unlinked or not i.paths:
                    break
                if i.stage is None and i.pending is None:
                    await trio.to_thread.run_sync(self.ws.gating.prime, i.path)
                    break
                await trio.sleep(PRIME_AFTER_IDLE)

    # ---- helpers ----

    def _fh(self, h: Handle | ControlHandle | DirHandle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = h
        return fh

    def _inode(self, ino: int) -> Inode:
        inode = self.inodes.get(ino)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return inode

    def _attr(self, ino: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.generation = 0
        a.entry_timeout = self.timeout
        a.attr_timeout = self.timeout
        a.st_mode = st.st_mode
        a.st_nlink = st.st_nlink
        i = self.inodes.get(ino)
        if i is not None and i.unlinked:
            a.st_nlink = 0  # its backing inode may be linked as a kept object (Inode)
        elif (
            self._dir_attrs
            and i is not None
            and i.is_dir
            and i.paths
            and i.removed is None
            and st.st_dev == self.inodes.dev  # (a file handle names a file of one filesystem)
        ):
            kernelflags.dir_known(ino, self.ws.root_fd, i.path, st)
        a.st_uid = st.st_uid
        a.st_gid = st.st_gid
        a.st_rdev = st.st_rdev
        a.st_size = st.st_size
        a.st_blksize = st.st_blksize
        a.st_blocks = st.st_blocks
        a.st_atime_ns = st.st_atime_ns
        a.st_mtime_ns = st.st_mtime_ns
        a.st_ctime_ns = st.st_ctime_ns
        return a

    def _negative(self) -> pyfuse3.EntryAttributes:
        """A name the tree does not hold, kept by the kernel as long as a name it found
        (compilers, node and git look for many absent files, again and again). Only the
        kernel's own requests make a name, or rwfs itself, which drops the kernel's entry
        then (``tree_changed``, ``drop_entry``); beside a separate mount point the
        timeout is short, as for every entry (docs/architecture.md, "Kernel caches")."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0  # (libfuse: a negative entry, kept for entry_timeout)
        a.entry_timeout = self.timeout
        return a

    def _stat(self, inode: Inode) -> os.stat_result:
        if inode.stage is not None:
            st = os.fstat(inode.stage.fd)
            if inode.fd < 0 or inode.virtual:
                return st
            # The stage's bytes, the file's links (a hard-linked file is staged too). Only
            # a count above 1 is the file's: a commit's rename leaves the old inode, still
            # open here, with none.
            nlink = os.fstat(inode.fd).st_nlink
            if nlink <= st.st_nlink:
                return st
            fields = list(st)
            fields[stat.ST_NLINK] = nlink
            return os.stat_result(fields, {k: getattr(st, k) for k in _STAT_EXTRA})
        if inode.fd >= 0:
            return os.fstat(inode.fd)
        if inode.removed is not None and not inode.paths:
            return inode.removed
        return os.stat(rel(inode.path), dir_fd=self.ws.root_fd, follow_symlinks=False)

    def _control_attr(
        self, node: Any, size: int = 0, mtime_ns: int | None = None
    ) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.entry_timeout = 0
        a.attr_timeout = 0
        # The owner and mode of what the entry shows (SPEC §3.3b): the kernel checks them,
        # since rwfs mounts with default_permissions (control.py, docs/security.md).
        perm = node.perm() if node.perm is not None else None
        a.st_uid, a.st_gid = perm[:2] if perm is not None else (os.getuid(), os.getgid())
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.control.mtime
        if isinstance(node, CDir):
            # A live view: a new mtime at each look makes the kernel list it again rather
            # than answer from a listing it kept (kernelflags).
            a.st_mtime_ns = time.time_ns()
            a.st_mode = stat.S_IFDIR | (perm[2] if perm is not None else 0o755)
            a.st_nlink = 2
        else:
            bits = perm[2] if perm is not None else 0o444
            if node.verbs:  # a verb file is every user's: each verb checks its caller's rights
                bits = 0o666  # (rights.py)
            elif node.write:
                bits |= 0o200
            a.st_mode = stat.S_IFREG | bits
            a.st_nlink = 1
            a.st_size = size
            a.st_blocks = (size + 511) // 512
            a.st_blksize = 4096
            if mtime_ns is not None:
                a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime_ns
        return a

    async def _control_entry(self, node: Any, ctx: Any) -> pyfuse3.EntryAttributes:
        """A control entry's attributes with its true size (SPEC §5), so that tools that
        copy st_size bytes (shutil, rsync, tar, mmap) get them all."""
        if not isinstance(node, CFile):
            return self._control_attr(node)
        return self._control_attr(node, *await self._control_size(node, ctx))

    async def _control_size(self, node: CFile, ctx: Any) -> tuple[int, int]:
        if node.stat is not None:  # fixed bytes (an object, a live file): one stat
            try:
                return node.stat()
            except OSError:
                return 0, time.time_ns()  # (and reading it gives nothing either)
        # The process reading it now (fstat after open): the bytes its open rendered.
        pid = self._who(ctx)["pid"] if ctx is not None else None
        for h in reversed(self._control_open.get(node.ino, [])):
            if h.who.get("pid") == pid and h.written is None:
                return len(h.data), h.mtime_ns
        # Otherwise render it as an open would (a large render in a worker thread).
        try:
            data, mtime = await self._render(node)
        except (RwfsError, OSError):
            return 0, time.time_ns()  # opening it fails the same way, and says why
        return len(data), mtime

    async def _render(self, node: CFile) -> tuple[bytes, int]:
        """A generated control file's bytes now, and since when it has held them."""
        if node.settle:
            await self.ws.committer.sync()
        elif node.fresh:
            with contextlib.suppress(RwfsError):  # a failing journal: show what there is
                await self.ws.committer.sync()
        if node.shows is not None and node.render_shown is not None:
            render_shown = node.render_shown
            with borrowed(self.files.shown_fd(node.shows)) as (fd,):
                data = await trio.to_thread.run_sync(render_shown, fd)
            return node.rendered(data)
        if node.slow:
            return await trio.to_thread.run_sync(node.rendered)
        return node.rendered()

    def _join(self, parent: Inode, name: bytes) -> bytes:
        if b"/" in name or name in (b".", b".."):
            raise pyfuse3.FUSEError(errno.EINVAL)
        path = parent.path + b"/" + name if parent.path else name
        # FUSE passes names up to 1,024 bytes; a name or path Linux would refuse is refused
        # here too, before a virtual file of an open batch could take it.
        if len(name) > NAME_MAX or len(path) > PATH_MAX:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        return path

    def _is_state_dir(self, path: bytes) -> bool:
        return path == b".rw"

    async def _tell_writer(self, env: dict[str, Any], holder: notice.Writer | None) -> None:
        """One line on the stderr of the writer now waiting for this refusal (notice.py):
        the process holding the descriptor (``holder``), else the request's sender."""
        mode = self.ws.policy.tell_writer
        if holder is None:
            holder = notice.Writer(env.get("pid") or 0, env.get("uid", -1))
        if mode == "off" or holder.pid <= 0:
            return
        line = f"rwfs: {env['message']}"
        if env.get("path"):
            line += f" Details: {self.control.info['mountpoint']}/.rw/why/{env['path']}"
        await trio.to_thread.run_sync(notice.tell, holder, line + "\n", mode == "always")

    def _holder(self, h: Handle) -> notice.Writer:
        """Whom a refusal at this flush or fsync is for: its sender (read before the first
        await), which holds the descriptor and waits in the call; else the opener."""
        sender, uid = kernelflags.caller()
        if sender > 0:
            return notice.Writer(sender, uid, h.stderr)
        return notice.Writer(h.info.get("pid") or 0, h.info.get("uid", -1), h.stderr, h.start)

    def _who(self, ctx: Any) -> dict[str, Any]:
        pid = ctx.pid
        hit = self._procs.get(pid)
        if hit is None:
            tgid, comm = pid, ""
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Tgid:"):
                            tgid = int(line.split()[1])
                            break
                with open(f"/proc/{tgid}/comm", "rb") as f:
                    comm = f.read().strip().decode(errors="replace")
            except OSError:
                pass
            if len(self._procs) > 4096:
                self._procs.clear()
            hit = self._procs[pid] = (tgid, comm)
        # (the thread's own pid: its ancestry is read afresh, see sessions.py)
        return {
            "pid": hit[0],
            "comm": hit[1],
            "uid": ctx.uid,
            "gid": ctx.gid,  # (a refused draft is its writer's: control.py)
            **self.control.sessions.tag(pid),
        }

    def _event(self, ctx: Any, op: str, path: bytes, extra: dict[str, Any]) -> dict[str, Any]:
        ev = {"op": op, "path": fsdecode(path), "batch": None, **extra, **self._who(ctx)}
        return {k: v for k, v in ev.items() if v is not None}

    # ---- lookup and attributes ----

    @_guard()
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        node = self.control.get(parent_inode)
        if node is not None:
            if isinstance(node, CDir) and node.settle:
                await self.ws.committer.sync()
            child = self.control.child(node, name) if isinstance(node, CDir) else None
            if child is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            if isinstance(node, CDir) and node.taken is not None:
                self.control.looked_up(node, name, ctx.pid)
            return await self._control_entry(child, ctx)
        parent = self._inode(parent_inode)
        if parent_inode == ROOT and name == b".rw":
            return self._control_attr(self.control.root)
        path = self._join(parent, name)
        virtual = self.files.virtual.get(path)
        if virtual is not None:
            virtual.lookups += 1
            return self._attr(virtual.ino, self._stat(virtual))
        if path in self.files.hidden:
            raise pyfuse3.FUSEError(errno.ENOENT)  # (an open batch's: not kept)
        try:
            st = os.stat(path, dir_fd=self.ws.root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return self._negative()
        inode = self.inodes.resolve(path, st)
        inode.lookups += 1
        return self._attr(inode.ino, self._stat(inode) if inode.stage else st)

    @_guard(quiet=True)
    async def forget(self, inode_list: Any) -> None:
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    @_guard()
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        node = self.control.get(inode)
        if node is not None:
            return await self._control_entry(node, ctx)
        i = self._inode(inode)
        return self._attr(inode, self._stat(i))

    @_guard()
    async def setattr(
        self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        if self.control.get(inode) is not None:
            if fields.update_size:
                return self._control_attr(self.control.get(inode))
            raise pyfuse3.FUSEError(errno.EPERM)
        i = self._inode(inode)
        path = i.path if i.paths else None  # None: removed, still open (or just removed)
        st = self._stat(i)
        if fields.update_size and not i.virtual:
            await self.files.names.unseen_names(i, st)
        journaled = path is not None and self._journaled(i, st)
        if (
            fields.update_size
            and journaled
            and not i.unlinked
            and stat.S_ISREG(st.st_mode)
            and attr.st_size > self.ws.policy.max_journaled_bytes
        ):
            assert path is not None
            await self.files.leave_journal(i, self._who(ctx), attr.st_size)
            journaled = False  # cut in place, below
        if fields.update_size:
            # An unlinked file's inode may be linked as a kept object meanwhile (st_nlink
            # 2 for a moment while the committer moves it): never change it in place. A
            # passed-through one is the exception: the kernel reads and writes its backing
            # file, and its removal kept nothing (it had passthrough names only).
            if (journaled or i.unlinked) and not i.direct and stat.S_ISREG(st.st_mode):
                await self.files.ensure_stage(i, truncate=attr.st_size == 0)
                assert i.stage is not None
                size = os.fstat(i.stage.fd).st_size
                os.ftruncate(i.stage.fd, attr.st_size)
                # A length the caller chose: an explicit truncation, not written text
                # (the gates do not judge it as a cut-off write; files.py).
                i.stage.cut(min(size, attr.st_size), attr.st_size)
                h = self.handles.get(fh) if fh is not None else None
                if isinstance(h, Handle):
                    h.dirty = True
                elif i.handles == 0:  # truncate(2) of a closed file is a commit of its own
                    await self.files.commit(i, self._who(ctx))
            else:
                self.files.open_backing(i, writable=True)
                os.ftruncate(i.fd, attr.st_size)
        targets: list[Any] = [] if i.virtual or path is None else [rel(path)]
        beneath = i.pending.stage if i.pending is not None and not i.pending.superseded else None
        if beneath is not None and beneath.fd >= 0 and beneath is not i.stage:
            # A commit still queued (or a batch's draft) under the stage being written: it
            # lands first, and stays the file if that stage ends as a no-op.
            targets.append(beneath.fd)
        if i.stage is not None:
            targets.append(i.stage.fd)
        elif path is None and i.fd >= 0:
            targets.append(i.fd)  # a removed file, still open: its own descriptor
        changed = []
        for t in targets:
            kw: dict[str, Any] = (
                {} if isinstance(t, int) else {"dir_fd": self.ws.root_fd, "follow_symlinks": False}
            )
            if fields.update_uid or fields.update_gid:
                uid = attr.st_uid if fields.update_uid else -1
                gid = attr.st_gid if fields.update_gid else -1
                os.chown(t, uid, gid, **kw)
                changed.append("owner")
            if fields.update_mode and not stat.S_ISLNK(st.st_mode):
                os.chmod(t, stat.S_IMODE(attr.st_mode), **kw)
                changed.append("mode")
            if fields.update_atime or fields.update_mtime:
                cur = os.stat(t, **kw)
                atime = attr.st_atime_ns if fields.update_atime else cur.st_atime_ns
                mtime = attr.st_mtime_ns if fields.update_mtime else cur.st_mtime_ns
                os.utime(t, ns=(atime, mtime), **kw)
                changed.append("times")
        if changed and journaled and not i.virtual and path is not None:
            mode = stat.S_IMODE(attr.st_mode) if fields.update_mode else None
            # Already applied: metadata changes are recorded, not staged.
            extra: dict[str, Any] = {"changed": sorted(set(changed)), "mode": mode}
            if "owner" in changed:  # .rw/ shows the file's versions with it (history.py)
                now = self._stat(i)
                extra["owner"] = [now.st_uid, now.st_gid]
            self.ws.committer.record(self._event(ctx, "setattr", path, extra))
        return self._attr(inode, self._stat(i))

    @_guard()
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.readlink(rel(self._inode(inode).path), dir_fd=self.ws.root_fd)

    # ---- namespace ----

    def _new_entry(self, path: bytes, ctx: Any, fd: int = -1) -> pyfuse3.EntryAttributes:
        """The entry the daemon just made for the caller, given the caller's owner (a root
        daemon made it as root). Its set-user-ID and set-group-ID bits, which the chown
        clears on anything but a directory, are put back: the caller asked for them (the
        kernel already dropped a set-group-ID bit the caller may not have). ``fd``: the
        new file's descriptor (read and write); this takes it, as the file's backing
        descriptor, which saves the open that follows a create."""
        kw: dict[str, Any] = {"dir_fd": self.ws.root_fd, "follow_symlinks": False}
        try:
            st = os.stat(path, **kw) if fd < 0 else os.fstat(fd)
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (ctx.uid, ctx.gid):
                gid = ctx.gid
                if st.st_gid != ctx.gid:
                    # In a set-group-ID directory a new entry takes the directory's group,
                    # as the backing filesystem gave it (POSIX; ext4 without grpid).
                    parent = path.rpartition(b"/")[0] or b"."
                    if os.stat(parent, **kw).st_mode & stat.S_ISGID:
                        gid = st.st_gid
                if (st.st_uid, st.st_gid) != (ctx.uid, gid):
                    os.chown(path, ctx.uid, gid, **kw)
                    setid = stat.S_IMODE(st.st_mode) & (stat.S_ISUID | stat.S_ISGID)
                    if setid and not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                        os.chmod(path, stat.S_IMODE(st.st_mode), dir_fd=self.ws.root_fd)
                    st = os.stat(path, **kw)
            inode = self.inodes.resolve(path, st)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        inode.lookups += 1
        if fd >= 0 and inode.fd < 0:
            inode.fd, inode.fd_writable = fd, True
        elif fd >= 0:
            os.close(fd)
        return self._attr(inode.ino, st)

    def _made_owner(self, path: bytes, ctx: Any) -> list[int]:
        """The (uid, gid) a new entry at ``path`` gets (``_new_entry``), for its journal
        event: .rw/ shows the file's versions with its owner (history.py)."""
        root = os.geteuid() == 0
        uid, gid = (ctx.uid, ctx.gid) if root else (os.geteuid(), os.getegid())
        with contextlib.suppress(OSError):
            parent = os.stat(
                path.rpartition(b"/")[0] or b".", dir_fd=self.ws.root_fd, follow_symlinks=False
            )
            if parent.st_mode & stat.S_ISGID:
                gid = parent.st_gid
        return [uid, gid]

    def _parent_path(self, parent_inode: int, name: bytes) -> bytes:
        if self.control.get(parent_inode) is not None:
            raise pyfuse3.FUSEError(errno.EPERM)
        path = self._join(self._inode(parent_inode), name)
        if parent_inode == ROOT and self._is_state_dir(path):
            raise pyfuse3.FUSEError(errno.EEXIST)
        return path

    @_guard()
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        path = self._parent_path(parent_inode, name)
        journaled, kind = self.files.journaled(path), stat.filemode(mode)[0]
        with self.ws.committer.operation(
            journaled, self._who(ctx), "create", path, type=kind, owner=self._made_owner(path, ctx)
        ):
            os.mknod(path, mode & ~ctx.umask, rdev, dir_fd=self.ws.root_fd)
        return self._new_entry(path, ctx)

    @_guard()
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        node = self.control.get(parent_inode)
        if isinstance(node, CDir) and node.mkdir is not None:  # e.g. .rw/batches/NAME
            await node.mkdir(name, self._who(ctx))
            child = self.control.child(node, name)
            if child is None:
                raise pyfuse3.FUSEError(errno.EIO)
            return self._control_attr(child)
        path = self._parent_path(parent_inode, name)
        journaled = self.files.journaled(path, None, True)
        with self.ws.committer.operation(journaled, self._who(ctx), "mkdir", path):
            os.mkdir(path, mode & ~ctx.umask, dir_fd=self.ws.root_fd)
        batch = self.batches.for_writer(self._who(ctx)) if journaled else None
        if batch is not None:
            await self.batches.made_dir(batch, path)
        return self._new_entry(path, ctx)

    @_guard()
    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        path = self._parent_path(parent_inode, name)
        with self.ws.committer.operation(
            self.files.journaled(path), self._who(ctx), "symlink", path, target=fsdecode(target)
        ):
            os.symlink(target, path, dir_fd=self.ws.root_fd)
        return self._new_entry(path, ctx)

    @_guard()
    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        src = self._inode(inode)
        path = self._parent_path(new_parent_inode, new_name)
        await self.files.names.link(src, path, self._who(ctx))
        return self._new_entry(path, ctx)

    async def _remove(self, parent_inode: int, name: bytes, ctx: Any, is_dir: bool) -> None:
        path = self._parent_path(parent_inode, name)
        try:
            await self.files.names.remove(path, self._who(ctx), is_dir)
        except OSError as exc:
            # (A removal that fails changes nothing: it can be tried again.)
            if exc.errno != errno.ENOSPC or not await self._room(removal=True):
                raise
            await self.files.names.remove(path, self._who(ctx), is_dir)
            await self._removed_on_full_disk()

    @_guard()
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        node = self.control.get(parent_inode)
        if isinstance(node, CDir) and node.unlink is not None:
            await node.unlink(name)
            return
        await self._remove(parent_inode, name, ctx, is_dir=False)

    @_guard()
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        node = self.control.get(parent_inode)
        if isinstance(node, CDir) and node.rmdir is not None:
            await node.rmdir(name)
            return
        await self._remove(parent_inode, name, ctx, is_dir=True)

    @_guard()
    async def rename(
        self,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int,
        ctx: Any,
    ) -> None:
        src = self._parent_path(old_parent, old_name)
        dst = self._parent_path(new_parent, new_name)
        try:
            await self.files.renames.rename(src, dst, flags, self._who(ctx))
        except OSError as exc:
            # (A rename that fails changes nothing: it can be tried again.)
            if exc.errno != errno.ENOSPC or not await self._room(removal=True):
                raise
            await self.files.renames.rename(src, dst, flags, self._who(ctx))
            await self._removed_on_full_disk()
        self.control.succeeded(dst)  # (a save by rename: an earlier refusal is over)

    # ---- files ----

    @_guard()
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        node = self.control.get(inode)
        if node is not None:
            if not isinstance(node, CFile):
                raise pyfuse3.FUSEError(errno.EISDIR)
            writable = flags & os.O_ACCMODE != os.O_RDONLY
            if writable and node.write is None:
                raise pyfuse3.FUSEError(errno.EACCES)
            if flags & os.O_TRUNC:
                data, mtime = b"", time.time_ns()
            else:
                data, mtime = await self._render(node)
            # A writer that does not truncate (an append, an edit in place) writes over the
            # bytes it opened, as in a file; a verb file's are empty.
            start = bytearray(data) if writable and not node.verbs else bytearray()
            h = ControlHandle(node, data, start if writable else None, who=self._who(ctx))
            h.mtime_ns = mtime
            self._control_open.setdefault(node.ino, []).append(h)
            return pyfuse3.FileInfo(fh=self._fh(h), direct_io=True)
        i = self._inode(inode)
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        # Size and link count matter only to a writer: a reader (grep opens every file)
        # is spared a stat.
        st = self._stat(i) if writable else None
        if st is not None and not i.virtual:
            await self.files.names.unseen_names(i, st)
        journaled = self._journaled(i, st)
        if not i.virtual:
            self.files.open_backing(i, writable and not journaled)
            if self._file_noatime:
                _no_atime(i.fd)
        i.handles += 1
        try:
            if writable and flags & os.O_TRUNC:
                if journaled:
                    await self.files.ensure_stage(i, truncate=True)
                    assert i.stage is not None
                    st = os.fstat(i.stage.fd)
                    if st.st_size:  # a stage other writers had filled
                        os.ftruncate(i.stage.fd, 0)
                    # Emptying a file to rewrite it: the empty file is what the writer
                    # wrote, judged like any write if nothing follows (cp /dev/null f),
                    # unlike a truncate(2) to a length the caller chose (files.py).
                    i.stage.wrote(0, 0)
                    # open(2) marks mtime and ctime for update, as ftruncate(2) does; an
                    # empty stage was not truncated (and a spare keeps its old times).
                    os.utime(i.stage.fd, ns=(st.st_atime_ns, time.time_ns()))
                else:
                    self.files.open_backing(i, writable=True)
                    os.ftruncate(i.fd, 0)
        except BaseException:
            i.handles -= 1
            self.files.release_fd(i)
            raise
        who = self._who(ctx)
        if journaled and flags & os.O_ACCMODE != os.O_WRONLY and not i.is_dir:
            self.files.reads.opened_to_read(who["pid"], i)
            if not writable and parsers.language(i.path) is not None:
                self._to_prime = i.ino
                self._read_one.set()
        handle = Handle(i, writable, info=who if writable else {})
        handle.truncated = bool(writable and journaled and flags & os.O_TRUNC)
        if writable and journaled:
            handle.stderr = notice.stderr_of(who["pid"])
            if not kernelflags.ACTIVE:  # (the flush will not name its sender)
                handle.start = notice.start_of(who["pid"])
        fh = self._fh(handle)
        if not journaled and not i.virtual:
            marked = self.passthrough.open(i, fh, lambda: os.fstat(i.fd))
            handle.direct = marked != fh
            fh = marked
        # A read-only handle commits nothing: its close needs no FLUSH.
        return pyfuse3.FileInfo(fh=fh | (0 if writable else kernelflags.NOFLUSH), keep_cache=True)

    @_guard()
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self.control.get(parent_inode)
        if isinstance(node, CDir) and node.create is not None:  # scratch/, chunks/NAME/
            if b"/" in name or name in (b".", b".."):
                raise pyfuse3.FUSEError(errno.EINVAL)
            if len(name) > NAME_MAX:  # the journal keys scratch files by name
                raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
            child = node.create(name)
            fi = await self.open(child.ino, flags, ctx)
            return fi, self._control_attr(child)
        path = self._parent_path(parent_inode, name)
        who = self._who(ctx)
        made = mode & ~ctx.umask & 0o7777
        virtual = await self.files.names.create_in_batch(path, made, who, (ctx.uid, ctx.gid))
        if virtual is not None:
            attr = self._attr(virtual.ino, self._stat(virtual))
            fi = await self.open(attr.st_ino, flags & ~(os.O_EXCL | os.O_TRUNC), ctx)
            return fi, attr
        how = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        created, fd = False, -1
        try:
            with self.ws.committer.operation(
                self.files.journaled(path),
                who,
                "create",
                path,
                intended=EMPTY_DIGEST,
                mode=made,
                owner=self._made_owner(path, ctx),
            ):
                fd = os.open(path, how, made, dir_fd=self.ws.root_fd)
            created = True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            # Created by someone else since the kernel's lookup: open it, as open(2) would.
        except BaseException:
            if fd >= 0:  # made, but its journaling failed after the syscall
                os.close(fd)
            raise
        attr = self._new_entry(path, ctx, fd)
        if created:
            self.files.reads.path_made(path, attr.st_ino, who["pid"])
        try:
            fi = await self.open(attr.st_ino, flags & ~os.O_EXCL, ctx)
        except BaseException:
            self.files.release_fd(self._inode(attr.st_ino))  # the descriptor adopted above
            raise
        return fi, attr

    @_guard()
    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles[fh]
        if isinstance(h, ControlHandle):
            return h.data[off : off + size]
        assert isinstance(h, Handle)
        i = h.inode
        fd = i.stage.fd if i.stage is not None else i.fd
        return os.pread(fd, size, off)

    @_guard()
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self.handles[fh]
        if isinstance(h, ControlHandle):
            assert h.written is not None
            if h.node.verbs and h.node.write is not None:
                if h.failed is not None and h.failed[:2] == (off, buf):
                    raise pyfuse3.FUSEError(h.failed[2])
                try:
                    await h.node.write(buf, h.who)
                except RwfsError as exc:
                    h.failed = (off, buf, exc.errno)
                    raise
                finally:
                    await self.kernel.settled()
                return len(buf)
            end = off + len(buf)
            if end > h.node.max_bytes or h.failed is not None:
                h.failed, h.over = (off, buf, errno.EFBIG), True  # nothing applied at close
                raise _too_large(h, self.control.root)
            if len(h.written) < end:
                h.written.extend(b"\0" * (end - len(h.written)))
            h.written[off:end] = buf
            h.dirty = True
            return len(buf)
        assert isinstance(h, Handle)
        i = h.inode
        if not h.dirty:  # the first write since a commit point: what its writer's stderr is
            h.stderr = notice.stderr_of(kernelflags.caller()[0]) or h.stderr
        _HOLDER.set(self._holder(h))  # (a refused write is its sender's to hear of)
        stage = await self._to_change(i, h.info, off + len(buf))
        try:
            n = os.pwrite(i.fd if stage is None else stage.fd, buf, off)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not await self._room():
                raise
            stage = await self._to_change(i, h.info, off + len(buf))
            n = os.pwrite(i.fd if stage is None else stage.fd, buf, off)
        if stage is None:
            return n
        stage.wrote(off, off + n)
        h.dirty = True
        # Until a commit point seals this stage, its next writes skip this method (they
        # only call stage.wrote): see kernelflags. h.dirty stays set meanwhile: what they
        # write is sealed by the commit that clears it.
        kernelflags.fast_writes(fh, i, stage, self.ws.policy.max_journaled_bytes)
        return n

    def _only_reference(self, h: Handle) -> bool:
        """Whether the handle's opener holds no other descriptor of the file (the one being
        closed is gone from its table when the kernel sends the flush). Read from
        /proc/PID/fd by readlink, which sends the mount nothing; False when unsure."""
        pid = h.info.get("pid")
        if not pid or not h.inode.paths:
            return False
        top = os.fsencode(self.control.info["mountpoint"])
        names = {top + b"/" + p for p in h.inode.paths}
        fds = f"/proc/{pid}/fd".encode()
        try:
            entries = os.listdir(fds)
        except OSError:
            return False
        for e in entries:
            try:
                if os.readlink(fds + b"/" + e) in names:
                    return False
            except OSError:
                continue
        return True

    def _in_place(self, i: Inode) -> bool:
        """Whether the open file's bytes are changed in place (not journaled)."""
        st = os.fstat(i.fd)
        if not i.paths:  # its names here are gone, and no other was found in the workspace
            return st.st_nlink >= 1  # (a name outside it: the file lives on, unjournaled)
        return not self._journaled(i, st)

    def _journaled(self, i: Inode, st: os.stat_result | None) -> bool:
        """Whether a change to the file goes through a stage. The globs and its size
        decide (policy ``max_journaled_bytes``), except while a stage or a queued commit
        holds its bytes: the tree does not hold what the mount shows then, and a change
        made in place would go under that commit and be lost when it lands (an O_TRUNC
        open of a big file just written was, and the file ended a mix of both writes; a
        truncate(2) of a file a rename had just moved onto a passthrough name was undone)."""
        if i.stage is not None or i.pending is not None:
            return True
        # Any name: a hard-linked file with one journaled name is journaled through all.
        return any(self.files.journaled(p, st, i.is_dir) for p in sorted(i.paths or {i.path}))

    async def _to_change(self, i: Inode, who: dict[str, Any], end: int = 0) -> Stage | None:
        """The open stage a change to the file's bytes goes to; None: the file is changed
        in place, through its backing descriptor (opened for writing). ``end``: the size
        the change makes the file at least (0: it does not grow it)."""
        # Decided at each change, not at open: a file may have grown past
        # max_journaled_bytes since it was opened.
        if i.direct or (i.stage is None and not i.unlinked and self._in_place(i)):
            # (A passed-through file, removed or not: the kernel reads its backing file.)
            self.files.open_backing(i, writable=True)
            return None
        if end > self.ws.policy.max_journaled_bytes and i.paths and not i.unlinked:
            # Growing past the limit: the file leaves journaling now (Files.leave_journal).
            await self.files.leave_journal(i, who, end)
            if i.paths:
                self.files.open_backing(i, writable=True)
                return None
        if i.stage is None or i.stage.sealed:
            try:
                await self.files.ensure_stage(i)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not await self._room():
                    raise
                await self.files.ensure_stage(i)
        assert i.stage is not None
        return i.stage

    async def _room(self, removal: bool = False) -> bool:
        """ENOSPC: let go of what rwfs keeps of removed files, so that deleting files
        frees space (docs/history.md): the descriptors kept of them, then, if files were
        removed since the last time, their kept bytes. For a removal, when that frees
        nothing, the state's reserve goes, so that the removal can be journaled. True if
        anything went: try again."""
        self.ws.stats.count("disk_full_reclaims")
        freed = self.files.baselines.let_go_kept()
        if await self._reclaim():
            return True
        if removal and not freed:
            freed = self.ws.reserve.release()
        return freed

    async def _reclaim(self) -> bool:
        """Collect the kept bytes of the files removed since the last time, or else the
        oldest history versions (docs/history.md), with the reserve's room for the journal
        to record that first; the reserve is made again after. True if any went."""
        removals, self.files.removals = self.files.removals, 0
        self.ws.reserve.release()
        try:
            return await self.control.reclaim(bool(removals))
        finally:
            await trio.to_thread.run_sync(self.ws.reserve.make)

    async def _removed_on_full_disk(self) -> None:
        """A removal went through on a full disk with the reserve's room: it frees its
        file's space now (once journaled), and the reserve is made again."""
        await self.ws.committer.flush()
        await self._reclaim()

    # ---- requests pyfuse3 has no method for (kernelflags.serve) ----

    async def serve_requests(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Answer the kernel's fallocate and lseek requests, which the extension hands
        over; started before the mount serves its first request."""
        send, receive = trio.open_memory_channel[tuple[Any, ...]](math.inf)
        kernelflags.serve(lambda *request: send.send_nowait(request))
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                async for request in receive:
                    nursery.start_soon(self._answer, *request)
        finally:
            kernelflags.serve(None)

    async def _answer(self, token: int, op: str, ino: int, fh: int, *args: int) -> None:
        try:
            if op == "fallocate":
                await self.fallocate(fh, *args)
                kernelflags.reply(token)
            else:
                kernelflags.reply(token, offset=await self.lseek(fh, *args))
        except pyfuse3.FUSEError as exc:
            kernelflags.reply(token, exc.errno)

    @_guard()
    async def fallocate(self, fh: int, mode: int, off: int, length: int) -> None:
        """A change of the file's bytes like a write: a journaled file's goes to its stage
        and is committed at the handle's next commit point."""
        h = self.handles.get(fh)
        if not isinstance(h, Handle):
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)  # a control file's text is in memory
        grows = 0 if mode & FALLOC_FL_KEEP_SIZE else off + length
        stage = await self._to_change(h.inode, h.info, grows)
        if stage is None:
            kernelflags.fallocate(h.inode.fd, mode, off, length)
            return
        size = os.fstat(stage.fd).st_size
        kernelflags.fallocate(stage.fd, mode, off, length)
        # Only preallocation (KEEP_SIZE alone) leaves every byte as it was.
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) or not mode & FALLOC_FL_KEEP_SIZE:
            stage.wrote(min(off, size), off + length)
            h.dirty = True

    @_guard()
    async def lseek(self, fh: int, off: int, whence: int) -> int:
        """SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself)."""
        h = self.handles.get(fh)
        if isinstance(h, Handle):
            i = h.inode
            # rwfs reads and writes with pread/pwrite: this descriptor's offset is unused.
            return os.lseek(i.stage.fd if i.stage is not None else i.fd, off, whence)
        size = len(h.data) if isinstance(h, ControlHandle) else 0
        if off >= size:
            raise pyfuse3.FUSEError(errno.ENXIO)
        return off if whence == os.SEEK_DATA else size

    @_guard()
    async def flush(self, fh: int) -> None:
        h = self.handles[fh]
        if isinstance(h, ControlHandle):
            # Like a file's commit point: only a flush after a write applies the text (a
            # shell closes a duplicate descriptor before it writes anything).
            if h.failed is not None:
                if h.over:
                    # The kernel reported the part before the limit as a short write, which
                    # a writer may not check: close() says that none of it was applied.
                    raise _too_large(h, self.control.root)
                return  # a verb was refused: the write said so
            if h.dirty and h.written is not None and h.node.write is not None:
                h.dirty = False
                await h.node.write(bytes(h.written), h.who)
            return
        assert isinstance(h, Handle)
        if h.dirty or (h.truncated and self._only_reference(h)):
            # (A truncation alone is committed here, and its refusal reaches close(), when
            # no other descriptor can still write: a shell's "> f" closes the one it opened
            # after a dup2 and before the command writes.)
            h.dirty = h.truncated = False
            _HOLDER.set(self._holder(h))
            await self.files.commit(h.inode, h.info)

    def _let_go(self) -> None:
        """Let go of the passed-through handles whose RELEASE the C extension answered
        (kernelflags.released), as ``release`` would: such a file has no stage and
        nothing queued (direct.py), so there is nothing to commit."""
        for fh in kernelflags.released():
            h = self.handles.pop(fh, None)
            if not isinstance(h, Handle):
                continue
            i = self._let_handle_go(fh, h)
            if i.stage is not None and not i.stage.sealed:  # (never: _to_change, setattr)
                log.warning("a passed-through file had an open stage: %r", sorted(i.paths))
            try:
                self.files.release_fd(i)
            except OSError as exc:  # (as release's: the next handles are let go all the same)
                log.info("releasing %r: %s", sorted(i.paths), exc)

    def _let_handle_go(self, fh: int, h: Handle) -> Inode:
        """A released handle no longer counts among its inode's opens."""
        kernelflags.fast_writes_end(fh)
        i = h.inode
        i.handles -= 1
        if h.direct:
            self.passthrough.release(i)
        return i

    @_guard(quiet=True)
    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh)
        if isinstance(h, ControlHandle):
            opened = self._control_open.get(h.node.ino, [])
            if h in opened:
                opened.remove(h)
            if not opened:
                self._control_open.pop(h.node.ino, None)
        if not isinstance(h, Handle):
            return
        i = self._let_handle_go(fh, h)
        if i.handles == 0 and i.stage is not None and not i.stage.sealed:
            # The last reference: commit what no flush did (e.g. a truncation alone).
            try:
                await self.files.commit(i, h.info or {"pid": 0, "comm": "", "uid": 0})
            except (RwfsError, OSError) as exc:
                # After close() returned: no one to tell but .rw/ (SPEC §4.3).
                log.info("commit at release of %r: %s", sorted(i.paths), exc)
                if isinstance(exc, RwfsError):
                    self.control.fail(exc)
        self.files.release_fd(i)

    @_guard()
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self.handles[fh]
        if not isinstance(h, Handle):
            return
        i = h.inode
        if i.stage is not None or i.pending is not None:
            h.dirty = False
            _HOLDER.set(self._holder(h))
            await self.files.commit(i, h.info, wait=True)
        elif i.fd >= 0:
            with borrowed(i.fd) as (fd,):
                await trio.to_thread.run_sync(os.fdatasync if datasync else os.fsync, fd)

    # ---- directories ----

    @_guard()
    async def opendir(self, inode: int, ctx: Any) -> int:
        if kernelflags.no_opendir():
            # Once: the kernel then sends no OPENDIR or RELEASEDIR, keeps every listing,
            # and readdir names the directory by inode (_dir).
            self._no_opendir = True
            raise pyfuse3.FUSEError(errno.ENOSYS)
        node = self.control.get(inode)
        if node is not None:
            assert isinstance(node, CDir)
            if node.settle:
                await self.ws.committer.sync()
            return self._fh(DirHandle(None, self.control.listing(node), node=node))
        i = self._inode(inode)
        # The kernel keeps the listing (CACHE_DIR) until the directory changes: through the
        # mount, or by rwfs itself (_tree_changed).
        return self._fh(self._dir_handle(i)) | kernelflags.CACHE_DIR

    def _dir_handle(self, i: Inode) -> DirHandle:
        if not i.paths:  # removed while the kernel held it: a removed directory is empty
            return DirHandle(i, [])
        how = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(rel(i.path), how, dir_fd=self.ws.root_fd)
        if self._dir_noatime:
            _no_atime(fd)
        return DirHandle(i, None, fd)

    async def _dir(self, fh: int, start_id: int) -> DirHandle:
        """The handle of a directory being listed: opendir's, or, when the kernel sends no
        OPENDIR (kernelflags), one made at the listing's start and kept to its end."""
        ino = kernelflags.dir_inode(fh)
        if ino is None:
            opened = self.handles[fh]
            assert isinstance(opened, DirHandle)
            return opened
        kept = self._listings.get(ino)
        if kept is not None and start_id > 0 and (kept.node or kept.inode is self.inodes.get(ino)):
            return kept  # (not a forgotten directory's: its number may be another's now)
        self._listed(ino)
        node = self.control.get(ino)
        if node is not None:
            assert isinstance(node, CDir)
            if node.settle:
                await self.ws.committer.sync()
            h = DirHandle(None, self.control.listing(node), node=node)
        else:
            h = self._dir_handle(self._inode(ino))
        self._listings[ino] = h
        if len(self._listings) > 64:  # listings a reader left half-way
            self._listed(next(iter(self._listings)))
        return h

    def _listed(self, ino: int | None) -> None:
        """A listing by inode (``ino``; None: an opendir's) is over: drop its handle."""
        h = self._listings.pop(ino, None) if ino is not None else None
        if h is not None and h.fd >= 0:
            os.close(h.fd)

    def _list(self, i: Inode, fd: int) -> list[bytes]:
        """The names a directory shows: the tree's, with an open batch's new files and
        without its deletions; ``.rw`` only under ``-o show_control``."""
        names = sorted(os.fsencode(n) for n in os.listdir(fd))
        if i.ino == ROOT:
            names = [n for n in names if n != b".rw"]
            if self.show_control:
                names = sorted([*names, b".rw"])
        if self.files.hidden:
            prefix = i.path + b"/" if i.path else b""
            names = [n for n in names if prefix + n not in self.files.hidden]
        if self.files.virtual:
            prefix = i.path + b"/" if i.path else b""
            extra = {
                p[len(prefix) :]
                for p in self.files.virtual
                if p.startswith(prefix) and b"/" not in p[len(prefix) :]
            }
            names = sorted(set(names) | extra)
        return names

    @_guard()
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        h = await self._dir(fh, start_id)
        if h.entries is None:
            assert h.inode is not None
            h.entries = self._list(h.inode, h.fd)
        # Offsets 0 and 1 are "." and "..", as in every POSIX listing (no lookup count:
        # the kernel makes no dentry of them); the names follow from offset 2. They also
        # keep a listing from being empty: the kernel cannot drop a cached listing that
        # has no entries (after a batch's abort, say), having no page of it to drop.
        for idx in range(start_id, len(h.entries) + 2):
            if idx < 2:
                attr = self._dot_attr(h, idx == 1)
                if attr is not None and not pyfuse3.readdir_reply(
                    token, b".." if idx else b".", attr, idx + 1
                ):
                    return
                continue
            name = h.entries[idx - 2]
            if h.node is not None:
                node = h.node.children.get(name)
                if node is None:
                    continue  # gone since opendir (a batch removed, a conflict settled)
                # (A stat asks again, attr_timeout 0: a listing sizes only fixed bytes.)
                attr = self._control_attr(node, *_fixed_size(node))
                if not pyfuse3.readdir_reply(token, name, attr, idx + 1):
                    return
                continue
            assert h.inode is not None
            if h.inode.ino == ROOT and name == b".rw":
                if not pyfuse3.readdir_reply(
                    token, name, self._control_attr(self.control.root), idx + 1
                ):
                    return
                continue
            path = h.inode.path + b"/" + name if h.inode.path else name
            virtual = self.files.virtual.get(path)
            if virtual is not None:
                if not pyfuse3.readdir_reply(
                    token, name, self._attr(virtual.ino, self._stat(virtual)), idx + 1
                ):
                    return
                virtual.lookups += 1
                continue
            try:
                st = os.stat(name, dir_fd=h.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since opendir
            inode = self.inodes.resolve(path, st)
            if not pyfuse3.readdir_reply(
                token,
                name,
                self._attr(inode.ino, self._stat(inode) if inode.stage else st),
                idx + 1,
            ):
                self.inodes.maybe_drop(inode)
                return
            inode.lookups += 1
        self._listed(kernelflags.dir_inode(fh))  # the whole listing went out

    def _dot_attr(self, h: DirHandle, parent: bool) -> pyfuse3.EntryAttributes | None:
        """The attributes listed for "." (or ".."): the directory's own, with its parent's
        inode number for "..". (Never a lookup of ".." in the raw tree: from the top of
        the workspace it would cross into this very mount and wait on itself. The kernel
        uses only the number of these entries.)"""
        if h.node is not None:
            return self._control_attr(h.node)
        i = h.inode
        if i is None or h.fd < 0:
            return None  # (a directory removed meanwhile: nothing to list)
        ino = i.ino
        if parent and i.ino != ROOT:
            up = self.inodes.by_path.get(os.path.dirname(i.path))
            ino = up.ino if up is not None else ino
        return self._attr(ino, os.fstat(h.fd))

    @_guard(quiet=True)
    async def releasedir(self, fh: int) -> None:
        h = self.handles.pop(fh)
        if isinstance(h, DirHandle) and h.fd >= 0:
            os.close(h.fd)

    @_guard()
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        ino = kernelflags.dir_inode(fh)
        if ino is not None:  # no OPENDIR was sent: open the directory to sync it
            if self.control.get(ino) is not None:
                return
            fd = self._dir_handle(self._inode(ino)).fd  # -1: removed, nothing to sync
            try:
                await self.ws.committer.sync()
                if fd >= 0:
                    await trio.to_thread.run_sync(os.fsync, fd)
            finally:
                if fd >= 0:
                    os.close(fd)
            return
        h = self.handles[fh]
        if isinstance(h, DirHandle) and h.fd >= 0:
            await self.ws.committer.sync()
            await trio.to_thread.run_sync(os.fsync, h.fd)

    # ---- the rest ----

    @_guard()
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        sv = os.statvfs(self.ws.root_fd)
        d = pyfuse3.StatvfsData()
        for key in (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_namemax",
        ):
            setattr(d, key, getattr(sv, key))
        return d

    def _xattr_targets(self, inode: int) -> list[Any]:
        if self.control.get(inode) is not None:
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        i = self._inode(inode)
        stage = [i.stage.fd] if i.stage is not None else []
        if i.virtual:  # a batch's new file: only a stage
            return stage
        if not i.paths and i.fd >= 0:  # removed, still open: its own descriptor
            return [i.fd, *stage]
        path = f"/proc/self/fd/{self.ws.root_fd}/".encode() + i.path
        return [path, *stage]

    @_guard()
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        for t in self._xattr_targets(inode):
            os.setxattr(t, name, value, follow_symlinks=isinstance(t, int))

    @_guard()
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        t = self._xattr_targets(inode)[-1]
        return os.getxattr(t, name, follow_symlinks=isinstance(t, int))

    @_guard()
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        t = self._xattr_targets(inode)[-1]
        return [os.fsencode(n) for n in os.listxattr(t, follow_symlinks=isinstance(t, int))]

    @_guard()
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        for t in self._xattr_targets(inode):
            os.removexattr(t, name, follow_symlinks=isinstance(t, int))
