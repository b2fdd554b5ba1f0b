"""One line on a refused writer's stderr, for a program that has never heard of rwfs.

All such a program sees of a refusal is an errno ("Bad message"), often without the file's
name; an agent reads what its shell tool captured, the command's stdout and stderr. So,
while the writer waits in the call we are about to fail (close, fsync, rename), rwfs writes
one line to that process's fd 2, before the writer's own error message. See
docs/control-files.md ("A refusal, seen from outside") for what else was weighed.

Only a process we can name for sure is told: the caller of the request, still inside it,
whose command name is the one recorded for it. The line goes to a pipe or a socket (output
another program reads) and to a terminal in line mode (a shell's command); a terminal in
raw mode belongs to a full-screen program (an editor, an agent's own screen) that the line
would draw over, so it is told only under ``tell_writer = "always"``. Nothing ever blocks:
a full pipe drops the line.
"""

from __future__ import annotations

import ctypes
import os
import socket
import termios

_SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 alike (Linux 5.6)
_MAX = 2048  # one write, well under PIPE_BUF: never interleaved with the writer's own
_libc = ctypes.CDLL(None, use_errno=True)


def _stderr_of(pid: int) -> int:
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


def tell(pid: int, comm: str, line: str, raw_terminals: bool = False) -> bool:
    """Write ``line`` to the stderr of process ``pid`` if it is still the one named
    ``comm`` and its stderr is a pipe, a socket or a terminal in line mode (in raw mode
    too, with ``raw_terminals``). True if the whole line was written. Blocks on nothing;
    run it off the event loop all the same (it reads /proc)."""
    if pid <= 0:
        return False
    data = line.encode("utf-8", "replace")
    if len(data) > _MAX:
        data = data[: _MAX - 4] + b"...\n"
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            if f.read().strip().decode(errors="replace") != comm:
                return False  # gone, and the pid is someone else's
        target = os.readlink(f"/proc/{pid}/fd/2")
        if target.startswith("socket:"):
            with socket.socket(fileno=_stderr_of(pid)) as s:
                return s.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) == len(data)
        tty = target.startswith(("/dev/pts/", "/dev/tty"))
        if not (tty or target.startswith("pipe:")):
            return False  # a file, /dev/null, a named FIFO (it could be on this mount)
        # A description of our own, so that O_NONBLOCK is not set on the writer's.
        fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            if tty and not raw_terminals and not termios.tcgetattr(fd)[3] & termios.ICANON:
                return False
            return os.write(fd, data) == len(data)
        finally:
            os.close(fd)
    except (OSError, termios.error):  # gone, not ours to open, a full pipe, a closed reader
        return False
