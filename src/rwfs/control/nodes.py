"""The nodes of the ``.rw/`` tree and its ``ctl`` files' verbs: what ``Control``, its
views and the features that add entries to it (chunks, handoff, scratch) build the tree
from, and the helpers they share (an object's or a live file's stat, JSON bytes, a state
file written atomically). Nothing here knows about FUSE or about the entries themselves."""

from __future__ import annotations

import calendar
import errno
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import beneath
from ..core.errors import RwfsError

if TYPE_CHECKING:
    from ..core.workspace import Workspace


@dataclass(eq=False)
class CNode:
    ino: int
    name: bytes


# The owner, group and permission bits an entry shows (SPEC §3.3b): the kernel checks them
# (rwfs mounts with default_permissions). A writable file gets its owner's write bit too.
Perm = tuple[int, int, int]

# A control file's writer: the text, and who wrote it ({"pid", "comm", "uid", "gid"}).
Writer = Callable[[bytes, dict[str, Any]], Awaitable[None]]
# A verb of a ``ctl`` file: its arguments, and who wrote it.
Verb = Callable[[list[str], dict[str, Any]], Awaitable[None]]


def split_verbs(text: str) -> list[list[str]]:
    """Lines of words, as a POSIX shell splits them: blanks separate words, a newline
    separates verbs, and quotes ('…', "…") or a backslash keep blanks, newlines and quotes
    in a word — so a path of any bytes can be named (``shlex.quote`` writes it).

    ValueError on an unterminated quote."""
    lines: list[list[str]] = []
    words: list[str] = []
    word: list[str] = []
    quote, escaped, started = "", False, False
    for ch in text + "\n":
        if escaped:
            if ch != "\n":  # a backslash before a newline continues the line
                word.append(ch)
                started = True
            escaped = False
        elif ch == "\\" and quote != "'":  # (inside '…' a backslash is itself)
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "'\"":
            quote, started = ch, True
        elif ch in " \t\r\n":
            if started:
                words.append("".join(word))
                word, started = [], False
            if ch == "\n" and words:
                lines.append(words)
                words = []
        else:
            word.append(ch)
            started = True
    if quote or escaped:
        raise ValueError("an unterminated quote")
    return lines


def verb_file(verbs: dict[str, Verb], where: str) -> Writer:
    """A ``ctl`` file: each line written is a verb and its arguments, run in order."""

    async def write(data: bytes, who: dict[str, Any]) -> None:
        try:  # surrogate escapes: a path argument may hold any bytes
            lines = split_verbs(os.fsdecode(data))
        except ValueError:
            lines = []
        if not lines or any(words[0] not in verbs for words in lines):
            raise RwfsError(
                errno.EINVAL,
                "policy_violation",
                "verb",
                f"Nothing was done because the text written to {where} is not a known verb; "
                f"write one of: {', '.join(sorted(verbs))}.",
                path=where,
            )
        for words in lines:
            await verbs[words[0]](words[1:], who)

    return write


def verb_error(message: str, where: str = ".rw/ctl") -> RwfsError:
    return RwfsError(errno.EINVAL, "policy_violation", "verb", message, path=where)


def no_args(args: list[str], verb: str, where: str) -> None:
    if args:
        raise RwfsError(
            errno.EINVAL,
            "policy_violation",
            "verb",
            f"{verb} takes no argument, so nothing was done; write just '{verb}'.",
            path=where,
        )


@dataclass(eq=False)
class CFile(CNode):
    render: Callable[[], bytes]
    write: Writer | None = None
    verbs: bool = False  # each write() is a verb, run before write() returns
    slow: bool = False  # render() does I/O or parsing: run it in a worker thread
    max_bytes: int = 1 << 20  # the most a writer may write to it
    settle: bool = False  # make queued commits reach the tree before render() (handoff)
    # Read-your-writes: queued commits are journaled first when the journal can take them
    # (status, journal, stats, the views); while it cannot, render() shows what it has.
    fresh: bool = False
    # A view of a workspace path (validate/, risk/): render_shown(fd) judges what the mount
    # shows there, a descriptor of an open stage or a batch's draft, or -1: the tree's file.
    shows: bytes | None = None
    render_shown: Callable[[int], bytes] | None = None
    # (st_size, st_mtime_ns) of bytes that are fixed, known without rendering them; None:
    # generated, sized by rendering.
    stat: Callable[[], tuple[int, int]] | None = None
    perm: Callable[[], Perm] | None = None  # None: the daemon's, 0444 (0644 if writable)
    # What render() last made ((length, hash) of the bytes) and since when: the mtime of a
    # generated file, so that it moves only when its bytes change (tar checks it).
    seen: tuple[tuple[int, int], int] | None = None

    def rendered(self, data: bytes | None = None) -> tuple[bytes, int]:
        """Its bytes, rendered now (or ``data``, rendered by the caller), and the time it
        was first seen to hold them (ns)."""
        if data is None:
            data = self.render()
        key = (len(data), hash(data))
        seen = self.seen
        if seen is None or seen[0] != key:
            seen = self.seen = (key, time.time_ns())
        return data, seen[1]


@dataclass(eq=False)
class CDir(CNode):
    children: dict[bytes, CNode] = field(default_factory=dict)
    # A view of the workspace (validate/, risk/): names are looked up in the tree.
    mirror: tuple[str, bytes] | None = None  # (view, workspace path of this directory)
    # Directories that mirror the journal (batches/, conflicts/): brought up to date
    # before every lookup and listing.
    refresh: Callable[[], None] | None = None
    settle: bool = False  # make queued commits journaled first (history/, snapshots/)
    mkdir: Callable[[bytes, dict[str, Any]], Awaitable[None]] | None = None
    rmdir: Callable[[bytes], Awaitable[None]] | None = None
    # Directories that take files (scratch/, chunks/NAME/): a new entry, and its removal.
    create: Callable[[bytes], CFile] | None = None
    unlink: Callable[[bytes], Awaitable[None]] | None = None
    # A name not among the children: made on lookup (history/ of a path it does not list).
    find: Callable[[bytes], CNode | None] | None = None
    unlisted: set[bytes] = field(default_factory=set)  # children readdir does not show
    perm: Callable[[], Perm] | None = None  # None: the daemon's, 0755
    # The refusal a mkdir of a child that exists gets (batches/, snapshots/, chunks/):
    # the kernel finds the child by a lookup and fails the mkdir with EEXIST itself,
    # unasked, so the lookup is the daemon's only chance to put it in ``last-error``.
    taken: Callable[[bytes], RwfsError | None] | None = None


def as_dir(perm: Perm) -> Perm:
    """A directory that stands for a file: whoever may read the file may list it."""
    uid, gid, mode = perm
    return uid, gid, (mode & 0o444) | ((mode & 0o444) >> 2)


def constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def object_stat(ws: Workspace, digest: str) -> tuple[int, int]:
    """(size, mtime in ns) of a kept object: one stat, no read."""
    st = os.stat(ws.objects.name(digest), dir_fd=ws.objects.fd, follow_symlinks=False)
    return st.st_size, st.st_mtime_ns


def live_stat(ws: Workspace, path: bytes) -> tuple[int, int]:
    """(size, mtime in ns) of a file of the tree as ``conflicts.live_bytes`` reads it:
    anything but a regular file reads as empty."""
    st = beneath.stat(ws.root_fd, path)
    return (st.st_size if stat.S_ISREG(st.st_mode) else 0), st.st_mtime_ns


def stamp_ns(text: str, fmt: str = "%Y-%m-%dT%H:%M:%S") -> int:
    """A UTC time at the start of ``text`` (a journal ``ts``, a draft id), in ns; the
    milliseconds of a ``ts`` (``2026-11-30T10:12:03.123Z``) included. 0 if none is there."""
    width = len(time.strftime(fmt, time.gmtime(0)))
    try:
        ns = calendar.timegm(time.strptime(text[:width], fmt)) * 10**9
    except ValueError:
        return 0
    ms = text[width + 1 : width + 4]
    return ns + int(ms) * 10**6 if text[width : width + 1] == "." and ms.isdigit() else ns


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def write_state_file(state_fd: int, name: bytes, data: bytes) -> None:
    """Atomically replace a file of the state directory (write, fsync, rename)."""
    tmp = name + b".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=state_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=state_fd, dst_dir_fd=state_fd)
