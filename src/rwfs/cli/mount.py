"""Mounting: open the workspace, recover, mount, serve, and unmount cleanly.

Order matters (SPEC §1 pitfalls): everything reached by path — the workspace directory,
the state directory, the LMDB environment — is opened *before* the mount, because once
mounted over, a path under the workspace resolves into the mount itself.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import faults
from ..fuse import kernelflags

# The daemon's modules (pyfuse3, trio, the core) are imported where the daemon starts
# (``serve``): every other verb of the command line needs none of them, and they take
# most of its start-up time.
if TYPE_CHECKING:
    from ..core.workspace import Workspace
    from ..fuse.fs import Operations
    from ..policy import Policy

log = logging.getLogger("rwfs")

STATE_MARK = b"rwfs-state"
OUR_OPTIONS = {"show_control"}
# The daemon's nice value (``-o nice=N``; -10 unless told). Every request of the mount's
# clients waits on the daemon, and each reply wakes its client: at the client's own
# priority the woken client takes the CPU from the daemon in the middle of its reply
# (docs/performance.md: a third of the metadata mix's time on two cores).
NICE = -10
# How long a worker thread holds the GIL before Python makes it give way (the default is
# 5 ms). Every system call of the event loop's thread lets the GIL go, and while a group
# commit or a gate runs Python in a worker thread, taking it back waited up to that long,
# with every request behind it (docs/performance.md, "The GIL's switch interval").
SWITCH_INTERVAL = 0.0005
# Access-time options (mount(8)). The times the mount shows are its backing files', so
# rwfs keeps these itself rather than the kernel: noatime (also given to the kernel, for
# /proc/mounts) and nodiratime keep the daemon's own reads from moving them (fs.py); a
# write never moves one (workspace.keep_atime). The others ask for what the backing file
# system does anyway (relatime, unless it is mounted otherwise) and are not passed on:
# libfuse 3.14 (Debian 12) refuses all but atime and noatime ("unknown option").
ATIME_DEFAULTS = {
    "atime", "relatime", "norelatime", "nostrictatime", "diratime", "lazytime", "nolazytime",
}  # fmt: skip
ATIME_OURS = {"nodiratime"}
# How long ``rwfs umount`` retries a journal that cannot commit before it unmounts anyway
# and reports the commits left to the next mount.
UMOUNT_WAIT = 30.0


class QuietError(Exception):
    """An error a user can fix: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def rwfs_mounts() -> dict[str, str]:
    """Mount points of rwfs filesystems → their mount source (from /proc/self/mountinfo)."""
    out = {}
    with open("/proc/self/mounts", "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == b"fuse.rwfs":
                point = parts[1].decode().replace("\\040", " ").replace("\\011", "\t")
                point = point.replace("\\012", "\n").replace("\\134", "\\")
                out[point] = parts[0].decode()
    return out


def refuse_nesting(workspace: str, mountpoint: str) -> None:
    """Refuse a workspace or mount point inside an rwfs mount (symlinks resolved): the
    outer mount would journal, gate and stage every write of the inner daemon (its LMDB
    pages, its objects) and the inner one would serve files the outer one rewrites."""
    mounts = rwfs_mounts()
    for what, path in (("workspace", workspace), ("mount point", mountpoint)):
        real = os.path.realpath(path)
        for point in mounts:
            if real != point and real.startswith(point.rstrip("/") + "/"):
                raise QuietError(
                    f"the {what} {real} is inside an rwfs mount ({point}); rwfs does not "
                    "mount inside itself and changed nothing: choose a directory outside "
                    f"{point}, or unmount it first"
                )


def open_state(workspace_fd: int, create: bool) -> int:
    """Open (or make) WORKSPACE/.rw, refusing a ``.rw`` that is not rwfs state."""
    try:
        fd = os.open(b".rw", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=workspace_fd)
    except FileNotFoundError:
        if not create:
            raise QuietError(
                "this directory has no rwfs state (.rw): it was never mounted"
            ) from None
        # (imported here: the verbs that only open a workspace's state need neither)
        from ..control.nodes import write_state_file
        from ..policy import DEFAULT_TEXT

        os.mkdir(b".rw", 0o700, dir_fd=workspace_fd)
        fd = os.open(b".rw", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=workspace_fd)
        write_state_file(fd, STATE_MARK, b"This directory holds rwfs state. Do not edit.\n")
        write_state_file(fd, b".gitignore", b"*\n")
        write_state_file(fd, b"policy.toml", DEFAULT_TEXT.encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise QuietError(
                "WORKSPACE/.rw exists and is not a directory of rwfs state; rwfs changed "
                "nothing. Move it away, then mount again."
            ) from None
        raise
    try:
        os.stat(STATE_MARK, dir_fd=fd)
    except FileNotFoundError:
        os.close(fd)
        raise QuietError(
            "WORKSPACE/.rw exists and is not rwfs state (no .rw/rwfs-state); rwfs changed "
            "nothing. Move it away, then mount again."
        ) from None
    return fd


def _leave(mountpoint: str) -> None:
    """Keep the daemon's own lookups off the mount: once it is mounted, a path under it
    would call into the daemon itself and deadlock (SPEC §1 pitfalls). Its working
    directory goes to ``/``; a first ``sys.path`` entry under the mount point (``python -m``
    puts the working directory there) is dropped, else a module imported lazily later
    would be looked up through the mount."""
    inside = mountpoint.rstrip("/") + "/"
    first = os.path.realpath(sys.path[0] or ".") if sys.path else ""
    if first == mountpoint or first.startswith(inside):
        del sys.path[0]
    os.chdir("/")


def load_policy(state_fd: int) -> Policy:
    from ..policy import Policy, PolicyError

    try:
        fd = os.open(b"policy.toml", os.O_RDONLY, dir_fd=state_fd)
    except FileNotFoundError:
        return Policy()
    with os.fdopen(fd, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    try:
        return Policy.parse(text)
    except PolicyError as exc:
        raise QuietError(f".rw/policy.toml: {exc}") from None


def serve(
    workspace: str,
    mountpoint: str,
    options: set[str],
    ready_fd: int | None,
    as_json: bool = False,
) -> None:
    """Run the daemon in the foreground until the mount goes away."""
    import pyfuse3
    import trio

    from ..core.batches import Batches
    from ..core.recovery import recover
    from ..core.workspace import Workspace
    from ..fuse.fs import Operations
    from ..journal.store import JournalUnavailable, Store

    try:
        faults.arm()
    except ValueError as exc:
        raise QuietError(str(exc)) from None
    # The caller's mode is honoured exactly (SPEC §3.3a): the kernel has already applied
    # the caller's umask to the mode a create, mkdir or mknod request carries (the
    # handlers mask with ctx.umask too, which changes nothing then), so the daemon's own
    # umask must not apply on top of it; a daemon started under umask 077 would make every
    # file 0600. Cleared before anything is created: every file and directory rwfs makes
    # for itself names its mode (0700 directories, 0600 files, 0400 objects).
    os.umask(0)
    nice = _nice(options)
    fastpath = _fastpath(options)
    if "strictatime" in options:
        raise QuietError(
            "-o strictatime cannot be kept: the access times the mount shows are its "
            "backing files', which move as the backing file system's own mount says "
            "(mount that one with strictatime), or never with -o noatime; nothing was mounted"
        )
    workspace = os.path.realpath(workspace)
    mountpoint = os.path.realpath(mountpoint)
    for point in {workspace, mountpoint} & set(rwfs_mounts()):
        if dead(point):
            raise QuietError(
                f"{point} is a dead rwfs mount: its daemon is gone. Clear it with "
                f"'rwfs umount {point}', then mount again"
            )
        raise QuietError(f"{point} is already an rwfs mount; a second mount is refused")
    refuse_nesting(workspace, mountpoint)
    _leave(mountpoint)
    root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    fresh = not os.path.lexists(os.path.join(workspace, ".rw"))
    state_fd = open_state(root_fd, create=True)
    lock_fd = os.open(b"lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=state_fd)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise QuietError(f"{workspace} is already mounted by another rwfs daemon") from None
    policy = load_policy(state_fd)
    store = Store(f"/proc/self/fd/{state_fd}/journal")
    ws = Workspace(root_fd, state_fd, store, policy)
    ws.mountpoint = mountpoint
    batches = Batches(ws)
    from ..progress import Progress

    bar = Progress()
    try:
        summary = recover(ws, batches, progress=bar)
    except JournalUnavailable as exc:  # LMDB commits nothing at all: nothing to serve on
        bar.done()
        raise QuietError(
            f"recovery could not write the journal ({exc}): free disk space or fix the "
            "device, then mount again (recovery goes on where it stopped)"
        ) from None
    bar.done()
    if any(summary.values()):
        if as_json:
            print(json.dumps({"recovered": summary}), file=sys.stderr, flush=True)
        else:
            done = ", ".join(f"{v} {k}" for k, v in summary.items() if v)
            print(f"rwfs: recovered: {done}", file=sys.stderr, flush=True)
    ws.committer.open_intents()
    overmount = workspace == mountpoint
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "workspace": workspace,
        "mountpoint": mountpoint,
        "options": sorted(options),
        "fastpath": fastpath,
        "root_fd": root_fd,
        "state_fd": state_fd,
    }
    # Over the workspace only rwfs changes the tree, so the kernel may cache long; with a
    # separate mount point the raw tree can change behind our back.
    ops = Operations(
        ws, batches, info, "show_control" in options, timeout=60.0 if overmount else 1.0
    )
    if overmount:
        kernelflags.keep_written_pages()
    if fastpath:
        kernelflags.want_passthrough()
    # default_permissions: the kernel checks every access against the owner and mode
    # rwfs reports, those of .rw/'s entries included (SPEC §3.3b; docs/security.md).
    fuse_opts = set(pyfuse3.default_options) | {"default_permissions"}
    given = {  # FUSE's
        o
        for o in options - OUR_OPTIONS - ATIME_DEFAULTS - ATIME_OURS
        if not o.startswith(("nice=", "fastpath="))
    }
    # The type stays fuse.rwfs (rwfs finds its mounts by it); a given fsname wins over
    # rwfs's (a set has no order: both would be passed, and either could win).
    fuse_opts |= {"subtype=rwfs"} | given - {o for o in given if o.startswith("subtype=")}
    if not any(o.startswith("fsname=") for o in given):
        fuse_opts.add("fsname=rwfs")
    said = ""
    try:
        said = _fuse_init(pyfuse3, ops, mountpoint, fuse_opts)
    except RuntimeError as exc:
        store.close()
        if fresh:  # a failed first mount leaves nothing behind
            import shutil

            shutil.rmtree(os.path.join(workspace, ".rw"), ignore_errors=True)
        raise QuietError(_init_failed(mountpoint, str(exc), exc.args[-1])) from None
    if said:  # (what libfuse said on a mount that worked: for its log)
        print(said, file=sys.stderr, flush=True)
    info["nice"] = _set_nice(nice)  # before trio's worker threads: they inherit it
    sys.setswitchinterval(SWITCH_INTERVAL)
    if ready_fd is not None:
        os.write(ready_fd, b"ok\n")
        os.close(ready_fd)
        _quiet_stdio(state_fd)
    try:
        trio.run(_main, ws, ops)
    finally:
        pyfuse3.close(unmount=True)
        store.close()


def _fuse_init(pyfuse3: Any, ops: Any, mountpoint: str, opts: set[str]) -> str:
    """``pyfuse3.init``, keeping what libfuse writes on stderr meanwhile: pyfuse3's own
    error says only "fuse_session_new() failed", libfuse's line says why (an option it
    does not take, the mount point, the device). Returns that text; a failure raises
    RuntimeError with it as its last argument."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:  # (opened before the mount: see _leave)
        os.dup2(kept.fileno(), 2)
        try:
            pyfuse3.init(ops, mountpoint, opts)
        except RuntimeError as exc:
            raise RuntimeError(str(exc), _said(kept)) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        return _said(kept)


def _said(f: Any) -> str:
    f.seek(0)
    return str(f.read(64 * 1024).decode("utf-8", "replace").strip())


def _init_failed(mountpoint: str, error: str, said: str) -> str:
    """The one line for a mount libfuse refused, from what it said (``_fuse_init``)."""
    import re

    unknown = re.findall(r"unknown option\(s\): `-o ([^']*)'", said)
    if unknown:
        names = sorted({n for found in unknown for n in found.split(",") if n})
        return (
            f"mounting {mountpoint} failed: FUSE does not know the mount option(s) "
            f"{', '.join(names)} (libfuse: {said.splitlines()[-1]}); nothing was mounted"
        )
    why = "; ".join(line for line in said.splitlines() if line) or error
    return f"mounting {mountpoint} failed: {why} (try 'rwfs doctor'); nothing was mounted"


def _nice(options: set[str]) -> int:
    """The ``-o nice=N`` asked for (checked before anything is made), or ``NICE``."""
    given = [o.partition("=")[2] for o in options if o.startswith("nice=")]
    if not given:
        return NICE
    try:
        value: int | None = int(given[-1])
    except ValueError:
        value = None
    if len(set(given)) > 1 or value is None or not -20 <= value <= 19:
        raise QuietError(
            f"-o nice={given[-1]} is not a nice value: give one integer from -20 (the "
            "highest priority) to 19; nothing was mounted"
        )
    return value


def _fastpath(options: set[str]) -> bool:
    """Whether requests that need no rwfs decision may be answered without it: on unless
    ``-o fastpath=off``. For now, the opens fuse/passthrough.py hands to the kernel."""
    given = {o.partition("=")[2] for o in options if o.startswith("fastpath=")}
    if len(given) > 1 or not given <= {"on", "off"}:
        raise QuietError(
            f"-o fastpath={sorted(given)[-1]} is not a switch: give fastpath=on (the default) "
            "or fastpath=off; nothing was mounted"
        )
    return given != {"off"}


def _set_nice(value: int) -> int:
    """Run the daemon at nice ``value``; a process that may not raise its priority (no
    CAP_SYS_NICE, RLIMIT_NICE) stays where it is and says so in its log. Returns the
    nice value it runs at."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)  # this thread, and the threads it makes
    except OSError as exc:
        log.info("running at nice %d, not %d: %s", os.getpriority(os.PRIO_PROCESS, 0), value, exc)
    return os.getpriority(os.PRIO_PROCESS, 0)


async def _main(ws: Workspace, ops: Operations) -> None:
    import pyfuse3
    import trio

    retention = trio.CancelScope()

    async def retain() -> None:  # gc by the policy (docs/history.md)
        with retention:
            await ops.control.retention.run()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ws.committer.run)
        nursery.start_soon(ws.stages.keep_spares)
        nursery.start_soon(ops.run_primer)
        nursery.start_soon(retain)
        nursery.start_soon(_on_signals)
        await nursery.start(ops.serve_requests)
        try:
            await pyfuse3.main()
        except* ConnectionAbortedError:
            # Linux fails a read of /dev/fuse with ECONNABORTED when the unmount's abort
            # of the connection meets a request being read (fs/fuse/dev.c); libfuse ends
            # the session quietly only on ENODEV. Either way the mount is gone.
            log.info("the kernel closed the connection while a request was read: unmounted")
        retention.cancel()  # (a collection under way ends at its next step)
        # Unmounted: finish every queued commit before the process ends.
        await ws.committer.close()
        nursery.cancel_scope.cancel()
    ws.stages.let_go_spares()


async def _on_signals() -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


def _quiet_stdio(state_fd: int) -> None:
    """Detach from the terminal: logs go to .rw/daemon.log."""
    fd = os.open(b"daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600, dir_fd=state_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)


# The background daemon's parent, a small process of its own (python -I -S, no rwfs
# module): it starts the daemon, lets go of the ready pipe and of the caller's stdio (a
# caller reading ``rwfs mount``'s output waits for their end), and waits for the daemon.
# When the daemon exits its pid is gone at once, reaped here, instead of staying a zombie
# until init gets to it (seconds on some machines), so that ``rwfs umount`` can return
# when the daemon's pid is gone. It exits with the daemon's status (128+N for signal N).
KEEPER = """\
import os, signal, sys
for sig in (signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
os.close(int(sys.argv[1]))
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
os._exit(128 - code if code < 0 else code)
"""


def spawn(workspace: str, mountpoint: str, options: list[str], as_json: bool = False) -> None:
    """Start the daemon in the background; return once the mount is ready or failed."""
    rfd, wfd = os.pipe()
    cmd = [sys.executable, "-m", "rwfs.cli", "mount", "--foreground", "--ready-fd", str(wfd)]
    cmd += ["--json"] if as_json else []
    for o in options:
        cmd += ["-o", o]
    cmd += [os.path.abspath(workspace), os.path.abspath(mountpoint)]
    # (cwd "/": the daemon must not resolve anything through its own mount, see _leave)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", KEEPER, str(wfd), *cmd],
        pass_fds=[wfd],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        cwd="/",
    )
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        answer = r.read(3)
    if answer != b"ok\n":
        code = proc.wait()
        raise QuietError(f"the mount failed (daemon exit {code}); see the message above")


def dead(point: str) -> bool:
    """Is this mount's daemon gone (ENOTCONN)?"""
    try:
        os.stat(point)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def holders(point: str, daemon: int = 0) -> list[str]:
    """The processes using a mount (``fuser -m``): "PID (COMM): how" for each one whose
    working directory, root or an open file is on it."""
    try:
        dev = os.stat(point).st_dev
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), daemon):
            continue
        how = []
        for what, link in (("cwd", "cwd"), ("root", "root")):
            try:
                if os.stat(f"/proc/{name}/{link}").st_dev == dev:
                    how.append(
                        f"its working directory {os.readlink(f'/proc/{name}/{link}')}"
                        if what == "cwd"
                        else "its root"
                    )
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            fds = []
        opened = 0
        for fd in fds:
            try:
                if os.stat(f"/proc/{name}/fd/{fd}").st_dev == dev:
                    opened += 1
            except OSError:
                pass
        if opened:
            how.append(f"{opened} open file(s)")
        if how:
            try:
                with open(f"/proc/{name}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                comm = "?"
            found.append(f"{name} ({comm}): {', '.join(how)}")
    return found


def umount(
    mountpoint: str, timeout: float = 60.0, wait: float = UMOUNT_WAIT, lazy: bool = False
) -> None:
    """Unmount, and say so only once every acknowledged commit is in the journal.

    First the queued commits are made durable (``sync``). While the journal cannot commit,
    that is retried for ``wait`` seconds with a line of progress on stderr. Then the mount
    goes, the daemon finishes (it tries a failing journal a few seconds more), and any
    commit still in the intent log is reported: the next mount finishes it.
    """
    mountpoint = os.path.realpath(mountpoint)
    if mountpoint not in rwfs_mounts():
        raise QuietError(f"{mountpoint} is not an rwfs mount")
    if dead(mountpoint):  # nothing to wait for: clear it
        res = subprocess.run(
            ["fusermount3", "-u", "-z", mountpoint], capture_output=True, text=True
        )
        if res.returncode != 0:
            raise QuietError(f"clearing the dead mount {mountpoint} failed: {res.stderr.strip()}")
        print(f"rwfs: cleared {mountpoint}, a mount whose daemon was gone", file=sys.stderr)
        return
    status = mount_status(mountpoint)
    pid = int(status.get("pid", 0))
    born = _proc_stat(pid)[1] if pid else None  # (to know it from a later process of its pid)
    workspace = str(status.get("workspace", ""))
    queued = status.get("journal", {}).get("queued_commits", 0)
    if queued:
        print(f"rwfs umount: making {queued} queued commits durable", file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(os.path.join(mountpoint, ".rw", "ctl"), "w") as f:
                f.write("sync\n")
            break
        except OSError as exc:
            left = deadline - time.monotonic()
            if exc.errno != errno.EIO or left <= 0:
                break
            j = mount_status(mountpoint).get("journal", {})
            print(
                f"rwfs umount: the journal cannot commit since {j.get('failing_since')} "
                f"({j.get('last_error')}); {j.get('queued_commits', '?')} commits queued; "
                f"retrying for {left:.0f}s more",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(min(1.0, left))
    status = mount_status(mountpoint) or status  # for the message below, if commits are left
    busy = holders(mountpoint, pid) if lazy else []
    cmd = ["fusermount3", "-u", *(["-z"] if lazy else []), mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        if "busy" in res.stderr:
            held = holders(mountpoint, pid)
            by = "; ".join(held) if held else "processes this user cannot see"
            raise QuietError(
                f"{mountpoint} is busy, so it stays mounted: in use by {by}. Leave it "
                "(cd elsewhere) or close those files, or detach it now with "
                f"'rwfs umount --lazy {mountpoint}' (the daemon finishes when they leave)"
            )
        raise QuietError(f"unmounting {mountpoint} failed: {res.stderr.strip()}")
    if busy:
        print(
            f"rwfs: {mountpoint} is detached; its daemon finishes its commits once these "
            f"leave it: {'; '.join(busy)}",
            file=sys.stderr,
        )
        return
    if pid and not wait_gone(pid, born, timeout):
        raise QuietError(
            f"{mountpoint} is unmounted, but its daemon (pid {pid}) has not exited after "
            f"{timeout:g}s: it is still finishing its commits (a background daemon logs "
            f"to {workspace}/.rw/daemon.log). Wait for it to exit before mounting "
            f"{workspace} again: a second daemon is refused while it runs"
        )
    owed = owed_commits(workspace) if workspace else 0
    if owed:
        j = status.get("journal", {})
        since = f" since {j['failing_since']}" if j.get("failing_since") else ""
        raise QuietError(
            f"{mountpoint} is unmounted, but {owed} acknowledged commits are not in the "
            f"journal yet (it could not commit{since}); the intent log keeps them and the "
            f"next 'rwfs mount {workspace}' finishes them. Free space on the filesystem "
            f"that holds {workspace}/.rw/journal first."
        )


def owed_commits(workspace: str, applied: int | None = None) -> int:
    """Commits in a workspace's intent log that its journal has not applied (for an
    unmounted workspace: the next mount finishes them). ``applied``: the journal's
    ``applied_gen``, from a caller that has the store open (LMDB must not be opened twice
    in one process)."""
    from ..journal.intents import IntentLog
    from ..journal.store import Store

    root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        state_fd = open_state(root_fd, create=False)
    finally:
        os.close(root_fd)
    try:
        if applied is None:
            store = Store(f"/proc/self/fd/{state_fd}/journal", readonly=True)
            try:
                applied = store.meta_int(b"applied_gen")
            finally:
                store.close()
        intents = IntentLog(state_fd)
        try:
            return intents.commits_after(applied)
        finally:
            intents.close()
    finally:
        os.close(state_fd)


def last_error(mount: str) -> str:
    try:
        with open(os.path.join(mount, ".rw", "last-error")) as f:
            return f.read()
    except OSError:
        return ""


def attempt(mount: str, action: Callable[[], object]) -> None:
    """Do something to a control file; if refused, say why in the envelope's sentence (when
    this refusal wrote one: the kernel refuses some things, e.g. an existing name, itself)."""
    before = last_error(mount)
    try:
        action()
    except OSError as exc:
        after = last_error(mount)
        message = exc.strerror or str(exc)
        if after and after != before:
            message = json.loads(after).get("message", message)
        raise QuietError(message) from None


def write_verb(mount: str, ctl: str, verb: str) -> None:
    """Write one verb to the control file ``ctl`` of ``mount``, as ``attempt`` does."""

    def write() -> None:
        with open(ctl, "wb") as f:
            f.write(os.fsencode(verb) + b"\n")

    attempt(mount, write)


def mount_status(mountpoint: str) -> dict[str, Any]:
    """The mount's ``.rw/status``, or {} if it cannot be read."""
    import json

    try:
        with open(os.path.join(mountpoint, ".rw", "status"), "rb") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def daemon_pid(mountpoint: str) -> int:
    import json

    try:
        with open(os.path.join(mountpoint, ".rw", "status"), "rb") as f:
            return int(json.load(f)["pid"])
    except (OSError, ValueError, KeyError):
        return 0


def _proc_stat(pid: int) -> tuple[str, str] | tuple[None, None]:
    """(state, start time) of process ``pid`` from /proc, or (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), fields[19].decode()
    except (OSError, IndexError):
        return None, None


# How long a daemon that has exited (a zombie: it holds no file, lock or mount any more)
# is waited for to be reaped by its parent. The keeper of a background daemon reaps it
# at once; a parent that does not wait for its children (a test harness holding a
# foreground daemon) is not waited for longer than this.
REAP_WAIT = 0.5


def wait_gone(pid: int, born: str | None, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for process ``pid`` (started at ``born``, its /proc
    start time) to exit; whether it did."""
    deadline = time.monotonic() + timeout
    exited = None
    while True:
        state, start = _proc_stat(pid)
        if state is None or start != born:  # gone (and its pid perhaps taken again)
            return True
        now = time.monotonic()
        if state == "Z":
            exited = exited or now
            if now - exited >= REAP_WAIT:
                return True
        elif now >= deadline:
            return False
        time.sleep(0.01)


def locate(path: str) -> tuple[str, str, dict[str, Any] | None]:
    """(raw tree, state dir, status-if-mounted) for a workspace or mount path."""
    path = os.path.realpath(path)
    if path in rwfs_mounts() and dead(path):
        raise QuietError(
            f"{path} is a dead rwfs mount: its daemon is gone. Clear it with "
            f"'rwfs umount {path}' (then mount again)"
        )
    if path in rwfs_mounts():
        # Make every queued commit durable first, so the journal read below is current.
        try:
            with open(os.path.join(path, ".rw", "ctl"), "w") as f:
                f.write("sync\n")
        except PermissionError:
            raise QuietError(
                f"you may not write {path}/.rw/ctl, so this command cannot ask the daemon "
                "anything; run it as the workspace's owner or as root"
            ) from None
        except OSError as exc:
            # The journal cannot commit (EIO): what it holds is read as it is, and
            # `status` says why (its `journal` entry).
            print(
                f"rwfs: the queued commits could not be made durable ({exc.strerror}); "
                "see the journal entry of 'rwfs status'",
                file=sys.stderr,
            )
        try:
            with open(os.path.join(path, ".rw", "status"), "rb") as f:
                status = json.load(f)
        except PermissionError:
            raise QuietError(
                f"you may not read {path}/.rw/status: the journal and what is made from it "
                "are the workspace owner's (docs/security.md); run this as the owner or root"
            ) from None
        pid = status["pid"]
        # The daemon's own descriptors reach the raw tree under the mount.
        return f"/proc/{pid}/fd/{status['root_fd']}", f"/proc/{pid}/fd/{status['state_fd']}", status
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(open_state(fd, create=False))
    finally:
        os.close(fd)
    return path, os.path.join(path, ".rw"), None
