"""rwfs benchmark: each workload on a native directory, a bindfs mount, a mount of
libfuse's passthrough_ll example (and of its passthrough_hp where one is given), a mount
of a minimal pyfuse3 passthrough and rwfs mounts (group, strict).

Run through ``scripts/bench`` (which bootstraps the venv). Every measurement gets a fresh
temporary directory under /tmp; every rwfs measurement mounts a fresh workspace over itself
and always unmounts it (``fusermount3 -u``, then ``-u -z``, then SIGKILL of the daemon this
script started). The table gives the median over ``--runs`` runs, the ratio to native and
each rwfs mode's ratio to bindfs (the targets' base, docs/performance.md) and to the pyfuse3
passthrough (rwfs's stack with no journaling: what is rwfs's own work), all measured in
the same run. Timings belong here, never in tests.
"""

from __future__ import annotations

import argparse
import errno
import gzip
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MODES = (
    "native",
    "bindfs",
    "libfuse_hp",
    "libfuse_ll",
    "pyfuse3",
    "group",
    "strict",
    "group_nofast",
)
# libfuse's own passthrough examples, C on the low-level API: passthrough_ll is built each
# run from the examples libfuse3-dev ships (Debian's have no passthrough_hp.cc);
# passthrough_hp (C++, libfuse's best passthrough) is used where a binary is given.
LIBFUSE_MODES = ("libfuse_hp", "libfuse_ll")
LIBFUSE_EXAMPLES = Path(
    os.environ.get("RWFS_BENCH_LIBFUSE_EXAMPLES", "/usr/share/doc/libfuse3-dev/examples")
)
# passthrough_ll's options: the kernel caches rwfs asks for too, which are passthrough_hp's
# default (cache=always: entry and attribute timeouts of a day, keep_cache), and xattr
# calls passed through (off by default: the floor row's getxattr would find ENOSYS).
LIBFUSE_LL_OPTIONS = "cache=always,xattr"
# A mode's durability and its mount options: group measures the fast path (-o
# fastpath=on, not yet the default), group_nofast is group without it.
RWFS_MOUNTS = {
    "group": ("group", ("fastpath=on",)),
    "strict": ("strict", ()),
    "group_nofast": ("group", ("fastpath=off",)),
}
# Where the passthrough rows write: a path rwfs's default policy does not journal.
PASSTHROUGH_DIR = "node_modules"
TREE_FILES = 10_000
FLOOR_CALLS = 20_000
SCRIPTS = Path(__file__).resolve().parent
MIN_TREE_FILES = 3000
GREP_WORD = "Guido"
REWRITE_LINES = 100
META_PROCS = 4
GIT = [
    "git",
    "-c",
    "user.name=rwfs bench",
    "-c",
    "user.email=bench@example.invalid",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "init.defaultBranch=main",
]


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Mounts


def in_mounts(point: Path | str, fstype: str | None = None) -> bool:
    """Whether something (of type ``fstype``, if given) is mounted on ``point``, from the
    mount table: a FUSE mount whose server died counts too."""
    with open("/proc/self/mounts") as f:
        for parts in map(str.split, f):
            if len(parts) > 2 and parts[1] == str(point) and fstype in (None, parts[2]):
                return True
    return False


def rwfs_mounted(point: str) -> bool:
    return in_mounts(point, "fuse.rwfs")


class Mount:
    """One rwfs daemon serving ``workspace`` mounted over itself."""

    def __init__(
        self, workspace: Path, durability: str, logfile: Path, options: tuple[str, ...] = ()
    ) -> None:
        self.workspace = workspace
        self.durability = durability
        self.logfile = logfile
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    def prepare(self) -> None:
        rw = self.workspace / ".rw"
        rw.mkdir(mode=0o700, exist_ok=True)
        (rw / "rwfs-state").write_text("rwfs state\n")
        (rw / "policy.toml").write_text(f'durability = "{self.durability}"\n')

    def start(self, timeout: float = 60.0) -> None:
        self.prepare()
        cmd = [sys.executable, "-m", "rwfs.cli", "mount", "--foreground", str(self.workspace)]
        cmd += [a for o in self.options for a in ("-o", o)]
        with open(self.logfile, "ab") as logf:
            self.proc = subprocess.Popen(
                cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, cwd="/"
            )
        deadline = time.monotonic() + timeout
        while not rwfs_mounted(str(self.workspace)):
            if self.proc.poll() is not None:
                raise BenchError(f"rwfs daemon exited {self.proc.returncode}: {self.log_text()}")
            if time.monotonic() > deadline:
                raise BenchError(f"rwfs did not mount within {timeout}s: {self.log_text()}")
            time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 900.0) -> None:
        """Unmount; fall back to a lazy unmount and SIGKILL of our own daemon."""
        point = str(self.workspace)
        try:
            if rwfs_mounted(point):
                res = subprocess.run(["fusermount3", "-u", point], capture_output=True)
                if res.returncode != 0:
                    log(f"fusermount3 -u failed ({res.stderr.decode().strip()}); trying -u -z")
                    time.sleep(0.5)
                    subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
            if self.proc is not None:
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log(f"daemon {self.proc.pid} did not exit after unmount; killing it")
                    self.proc.send_signal(signal.SIGKILL)
                    self.proc.wait(30)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(30)
            self.proc = None
            if rwfs_mounted(point):
                subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)

    def log_text(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""


def _proc_counters(pid: int) -> tuple[int, int]:
    """(CPU ticks, bytes written by syscalls) of a whole process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    wchar = 0
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                wchar = int(line.split()[1])
    return ticks, wchar


def wait_idle(pid: int | None, timeout: float = 600.0) -> None:
    """Wait until the daemon has finished its background work (group commits)."""
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    prev = _proc_counters(pid)
    quiet = 0
    while quiet < 2:
        time.sleep(0.3)
        cur = _proc_counters(pid)
        if cur[1] == prev[1] and cur[0] - prev[0] <= 2:
            quiet += 1
        else:
            quiet = 0
        prev = cur
        if time.monotonic() > deadline:
            log(f"daemon {pid} still busy after {timeout}s; measuring anyway")
            return


@dataclass
class Target:
    """A target: the workload's time over ``base``'s (native or bindfs, same run) must be
    at most ``limit`` in these modes, or under it when ``below`` (stays ahead of it)."""

    limit: float
    modes: tuple[str, ...] = ("group", "strict")
    base: str = "native"
    below: bool = False

    def met(self, r: float) -> bool:
        return r < self.limit if self.below else r <= self.limit

    def text(self) -> str:
        which = "both" if set(self.modes) == {"group", "strict"} else "/".join(self.modes)
        return f"{'<' if self.below else '≤'}{self.limit:g}× {self.base} ({which})"


# Issue 18's targets are ratios to bindfs, the C passthrough measured in the same run.
def vs_bindfs(limit: float, *modes: str) -> Target:
    return Target(limit, modes or ("group", "strict"), base="bindfs")


WRITE_TARGET = (vs_bindfs(1.0, "group"),)
READ_TARGET = (Target(1.0, base="bindfs", below=True),)
PASS_TARGET = (vs_bindfs(1.0, "group"),)  # issue 31: a passthrough path's rows


@dataclass
class Env:
    """What one measurement sees: its directory and, on rwfs, the daemon's pid."""

    dir: Path
    mode: str
    pid: int | None
    args: argparse.Namespace
    tarball: Path

    def settle(self) -> None:
        """Untimed: let the daemon finish background commits, then flush dirty pages."""
        wait_idle(self.pid)
        os.sync()
        wait_idle(self.pid)


# A measure function gets an Env and returns {metric name: seconds}.
MeasureFn = Callable[[Env], dict[str, float]]


@dataclass
class Workload:
    name: str
    metrics: list[tuple[str, str, tuple[Target, ...]]]  # (key, label, targets)
    fn: MeasureFn
    note: str = ""
    # Make no tree: the other cells' directories are removed before it runs. What such a
    # workload depends on is free memory, which the kept trees' page cache takes, not
    # the inodes freed lately, which only slow creates.
    no_tree: bool = False


@dataclass
class Results:
    # times[metric][mode] = list of seconds
    times: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, metric: str, mode: str, secs: float) -> None:
        self.times.setdefault(metric, {}).setdefault(mode, []).append(secs)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(
    cmd: list[str] | str,
    cwd: Path | None = None,
    ok: tuple[int, ...] = (0,),
    env: dict[str, str] | None = None,
) -> None:
    """Run a command, output discarded through a pipe (never /dev/null: grep would stop early)."""
    res = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True, env=env)
    if res.returncode not in ok:
        said = (res.stderr or res.stdout).decode(errors="replace")[-2000:]  # (pytest: stdout)
        raise BenchError(f"{cmd!r} exited {res.returncode}: {said}")


# ---------------------------------------------------------------------------------------
# The source tree


def stdlib_dir() -> Path:
    out = subprocess.run(
        ["python3", "-c", 'import sysconfig; print(sysconfig.get_paths()["stdlib"])'],
        capture_output=True,
        text=True,
    )
    if out.returncode == 0 and out.stdout.strip():
        return Path(out.stdout.strip())
    return Path(sysconfig.get_paths()["stdlib"])


def make_tarball(dest: Path) -> tuple[int, int, int, Path]:
    """Tar the stdlib (no site-packages, no __pycache__), repeated until >= 3,000 files.

    Returns (files, bytes, copies, stdlib path).
    """
    src = stdlib_dir()
    excluded = {"site-packages", "dist-packages", "__pycache__"}
    members: list[tuple[Path, str]] = []
    nfiles = nbytes = 0
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in excluded)
        rel = Path(root).relative_to(src)
        members.append((Path(root), str(rel)))
        for name in sorted(files):
            p = Path(root) / name
            members.append((p, str(rel / name)))
            if not p.is_symlink():
                nfiles += 1
                nbytes += p.stat().st_size
    if nfiles == 0:
        raise BenchError(f"no files found in {src}")
    copies = -(-MIN_TREE_FILES // nfiles)
    with tarfile.open(dest, "w") as tar:
        for i in range(copies):
            top = f"stdlib{i + 1}"
            for path, rel in members:
                arc = top if rel == "." else f"{top}/{rel}"
                tar.add(path, arcname=arc, recursive=False)
    return nfiles * copies, nbytes * copies, copies, src


# ---------------------------------------------------------------------------------------
# Workloads


def w_extract(env: Env) -> dict[str, float]:
    target = env.dir / "tree"
    target.mkdir()
    env.settle()
    return {"extract": timed(lambda: run(["tar", "-xf", str(env.tarball), "-C", str(target)]))}


def w_extract_pt(env: Env) -> dict[str, float]:
    """The tarball extracted under a passthrough path: no journaling, only the stack."""
    target = env.dir / PASSTHROUGH_DIR / "tree"
    target.mkdir(parents=True)
    env.settle()
    return {"extract_pt": timed(lambda: run(["tar", "-xf", str(env.tarball), "-C", str(target)]))}


def w_tree_pt(env: Env) -> dict[str, float]:
    """TREE_FILES small files in nested directories under a passthrough path (an
    install's shape: 10 packages of 10 directories of 100 files), then ``rm -rf``."""
    top = env.dir / PASSTHROUGH_DIR
    rng = random.Random(99)
    payloads = [rng.randbytes(rng.randint(200, 6000)) for _ in range(TREE_FILES)]
    top.mkdir()
    env.settle()

    def make() -> None:
        for i, data in enumerate(payloads):
            d = top / f"pkg{i // 1000}" / f"lib{i // 100 % 10}"
            if i % 100 == 0:
                d.mkdir(parents=True)
            (d / f"m{i}.js").write_bytes(data)

    t_make = timed(make)
    env.settle()
    t_rm = timed(lambda: run(["rm", "-rf", str(top)]))
    return {"tree_pt": t_make, "tree_pt_rm": t_rm}


def _extracted(env: Env) -> Path:
    target = env.dir / "tree"
    target.mkdir()
    run(["tar", "-xf", str(env.tarball), "-C", str(target)])
    return target


def warm(step: Callable[[], object]) -> None:
    """Run a read workload twice untimed, so that its timed run finds every cache steady:
    through FUSE, the first listing or read of a file makes the kernel mark its atime stale,
    and the run after it refreshes each one's attributes once (docs/performance.md)."""
    step()
    step()


def w_find(env: Env) -> dict[str, float]:
    tree = _extracted(env)
    env.settle()
    cmd = f"find {tree} -printf '%s %m\\n'"
    warm(lambda: run(cmd))
    return {"find": timed(lambda: run(cmd))}


def w_grep(env: Env) -> dict[str, float]:
    tree = _extracted(env)
    env.settle()
    cmd = ["grep", "-r", GREP_WORD, str(tree)]
    warm(lambda: run(cmd, ok=(0, 1)))
    return {"grep": timed(lambda: run(cmd, ok=(0, 1)))}


def w_git(env: Env) -> dict[str, float]:
    tree = _extracted(env)
    run([*GIT, "init", "-q"], cwd=tree)
    env.settle()
    git = " ".join(f"'{a}'" for a in GIT)
    t_commit = timed(lambda: run(f"{git} add -A && {git} commit -q -m bench", cwd=tree))
    env.settle()
    warm(lambda: run([*GIT, "status"], cwd=tree))
    t_status = timed(lambda: run([*GIT, "status"], cwd=tree))
    env.settle()
    # Packs every loose object the commit wrote and removes them: .git/ alone.
    t_gc = timed(lambda: run([*GIT, "gc", "-q"], cwd=tree))
    return {"git_commit": t_commit, "git_status": t_status, "git_gc": t_gc}


# A real project's tests, run where an agent runs them: rwfs's own in-process suites (no
# mount), copied with the sources they import. pytest writes its __pycache__/ beside them.
PYTEST_FILES = ("test_parsers.py", "test_decision.py", "test_imports.py")


def w_pytest(env: Env) -> dict[str, float]:
    root = SCRIPTS.parent
    proj = env.dir / "project"
    shutil.copytree(root / "src", proj / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "tests").mkdir()
    names = [n for n in PYTEST_FILES if (root / "tests" / n).exists()]
    for n in ("conftest.py", "gate_corpus.py", *names):
        if (root / "tests" / n).exists():
            shutil.copy2(root / "tests" / n, proj / "tests" / n)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    run_env = {**os.environ, "PYTHONPATH": str(proj / "src")}
    env.settle()
    t = timed(lambda: run([*cmd, *(f"tests/{n}" for n in names)], cwd=proj, env=run_env))
    return {"pytest": t}


def _small_files(env: Env, fsync: bool) -> float:
    rng = random.Random(1234)
    n = env.args.small_files
    base = env.dir / "small"
    dirs = [base / f"d{i:02d}" for i in range(20)]
    for d in dirs:
        d.mkdir(parents=True)
    payloads = [rng.randbytes(rng.randint(1024, 4096)) for _ in range(n)]
    env.settle()
    t0 = time.perf_counter()
    for i, data in enumerate(payloads):
        fd = os.open(dirs[i % 20] / f"f{i:05d}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def w_small(env: Env) -> dict[str, float]:
    return {"small": _small_files(env, fsync=False)}


def w_small_fsync(env: Env) -> dict[str, float]:
    return {"small_fsync": _small_files(env, fsync=True)}


def rewrite_all(path: Path, versions: list[bytes]) -> float:
    """Rewrite ``path`` with each of ``versions`` in turn (O_TRUNC, write, close): seconds."""
    t0 = time.perf_counter()
    for data in versions:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def _module_text(i: int) -> bytes:
    """Version ``i`` of a ``REWRITE_LINES``-line Python module: each changes one line."""
    values = [k + 1000 * ((i - 1 - k) // (REWRITE_LINES - 1) + 1) if k < i else k
              for k in range(REWRITE_LINES - 1)]  # fmt: skip
    body = "".join(f"VALUE_{k:03d} = {v}\n" for k, v in enumerate(values))
    return ('"""Rewritten by the rwfs bench."""\n' + body).encode()


def w_rewrite(env: Env) -> dict[str, float]:
    """One process rewrites one 100-line Python file in full, each time one line changed:
    an editor's or an agent's save loop. A .py file outside the passthrough globs, so rwfs
    journals (and gates) every version; it stays valid, so no gate refuses one."""
    path = env.dir / "rewrite" / "module.py"
    path.parent.mkdir()
    path.write_bytes(_module_text(0))
    versions = [_module_text(i) for i in range(1, env.args.rewrites + 1)]
    env.settle()
    t = rewrite_all(path, versions)
    if path.read_bytes() != versions[-1]:
        raise BenchError(f"{path} does not hold its last version")
    return {"rewrite": t}


def save_all(path: Path, versions: list[bytes]) -> float:
    """Save ``path`` with each of ``versions`` in turn the way ``sed -i``, editors and
    ``os.replace`` do (write a new temporary file beside it, close, rename it over
    ``path``): seconds."""
    t0 = time.perf_counter()
    for i, data in enumerate(versions):
        tmp = path.with_name(f".{path.name}.{i}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    return time.perf_counter() - t0


def w_save(env: Env) -> dict[str, float]:
    """``w_rewrite``'s file and versions, each saved by a temporary file and a rename."""
    path = env.dir / "save" / "module.py"
    path.parent.mkdir()
    versions = [_module_text(i) for i in range(env.args.rewrites + 1)]
    path.write_bytes(versions[0])
    env.settle()
    t = save_all(path, versions[1:])
    if path.read_bytes() != versions[-1] or len(os.listdir(path.parent)) != 1:
        raise BenchError(f"{path} does not hold its last version, or a temporary is left")
    return {"save": t}


# Errors a metadata process expects: another process removed or renamed a name in the
# shared directory first, or made the directory it wanted to make.
META_RACES = (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY)


def _meta_text(rng: random.Random) -> bytes:
    # Fewer than 10 lines: below the truncation and elision gates' min_lines, so no
    # rewrite or cut of a random file is judged (refused) as a broken one.
    return "".join(f"{rng.randrange(10**6)} line {k}\n" for k in range(rng.randint(1, 9))).encode()


def _meta_worker(top: Path, i: int, seed: int, nops: int) -> dict[str, int]:
    """fsstress-like: ``nops`` metadata operations in ``top``/p<i> and ``top``/shared.

    The model of which names exist is updated whatever each operation returns, so the
    sequence of operations depends on the seed only; races in the shared directory only
    make some of them fail (META_RACES)."""
    rng = random.Random(seed + i)
    own = top / f"p{i}"
    shared = top / "shared"
    dirs = [own]  # this process's directories, own first
    files: list[Path] = []  # names this process made, in own dirs or shared
    held: dict[Path, int] = {own: 0}  # own dir -> names in it (files and dirs), by the model
    counter = 0
    errors = 0

    def fresh(d: Path) -> Path:
        nonlocal counter
        counter += 1
        if d in held:
            held[d] += 1
        return d / (f"s{i}_{counter}.txt" if d == shared else f"f{counter}.txt")

    def gone(path: Path) -> None:
        if path.parent in held:
            held[path.parent] -= 1

    def any_dir() -> Path:
        return shared if rng.random() < 0.2 else rng.choice(dirs)

    def pick() -> int:
        return rng.randrange(len(files))

    ops = (
        ("create", 25),
        ("rename", 8),
        ("rename_across", 8),
        ("link", 7),
        ("unlink", 14),
        ("truncate", 7),
        ("mkdir", 5),
        ("rmdir", 4),
        ("chmod", 8),
        ("fsync", 6),
        ("race", 8),
    )
    names = [n for n, _ in ops]
    weights = [w for _, w in ops]
    for _ in range(nops):
        op = rng.choices(names, weights)[0]
        if not files and op not in ("mkdir", "rmdir", "race"):
            op = "create"
        try:
            if op == "create":
                path = fresh(any_dir())
                files.append(path)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, _meta_text(rng))
                finally:
                    os.close(fd)
            elif op in ("rename", "rename_across"):
                k = pick()
                old = files[k]
                if op == "rename":
                    dest = old.parent
                else:
                    dest = rng.choice([d for d in [*dirs, shared] if d != old.parent])
                files[k] = fresh(dest)
                gone(old)
                os.rename(old, files[k])
            elif op == "link":
                src = files[pick()]
                files.append(fresh(any_dir()))
                os.link(src, files[-1])
            elif op == "unlink":
                k = pick()
                path, files[k] = files[k], files[-1]
                files.pop()
                gone(path)
                os.unlink(path)
            elif op == "truncate":
                os.truncate(files[pick()], rng.randint(0, 64))
            elif op == "mkdir":
                parent = rng.choice(dirs)
                dirs.append(parent / f"d{counter}")
                counter += 1
                held[parent] += 1
                held[dirs[-1]] = 0
                os.mkdir(dirs[-1])
            elif op == "rmdir":
                empty = [d for d in dirs[1:] if not held[d]]
                if empty:
                    d = rng.choice(empty)
                    dirs.remove(d)
                    del held[d]
                    gone(d)
                    os.rmdir(d)
            elif op == "chmod":
                os.chmod(files[pick()], rng.choice((0o644, 0o600, 0o664, 0o640)))
            elif op == "fsync":
                path, data = files[pick()], _meta_text(rng)
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:  # race: another process's name in the shared directory, if it is there
                j = rng.choice([p for p in range(META_PROCS) if p != i])
                other = shared / f"s{j}_{rng.randrange(1, counter + 2)}.txt"
                kind = rng.randrange(4)
                if kind == 0:
                    os.unlink(other)
                elif kind == 1:
                    os.rename(other, fresh(shared))
                elif kind == 2:
                    os.link(other, fresh(own))
                else:
                    sub = shared / f"x{rng.randrange(8)}"
                    if rng.random() < 0.5:
                        os.mkdir(sub)
                    else:
                        os.rmdir(sub)
        except OSError as exc:
            if exc.errno not in META_RACES:
                raise
            errors += 1
    return {"ops": nops, "errors": errors}


def w_meta(env: Env) -> dict[str, float]:
    """META_PROCS forked processes, each with its own seed, run their operations at once;
    the time is the wall time until the last one ends."""
    top = env.dir / "meta"
    (top / "shared").mkdir(parents=True)
    for i in range(META_PROCS):
        (top / f"p{i}").mkdir()
    go_r, go_w = os.pipe()
    kids: list[tuple[int, int]] = []  # (pid, read end of its result pipe)
    statuses: list[int] = []
    try:
        for i in range(META_PROCS):
            res_r, res_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child never returns into the bench (its finally clauses)
                code = 1
                try:
                    os.close(go_w)
                    os.close(res_r)
                    for _, r in kids:
                        os.close(r)
                    if os.read(go_r, 1):
                        out = _meta_worker(top, i, env.args.meta_seed, env.args.meta_ops)
                        os.write(res_w, json.dumps(out).encode())
                        code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(code)
            os.close(res_w)
            kids.append((pid, res_r))
        os.close(go_r)
        env.settle()
        t0 = time.perf_counter()
        os.write(go_w, b"g" * META_PROCS)
        statuses = [os.waitpid(pid, 0)[1] for pid, _ in kids]
        t = time.perf_counter() - t0
    finally:
        os.close(go_w)  # children still waiting for it read EOF and exit
        if len(statuses) < len(kids):  # interrupted: end the children not yet reaped
            for pid, _ in kids[len(statuses) :]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            for _, r in kids:
                os.close(r)
    results = []
    for (_, r), status in zip(kids, statuses, strict=True):
        data = os.read(r, 4096)
        os.close(r)
        if os.waitstatus_to_exitcode(status) != 0 or not data:
            raise BenchError(f"a metadata process failed (status {status}); see its traceback")
        results.append(json.loads(data))
    errors = sum(r["errors"] for r in results)
    log(f"meta {env.mode}: {sum(r['ops'] for r in results)} operations, {errors} raced")
    return {"meta": t}


FSSTRESS_OPS = 2000
FSSTRESS_PROCS = 4
FSSTRESS_HOW = (
    "build xfstests' ltp/ (make configure && ./configure && make -C lib && make -C ltp"
    " fsstress) and set FSSTRESS=path/to/ltp/fsstress"
)


def fsstress_exe() -> str | None:
    """xfstests' fsstress: $FSSTRESS, else one on PATH."""
    given = os.environ.get("FSSTRESS")
    return shutil.which(given) if given else shutil.which("fsstress")


def daemon_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def w_fsstress(env: Env) -> dict[str, float]:
    """xfstests' fsstress, FSSTRESS_PROCS processes of FSSTRESS_OPS operations each with
    seed 1, in a directory rwfs journals (no passthrough glob matches fsstress's names).
    A nonzero exit fails the cell, and so does a daemon or a mount that did not last."""
    exe = fsstress_exe()
    if exe is None:
        raise BenchError(f"no fsstress: {FSSTRESS_HOW}")
    top = env.dir / "fsstress"
    top.mkdir()
    cmd = [exe, "-d", str(top), "-n", str(FSSTRESS_OPS), "-p", str(FSSTRESS_PROCS), "-s", "1"]
    env.settle()
    t = timed(lambda: run(cmd))
    if env.pid is not None and not (daemon_alive(env.pid) and rwfs_mounted(str(env.dir))):
        raise BenchError(f"the {env.mode} daemon did not survive fsstress")
    if env.mode != "native" and not os.path.ismount(env.dir):
        raise BenchError(f"the {env.mode} mount did not survive fsstress")
    return {"fsstress": t}


# git with the default configuration whatever this machine's (no system or global file).
GIT_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
_checkout_src: dict[tuple[Path, int], tuple[Path, str]] = {}


def checkout_source(root: Path, nfiles: int) -> tuple[Path, str]:
    """A git repository (made once a run, natively, under ``root``) of ``nfiles`` files of
    the stdlib, with a branch ``b`` that changes 30% of its .py files, removes 5% of its
    files and adds as many. Returns the repository and a description of b."""
    key = (root, nfiles)
    if key in _checkout_src:
        return _checkout_src[key]
    src = stdlib_dir()
    excluded = {"site-packages", "dist-packages", "__pycache__"}
    every: list[Path] = []
    for top, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in excluded)
        every += [Path(top, n) for n in sorted(names) if not Path(top, n).is_symlink()]
    step = max(1, len(every) // nfiles)
    chosen = every[::step][:nfiles]
    repo = root / f"checkout-src-{nfiles}"
    for f in chosen:
        dest = repo / f.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    rels = [f.relative_to(src) for f in chosen]

    def git(*a: str) -> None:
        run([*GIT, *a], cwd=repo, env=GIT_ENV)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "main")
    git("checkout", "-q", "-b", "b")
    rng = random.Random(18)
    py = [r for r in rels if r.suffix == ".py"]
    changed = rng.sample(py, len(py) * 3 // 10)
    for r in changed:  # one line more: an edit every gate passes
        with open(repo / r, "a") as f:
            f.write(f"# branch b: {rng.randrange(10**6)}\n")
    changed_set = set(changed)
    rest = [r for r in rels if r not in changed_set]
    removed = rng.sample(rest, len(rels) // 20)
    for r in removed:
        (repo / r).unlink()
    added = rng.sample(py, len(rels) // 20)
    for k, r in enumerate(added):
        shutil.copyfile(repo / r if (repo / r).exists() else src / r, repo / r.parent / f"b_{k}.py")
    git("add", "-A")
    git("commit", "-q", "-m", "b")
    git("checkout", "-q", "main")
    git("repack", "-a", "-d", "-q")
    desc = f"{len(changed)} changed, {len(removed)} removed, {len(added)} added"
    log(f"checkout repository: {len(chosen)} files from {src}; branch b: {desc}")
    _checkout_src[key] = (repo, desc)
    return repo, desc


def w_checkout(env: Env) -> dict[str, float]:
    """``git checkout b`` then back to main in a clone (made untimed, through the mount).
    On rwfs .git/ is passthrough (written in place); the work-tree files are journaled."""
    src, _ = checkout_source(env.tarball.parent, env.args.checkout_files)
    tree = env.dir / "repo"
    run([*GIT, "clone", "-q", "--no-hardlinks", str(src), str(tree)], env=GIT_ENV)
    env.settle()
    # Untimed: a status first, so that the index is refreshed and written after the
    # clone's racily-clean second and neither checkout re-reads files to compare them.
    time.sleep(1.1)
    run([*GIT, "status", "-s"], cwd=tree, env=GIT_ENV)
    t0 = time.perf_counter()
    run([*GIT, "checkout", "-q", "b"], cwd=tree, env=GIT_ENV)
    run([*GIT, "checkout", "-q", "main"], cwd=tree, env=GIT_ENV)
    return {"checkout": time.perf_counter() - t0}


def w_bigfile(env: Env) -> dict[str, float]:
    size_mb = env.args.size_mb
    block = os.urandom(1 << 20)
    path = env.dir / "big.bin"
    env.settle()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size_mb):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    t_write = time.perf_counter() - t0
    env.settle()

    buf = bytearray(1 << 20)

    def read_all() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            total = 0
            while n := os.readv(fd, [buf]):
                total += n
        finally:
            os.close(fd)
        if total != size_mb << 20:
            raise BenchError(f"read back {total} bytes, wrote {size_mb << 20}")

    # The first read after the write is the one an agent does (its bytes are in the page
    # cache on both sides); a second read shows the steady cache.
    t_read = timed(read_all)
    t_reread = timed(read_all)
    # Removed now, not with the other cells' trees at the end: kept, the large files fill
    # the page cache, and the next cell's writes wait for memory to be reclaimed (a native
    # 1 GiB write took 2.9 s instead of 0.6). One inode freed costs the allocator nothing.
    path.unlink()
    return {"big_write": t_write, "big_read": t_read, "big_reread": t_reread}


def _getxattr_loop(path: Path) -> float:
    """FLOOR_CALLS getxattr calls of an attribute ``path`` lacks: one FUSE request each
    (after a first, untimed loop has cached the entry)."""

    def loop() -> None:
        for _ in range(FLOOR_CALLS):
            try:
                os.getxattr(path, "user.rwfs-bench-missing")
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise

    loop()
    return timed(loop)


def build_c(build: Path, source: Path) -> Path | None:
    """``source`` compiled against libfuse 3 (``cc -O2``) into ``build``, once: the
    executable, or None (and a log line) when it does not build."""
    exe = build / source.stem
    if exe.exists():
        return exe
    if not shutil.which("cc"):
        log(f"{source.name} did not build: no C compiler (cc)")
        return None
    try:
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True
        )
    except FileNotFoundError:
        log(f"{source.name} did not build: no pkg-config")
        return None
    res = subprocess.run(
        ["cc", "-O2", "-o", str(exe), str(source), *shlex.split(flags.stdout)],
        capture_output=True,
        text=True,
    )
    if flags.returncode != 0 or res.returncode != 0:
        log(f"{source.name} did not build: {flags.stderr.strip()} {res.stderr.strip()[-500:]}")
        return None
    return exe


def passthrough_hp() -> str | None:
    """A passthrough_hp binary: $RWFS_BENCH_PASSTHROUGH_HP, else one on PATH."""
    given = os.environ.get("RWFS_BENCH_PASSTHROUGH_HP")
    return shutil.which(given) if given else shutil.which("passthrough_hp")


# Per run (its build directory): a libfuse mode's server, None where it cannot run.
_libfuse: dict[tuple[str, Path], str | None] = {}


def libfuse_server(mode: str, build: Path) -> str | None:
    """The server of a libfuse mode, built once a run into ``build`` for libfuse_ll; None
    (logged once) where the examples, a compiler or the binary are missing."""
    key = (mode, build)
    if key in _libfuse:
        return _libfuse[key]
    exe: str | None = None
    if mode == "libfuse_hp":
        exe = passthrough_hp()
        if exe is None:
            log("libfuse_hp skipped: no passthrough_hp (set RWFS_BENCH_PASSTHROUGH_HP)")
    else:
        names = ("passthrough_ll.c", "passthrough_helpers.h")
        src = build / "libfuse"
        src.mkdir(exist_ok=True)
        for name in names:  # copied beside each other (or unpacked where they are .gz)
            plain, packed = LIBFUSE_EXAMPLES / name, LIBFUSE_EXAMPLES / f"{name}.gz"
            if plain.exists():
                shutil.copyfile(plain, src / name)
            elif packed.exists():
                with gzip.open(packed) as f:
                    (src / name).write_bytes(f.read())
        if all((src / n).exists() for n in names):
            built = build_c(build, src / names[0])
            exe = None if built is None else str(built)
            if exe is None:
                log("libfuse_ll skipped: passthrough_ll.c did not build")
        else:
            log(f"libfuse_ll skipped: no passthrough_ll.c in {LIBFUSE_EXAMPLES} (libfuse3-dev)")
    _libfuse[key] = exe
    return exe


def c_floor(build: Path) -> float | None:
    """The same loop against a minimal C libfuse server (scripts/fuse_floor.c) that
    answers each request with nothing else: the round trip any FUSE filesystem pays here.
    None (and a log line) when it cannot be built or mounted."""
    exe = build_c(build, SCRIPTS / "fuse_floor.c")
    if exe is None:
        return None
    point = Path(tempfile.mkdtemp(prefix="rwfs-bench-floor-", dir="/tmp"))
    try:
        with fuse_process([str(exe), str(point)], point):
            return _getxattr_loop(point / "f")
    except BenchError as exc:
        log(str(exc))
        return None
    finally:
        point.rmdir()


@contextmanager
def fuse_process(cmd: list[str], point: Path, timeout: float = 30.0) -> Iterator[None]:
    """Run a FUSE server in the foreground until ``point`` is mounted; always unmount it
    (lazily if need be) and end the process this started."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while not os.path.ismount(point):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{cmd[0]} did not mount {point}")
            time.sleep(0.02)
        yield
    finally:
        if in_mounts(point):  # (a server that died leaves its mount, which stat calls lost)
            if subprocess.run(["fusermount3", "-u", str(point)], capture_output=True).returncode:
                subprocess.run(["fusermount3", "-u", "-z", str(point)], capture_output=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def w_floor(env: Env) -> dict[str, float]:
    f = env.dir / "f"
    f.write_bytes(b"")
    env.settle()
    out = {"floor": _getxattr_loop(f)}
    if env.mode == "native":
        c = c_floor(env.tarball.parent)
        if c is not None:
            out["floor_c"] = c
    return out


def workloads(args: argparse.Namespace, tree_desc: str) -> list[Workload]:
    mb = args.size_mb
    size = f"{mb // 1024} GiB" if mb % 1024 == 0 else f"{mb} MiB"
    return [
        Workload(
            "floor",
            [("floor", f"getxattr x{FLOOR_CALLS:,} (one request each)", ())],
            w_floor,
        ),
        Workload("extract", [("extract", f"tar -xf ({tree_desc})", WRITE_TARGET)], w_extract),
        Workload(
            "extract_pt",
            [("extract_pt", f"tar -xf into {PASSTHROUGH_DIR}/ ({tree_desc})", PASS_TARGET)],
            w_extract_pt,
        ),
        Workload(
            "tree_pt",
            [
                ("tree_pt", f"{TREE_FILES:,} files, nested, in {PASSTHROUGH_DIR}/", PASS_TARGET),
                ("tree_pt_rm", f"rm -rf of those {TREE_FILES:,} files", PASS_TARGET),
            ],
            w_tree_pt,
        ),
        Workload("find", [("find", "find -printf '%s %m' (stat, warm)", READ_TARGET)], w_find),
        Workload("grep", [("grep", f"grep -r {GREP_WORD} (warm)", READ_TARGET)], w_grep),
        Workload(
            "git",
            [
                ("git_commit", "git add -A && git commit", WRITE_TARGET),
                ("git_status", "git status (warm)", READ_TARGET),
                ("git_gc", "git gc (.git/ passthrough)", PASS_TARGET),
            ],
            w_git,
        ),
        Workload(
            "pytest",
            [("pytest", "pytest of rwfs's own core tests (sources journaled)", WRITE_TARGET)],
            w_pytest,
            no_tree=True,
        ),
        Workload(
            "checkout",
            [
                (
                    "checkout",
                    f"git checkout b, then main ({args.checkout_files} files)",
                    WRITE_TARGET,
                )
            ],
            w_checkout,
        ),
        Workload(
            "small",
            [("small", f"{args.small_files} files 1-4 KiB, write+close", WRITE_TARGET)],
            w_small,
        ),
        Workload(
            "small_fsync",
            [
                (
                    "small_fsync",
                    f"{args.small_files} files 1-4 KiB, write+fsync+close",
                    (*WRITE_TARGET, vs_bindfs(1.5, "strict")),
                )
            ],
            w_small_fsync,
        ),
        Workload(
            "rewrite",
            [
                (
                    "rewrite",
                    f"rewrite one {REWRITE_LINES}-line .py x{args.rewrites}",
                    WRITE_TARGET,
                )
            ],
            w_rewrite,
        ),
        Workload(
            "save",
            [
                (
                    "save",
                    f"save one {REWRITE_LINES}-line .py by temp+rename x{args.rewrites}",
                    WRITE_TARGET,
                )
            ],
            w_save,
        ),
        Workload(
            "meta",
            [
                (
                    "meta",
                    f"metadata mix, {META_PROCS} procs x{args.meta_ops} ops",
                    WRITE_TARGET,
                )
            ],
            w_meta,
        ),
        Workload(
            "fsstress",
            [
                (
                    "fsstress",
                    f"fsstress -n {FSSTRESS_OPS} -p {FSSTRESS_PROCS} -s 1 (xfstests)",
                    (Target(20.0, ("group",)),),  # issue 31
                )
            ],
            w_fsstress,
        ),
        Workload(
            "big",
            [
                # No bindfs target for the large write; the one to native stays.
                ("big_write", f"{size} seq write, 1 MiB blocks, final fsync", (Target(2.5),)),
                (
                    "big_read",
                    f"{size} seq read back, 1 MiB blocks",
                    (*READ_TARGET, Target(1.2)),
                ),
                ("big_reread", f"{size} seq read again", READ_TARGET),
            ],
            w_bigfile,
            no_tree=True,
        ),
    ]


# ---------------------------------------------------------------------------------------
# Driver


# Cells' directories are removed at the end of the run, or before a workload that makes no
# tree (Workload.no_tree), not between cells. On ext4 without a journal (this machine's) the
# inode allocator skips every inode freed in the last minutes, reading each one's inode to
# find out, so removing a tree between cells slowed the creates of whichever cell came
# next, native or not, by up to ten times (forty for small files).
_leftovers: list[Path] = []


def remove_leftovers() -> None:
    while _leftovers:
        d = _leftovers.pop()
        if os.path.ismount(d):
            log(f"WARNING: {d} is still mounted; not removing it")
        else:
            shutil.rmtree(d, ignore_errors=True)


# The modes that mount a passthrough server (no journaling) over another directory.
PASSTHROUGH_MODES = ("bindfs", *LIBFUSE_MODES, "pyfuse3")


def server_cmd(mode: str, backing: Path, point: Path, build: Path) -> list[str]:
    """The command that serves ``backing`` at ``point`` in the foreground, in one of the
    PASSTHROUGH_MODES; a libfuse mode's server is built into ``build`` (once a run)."""
    if mode == "bindfs":  # a C passthrough: the FUSE baseline
        return ["bindfs", "-f", str(backing), str(point)]
    if mode in LIBFUSE_MODES:  # libfuse's C passthrough examples
        exe = libfuse_server(mode, build)
        if exe is None:
            raise BenchError(f"{mode} is not available")  # main() skips it before
        if mode == "libfuse_ll":
            return [exe, "-f", "-o", f"source={backing},{LIBFUSE_LL_OPTIONS}", str(point)]
        return [exe, "--foreground", str(backing), str(point)]
    if mode == "pyfuse3":  # rwfs's stack: the floor of this design
        return [sys.executable, str(SCRIPTS / "pyfuse3_passthrough.py"), str(backing), str(point)]
    raise ValueError(f"not a passthrough mode: {mode}")


@contextmanager
def measurement_dir(mode: str, logdir: Path, tag: str) -> Iterator[tuple[Path, int | None]]:
    """A fresh directory under /tmp; for rwfs modes, mounted over itself and unmounted
    after; for bindfs, libfuse's passthroughs and pyfuse3, a mount of another. Removed by ``remove_leftovers`` at the
    end of the run."""
    d = Path(tempfile.mkdtemp(prefix=f"rwfs-bench-{tag}-{mode}-", dir="/tmp"))
    mount: Mount | None = None
    try:
        if mode == "native":
            yield d, None
        elif mode in PASSTHROUGH_MODES:
            backing = Path(f"{d}-backing")
            backing.mkdir()
            _leftovers.append(backing)
            with fuse_process(server_cmd(mode, backing, d, logdir), d):
                yield d, None
        else:
            durability, options = RWFS_MOUNTS[mode]
            mount = Mount(d, durability, logdir / f"{d.name}.log", options)
            try:
                mount.start()
                yield d, mount.pid
            finally:
                mount.stop()
                text = mount.log_text()
                if "Traceback" in text:
                    log(f"WARNING: the {mode} daemon logged a traceback ({mount.logfile}):")
                    print(text[-3000:], file=sys.stderr)
    finally:
        _leftovers.append(d)


def ratio(t: float | None, base: float | None) -> float | None:
    if t is None or base is None or base <= 0:
        return None
    return t / base


def fmt_secs(t: float | None) -> str:
    if t is None:
        return "—"
    return f"{t:.3f}s" if t < 100 else f"{t:.1f}s"


def fmt_ratio(r: float | None, targets: tuple[Target, ...], mode: str, base: str) -> str:
    """The ratio, marked ok or MISS against the targets for this mode and base."""
    if r is None:
        return "—"
    mine = [t for t in targets if mode in t.modes and t.base == base]
    mark = ""
    if mine:
        mark = " ok" if all(t.met(r) for t in mine) else " MISS"
    return f"{r:.2f}×{mark}"


# The rwfs modes whose ratios to bindfs and to the pyfuse3 passthrough the table and the
# JSON give; the passthroughs (libfuse's and pyfuse3) give theirs to bindfs only.
RWFS_MODES = ("group", "strict", "group_nofast")
BINDFS_RATIOS = (*LIBFUSE_MODES, "pyfuse3", *RWFS_MODES)


def render_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = set(range(1, len(header) - 1))

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement (median; 3)")
    ap.add_argument("--size-mb", type=int, default=1024, help="large-file size in MiB (1024)")
    ap.add_argument("--small-files", type=int, default=2000, help="small-file count (2000)")
    ap.add_argument("--rewrites", type=int, default=1000, help="rewrites of one file (1000)")
    ap.add_argument(
        "--meta-ops",
        type=int,
        default=2500,
        help=f"metadata operations per process, {META_PROCS} processes (2500)",
    )
    ap.add_argument("--meta-seed", type=int, default=1, help="metadata mix seed (1; +i a process)")
    ap.add_argument(
        "--checkout-files", type=int, default=2000, help="files in the checkout repository (2000)"
    )
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated workloads: floor,extract,extract_pt,tree_pt,find,grep,git,\n"
        "pytest,checkout,small,small_fsync,rewrite,save,meta,fsstress,big (fsstress: where\n"
        "$FSSTRESS or PATH has xfstests' fsstress, else left out)",
    )
    ap.add_argument(
        "--modes",
        default=",".join(
            m
            for m in MODES
            if (m != "bindfs" or shutil.which("bindfs"))
            and (m != "libfuse_hp" or passthrough_hp())
            and m != "group_nofast"
        ),
        help=f"comma-separated of {','.join(MODES)}\n(bindfs: when installed; libfuse_ll:"
        " libfuse's passthrough_ll example, built each run, — where it cannot be;\n"
        "libfuse_hp: its passthrough_hp, where $RWFS_BENCH_PASSTHROUGH_HP or PATH has one;\n"
        "group_nofast: group with -o fastpath=off)",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    sizes = ("runs", "size_mb", "small_files", "rewrites", "meta_ops", "checkout_files")
    if any(getattr(args, s) < 1 for s in sizes):
        ap.error(
            "--runs, --size-mb, --small-files, --rewrites, --meta-ops, --checkout-files"
            " must be positive"
        )
    modes = [m for m in args.modes.split(",") if m]
    if "native" not in modes or any(m not in MODES for m in modes):
        ap.error(f"--modes must include native and only name {', '.join(MODES)}")
    if "bindfs" in modes and not shutil.which("bindfs"):
        ap.error("bindfs is not installed (scripts/bench installs it)")
    if not os.path.exists("/dev/fuse") and len(modes) > 1:
        raise SystemExit("bench: /dev/fuse is missing")

    # SIGTERM/SIGHUP unwind like Ctrl-C, so every finally unmounts.
    def _stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)

    root = Path(tempfile.mkdtemp(prefix="rwfs-bench-", dir="/tmp"))
    results = Results()
    started = time.time()
    try:
        tarball = root / "tree.tar"
        nfiles, nbytes, copies, src = make_tarball(tarball)
        tree_desc = f"{nfiles} files, {nbytes / 1e6:.0f} MB"
        log(
            f"tree: {src} (no site-packages/__pycache__) x{copies}: {tree_desc}; "
            f"tarball {tarball.stat().st_size / 1e6:.0f} MB"
        )
        run(["cat", str(tarball)])  # the tarball in the page cache for every extract
        wls = workloads(args, tree_desc)
        if args.only:
            wanted = set(args.only.split(","))
            unknown = wanted - {w.name for w in wls}
            if unknown:
                ap.error(f"unknown workloads: {', '.join(sorted(unknown))}")
            wls = [w for w in wls if w.name in wanted]
        if any(w.name == "fsstress" for w in wls) and fsstress_exe() is None:
            log(f"fsstress row skipped: no fsstress ($FSSTRESS or PATH); {FSSTRESS_HOW}")
            wls = [w for w in wls if w.name != "fsstress"]
        for wl in wls:
            if wl.no_tree:
                remove_leftovers()
                os.sync()
                time.sleep(5)  # untimed: let the removal's freeing and discards finish
            for i in range(args.runs):
                for mode in modes:
                    if mode in LIBFUSE_MODES and libfuse_server(mode, root) is None:
                        continue  # its column shows "—" (logged once)
                    with measurement_dir(mode, root, wl.name) as (d, pid):
                        env = Env(d, mode, pid, args, tarball)
                        out = wl.fn(env)
                    for k, v in out.items():
                        results.add(k, mode, v)
                    shown = ", ".join(f"{k}={v:.3f}s" for k, v in out.items())
                    log(f"{wl.name} run {i + 1}/{args.runs} {mode}: {shown}")
    finally:
        remove_leftovers()
        shutil.rmtree(root, ignore_errors=True)

    medians: dict[str, dict[str, float]] = {
        metric: {mode: statistics.median(ts) for mode, ts in per.items()}
        for metric, per in results.times.items()
    }
    if args.json:
        out_json = {
            "runs": args.runs,
            "tree": {"files": nfiles, "bytes": nbytes, "source": str(src), "copies": copies},
            "size_mb": args.size_mb,
            "small_files": args.small_files,
            "rewrites": args.rewrites,
            "meta_ops": args.meta_ops,
            "meta_procs": META_PROCS,
            "meta_seed": args.meta_seed,
            "checkout_files": args.checkout_files,
            "notes": {
                "big_write": "includes a final fsync before close",
                "big_read": "the first read after the write (settled: synced, daemon idle)",
                "big_reread": "the read after that one",
                "find/grep/git_status": "warm: run twice untimed before timing",
                "small_fsync": "native also fsyncs each file",
                "meta": f"{META_PROCS} processes at once, wall time; seeds meta_seed + i",
                "checkout": "git checkout b, then main, in a clone made untimed",
            },
            "elapsed_s": round(time.time() - started, 1),
            "floor_c": medians.get("floor_c", {}).get("native"),
            "workloads": [],
        }
        for wl in wls:
            for key, label, targets in wl.metrics:
                med = medians.get(key, {})
                ratios = {
                    base: {m: ratio(med.get(m), med.get(base)) for m in modes}
                    for base in ("native", "bindfs", "pyfuse3")
                }
                entry = {
                    "metric": key,
                    "label": label,
                    "seconds": {m: results.times.get(key, {}).get(m, []) for m in modes},
                    "median": med,
                    "ratio": ratios["native"],
                    "ratio_bindfs": {m: ratios["bindfs"][m] for m in modes if m in BINDFS_RATIOS},
                    "ratio_pyfuse3": {m: ratios["pyfuse3"][m] for m in modes if m in RWFS_MODES},
                    "targets": [
                        {
                            "base": tg.base,
                            "max_ratio": tg.limit,
                            "below": tg.below,
                            "modes": list(tg.modes),
                            "met": {
                                m: None if r is None else tg.met(r)
                                for m in tg.modes
                                for r in [ratios[tg.base].get(m)]
                            },
                        }
                        for tg in targets
                    ],
                }
                out_json["workloads"].append(entry)  # type: ignore[union-attr]
        print(json.dumps(out_json, indent=2))
        return 0

    others = [m for m in modes if m != "native"]
    header = ["workload", "native"]
    for m in others:
        header += [m, f"{m}/nat"]
    over_bindfs = [m for m in BINDFS_RATIOS if m in others] if "bindfs" in others else []
    over_py = [m for m in RWFS_MODES if m in others] if "pyfuse3" in others else []
    header += [f"{m}/bindfs" for m in over_bindfs] + [f"{m}/py" for m in over_py]
    header.append("target")
    rows: list[list[str]] = []
    for wl in wls:
        for key, label, targets in wl.metrics:
            med = medians.get(key, {})
            nat = med.get("native")
            row = [label, fmt_secs(nat)]
            for mode in others:
                r = ratio(med.get(mode), nat)
                row += [fmt_secs(med.get(mode)), fmt_ratio(r, targets, mode, "native")]
            for mode in over_bindfs:
                r = ratio(med.get(mode), med.get("bindfs"))
                row.append(fmt_ratio(r, targets, mode, "bindfs"))
            for mode in over_py:
                row.append(fmt_ratio(ratio(med.get(mode), med.get("pyfuse3")), (), mode, "py"))
            row.append(", ".join(tg.text() for tg in targets) or "—")
            rows.append(row)
    print(
        f"rwfs bench: median of {args.runs} run(s) per cell; ratio = time / native's"
        f" (m/nat) or bindfs's (m/bindfs), same run ({time.time() - started:.0f}s total)"
    )
    print(render_table(rows, header))
    print(
        "notes: find/grep/git status are warm (run twice untimed first); the large file is"
        " read back right after\n       its write (which includes a final fsync), then again;"
        " the fsync small-file row compares with\n       native fsyncing each file too; every"
        " cell used a fresh /tmp dir and mount;\n       bindfs is a C passthrough"
        " filesystem (no journaling) over another directory, the FUSE baseline;\n"
        "       pyfuse3 (m/py) a passthrough on rwfs's own stack (pyfuse3 + trio, no"
        " journaling), the floor of this design;\n"
        "       libfuse_ll (libfuse_hp) is libfuse's passthrough_ll (passthrough_hp) example,"
        " C on its low-level API;\n"
        f"       the metadata mix is the wall time of {META_PROCS} processes at once; the"
        " checkout runs in a clone made untimed;\n       targets to bindfs are marked in"
        " the m/bindfs columns, those to native in m/nat."
    )
    c = medians.get("floor_c", {}).get("native")
    rw = medians.get("floor", {}).get("group")
    py = medians.get("floor", {}).get("pyfuse3")
    if c is not None:
        print(
            f"floor: the getxattr loop against a minimal C libfuse server took {fmt_secs(c)}"
            f" ({c / FLOOR_CALLS * 1e6:.0f} µs a request), the FUSE round trip on this"
            " machine"
            + (f"; rwfs (group) took {rw / c:.2f}× that" if rw is not None else "")
            + (f", the pyfuse3 passthrough {py / c:.2f}×" if py is not None else "")
            + "."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
