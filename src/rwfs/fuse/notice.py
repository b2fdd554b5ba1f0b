"""One line on a refused writer's stderr, for a program that has never heard of rwfs.

All such a program sees of a refusal is an errno ("Bad message"), often without the file's
name, and a program that never checks ``close()`` sees nothing at all (``python3 gen.py >
f``: the kernel closes ``f`` as the program exits). An agent reads what its shell tool
captured, the command's stdout and stderr. So, while the writer waits in the call we are
about to fail (close, fsync, rename), rwfs writes one line to that process's stderr, before
the writer's own error message. See docs/control-files.md ("A refusal, seen from outside")
for what else was weighed.

Who is told (``tell``): the process that holds the descriptor at the commit point, the
sender of the request, still inside it (``Writer.pid``): a program a shell exec'd after it
opened the file (``cmd > f``) holds the shell's descriptor. When that process is exiting,
its descriptor table is gone (the kernel closes a dying process's files after it dropped
the table), so its stderr is reached through what it was when it wrote
(``Writer.stderr``, read then by ``stderr_of``): the nearest ancestor whose fd 2 is the
same (the shell that forked it and waits for it), else an ancestor that holds the same
pipe or terminal at another descriptor (the program that reads the writer's output), opened
anew through /proc. No process is scanned beyond the writer's ancestors, and only a process
the writer's uid may signal (its real or saved uid is the writer's; root may signal any) is
ever written to.

The line goes to a pipe or a socket (output another program reads) and to a terminal in
line mode (a shell's command); a terminal in raw mode belongs to a full-screen program (an
editor, an agent's own screen) that the line would draw over, so it is told only under
``tell_writer = "always"``. A regular file, /dev/null and a named FIFO are never written.
Nothing ever blocks: a full pipe drops the line.
"""

from __future__ import annotations

import ctypes
import os
import socket
import termios
from dataclasses import dataclass

_SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 alike (Linux 5.6)
_MAX = 2048  # one write, well under PIPE_BUF: never interleaved with the writer's own
# How far up the writer's ancestry the line looks for its stderr, and how many descriptors
# of each ancestor it reads: a refusal costs at most this many readlinks.
_DEPTH = 16
_FDS = 1024
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Writer:
    """Whom a refusal is for."""

    pid: int  # the process (or thread) holding the descriptor at the commit point
    uid: int  # the writer's uid: only a process it may signal is written to
    stderr: str = ""  # its fd 2 when it wrote (``stderr_of``); "" if unknown
    start: int = -1  # its start time (clock ticks); -1: it is inside the request now


def stderr_of(pid: int) -> str:
    """What the process's fd 2 is (``pipe:[N]``, ``socket:[N]``, a path), "" if unknown.
    One readlink: cheap enough for the event loop."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2") if pid > 0 else ""
    except OSError:
        return ""


def start_of(pid: int) -> int:
    """The process's start time in clock ticks since boot (-1 if it is gone): with its pid,
    it names the process for sure, across an exec (which keeps it) and a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[-1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def _status(pid: int) -> tuple[int, int, tuple[int, ...]] | None:
    """(thread group id, parent pid, (real, effective, saved uid)), None if it is gone."""
    tgid = ppid = -1
    uids: tuple[int, ...] = ()
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                elif line.startswith(b"PPid:"):
                    ppid = int(line.split()[1])
                elif line.startswith(b"Uid:"):
                    uids = tuple(int(u) for u in line.split()[1:4])
                    break  # (Uid comes after Tgid and PPid)
    except (OSError, ValueError):
        return None
    return (tgid, ppid, uids) if tgid > 0 and len(uids) == 3 else None


def _may_tell(uid: int, uids: tuple[int, ...]) -> bool:
    """Whether a process of ``uid`` could signal a process with these (real, effective,
    saved) uids, as kill(2) decides (root may signal any)."""
    return uid == 0 or uid in (uids[0], uids[2])


def _stderr_pid(pid: int) -> int:
    """A duplicate of the process's fd 2 itself (a socket cannot be opened by name)."""
    pidfd = os.pidfd_open(pid)
    try:
        fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, 2, 0)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(fd)
    finally:
        os.close(pidfd)


def _is_tty(target: str) -> bool:
    return target.startswith(("/dev/pts/", "/dev/tty"))


def _write(pid: int, fd: int, target: str, data: bytes, raw_terminals: bool) -> bool:
    """Write ``data`` to descriptor ``fd`` of ``pid``, which is ``target``, if it is a pipe,
    a socket (fd 2 only) or a terminal in line mode."""
    if target.startswith("socket:"):
        if fd != 2:
            return False  # a socket's other descriptors may be its reading end
        with socket.socket(fileno=_stderr_pid(pid)) as s:
            return s.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) == len(data)
    tty = _is_tty(target)
    if not (tty or target.startswith("pipe:")):
        return False  # a file, /dev/null, a named FIFO (it could be on this mount)
    # A description of our own, so that O_NONBLOCK is not set on the writer's (a pipe's
    # reading end opened for writing is a writing end of the same pipe).
    own = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if os.readlink(f"/proc/self/fd/{own}") != target:
            return False  # the descriptor changed meanwhile
        if tty and not raw_terminals and not termios.tcgetattr(own)[3] & termios.ICANON:
            return False
        return os.write(own, data) == len(data)
    finally:
        os.close(own)


def _ancestors(pid: int, uid: int) -> list[int]:
    """The writer's ancestors, nearest first, that ``uid`` may signal (not this daemon,
    nor init)."""
    found: list[int] = []
    me = os.getpid()
    st = _status(pid)
    for _ in range(_DEPTH):
        if st is None or st[1] <= 1:
            break
        pid = st[1]
        st = _status(pid)
        if st is not None and pid != me and _may_tell(uid, st[2]):
            found.append(pid)
    return found


def _holding(pid: int, target: str) -> int | None:
    """A descriptor of ``pid`` that is ``target``, if one of its first ``_FDS`` is."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in sorted(fds, key=int)[:_FDS]:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                return int(name)
        except OSError:
            continue
    return None


def _exiting(pid: int) -> bool:
    """Whether the process has no descriptor table left (it is exiting)."""
    try:
        return not os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True


def tell(writer: Writer, line: str, raw_terminals: bool = False) -> bool:
    """Write ``line`` to the stderr of ``writer`` (see the module's docstring). True if the
    whole line was written. Blocks on nothing; run it off the event loop all the same (it
    reads /proc)."""
    if writer.pid <= 0:
        return False
    data = line.encode("utf-8", "replace")
    if len(data) > _MAX:
        data = data[: _MAX - 4] + b"...\n"
    try:
        st = _status(writer.pid)
        if st is None or not _may_tell(writer.uid, st[2]):
            return False
        pid = st[0]
        if writer.start >= 0 and start_of(pid) != writer.start:
            return False  # gone, and the pid is someone else's
        if not _exiting(pid):
            target = stderr_of(pid)
            return bool(target) and _write(pid, 2, target, data, raw_terminals)
        if not writer.stderr or writer.stderr.startswith("/") and not _is_tty(writer.stderr):
            return False  # unknown, or a file: nothing to look for
        ancestors = _ancestors(pid, writer.uid)
        for a in ancestors:  # the shell that waits for it, with the same stderr
            if stderr_of(a) == writer.stderr:
                return _write(a, 2, writer.stderr, data, raw_terminals)
        if writer.stderr.startswith("socket:"):
            return False  # a socket's other end cannot be written into from its reader's
        for a in ancestors:  # the program that reads it
            fd = _holding(a, writer.stderr)
            if fd is not None:
                return _write(a, fd, writer.stderr, data, raw_terminals)
        return False
    except (OSError, termios.error):  # gone, not ours to open, a full pipe, a closed reader
        return False
