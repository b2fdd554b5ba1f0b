"""rwfs stress: several processes run random file operations in one mount at once.

Run through ``scripts/stress`` (which bootstraps the venv). Like fsstress, each worker
process picks operations at random (create, write, append, truncate, fallocate, O_DIRECT
writes, fsync, rename, link, unlink, mkdir, rmdir, symlink, chmod, utime, xattrs, reads,
listings) on names shared by every worker, so they race on the same files and
directories. Errors a race explains (ENOENT, EEXIST, ENOTEMPTY, ...) are counted; any
other is a failure. Each worker also keeps files of its own, which only it writes (whole,
in place, through a shared mapping, or as a temporary file renamed over), and remembers
their last bytes: they must read back exactly while it runs, at the end through the
mount, and again after a remount. The daemon must stay up, log no traceback, and ``rwfs fsck`` must
find the journal, objects and tree in agreement.

The workspace is a fresh temporary directory, mounted over itself and always unmounted.
Exit status 0 when every check held. A short run is part of the test suite; longer ones
(``--seconds 600``) are for people to run and report.

``--kill-loop N`` is a crash loop instead: N times, the workspace is mounted, the workers
run (adding FIFOs, device nodes, sockets and their hard links and renames to the mix, on
names of their own, since opening a FIFO blocks), the daemon is killed with SIGKILL at a
random instant, the dead mount is cleared (``fusermount3 -u -z``), the workspace is
mounted again (recovery runs) and unmounted, and ``rwfs fsck`` checks it. It reports the
kills, the remounts that worked and the clean fscks; a workspace that does not mount again,
or whose fsck finds drift, is kept for a look and the loop goes on with a new one.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import json
import mmap
import multiprocessing
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (scripts/ is not a package)

# What a race between workers explains: the name went, came, or changed type meanwhile.
RACES = {
    errno.ENOENT,
    errno.EEXIST,
    errno.ENOTEMPTY,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENODATA,
    errno.EXDEV,  # rename of a file an open batch holds (none here), kept for safety
    errno.EINVAL,  # rename of a directory into itself
    errno.ELOOP,  # a symlink where a file was
    errno.EMLINK,
    # A rename or link that would give a journaled name to a file another worker holds
    # open under node_modules/ (the kernel passes such opens through: the fast path).
    errno.EBUSY,
}
SHARED_NAMES = 24
SPECIAL_NAMES = 8
# node_modules/ is a passthrough path: its files' opens are the fast path's.
DIRS = ("", "d0", "d1", "d0/e", "node_modules", "node_modules/p")
BLOCK = 4096
_libc = ctypes.CDLL(None, use_errno=True)


def fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(length)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Worker:
    def __init__(self, root: Path, wid: int, seed: int) -> None:
        self.root = root
        self.wid = wid
        self.rng = random.Random(seed * 1000 + wid)
        self.own: dict[str, bytes] = {}  # this worker's files and their last bytes
        self.counts: collections.Counter[str] = collections.Counter()
        self.failures: list[str] = []

    def shared(self) -> Path:
        d = self.rng.choice(DIRS)
        return self.root / d / f"n{self.rng.randrange(SHARED_NAMES)}"

    def payload(self) -> bytes:
        n = self.rng.choice((0, 1, 100, 4096, 5000, 70_000))
        return self.rng.randbytes(n)

    # ---- operations on shared names (races expected) ----

    def op_write(self) -> None:
        p = self.shared()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | self.rng.choice((0, os.O_TRUNC)), 0o644)
        try:
            os.pwrite(fd, self.payload(), self.rng.randrange(0, 80_000))
        finally:
            os.close(fd)

    def op_append(self) -> None:
        with open(self.shared(), "ab") as f:
            f.write(self.payload())

    def op_truncate(self) -> None:
        os.truncate(self.shared(), self.rng.randrange(0, 90_000))

    def op_fallocate(self) -> None:
        fd = os.open(self.shared(), os.O_RDWR)
        try:
            off, length = self.rng.randrange(0, 60_000), self.rng.randrange(1, 40_000)
            fallocate(fd, self.rng.choice((0, 0x01, 0x03, 0x10)), off, length)
        finally:
            os.close(fd)

    def op_direct(self) -> None:
        fd = os.open(self.shared(), os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
            buf.write(self.rng.randbytes(BLOCK))
            os.pwrite(fd, buf, BLOCK * self.rng.randrange(0, 8))
        finally:
            os.close(fd)

    def op_fsync(self) -> None:
        fd = os.open(self.shared(), os.O_WRONLY)
        try:
            os.write(fd, b"sync")
            os.fsync(fd)
        finally:
            os.close(fd)

    def op_read(self) -> None:
        self.shared().read_bytes()

    def op_list(self) -> None:
        os.listdir(self.shared().parent)

    def op_rename(self) -> None:
        os.rename(self.shared(), self.shared())

    def op_link(self) -> None:
        os.link(self.shared(), self.shared())

    def op_unlink(self) -> None:
        os.unlink(self.shared())

    def op_mkdir(self) -> None:
        os.mkdir(self.shared())

    def op_rmdir(self) -> None:
        os.rmdir(self.shared())

    def op_symlink(self) -> None:
        os.symlink(f"n{self.rng.randrange(SHARED_NAMES)}", self.shared())

    def op_chmod(self) -> None:
        os.chmod(self.shared(), self.rng.choice((0o600, 0o644, 0o755)))

    def op_utime(self) -> None:
        os.utime(self.shared(), ns=(self.rng.randrange(1 << 40), self.rng.randrange(1 << 40)))

    def op_xattr(self) -> None:
        p = self.shared()
        if self.rng.random() < 0.5:
            os.setxattr(p, b"user.stress", self.rng.randbytes(16), follow_symlinks=False)
        else:
            os.listxattr(p, follow_symlinks=False)

    # ---- operations on this worker's own files (their bytes are known) ----

    def own_dir(self) -> str:
        """Journaled (w1/) or passthrough (node_modules/w1/): the fast path's files too."""
        return self.rng.choice((f"w{self.wid}", f"node_modules/w{self.wid}"))

    def op_own(self) -> None:
        name = f"{self.own_dir()}/f{self.rng.randrange(6)}"
        p = self.root / name
        old = self.own.get(name, b"")
        how = self.rng.randrange(5 if old else 4)
        if how == 0:  # rewrite whole
            new = self.payload()
            p.write_bytes(new)
        elif how == 4:  # through a shared mapping (only this worker resizes it:
            # touching a mapped page past a shrunk end would kill the process with SIGBUS)
            at = self.rng.randrange(len(old))
            fd = os.open(p, os.O_RDWR)
            try:
                with mmap.mmap(fd, len(old)) as m:
                    m[at : at + 1] = b"m"
                    m.flush()
            finally:
                os.close(fd)
            new = old[:at] + b"m" + old[at + 1 :]
        elif how == 1:  # write in place at an offset, keeping the rest
            at = self.rng.randrange(len(old) + 1)
            data = self.payload()[:3000]
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, data, at)
                if self.rng.random() < 0.3:
                    os.fsync(fd)
            finally:
                os.close(fd)
            new = old[:at] + data + old[at + len(data) :]
        elif how == 2:  # write a temporary file, then rename it over (an editor's save)
            new = self.payload()
            tmp = p.parent / f".tmp{self.rng.randrange(1 << 30)}"
            tmp.write_bytes(new)
            os.rename(tmp, p)
        elif how == 3:  # check it
            got = p.read_bytes() if name in self.own else None
            if got is not None and got != old:
                self.failures.append(f"{name}: read {len(got)} bytes, expected {len(old)}")
            return
        self.own[name] = new

    # ---- special files (--kill-loop): names of their own, as opening a FIFO blocks ----

    def special(self) -> Path:
        return self.root / self.rng.choice(DIRS) / f"s{self.rng.randrange(SPECIAL_NAMES)}"

    def kill_fifo(self) -> None:
        os.mkfifo(self.special(), 0o644)

    def kill_mknod(self) -> None:
        os.mknod(self.special(), 0o644 | stat.S_IFCHR, os.makedev(0, 0))

    def kill_socket(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(self.special()))

    def kill_rename(self) -> None:
        os.rename(self.special(), self.special())

    def kill_link(self) -> None:
        os.link(self.special(), self.special(), follow_symlinks=False)

    def kill_unlink(self) -> None:
        os.unlink(self.special())

    def kill_stat(self) -> None:
        os.lstat(self.special())

    def run(self, seconds: float, only: set[str], specials: bool = False) -> None:
        (self.root / f"w{self.wid}").mkdir(exist_ok=True)
        (self.root / f"node_modules/w{self.wid}").mkdir(parents=True, exist_ok=True)
        ops = [(name[3:], getattr(self, name)) for name in dir(self) if name.startswith("op_")]
        ops = [(n, fn) for n, fn in ops if not only or n in only]
        if specials:
            ops += [(name, getattr(self, name)) for name in dir(self) if name.startswith("kill_")]
        weights = [8 if n == "own" else 4 if n in ("write", "read") else 1 for n, _ in ops]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(self.failures) < 20:
            (name, fn) = self.rng.choices(ops, weights)[0]
            try:
                fn()
                self.counts[name] += 1
            except OSError as exc:
                # EPERM: a link to a directory, a user xattr on a symlink (POSIX says so).
                if exc.errno in RACES or (exc.errno == errno.EPERM and name in ("link", "xattr")):
                    self.counts["race"] += 1
                else:
                    self.failures.append(f"{name}: {exc!r}")
            except Exception as exc:  # the worker itself must not die unreported
                self.failures.append(f"{name}: {exc!r} ({type(exc).__name__})")


def worker_main(root: str, wid: int, seed: int, seconds: float, only: str, out: str) -> None:
    w = Worker(Path(root), wid, seed)
    w.run(seconds, set(only.split(",")) - {""})
    Path(out).write_text(
        json.dumps(
            {
                "counts": w.counts,
                "failures": w.failures,
                "own": {k: v.hex() for k, v in w.own.items()},
            }
        )
    )


def kill_worker_main(root: str, wid: int, seed: int) -> None:
    """A worker of --kill-loop: runs until it is killed, errors and all (the mount dies
    under it)."""
    w = Worker(Path(root), wid, seed)
    w.failures = _Never()
    w.run(1e9, set(), specials=True)


class _Never(list[str]):
    """A failure list that keeps nothing: a --kill-loop worker only has to make load."""

    def append(self, item: str) -> None:
        pass


class StressMount(bench.Mount):
    def prepare(self) -> None:
        rw = self.workspace / ".rw"
        rw.mkdir(mode=0o700, exist_ok=True)
        (rw / "rwfs-state").write_text("rwfs state\n")
        gates = "".join(
            f'[gates.{g}]\naction = "off"\n' for g in ("truncation", "elision", "syntax")
        )
        (rw / "policy.toml").write_text(f'durability = "{self.durability}"\n' + gates)


def check_own(root: Path, results: list[dict], when: str) -> list[str]:
    bad = []
    for r in results:
        for name, hexdata in r["own"].items():
            try:
                got = (root / name).read_bytes()
            except OSError as exc:
                bad.append(f"{when}: {name}: {exc!r}")
                continue
            if got != bytes.fromhex(hexdata):
                bad.append(
                    f"{when}: {name} holds {len(got)} bytes, not its last {len(hexdata) // 2}"
                )
    return bad


def fsck(workspace: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rwfs.cli", "fsck", str(workspace)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def kill_loop(rounds: int, procs: int, seed: int, durability: str, options: tuple[str, ...]) -> int:
    """--kill-loop: mount, load, SIGKILL the daemon, clear, remount, unmount, fsck."""
    rng = random.Random(seed)
    base = Path(tempfile.mkdtemp(prefix="rwfs-killloop-", dir="/tmp"))
    counts = collections.Counter({"kills": 0, "remounted": 0, "fsck_clean": 0})
    problems: list[str] = []
    kept: list[Path] = []
    n_ws = 0

    def fresh() -> tuple[Path, StressMount]:
        nonlocal n_ws
        n_ws += 1
        ws = base / f"ws{n_ws}"
        ws.mkdir()
        for d in DIRS[1:]:
            (ws / d).mkdir(parents=True, exist_ok=True)
        return ws, StressMount(ws, durability, base / f"daemon{n_ws}.log", options)

    print(f"stress: kill loop, seed {seed}, {rounds} rounds of {procs} workers ({durability})")
    ws, m = fresh()
    ctx = multiprocessing.get_context("fork")
    try:
        for r in range(rounds):
            try:
                m.start()
            except bench.BenchError as exc:
                problems.append(f"round {r + 1}: mount failed before the kill: {str(exc)[-300:]}")
                kept.append(ws)
                ws, m = fresh()
                continue
            workers = [
                ctx.Process(target=kill_worker_main, args=(str(ws), i, seed * 1000 + r))
                for i in range(procs)
            ]
            for p in workers:
                p.start()
            time.sleep(rng.uniform(0.3, 3.0))  # the random instant
            assert m.proc is not None
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(30)
            m.proc = None
            counts["kills"] += 1
            for p in workers:  # before the dead mount goes: they must not reach the raw tree
                p.kill()
            for p in workers:
                p.join(60)
            subprocess.run(["fusermount3", "-u", "-z", str(ws)], capture_output=True)
            try:
                m.start()
            except bench.BenchError as exc:
                last = str(exc).strip().splitlines()[-1:] or [""]
                problems.append(f"round {r + 1}: the remount failed: {last[0][:300]}")
                m.stop()
                kept.append(ws)
                ws, m = fresh()
                continue
            counts["remounted"] += 1
            m.stop()
            res = fsck(ws)
            if res.returncode == 0:
                counts["fsck_clean"] += 1
            else:
                drift = (res.stdout + res.stderr).strip().splitlines()
                problems.append(f"round {r + 1}: fsck: {len(drift)} lines: {' | '.join(drift[:3])}")
                kept.append(ws)  # as it is, for a look; the next rounds start afresh
                ws, m = fresh()
            print(
                f"stress: round {r + 1}/{rounds}: kills {counts['kills']}, "
                f"remounted {counts['remounted']}, fsck clean {counts['fsck_clean']}",
                flush=True,
            )
    finally:
        m.stop()
    for logfile in sorted(base.glob("daemon*.log")):
        if "Traceback" in logfile.read_text(errors="replace"):
            problems.append(f"a daemon logged a traceback (see {logfile})")
    print(
        f"stress: kill loop: kills {counts['kills']}, remounted {counts['remounted']}, "
        f"fsck clean {counts['fsck_clean']}"
    )
    if problems:
        print("stress: FAILED\n  " + "\n  ".join(problems[:40]), file=sys.stderr)
        print(f"stress: kept {base} (seed {seed})", file=sys.stderr)
        return 1
    shutil.rmtree(base, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the workers run (60)")
    ap.add_argument("--procs", type=int, default=4, help="worker processes (4)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: a new one)")
    ap.add_argument("--durability", choices=("group", "strict"), default="group")
    ap.add_argument(
        "--fastpath", choices=("on", "off"), default="on", help="the mount's -o fastpath (on)"
    )
    ap.add_argument("--ops", default="", help="only these operations, comma-separated")
    ap.add_argument(
        "--kill-loop",
        type=int,
        metavar="N",
        default=0,
        help="instead: N rounds of load, SIGKILL of the daemon, remount and fsck",
    )
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.procs < 1 or args.kill_loop < 0:
        ap.error("--seconds, --procs and --kill-loop must be positive")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    options = (f"fastpath={args.fastpath}",)
    if args.kill_loop:
        return kill_loop(args.kill_loop, args.procs, seed, args.durability, options)
    base = Path(tempfile.mkdtemp(prefix="rwfs-stress-", dir="/tmp"))
    ws = base / "ws"
    ws.mkdir()
    for d in DIRS[1:]:
        (ws / d).mkdir(parents=True, exist_ok=True)
    m = StressMount(ws, args.durability, base / "daemon.log", options)
    problems: list[str] = []
    print(f"stress: seed {seed}, {args.procs} workers for {args.seconds:g}s ({args.durability})")
    try:
        m.start()
        ctx = multiprocessing.get_context("fork")
        outs = [base / f"worker{i}.json" for i in range(args.procs)]
        procs = [
            ctx.Process(
                target=worker_main, args=(str(ws), i, seed, args.seconds, args.ops, str(outs[i]))
            )
            for i in range(args.procs)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(args.seconds + 300)
            if p.is_alive():
                p.kill()
                problems.append(f"worker {p.pid} did not finish")
            elif p.exitcode:
                problems.append(f"worker {p.pid} exited with {p.exitcode} (<0: a signal)")
        if m.proc is None or m.proc.poll() is not None:
            problems.append("the daemon died")
        results = [json.loads(o.read_text()) for o in outs if o.exists()]
        if len(results) != args.procs:
            problems.append(f"{args.procs - len(results)} workers wrote no result")
        total: collections.Counter[str] = collections.Counter()
        for r in results:
            total.update(r["counts"])
            problems += [f"worker: {f}" for f in r["failures"]]
        print("stress: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
        fast = json.loads((ws / ".rw" / "status").read_text()).get("passthrough", {})
        print(f"stress: opens passed through (the fast path) {fast.get('opens', 0)}")
        if problems:  # what rwfs said of its last error, while it is still mounted
            print((ws / ".rw" / "last-error").read_text(), file=sys.stderr)
        problems += check_own(ws, results, "mounted")
        m.stop()
        if "Traceback" in m.log_text():
            problems.append(f"the daemon logged a traceback (see {m.logfile})")
        res = fsck(ws)
        if res.returncode != 0:
            problems.append(f"fsck: {res.stdout.strip()} {res.stderr.strip()}")
        else:  # (after drift, the state is kept as it is, for a look)
            m.start()  # again: what the workers wrote survives a remount
            problems += check_own(ws, results, "remounted")
    finally:
        m.stop()
    if problems:
        print("stress: FAILED\n  " + "\n  ".join(problems[:40]), file=sys.stderr)
        print(f"stress: kept {base} (seed {seed})", file=sys.stderr)
        return 1
    shutil.rmtree(base, ignore_errors=True)
    print(
        "stress: ok (daemon up throughout, own files exact before and after a remount, fsck clean)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
