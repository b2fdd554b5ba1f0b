"""The first `git status` after a remount against a warm one (docs/performance.md,
"git status after a remount"), on rwfs and on what any FUSE filesystem does here.

For each mode (scripts/bench.py's: native, bindfs, libfuse's passthrough examples, the
pyfuse3 passthrough, rwfs's group and strict mounts), a git work tree of N files
(default 10,000) is made in a fresh temporary directory; through the mount, `git add`,
`git commit` and `git status` write the index with the stat data the mount shows. Then
the tree is unmounted and mounted again, and `git status` is timed twice: the first after
the remount (the kernel's caches are cold, and git re-reads every file whose recorded stat
data no longer matches), then a warm one. Then, each first after another remount, an
`lstat` of every file by its path in the index's order (the lookups alone: what git's
index refresh asks of the mount) and `find -printf %i` (directory listings alone: find
takes %i from readdir and stats nothing). On rwfs, also a warm `git status` of the raw
tree once unmounted.

native has no mount: its "remount" is `sync` and `echo 2 > /proc/sys/vm/drop_caches`,
which empties the kernel's dentry and inode caches (root only). A FUSE remount empties
the FUSE mount's own; the backing directory's stay warm unless --drop-caches drops them
before every mount of every mode too.

The table gives each mode's median over --runs runs, the ratio of the first status to
the warm one, and the first status's ratio to bindfs's and to libfuse_ll's (same run);
"index rewritten" says whether the first status wrote the index (git found stat data that
no longer matched, and so re-read files).

    .venv/bin/python scripts/bench_git_remount.py [N] [--modes native,bindfs,...]
        [--runs R] [--drop-caches] [--timeout S]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import bench  # noqa: E402  (its modes and mount helpers)

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@example.com",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}
RWFS_MODES = tuple(bench.RWFS_MOUNTS)
DROP_CACHES = "/proc/sys/vm/drop_caches"
timeout = 3600.0  # seconds one command may take (--timeout)


def log(msg: str) -> None:
    print(f"[git-remount] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], cwd: Path | None = None) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, timeout=timeout)


def git(cwd: Path, *args: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        # (no auto gc: it would run on in the background and keep the mount busy)
        ["git", "-c", "core.untrackedCache=false", "-c", "gc.auto=0", *args],
        cwd=cwd,
        env={**ENV, "HOME": str(cwd.parent)},
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=timeout,
    )
    return time.perf_counter() - t


def drop_caches() -> None:
    """Write back, then empty the kernel's dentry and inode caches (2: not the page
    cache)."""
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("2\n")


def can_drop_caches() -> bool:
    return os.access(DROP_CACHES, os.W_OK)


def raise_nofile() -> None:
    """As many open files as the kernel allows (root may raise the hard limit), for the
    servers this starts: passthrough_ll holds an O_PATH descriptor for each inode the
    kernel knows, the work tree's N files and git's N objects, and past the limit its
    flush's dup() fails, so that close() reports EBADF to git."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = int(Path("/proc/sys/fs/nr_open").read_text())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log(f"open files: {hard} (the hard limit; {want} was refused)")


def default_modes() -> list[str]:
    """Every mode of scripts/bench.py that can run here (libfuse_ll: where it builds,
    checked when its turn comes; group_nofast: only when asked)."""
    return [
        m
        for m in bench.MODES
        if (m != "native" or can_drop_caches())
        and (m != "bindfs" or shutil.which("bindfs"))
        and (m != "libfuse_hp" or bench.passthrough_hp())
        and m != "group_nofast"
    ]


@contextmanager
def mounted(mode: str, tree: Path, point: Path, build: Path, drop: bool) -> Iterator[None]:
    """``tree`` seen at ``point`` in ``mode`` from a cold start, until the block ends: on
    native, ``point`` is ``tree`` once the kernel's caches are dropped; on rwfs, ``tree``
    is mounted over itself; else a passthrough server serves it at ``point``. Always
    unmounted on the way out (lazily, and the server this started ended, if need be)."""
    if mode == "native" or drop:
        drop_caches()
    if mode == "native":
        yield
    elif mode in bench.PASSTHROUGH_MODES:
        with bench.fuse_process(bench.server_cmd(mode, tree, point, build), point):
            yield
    else:
        durability, options = bench.RWFS_MOUNTS[mode]
        mount = bench.Mount(tree, durability, build / f"{tree.parent.name}.log", options)
        try:
            mount.start()
            yield
        finally:
            mount.stop()
            text = mount.log_text()
            if "Traceback" in text:
                log(f"WARNING: the {mode} daemon logged a traceback ({mount.logfile}):")
                print(text[-3000:], file=sys.stderr)
    os.sync()  # (untimed: the next step starts with nothing left to write back)


def forget(mode: str) -> None:
    """In libfuse's modes, the kernel made to forget the inodes it holds of the mount."""
    if mode in bench.LIBFUSE_MODES and can_drop_caches():
        drop_caches()


def make_tree(tree: Path, n: int) -> None:
    old = time.time() - 3600  # no racily clean entry in the index
    for i in range(n):
        f = tree / f"d{i % 100:02d}" / f"f{i}.txt"
        f.parent.mkdir(exist_ok=True)
        f.write_text(f"line {i}\n" * 20)
        os.utime(f, (old, old))


def measure(mode: str, n: int, root: Path, build: Path, drop: bool) -> dict[str, float]:
    """One run of the workload in ``mode``: seconds of each step, and whether the first
    status after the remount wrote the index (1.0) or not (0.0)."""
    d = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root))
    tree = d / "tree"
    tree.mkdir()
    point = tree
    if mode in bench.PASSTHROUGH_MODES:
        point = d / "mnt"
        point.mkdir()
    make_tree(tree, n)
    out: dict[str, float] = {}
    with mounted(mode, tree, point, build, drop):
        git(point, "init", "-q")
        # libfuse's examples hold a descriptor for each inode the kernel knows, and the
        # files with git's N loose objects would take them past the open-file limit
        # (20,000 here, which root may not raise): so the files are added in batches of
        # 10 of the 100 directories, the kernel's caches dropped between them for those
        # modes (the FORGETs close the descriptors), and the objects packed before the
        # commit (which checks that each exists) in every mode.
        for b in range(0, 100, 10):
            batch = [f"d{i:02d}" for i in range(b, min(b + 10, n))]
            if batch:
                forget(mode)
                git(point, "add", *batch)
        forget(mode)
        git(point, "repack", "-adq")
        forget(mode)
        git(point, "add", "-A")
        git(point, "commit", "-q", "-m", "tree")
        git(point, "status")
    index = tree / ".git" / "index"
    before = index.stat().st_mtime_ns
    with mounted(mode, tree, point, build, drop):
        out["first"] = git(point, "status")
        out["warm"] = git(point, "status")
    out["index_rewritten"] = float(index.stat().st_mtime_ns != before)
    paths = sorted(str(f.relative_to(tree)) for f in tree.glob("d*/f*.txt"))
    with mounted(mode, tree, point, build, drop):  # the lookups alone, first after a remount
        t = time.perf_counter()
        for rel in paths:
            os.lstat(point / rel)
        out["stat"] = time.perf_counter() - t
    with mounted(mode, tree, point, build, drop):  # the listings alone, first after a remount
        t = time.perf_counter()
        run(["find", ".", "-printf", "%i\\n"], cwd=point)
        out["find"] = time.perf_counter() - t
    if mode in RWFS_MODES:
        git(tree, "status")  # the raw tree (its index then holds the raw stat data)
        out["raw_warm"] = git(tree, "status")
    shutil.rmtree(d)
    return out


def fmt(t: float | None, unit: str = "s") -> str:
    if t is None:
        return "—"
    return f"{t:.3f}{unit}" if unit == "s" else f"{t:.2f}{unit}"


def table(med: dict[str, dict[str, float]], modes: list[str]) -> str:
    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    bindfs = med.get("bindfs", {}).get("first")
    ll = med.get("libfuse_ll", {}).get("first")
    rows = []
    for mode in modes:
        m = med.get(mode)
        if m is None:
            continue
        first = m["first"]
        rows.append(
            [
                mode,
                fmt(first),
                fmt(m["warm"]),
                fmt(ratio(first, m["warm"]), "×"),
                fmt(m["stat"]),
                fmt(m["find"]),
                fmt(ratio(first, bindfs), "×"),
                fmt(ratio(first, ll), "×"),
                {0.0: "no", 1.0: "yes"}.get(m["index_rewritten"], "some runs"),
            ]
        )
    header = [
        "mode",
        "first status",
        "warm status",
        "first/warm",
        "lstat, first",
        "find, first",
        "first/bindfs",
        "first/libfuse_ll",
        "index rewritten",
    ]
    return bench.render_table(rows, header)


def main(argv: list[str] | None = None) -> int:
    global timeout
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("files", nargs="?", type=int, default=10_000, help="files (10,000)")
    ap.add_argument(
        "--modes",
        default=",".join(default_modes()),
        help=f"comma-separated of {','.join(bench.MODES)}\n(default: every one that can run"
        " here; native needs root, to drop the kernel's caches)",
    )
    ap.add_argument("--runs", type=int, default=1, help="runs of each mode (median; 1)")
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="drop the kernel's dentry and inode caches before every mount of every mode",
    )
    ap.add_argument("--timeout", type=float, default=timeout, help="seconds one command may take")
    args = ap.parse_args(argv)
    timeout = args.timeout
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in bench.MODES for m in modes) or args.runs < 1 or args.files < 1:
        ap.error(f"--modes names some of {', '.join(bench.MODES)}; --runs and N are positive")
    if ("native" in modes or args.drop_caches) and not can_drop_caches():
        ap.error(f"native and --drop-caches write {DROP_CACHES} (root only)")
    if "bindfs" in modes and not shutil.which("bindfs"):
        ap.error("bindfs is not installed (apt-get install bindfs; scripts/bench does)")

    # SIGTERM/SIGHUP unwind like Ctrl-C, so every block unmounts.
    def _stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    saved = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    raise_nofile()
    times: dict[str, dict[str, list[float]]] = {}
    failed: dict[str, int] = {}  # runs that failed, of each mode
    try:
        with tempfile.TemporaryDirectory(prefix="rwfs-bench-git-") as tmp:
            root = Path(tmp)
            build = root / "build"  # libfuse_ll's server, the rwfs daemons' logs
            build.mkdir()
            for i in range(args.runs):
                for mode in modes:
                    if mode in bench.LIBFUSE_MODES and bench.libfuse_server(mode, build) is None:
                        continue  # (logged by bench)
                    try:
                        out = measure(mode, args.files, root, build, args.drop_caches)
                    except (subprocess.SubprocessError, bench.BenchError) as exc:
                        log(f"run {i + 1}/{args.runs} {mode} failed: {exc}")
                        failed[mode] = failed.get(mode, 0) + 1
                        continue
                    for k, v in out.items():
                        times.setdefault(mode, {}).setdefault(k, []).append(v)
                    shown = ", ".join(f"{k}={v:.3f}" for k, v in out.items())
                    log(f"run {i + 1}/{args.runs} {mode}: {shown}")
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    med = {mode: {k: statistics.median(v) for k, v in per.items()} for mode, per in times.items()}

    print(f"files: {args.files}")
    for mode in modes:
        if mode in RWFS_MODES and mode in med:
            m = med[mode]
            print(f"rwfs ({mode}):")
            print(f"git status, first after a remount: {m['first']:.3f} s")
            print(f"git status, warm:                  {m['warm']:.3f} s")
            print(f"lstat of every file, first after a remount: {m['stat']:.3f} s")
            print(f"find -printf %i, first after a remount: {m['find']:.3f} s")
            print(f"git status, native (warm):         {m['raw_warm']:.3f} s")
    how = "every mode's mounts" if args.drop_caches else "native's"
    print(
        f"\nmedians of {args.runs} run(s); kernel dentry/inode caches dropped"
        f" (drop_caches=2) before {how}"
    )
    print(table(med, modes))
    for mode, nfail in failed.items():
        print(f"{mode}: {nfail} of {args.runs} run(s) failed (see the log above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
