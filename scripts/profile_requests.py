"""Where a file's milliseconds go: rwfs daemon counters per file, for group and strict.

Run through ``scripts/profile`` (which bootstraps the venv). For each durability mode a
fresh workspace under /tmp is mounted over itself by a daemon that is this script run
with ``--daemon``: the daemon runs in-process (``rwfs.cli.mount.serve``) with counting
wrappers installed first, and src/ is not changed. The wrappers count and time

- every FUSE handler of ``rwfs.fuse.fs.Operations`` (the requests Python answers; writes and
  ``security.capability`` questions answered in C by ``_fuseopen`` are counted apart);
- ``trio.to_thread.run_sync`` (thread hops, by calling function > function run), and
  calls back into the loop (``from_thread``, ``run_sync_soon``);
- ``os.fsync``, ``os.fdatasync``, ``os.sync`` and rwfs's ``syncfs``;
- LMDB transactions (``Store.env.begin``; a write transaction is timed from begin to its
  commit, which syncs: the store opens LMDB with ``sync`` and ``metasync``), ``env.sync``
  and ``Store.write`` by the function it runs;
- intent-log appends (by record kind) and rotations, and the committer's groups.

The daemon writes its counters to a JSON file on SIGUSR1 (and starts or stops cProfile of
the event loop's thread on SIGUSR2); the driver, this script's parent process, takes a
snapshot before and after each workload and prints the difference per file. A second,
slower pass counts every request the kernel sends (libfuse's ``-o debug`` lines, which
name each request's opcode before any handler, C or Python, sees it) and every system
call of the daemon (``strace -f -c`` attached for the workload), with fewer files.

Always unmounts (``fusermount3 -u``, then ``-u -z``, then SIGKILL of its own daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import errno
import functools
import json
import os
import pstats
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import bench  # noqa: E402  (its mount helpers, floor and idle wait)

MODES = ("group", "strict")
WORKLOADS = ("floor", "new", "new_fsync", "rewrite", "save", "meta", "gitobj")
META_PHASES = ("create", "chmod", "truncate", "rename", "link", "unlink_link", "unlink")
META_PHASES += ("mkdir", "rmdir")
FLOOR_XATTR = "user.rwfs-profile-missing"


def log(msg: str) -> None:
    print(f"[profile] {msg}", file=sys.stderr, flush=True)


# =======================================================================================
# The daemon side: counting wrappers, then rwfs.cli.mount.serve


class Counters:
    """name → [calls, seconds, extra]; extra is a second time or a size, by name."""

    def __init__(self) -> None:
        self.d: dict[str, list[float]] = {}
        self.lock = threading.Lock()  # worker threads and the loop both count

    def add(self, key: str, secs: float = 0.0, extra: float = 0.0) -> None:
        with self.lock:
            v = self.d.get(key)
            if v is None:
                self.d[key] = [1, secs, extra]
            else:
                v[0] += 1
                v[1] += secs
                v[2] += extra

    def snapshot(self) -> dict[str, list[float]]:
        # Called from a signal handler on the loop's thread, which may hold the lock:
        # copying a dict and its small lists takes no Python code, so no lock is needed.
        return {k: list(v) for k, v in dict(self.d).items()}


C = Counters()
_HERE = __file__


def _caller(depth: int = 2) -> str:
    """The first function up the stack that is not one of these wrappers."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename == _HERE:
        f = f.f_back
    return f.f_code.co_name if f is not None else "?"


def _name(fn: Any) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def install_wrappers() -> None:
    # First, as rwfs.cli does: pyfuse3 loaded before it would bind libfuse's own
    # fuse_reply_open and fuse_session_new, and the C fast paths would be off.
    from rwfs.fuse import kernelflags

    if not kernelflags.ACTIVE:
        raise RuntimeError(
            "rwfs's _fuseopen extension is not active: the figures would not be rwfs's"
        )
    import pyfuse3
    import trio

    import rwfs.cli.mount  # noqa: F401
    import rwfs.core.batches  # noqa: F401  (every module that holds syncfs, imported first)
    import rwfs.core.committer
    import rwfs.core.landing
    import rwfs.core.recovery  # noqa: F401
    import rwfs.core.syscalls
    import rwfs.fuse.fs
    import rwfs.journal.intents
    import rwfs.journal.store

    pc = time.perf_counter

    # FUSE handlers (outside _guard: its latency samples keep only the newest 1,000). A
    # handler one calls (create opens its file through open) is counted apart: no request.
    base = set(dir(pyfuse3.Operations))
    in_op = contextvars.ContextVar("in_op", default=False)
    for name, fn in list(vars(rwfs.fuse.fs.Operations).items()):
        if name in base and not name.startswith("_") and callable(fn):

            def op_wrap(fn: Any = fn, key: str = "op:" + name) -> Any:
                @functools.wraps(fn)
                async def handler(*args: Any) -> Any:
                    nested = in_op.get()
                    token = in_op.set(True)
                    t = pc()
                    try:
                        return await fn(*args)
                    finally:
                        C.add("inner_" + key if nested else key, pc() - t)
                        in_op.reset(token)

                return handler

            setattr(rwfs.fuse.fs.Operations, name, op_wrap())

    # Thread hops: await time, and the time the function ran in its thread (extra).
    to_thread = trio.to_thread.run_sync

    async def run_sync(fn: Any, *args: Any, **kw: Any) -> Any:
        key = f"hop:{_caller()}>{_name(fn)}"
        ran = [0.0]

        def timed(*a: Any) -> Any:
            t = pc()
            try:
                return fn(*a)
            finally:
                ran[0] = pc() - t

        t = pc()
        try:
            return await to_thread(timed, *args, **kw)
        finally:
            C.add(key, pc() - t, ran[0])

    trio.to_thread.run_sync = run_sync
    from_thread = trio.from_thread.run_sync

    def from_thread_run_sync(fn: Any, *args: Any, **kw: Any) -> Any:
        t = pc()
        try:
            return from_thread(fn, *args, **kw)
        finally:
            C.add(f"to_loop:from_thread>{_name(fn)}", pc() - t)

    trio.from_thread.run_sync = from_thread_run_sync
    token_cls = trio.lowlevel.TrioToken
    soon = token_cls.run_sync_soon

    def run_sync_soon(self: Any, fn: Any, *args: Any, **kw: Any) -> Any:
        C.add(f"to_loop:run_sync_soon>{_name(fn)}")
        return soon(self, fn, *args, **kw)

    token_cls.run_sync_soon = run_sync_soon  # type: ignore[method-assign]

    # Syncs.
    def sync_wrap(fn: Any, what: str) -> Any:
        @functools.wraps(fn)
        def wrapped(*args: Any) -> Any:
            t = pc()
            try:
                return fn(*args)
            finally:
                C.add(f"sync:{what}<{_caller()}", pc() - t)

        return wrapped

    for what in ("fsync", "fdatasync", "sync"):
        setattr(os, what, sync_wrap(getattr(os, what), what))
    syncfs = sync_wrap(rwfs.core.syscalls.syncfs, "syncfs")
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("rwfs") and hasattr(mod, "syncfs"):
            mod.syncfs = syncfs  # type: ignore[attr-defined]

    # LMDB: every begin() in rwfs is a ``with``; a write transaction's __exit__ commits.
    class TimedTxn:
        __slots__ = ("t", "txn", "key")

        def __init__(self, txn: Any, key: str) -> None:
            self.txn, self.key = txn, key

        def __enter__(self) -> Any:
            self.t = pc()
            return self.txn.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return self.txn.__exit__(*exc)
            finally:
                C.add(self.key, pc() - self.t)

    class EnvProxy:
        def __init__(self, env: Any) -> None:
            self._env = env

        def begin(self, *args: Any, **kw: Any) -> Any:
            txn = self._env.begin(*args, **kw)
            if not kw.get("write"):
                C.add("lmdb:read_txn")
                return txn
            key = "lmdb:nested_write_txn" if kw.get("parent") is not None else "lmdb:write_txn"
            return TimedTxn(txn, key)

        def sync(self, *args: Any) -> Any:
            t = pc()
            try:
                return self._env.sync(*args)
            finally:
                C.add("sync:lmdb_env_sync", pc() - t)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._env, name)

    store_init = rwfs.journal.store.Store.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        store_init(self, *args, **kw)
        self.env = EnvProxy(self.env)

    rwfs.journal.store.Store.__init__ = init  # type: ignore[method-assign]
    store_write = rwfs.journal.store.Store.write

    def write(self: Any, fn: Any, *args: Any) -> Any:
        t = pc()
        try:
            return store_write(self, fn, *args)
        finally:
            C.add(f"store.write:{_caller()}>{_name(fn)}", pc() - t)

    rwfs.journal.store.Store.write = write  # type: ignore[method-assign]

    # The intent log.
    append = rwfs.journal.intents.IntentLog.append

    def intent_append(self: Any, record: dict[str, Any]) -> None:
        t = pc()
        try:
            append(self, record)
        finally:
            C.add(f"intent:{record.get('kind')}", pc() - t)

    rwfs.journal.intents.IntentLog.append = intent_append  # type: ignore[method-assign]
    rotate = rwfs.journal.intents.IntentLog.rotate

    def intent_rotate(self: Any) -> int:
        C.add("intent_rotate")
        return rotate(self)

    rwfs.journal.intents.IntentLog.rotate = intent_rotate  # type: ignore[method-assign]

    # The committer's groups (extra: how many commits and events each took).
    attempt = rwfs.core.committer.Committer._attempt

    async def timed_attempt(self: Any, group: list[Any], gens: list[int], **kw: Any) -> bool:
        t = pc()
        try:
            return await attempt(self, group, gens, **kw)
        finally:
            C.add("group", pc() - t, len(group))

    rwfs.core.committer.Committer._attempt = timed_attempt  # type: ignore[method-assign]


def daemon_main(workspace: str, outdir: str, options: list[str]) -> int:
    import cProfile
    import logging

    install_wrappers()
    from rwfs.cli.mount import serve
    from rwfs.fuse import kernelflags

    out = Path(outdir)
    seq = [0]
    prof: list[Any] = [None]

    def write_json(name: str, obj: Any) -> None:
        tmp = out / (name + ".tmp")
        tmp.write_text(json.dumps(obj))
        tmp.rename(out / name)

    def dump(_sig: int, _frame: Any) -> None:
        seq[0] += 1
        snap: dict[str, Any] = {"counters": C.snapshot(), "t": time.perf_counter()}
        snap["fast_writes"] = kernelflags.fast_written()  # answered in C, no handler
        write_json(f"snap-{seq[0]}.json", snap)

    def toggle_profile(_sig: int, _frame: Any) -> None:
        seq[0] += 1
        if prof[0] is None:
            prof[0] = cProfile.Profile()
            prof[0].enable()
        else:
            prof[0].disable()
            prof[0].dump_stats(str(out / f"profile-{seq[0]}.pstats"))
            prof[0] = None
        write_json(f"snap-{seq[0]}.json", {})

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, toggle_profile)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(workspace, workspace, set(options), None)
    return 0


# =======================================================================================
# The driver side


class Daemon:
    """One counting rwfs daemon serving a fresh workspace mounted over itself."""

    def __init__(self, mode: str, options: tuple[str, ...] = ()) -> None:
        self.mode = mode
        self.options = options
        self.ws = Path(tempfile.mkdtemp(prefix=f"rwfs-prof-{mode}-", dir="/tmp"))
        self.out = Path(tempfile.mkdtemp(prefix=f"rwfs-prof-{mode}-out-", dir="/tmp"))
        self.logfile = self.out / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.seq = 0

    def start(self, timeout: float = 60.0) -> None:
        rw = self.ws / ".rw"
        rw.mkdir(mode=0o700)
        (rw / "rwfs-state").write_text("rwfs state\n")
        (rw / "policy.toml").write_text(f'durability = "{self.mode}"\n')
        cmd = [sys.executable, str(Path(__file__).resolve()), "--daemon", str(self.ws)]
        cmd += [str(self.out), *self.options]
        with open(self.logfile, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, cwd="/"
            )
        deadline = time.monotonic() + timeout
        while not bench.rwfs_mounted(str(self.ws)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no mount within {timeout}s: {self.log_tail()}")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _signal(self, sig: int, timeout: float = 30.0) -> dict[str, Any]:
        self.seq += 1
        path = self.out / f"snap-{self.seq}.json"
        os.kill(self.pid, sig)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                raise RuntimeError(f"no answer to signal {sig}: {self.log_tail()}")
            time.sleep(0.005)
        got: dict[str, Any] = json.loads(path.read_text())
        return got

    def snapshot(self) -> dict[str, Any]:
        snap = self._signal(signal.SIGUSR1)
        snap["cpu"] = cpu_ticks(self.pid)
        return snap

    def profile_toggle(self) -> None:
        self._signal(signal.SIGUSR2)

    def idle(self) -> None:
        bench.wait_idle(self.pid, timeout=300)

    def stop(self, timeout: float = 120.0) -> None:
        point = str(self.ws)
        try:
            if bench.rwfs_mounted(point):
                res = subprocess.run(
                    ["fusermount3", "-u", point], capture_output=True, timeout=timeout
                )
                if res.returncode != 0:
                    subprocess.run(["fusermount3", "-u", "-z", point], timeout=timeout)
            if self.proc is not None:
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log(f"daemon {self.proc.pid} did not exit after unmount; killing it")
                    self.proc.kill()
                    self.proc.wait(30)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            if bench.rwfs_mounted(point):
                subprocess.run(["fusermount3", "-u", "-z", point], timeout=60)
            if "Traceback" in self.log_tail():
                log(f"the {self.mode} daemon logged a traceback:\n{self.log_tail()}")

    def remove(self) -> None:
        if not bench.rwfs_mounted(str(self.ws)):
            shutil.rmtree(self.ws, ignore_errors=True)
            shutil.rmtree(self.out, ignore_errors=True)


@contextlib.contextmanager
def daemon(mode: str, options: tuple[str, ...] = ()) -> Iterator[Daemon]:
    d = Daemon(mode, options)
    try:
        d.start()
        yield d
    finally:
        d.stop()
        d.remove()


def cpu_ticks(pid: int) -> dict[str, int]:
    """CPU ticks (user + system) of the whole daemon and of its main (event loop) thread."""

    def ticks(path: str) -> int:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    return {"all": ticks(f"/proc/{pid}/stat"), "loop": ticks(f"/proc/{pid}/task/{pid}/stat")}


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    ca, cb = a["counters"], b["counters"]
    out = {}
    for k, v in cb.items():
        u = ca.get(k, [0, 0.0, 0.0])
        d = [v[0] - u[0], v[1] - u[1], v[2] - u[2]]
        if d[0]:
            out[k] = d
    hz = os.sysconf("SC_CLK_TCK")
    return {
        "counters": out,
        "fast_writes": b.get("fast_writes", 0) - a.get("fast_writes", 0),
        "cpu_s": (b["cpu"]["all"] - a["cpu"]["all"]) / hz,
        "loop_cpu_s": (b["cpu"]["loop"] - a["cpu"]["loop"]) / hz,
    }


# ---------------------------------------------------------------------------------------
# Workloads: each returns {phase: (wall seconds, units)}; setup is untimed.


def payloads(n: int, seed: int) -> list[bytes]:
    # As scripts/bench's small-file loop: 1-4 KiB of random bytes.
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(1024, 4096)) for _ in range(n)]


def w_new(root: Path, n: int, fsync: bool) -> Callable[[], dict[str, tuple[float, int]]]:
    base = root / ("new_fsync" if fsync else "new")
    dirs = [base / f"d{i:02d}" for i in range(20)]
    for d in dirs:
        d.mkdir(parents=True)
    data = payloads(n, 1234 if not fsync else 4321)

    def run() -> dict[str, tuple[float, int]]:
        t0 = time.perf_counter()
        for i, b in enumerate(data):
            fd = os.open(
                dirs[i % 20] / f"f{i:05d}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
            try:
                os.write(fd, b)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return {"file": (time.perf_counter() - t0, n)}

    return run


def module_text(i: int) -> bytes:
    """A 100-line Python module; rewrite ``i`` changes one line of it."""
    lines = [f"value_{k:03d} = {k * 7 % 1000}  # a setting\n" for k in range(100)]
    lines[i % 100] = f"value_{i % 100:03d} = {i}  # changed\n"
    return "".join(lines).encode()


def w_rewrite(root: Path, n: int) -> Callable[[], dict[str, tuple[float, int]]]:
    path = root / "rewrite" / "settings.py"
    path.parent.mkdir()
    path.write_bytes(module_text(-1))
    texts = [module_text(i) for i in range(n)]

    def run() -> dict[str, tuple[float, int]]:
        return {"file": (bench.rewrite_all(path, texts), n)}

    return run


def w_save(root: Path, n: int) -> Callable[[], dict[str, tuple[float, int]]]:
    path = root / "save" / "settings.py"
    path.parent.mkdir()
    path.write_bytes(module_text(-1))
    texts = [module_text(i) for i in range(n)]

    def run() -> dict[str, tuple[float, int]]:
        return {"file": (bench.save_all(path, texts), n)}

    return run


def meta_phases(root: Path, n: int) -> list[tuple[str, Callable[[], tuple[float, int]]]]:
    base = root / "meta"
    base.mkdir()
    a = [base / f"m{i:05d}" for i in range(n)]
    r = [base / f"m{i:05d}.r" for i in range(n)]
    ln = [base / f"m{i:05d}.l" for i in range(n)]
    dd = [base / f"dir{i:05d}" for i in range(n)]

    def loop(fn: Callable[[int], object]) -> Callable[[], tuple[float, int]]:
        def run() -> tuple[float, int]:
            t0 = time.perf_counter()
            for i in range(n):
                fn(i)
            return time.perf_counter() - t0, n

        return run

    def create(i: int) -> None:
        os.close(os.open(a[i], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))

    return [
        ("create", loop(create)),
        ("chmod", loop(lambda i: os.chmod(a[i], 0o600))),
        ("truncate", loop(lambda i: os.truncate(a[i], 100))),
        ("rename", loop(lambda i: os.rename(a[i], r[i]))),
        ("link", loop(lambda i: os.link(r[i], ln[i]))),
        ("unlink_link", loop(lambda i: os.unlink(ln[i]))),
        ("unlink", loop(lambda i: os.unlink(r[i]))),
        ("mkdir", loop(lambda i: os.mkdir(dd[i]))),
        ("rmdir", loop(lambda i: os.rmdir(dd[i]))),
    ]


def w_gitobj(root: Path, n: int) -> Callable[[], dict[str, tuple[float, int]]]:
    """What git does for each object it writes, under its passthrough ``.git/``: a
    temporary made with O_EXCL, its bytes, the close, a link to the object's name in a
    fan-out directory and the temporary's unlink (``git add``, ``commit``, ``gc``)."""
    objects = root / "gitobj" / ".git" / "objects"
    fan = [objects / f"{i:02x}" for i in range(64)]
    for d in fan:
        d.mkdir(parents=True)
    data = payloads(n, 99)

    def run() -> dict[str, tuple[float, int]]:
        t0 = time.perf_counter()
        for i, b in enumerate(data):
            d = fan[i % 64]
            tmp, final = d / f"tmp_obj_{i:06d}", d / f"{i:038x}"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o444)
            try:
                os.write(fd, b)
            finally:
                os.close(fd)
            os.link(tmp, final)
            os.unlink(tmp)
        return {"file": (time.perf_counter() - t0, n)}

    return run


def getxattr_loop(path: Path, calls: int) -> float:
    def loop() -> None:
        for _ in range(calls):
            try:
                os.getxattr(path, FLOOR_XATTR)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise

    loop()  # the entry cached
    t0 = time.perf_counter()
    loop()
    return time.perf_counter() - t0


def phases(root: Path, n: int, which: tuple[str, ...], floor_calls: int) -> Iterator[Any]:
    """(workload, phase, setup-done runner) in order; each runner returns (wall, units)."""
    for w in which:
        if w == "floor":
            f = root / "floor"
            f.write_bytes(b"")
            yield w, "getxattr", lambda f=f: (getxattr_loop(f, floor_calls), floor_calls)
        elif w in ("new", "new_fsync", "rewrite", "save"):
            if w in ("rewrite", "save"):
                run = (w_rewrite if w == "rewrite" else w_save)(root, n)
            else:
                run = w_new(root, n, w == "new_fsync")
            yield w, "file", lambda run=run: run()["file"]
        elif w == "meta":
            for name, run in meta_phases(root, n):
                yield w, name, run
        elif w == "gitobj":
            run = w_gitobj(root, n)
            yield w, "object", lambda run=run: run()["file"]


def measure(d: Daemon, n: int, which: tuple[str, ...], floor_calls: int) -> list[dict[str, Any]]:
    rows = []
    for w, phase, run in phases(d.ws, n, which, floor_calls):
        d.idle()
        os.sync()
        d.idle()
        a = d.snapshot()
        wall, units = run()
        d.idle()  # the group commit after the last close belongs to this workload
        b = d.snapshot()
        # The floor's first loop is not timed, but its requests are counted.
        units_counted = units * 2 if w == "floor" else units
        rows.append(
            {
                "workload": w,
                "phase": phase,
                "wall_s": wall,
                "units": units,
                "counted_units": units_counted,
                **diff(a, b),
            }  # fmt: skip
        )
        log(f"{d.mode} {w}/{phase}: {wall / units * 1e3:.3f} ms each")
    return rows


# ---------------------------------------------------------------------------------------
# The counting pass: every request by opcode (libfuse debug), every syscall (strace -c)


OPCODE = re.compile(rb"opcode: (\w+) \(")


def strace_summary(path: Path) -> dict[str, int]:
    """syscall → calls, from ``strace -c`` output."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] not in ("total",):
            try:
                out[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return out


def count_pass(d: Daemon, n: int, which: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for w, phase, run in phases(d.ws, n, tuple(x for x in which if x != "floor"), 0):
        d.idle()
        st_out = d.out / f"strace-{w}-{phase}.txt"
        st = subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(st_out), "-p", str(d.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread
        start = d.logfile.stat().st_size
        _, units = run()
        d.idle()
        end = d.logfile.stat().st_size
        st.send_signal(signal.SIGINT)
        try:
            st.wait(60)
        except subprocess.TimeoutExpired:
            st.kill()
            st.wait(10)
        with open(d.logfile, "rb") as f:
            f.seek(start)
            text = f.read(end - start)
        ops: dict[str, int] = {}
        for m in OPCODE.finditer(text):
            ops[m.group(1).decode()] = ops.get(m.group(1).decode(), 0) + 1
        rows.append(
            {
                "workload": w,
                "phase": phase,
                "units": units,
                "requests": ops,
                "syscalls": strace_summary(st_out) if st_out.exists() else {},
            }  # fmt: skip
        )
        log(f"{d.mode} {w}/{phase}: {sum(ops.values()) / units:.1f} requests each (debug)")
    return rows


# ---------------------------------------------------------------------------------------
# The profile pass: cProfile of the loop's thread, py-spy of every thread


PROFILED = ("new", "rewrite", "save", "gitobj")


def profile_pass(n: int, top: int, which: tuple[str, ...] = PROFILED) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with daemon("group") as d:
        for w in (w for w in PROFILED if w in which):
            run = {"new": lambda: w_new(d.ws, n, False), "rewrite": lambda: w_rewrite(d.ws, n),
                   "save": lambda: w_save(d.ws, n), "gitobj": lambda: w_gitobj(d.ws, n)}[w]()  # fmt: skip
            d.idle()
            raw = d.out / f"pyspy-{w}.txt"
            sp = None
            if os.access(spy, os.X_OK):
                sp = subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(d.pid),
                        "--format",
                        "raw",
                        "--rate",
                        "500",
                        "--threads",
                        "-o",
                        str(raw),
                    ],  # fmt: skip
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            d.profile_toggle()
            files = run()["file"][1]
            d.idle()
            got: dict[str, Any] = {"files": files}
            if sp is not None:  # stopped first: cProfile's dump is no part of the workload
                sp.send_signal(signal.SIGINT)
                try:
                    sp.wait(60)
                except subprocess.TimeoutExpired:
                    sp.kill()
                    sp.wait(10)
                if raw.exists():
                    got["pyspy"] = pyspy_self(raw, top)
            d.profile_toggle()
            prof = sorted(d.out.glob("profile-*.pstats"), key=os.path.getmtime)[-1]
            got["cprofile"] = cprofile_top(prof, top)
            out[w] = got
    return out


def cprofile_top(path: Path, top: int) -> list[dict[str, Any]]:
    st = pstats.Stats(str(path))
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"fn": f"{_short(file)}:{line}:{fn}", "calls": nc, "self_s": tt, "cum_s": ct})
    rows.sort(key=lambda r: -r["self_s"])
    # epoll.poll is the loop waiting for the kernel: idle, not work.
    return [r for r in rows if "select.epoll" not in r["fn"]][:top]


# Leaves py-spy samples as busy that are waits: the loop in epoll, an idle worker thread.
IDLE_LEAVES = ("EpollIOManager.get_events", "WorkerThread._work")


def pyspy_self(path: Path, top: int) -> dict[str, Any]:
    """Self samples by leaf function from py-spy's collapsed stacks, waits left out (and
    counted apart), and the busy samples per thread. A leaf in one of this script's
    wrappers is the C call it wraps (an LMDB commit, an fsync): named by its caller."""
    leaf: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        if frames[-1].startswith(IDLE_LEAVES):
            idle += c
            continue
        total += c
        thread = re.sub(r"^thread \(\d+\): ", "", frames[0].strip())
        threads[thread] = threads.get(thread, 0) + c
        fn = re.sub(r"\s+", " ", frames[-1])
        if "profile_requests.py" in fn and len(frames) > 2:
            inner = "LMDB commit" if "TimedTxn" in fn else "C call"
            caller = re.sub(r"\s+", " ", frames[-2])
            fn = f"{inner} in {caller}"
        leaf[fn] = leaf.get(fn, 0) + c
    ranked = sorted(leaf.items(), key=lambda kv: -kv[1])[:top]
    return {"total": total, "idle": idle, "top": ranked, "threads": threads}


def _short(file: str) -> str:
    for marker in ("/site-packages/", "/src/", "/scripts/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return re.sub(r"^.*/lib/python3\.\d+/", "", file)


# ---------------------------------------------------------------------------------------
# Report


def per(v: float, units: int) -> str:
    return f"{v / units:.2f}" if v else "0"


def md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def group_sum(c: dict[str, list[float]], prefix: str) -> tuple[float, float, float]:
    n = s = x = 0.0
    for k, v in c.items():
        if k.startswith(prefix):
            n, s, x = n + v[0], s + v[1], x + v[2]
    return n, s, x


def summary_table(rows: list[dict[str, Any]], floor_us: float) -> str:
    out = []
    for r in rows:
        if r["workload"] == "floor":
            continue
        u, c = r["counted_units"], r["counters"]
        ops_n, ops_s, _ = group_sum(c, "op:")
        hop_n, hop_s, hop_run = group_sum(c, "hop:")
        wtx_n, wtx_s, _ = group_sum(c, "lmdb:write_txn")
        fs_n = group_sum(c, "sync:fsync")[0] + group_sum(c, "sync:fdatasync")[0]
        sfs_n = group_sum(c, "sync:syncfs")[0]
        int_n = group_sum(c, "intent:")[0]
        grp_n, _, grp_items = group_sum(c, "group")
        wall_ms = r["wall_s"] / r["units"] * 1e3
        out.append([
            f"{r['workload']}/{r['phase']}" if r["workload"] == "meta" else r["workload"],
            f"{wall_ms:.3f}",
            f"{wall_ms * 1e3 / floor_us:.1f}",
            f"{(ops_n + r['fast_writes']) / u:.2f}",
            f"{ops_s / max(ops_n, 1) * 1e6:.0f}",
            per(hop_n, u),
            f"{hop_s / u * 1e3:.3f}",
            per(wtx_n, u),
            f"{wtx_s / u * 1e3:.3f}",
            per(fs_n, u),
            per(sfs_n, u),
            per(int_n, u),
            f"{grp_items / grp_n:.0f}" if grp_n else "-",
            f"{r['cpu_s'] / u * 1e3:.2f} ({r['loop_cpu_s'] / u * 1e3:.2f})",
        ])  # fmt: skip
    header = ["workload", "wall ms", "× floor", "requests", "µs/request", "hops",
              "hop ms", "LMDB wtx", "wtx ms", "fsync", "syncfs", "intents",
              "files/group", "daemon CPU ms (loop)"]  # fmt: skip
    return md(header, out)


def detail_table(r: dict[str, Any], prefixes: tuple[str, ...]) -> str:
    u, c = r["counted_units"], r["counters"]
    rows = []
    for k, v in sorted(c.items(), key=lambda kv: -kv[1][1]):
        if not k.startswith(prefixes) or v[0] / u < 0.005:
            continue
        extra = ""
        if k.startswith("hop:"):
            extra = f"{v[2] / v[0] * 1e6:.0f}"
        elif k == "group":
            extra = f"{v[2] / v[0]:.0f} items"
        rows.append([k, f"{v[0] / u:.2f}", f"{v[1] / v[0] * 1e6:.0f}", f"{v[1] / u * 1e3:.3f}",
                     extra])  # fmt: skip
    if r["fast_writes"]:
        rows.append(["C fast write", f"{r['fast_writes'] / u:.2f}", "-", "-", ""])
    return md(["counter", "per file", "mean µs", "ms per file", "in thread µs / extra"], rows)


def count_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        u = r["units"]
        ops = sorted(r["requests"].items(), key=lambda kv: -kv[1])
        sc = r["syscalls"]
        syncs = sum(sc.get(k, 0) for k in ("fsync", "fdatasync", "syncfs", "sync", "msync"))
        name = f"{r['workload']}/{r['phase']}" if r["workload"] == "meta" else r["workload"]
        out.append([
            name,
            f"{sum(r['requests'].values()) / u:.2f}",
            ", ".join(f"{k} {v / u:.2f}" for k, v in ops if v / u >= 0.01),
            f"{sum(sc.values()) / u:.1f}",
            f"{syncs / u:.2f} ("
            + ", ".join(f"{k} {sc[k] / u:.2f}" for k in ("fsync", "fdatasync", "syncfs")
                        if sc.get(k)) + ")",  # fmt: skip
        ])  # fmt: skip
    return md(["workload", "requests", "by opcode (per file)", "syscalls", "sync calls"], out)


def report(res: dict[str, Any]) -> str:
    parts = []
    floor_c = res.get("floor_c_us")
    for mode in res["modes"]:
        rows = res["measure"][mode]
        fl = next((r for r in rows if r["workload"] == "floor"), None)
        rw_floor = fl["wall_s"] / fl["units"] * 1e6 if fl else None
        floor_us = res.get("unit_us") or floor_c or rw_floor or 50.0
        parts.append(f"### {mode}\n")
        if fl:
            c = fl["counters"].get("op:getxattr", [1, 0.0])
            parts.append(
                f"getxattr on this mount: {rw_floor:.1f} µs a request wall, "
                f"{c[1] / c[0] * 1e6:.1f} µs in the handler"
                + (f"; the C server's floor: {floor_c:.1f} µs" if floor_c else "")
                + f"; the unit of × below: {floor_us:.1f} µs"
                + "\n"
            )
        parts.append(summary_table(rows, floor_us) + "\n")
        for r in rows:
            if r["workload"] != "floor":
                parts.append(f"#### {mode}: {r['workload']}/{r['phase']}\n")
                parts.append(
                    detail_table(
                        r,
                        (
                            "op:",
                            "inner_op:",
                            "hop:",
                            "sync:",
                            "lmdb:",
                            "intent",
                            "group",
                            "to_loop",
                            "store.",
                        ),
                    )
                    + "\n"
                )
    for mode, rows in res.get("count", {}).items():
        parts.append(f"### every request and system call ({mode}, {rows[0]['units']} files)\n")
        parts.append(count_table(rows) + "\n")
    for w, got in res.get("profile", {}).items():
        n = got["files"]
        parts.append(f"### profile, group, {w} ({n} files)\n")
        cp = got["cprofile"]
        parts.append(
            md(
                ["function (cProfile, loop thread)", "calls/file", "self µs/file", "cum µs/file"],
                [
                    [
                        r["fn"],
                        f"{r['calls'] / n:.1f}",
                        f"{r['self_s'] / n * 1e6:.0f}",
                        f"{r['cum_s'] / n * 1e6:.0f}",
                    ]
                    for r in cp
                ],  # fmt: skip
            )
            + "\n"
        )
        spy = got.get("pyspy")
        if spy and spy["total"]:
            parts.append(
                md(
                    ["leaf function (py-spy, all threads, busy samples)", "share"],
                    [[f"`{fn}`", f"{c / spy['total'] * 100:.1f}%"] for fn, c in spy["top"]],
                )
                + "\n"
            )
            parts.append(
                f"busy samples {spy['total']} (waits left out: {spy['idle']}); by thread: "
                + ", ".join(f"{k} {v / spy['total'] * 100:.0f}%" for k, v in spy["threads"].items())
                + "\n"
            )
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", type=int, default=1000, help="files (and ops) per workload (1000)")
    ap.add_argument("--count-files", type=int, default=200, help="files in the counting pass (200)")
    ap.add_argument("--modes", default="group,strict")
    ap.add_argument("--only", default=",".join(WORKLOADS), help=",".join(WORKLOADS))
    ap.add_argument("--floor-calls", type=int, default=5000, help="getxattr calls on the mount")
    ap.add_argument("--no-count", action="store_true", help="skip the debug + strace pass")
    ap.add_argument("--no-profile", action="store_true", help="skip the profile pass")
    ap.add_argument("--no-c-floor", action="store_true", help="skip the C libfuse server")
    ap.add_argument(
        "--unit-us",
        type=float,
        help="the request cost the × column divides by (default: the C server's, measured)",
    )
    ap.add_argument("--top", type=int, default=15, help="functions per profile (15)")
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    args = ap.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    which = tuple(w for w in args.only.split(",") if w)
    res: dict[str, Any] = {"modes": modes, "measure": {}, "count": {}, "files": args.files}
    res["unit_us"] = args.unit_us
    with open("/proc/loadavg") as f:
        res["loadavg_before"] = f.read().split()[:3]
    if not args.no_c_floor:
        build = Path(tempfile.mkdtemp(prefix="rwfs-prof-floor-", dir="/tmp"))
        try:
            t = bench.c_floor(build)
            if t is not None:
                res["floor_c_us"] = t / bench.FLOOR_CALLS * 1e6
        finally:
            shutil.rmtree(build, ignore_errors=True)
    for mode in modes:
        with daemon(mode) as d:
            res["measure"][mode] = measure(d, args.files, which, args.floor_calls)
    if not args.no_count and shutil.which("strace"):
        for mode in modes:
            with daemon(mode, ("debug",)) as d:
                res["count"][mode] = count_pass(d, args.count_files, which)
    if not args.no_profile:
        res["profile"] = profile_pass(args.files, args.top, which)
    with open("/proc/loadavg") as f:
        res["loadavg_after"] = f.read().split()[:3]
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(report(res))
    print(f"\nload average before {res['loadavg_before']}, after {res['loadavg_after']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--daemon":
        sys.exit(daemon_main(sys.argv[2], sys.argv[3], sys.argv[4:]))
    sys.exit(main())
