"""How rwfs's costs grow with the journal (issue 29: a workspace used for months should
stay as fast as on its first day).

For each size given (journal events), a fresh workspace is made under a temporary
directory of this script's own and filled in-process, before any mount, with the
project's own APIs (``Store.write`` with ``Txn.append_event``/``set_path``/``add_object``,
objects laid out as ``ObjectStore`` names them), so that a million events take about two
minutes, not the 18 the mount's ~900 commits/s would. The fill keeps the tree, the ``paths``
index and the object store consistent (``rwfs fsck`` agrees; its verdict is printed). Its
events are what a mount journals: rewrites of a few thousand files (several versions
each), creates, unlinks, renames and saves by write-a-temporary-then-rename; and
``--snapshots`` snapshots spread over the journal.

Then the workspace is mounted (``bench.Mount``: always unmounted, lazily if it must be,
the daemon SIGKILLed last) and each row is timed once; the table gives each row at each
size and the growth (the largest size's figure over the smallest's). A row that takes
longer than ``--limit`` seconds shows as ``> LIMIT`` and ends that size's rows (the daemon
is still busy with it). ``--git-files N`` adds scripts/bench_git_remount.py's first ``git
status`` after a remount, at N files.

    scripts/scale 10000 100000 1000000 [--snapshots 1000] [--files 3000] [--limit 600]
                  [--git-files N]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import bench  # noqa: E402  (scripts/bench.py: its Mount and wait_idle)

from rwfs.features.gc import FIRST_AFTER_S  # noqa: E402
from rwfs.journal.objects import EMPTY_DIGEST, ObjectStore  # noqa: E402
from rwfs.journal.store import Store, Txn  # noqa: E402

# The installed command, as a user runs it.
RWFS = [str(Path(sys.executable).with_name("rwfs"))]
LISTED = "src/listed.py"  # the file whose history is listed and restored
LISTED_VERSIONS = 20  # the same at every size: the listing's cost is the journal's
SMALL = "src/small.txt"  # the unrelated file read while the history is listed
TXN_EVENTS = 5000  # events per LMDB write transaction of the fill
SPAN_DAYS = 20  # the fill's events are spread over this (within retain_days)
TIMEOUT = 3600.0  # each command's, and each wait's (--limit)
STAGGER_S = 0.05


def log(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------
# The fill


@dataclass
class Fill:
    """Journals ``events`` events into a fresh workspace, the way a mount would have."""

    ws: Path
    events: int
    files: int
    snapshots: int
    seed: int = 1
    rng: random.Random = field(init=False)
    live: dict[str, bytes] = field(default_factory=dict)  # path -> its bytes now
    order: list[str] = field(default_factory=list)  # live paths but the pinned ones
    where: dict[str, int] = field(default_factory=dict)  # path -> its index in order
    serial: int = 0
    made_dirs: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.pids = random.Random(self.seed)  # (its own: the mix is the same at any --snapshots)
        self.uid, self.gid = os.getuid(), os.getgid()
        self.t0 = time.time() - SPAN_DAYS * 86400
        self.step = SPAN_DAYS * 86400 / max(self.events, 1)

    # -- bytes ----------------------------------------------------------------------

    def content(self, path: str) -> bytes:
        """New bytes for ``path``, never seen before: every version is its own object."""
        self.serial += 1
        lines = [f"# {path}, version {self.serial}\n"]
        for k in range(self.rng.randint(5, 60)):
            lines.append(f"value_{k} = {k * self.serial % 9973}  # setting {k}\n")
        return "".join(lines).encode()

    def keep(self, txn: Txn, data: bytes, lsn: int) -> str:
        """Keep ``data`` as an object (the pre-image a commit keeps), listed at ``lsn``."""
        d = digest(data)
        name = ObjectStore.name(d)
        sub = name.split(b"/")[0]
        if sub not in self.made_dirs:
            os.makedirs(self.objdir / os.fsdecode(sub), mode=0o700, exist_ok=True)
            self.made_dirs.add(sub)
        try:  # no fsync each: the fill ends with one sync
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444, dir_fd=self.objfd)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        txn.add_object(d, len(data), lsn)
        return d

    # -- the live set ---------------------------------------------------------------

    def add_live(self, path: str, data: bytes, pinned: bool = False) -> None:
        self.live[path] = data
        if not pinned:
            self.where[path] = len(self.order)
            self.order.append(path)

    def drop_live(self, path: str) -> None:
        del self.live[path]
        i = self.where.pop(path)
        last = self.order.pop()
        if last != path:
            self.order[i] = last
            self.where[last] = i

    def pick(self) -> str:
        """A live file, the first ones far more often (a few files are hot)."""
        return self.order[int(len(self.order) * self.rng.random() ** 2)]

    def new_path(self) -> str:
        self.serial += 1
        return f"d{self.rng.randrange(50):02d}/n{self.serial}.py"

    # -- events ---------------------------------------------------------------------

    def who(self, comm: str) -> dict[str, object]:
        return {"pid": 4000 + self.pids.randrange(3000), "comm": comm, "uid": self.uid}

    def event(self, txn: Txn, ev: dict[str, object]) -> int:
        ev["ts"] = iso(self.t0 + self.done * self.step)
        self.done += 1
        return txn.append_event(ev)

    def receipt(self, txn: Txn, lsn: int, **fields: object) -> None:
        txn.new_receipt({**fields, "state": "committed", "lsn": lsn})
        self.commits += 1

    def write(self, txn: Txn, path: str, data: bytes, comm: str = "python3") -> None:
        old = self.live[path]
        lsn = txn.next_lsn()
        expected = self.keep(txn, old, lsn)
        new = digest(data)
        batch = f"auto-{self.commits + 1}"
        ev: dict[str, object] = {"op": "write", "path": path, "batch": batch}
        ev["expected"] = expected
        ev |= {"intended": new, "size": len(data), **self.who(comm), "mode": 0o644}
        self.event(txn, ev)
        self.receipt(txn, lsn, batch=batch, path=path, expected=expected, intended=new)
        txn.set_path(path.encode(), new, lsn)
        self.live[path] = data

    def create(self, txn: Txn, path: str, comm: str = "python3") -> None:
        lsn = self.event(
            txn,
            {
                "op": "create",
                "path": path,
                "intended": EMPTY_DIGEST,
                "mode": 0o644,
                "owner": [self.uid, self.gid],
                "gid": self.gid,
                "batch": f"auto-e{txn.next_lsn()}",
                **self.who(comm),
            },
        )
        txn.set_path(path.encode(), EMPTY_DIGEST, lsn)
        self.live[path] = b""

    def rename(self, txn: Txn, src: str, dst: str, comm: str = "mv") -> None:
        """``mv src dst``; over a file it replaces when ``dst`` is live."""
        data = self.live[src]
        lsn = txn.next_lsn()
        batch = f"auto-{self.commits + 1}"
        ev: dict[str, object] = {"op": "rename", "path": src, "dest": dst}
        ev |= {"intended": digest(data), "size": len(data), "mode": 0o644}
        ev |= {"owner": [self.uid, self.gid], "gid": self.gid, "batch": batch}
        expected = None
        if dst in self.live:
            expected = self.keep(txn, self.live[dst], lsn)
            ev["expected"] = expected
        self.event(txn, {**ev, **self.who(comm)})
        self.receipt(
            txn, lsn, batch=batch, path=dst, expected=expected, intended=digest(data), source=src
        )
        txn.move_paths(src.encode(), dst.encode(), lsn)
        if src in self.where:
            self.drop_live(src)
        else:
            del self.live[src]  # (a temporary)
        if dst in self.live:
            self.live[dst] = data
        else:
            self.add_live(dst, data)

    def unlink(self, txn: Txn, path: str) -> None:
        old = self.live[path]
        lsn = txn.next_lsn()
        expected = self.keep(txn, old, lsn)
        ev = {"op": "unlink", "path": path, "mode": 0o644, "expected": expected}
        ev |= {"size": len(old), "owner": [self.uid, self.gid], "gid": self.gid}
        self.event(txn, {**ev, "batch": f"auto-e{lsn}", "intended": None, **self.who("rm")})
        txn.set_path(path.encode(), None, lsn)
        self.drop_live(path)

    def save(self, txn: Txn, path: str) -> None:
        """An editor's save: write a temporary, rename it over the file."""
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.swp{self.serial}"
        self.create(txn, tmp, "vim")
        self.write(txn, tmp, self.content(path), "vim")
        self.rename(txn, tmp, path, "vim")

    def one(self, txn: Txn) -> None:
        """One operation of the mix (1 to 3 events)."""
        r = self.rng.random()
        if r < 0.70 or len(self.order) < self.files // 2:
            path = self.pick()
            self.write(txn, path, self.content(path))
        elif r < 0.80:
            self.save(txn, self.pick())
        elif r < 0.87 or len(self.order) < self.files:
            path = self.new_path()
            self.create(txn, path)
            self.add_live(path, b"")
            self.write(txn, path, self.content(path))
        elif r < 0.94:
            self.unlink(txn, self.order[self.rng.randrange(len(self.order))])
        else:
            src = self.order[self.rng.randrange(len(self.order))]
            self.rename(txn, src, self.new_path())

    def run(self) -> dict[str, object]:
        rw = self.ws / ".rw"
        rw.mkdir(parents=True, mode=0o700)
        (rw / "rwfs-state").write_text("This directory holds rwfs state. Do not edit.\n")
        (rw / "intents").mkdir(mode=0o700)  # (fsck reads it; a mount would have made it)
        # The tree before rwfs journaled it (version 0 of its files): a project checked out.
        for i in range(self.files * 2 // 3):
            self.add_live(f"d{i % 50:02d}/f{i:05d}.py", self.content(f"f{i}"))
        self.add_live(LISTED, self.content(LISTED), pinned=True)
        self.add_live(SMALL, b"a small file of the tree\n", pinned=True)
        state_fd = os.open(rw, os.O_RDONLY | os.O_DIRECTORY)
        objects = ObjectStore(state_fd)
        self.objfd = objects.fd
        self.objdir = rw / "objects"
        store = Store(str(rw / "journal"), map_size=1 << 34)
        self.done = self.commits = 0
        listed_every = max(self.events // LISTED_VERSIONS, 1)
        snap_every = max(self.events // max(self.snapshots, 1), 1)
        snaps = listed = 0
        middle = ""

        def chunk(txn: Txn) -> None:
            nonlocal snaps, listed, middle
            end = min(self.done + TXN_EVENTS, self.events)
            while self.done < end:
                if listed < LISTED_VERSIONS and self.done >= listed * listed_every:
                    listed += 1
                    self.write(txn, LISTED, self.content(LISTED))
                else:
                    self.one(txn)
                if snaps < self.snapshots and self.done >= (snaps + 1) * snap_every:
                    snaps += 1
                    name = f"snap-{snaps:05d}"
                    lsn = txn.next_lsn() - 1
                    txn.put_snapshot(
                        {"name": name, "lsn": lsn, "ts": iso(self.t0 + self.done * self.step)}
                        | self.who("mkdir")
                    )
                    if snaps == (self.snapshots + 1) // 2:
                        middle = name

        try:
            while self.done < self.events:
                store.write(chunk)
            store.write(lambda txn: txn.bump("commits", self.commits))
            lsn = store.meta_int(b"lsn")
        finally:
            store.close()
            os.close(state_fd)
        for path, data in self.live.items():
            p = self.ws / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        os.sync()
        return {"lsn": lsn, "live": len(self.live), "snapshot": middle, "snapshots": snaps}


# ---------------------------------------------------------------------------------------
# The measurements


class ScaleMount(bench.Mount):
    """bench's Mount with a policy that keeps every version: gc then does all of its
    survey but removes nothing, so each row sees the workspace the fill made."""

    def prepare(self) -> None:
        rw = self.workspace / ".rw"
        (rw / "policy.toml").write_text(
            f'durability = "{self.durability}"\nretain_days = 3650\nretain_min_bytes = {1 << 40}\n'
        )


STUCK: list[subprocess.Popen[bytes]] = []  # killed past the limit, not reaped yet


def run(cmd: list[str], cwd: Path, check: bool = True) -> tuple[float, str, int]:
    """(time, output, exit status) of ``cmd``; TimeoutExpired past the limit."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # Killed, it still waits for the daemon's answer to its request (a FUSE wait that
        # SIGKILL does not end) until the mount is gone: reaped after Mount.stop (reap).
        proc.kill()
        STUCK.append(proc)
        raise
    took = time.perf_counter() - t
    if check and proc.returncode != 0:
        raise bench.BenchError(f"{cmd} exited {proc.returncode}: {err.decode()[-2000:]}")
    return took, out.decode(errors="replace"), proc.returncode


def reap() -> None:
    for proc in STUCK:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            log(f"process {proc.pid} ({proc.args!r}) is still not dead")
    STUCK.clear()


def timed_together(cmds: list[list[str]], cwd: Path) -> list[tuple[float, str, int] | None]:
    """Start the commands together, each STAGGER_S after the one before (so that the first
    is surely in the daemon already: which one a race lets in first would decide the
    figure otherwise); the time each took, and its output, or None past the limit."""
    took: list[tuple[float, str, int] | None] = [None] * len(cmds)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            took[i] = run(cmds[i], cwd)
        except subprocess.TimeoutExpired:
            pass
        except BaseException as exc:  # (raised again below, in the caller's thread)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cmds))]
    for t in threads:
        t.start()
        time.sleep(STAGGER_S)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return took


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


WRITER = r"""
import os, sys, time
path, stop = sys.argv[1], sys.argv[2]
worst, n, i = 0.0, 0, 0
while not os.path.exists(stop):
    i += 1
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"writer line %d\n" % i)
    os.fsync(fd)
    os.close(fd)
    worst, n = max(worst, time.perf_counter() - t), n + 1
print(worst, n)
"""


def with_writer(ws: Path, tmp: Path, cmd: list[str]) -> tuple[float, float, int]:
    """Run ``cmd`` while a process does write+fsync of a tree file in a loop: (the
    command's time, the writer's worst write+fsync+close, its count)."""
    stop = tmp / "writer.stop"
    stop.unlink(missing_ok=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ws / "gc-writer.txt"), str(stop)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # (its first writes: the file's create, before the command starts)
        took = run(cmd, ws)[0]
    finally:
        stop.touch()
        try:
            out, _ = writer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()  # (reaped after Mount.stop, as run's are)
            STUCK.append(writer)
            raise
    worst, n = out.split()
    return took, float(worst), int(n)


class Rows(dict[str, float]):
    """A size's figures, each said as soon as it is known (a run stopped short still
    prints what it had); ``over``: the rows that took longer than the limit."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.over: set[str] = set()

    def __setitem__(self, key: str, value: float) -> None:
        super().__setitem__(key, value)
        log(f"{self.size}: {key} = {value:.3f}")


def measure(size: int, args: argparse.Namespace, tmp: Path, rows: Rows) -> None:
    ws = tmp / f"ws-{size}"
    t = time.perf_counter()
    made = Fill(ws, size, args.files, args.snapshots).run()
    fill_s = time.perf_counter() - t
    print(
        f"fill of {size} events: {fill_s:.1f} s ({made['lsn']} events, {made['live']} live "
        f"files, {made['snapshots']} snapshots)",
        flush=True,
    )
    mount = ScaleMount(ws, "group", tmp / f"daemon-{size}.log")
    try:
        t = time.perf_counter()
        mount.start(timeout=TIMEOUT)
        mounted_at = time.monotonic()
        rows["mount"] = time.perf_counter() - t
        rows["rss_mount"] = rss_bytes(mount.pid)
        ls, cat = timed_together([["ls", f".rw/history/{LISTED}/"], ["cat", SMALL]], ws)
        if cat is not None:
            rows["history_cat"] = cat[0]
        if ls is None:
            rows.over |= {"history_ls"} | ({"history_cat"} if cat is None else set())
            return
        rows["history_ls"] = ls[0]
        log(f"{size}: .rw/history/{LISTED}/ lists {len(ls[1].split())} versions")
        rows["rss_history"] = rss_bytes(mount.pid)
        # (over the mount's own: what the history index holds)
        rows["rss_per_event"] = (rows["rss_history"] - rows["rss_mount"]) / size
        # The daemon's own first collection comes FIRST_AFTER_S after the mount: let it
        # end before the rows that follow, which it would otherwise slow.
        time.sleep(max(0.0, mounted_at + FIRST_AFTER_S - time.monotonic()))
        t = time.perf_counter()
        time.sleep(1.0)  # (it has begun)
        bench.wait_idle(mount.pid, timeout=TIMEOUT)
        if time.perf_counter() - t >= TIMEOUT:
            rows.over.add("first_gc")
            return  # (still busy: the rows after it would measure that)
        rows["first_gc"] = time.perf_counter() - t
        rows["log_last"] = run([*RWFS, "log", "--last", "10"], ws)[0]
        took, out, _ = run([*RWFS, "snapshot"], ws)
        rows["snap_list"] = took
        if len(out.splitlines()) != made["snapshots"]:
            log(f"rwfs snapshot listed {len(out.splitlines())}, not {made['snapshots']}")
        rows["snap_mkdir"] = run(["mkdir", ".rw/snapshots/scale-extra"], ws)[0]
        rows["restore"] = run([*RWFS, "restore", str(made["snapshot"]), LISTED], ws)[0]
        bench.wait_idle(mount.pid, timeout=TIMEOUT)
        rows["gc"], rows["gc_writer"], n = with_writer(ws, tmp, [*RWFS, "gc"])
        log(f"{size}: the writer did {n} write+fsync during gc")
        bench.wait_idle(mount.pid, timeout=TIMEOUT)
        rows["fsck"], out, status = run([*RWFS, "fsck"], ws, check=False)
        problems = out.strip().splitlines()
        verdict = (problems or [""])[-1]
        if status != 0:
            verdict = f"{len(problems)} problem(s), first: {problems[:3]}"
        print(f"fsck at {size} events: {verdict}", flush=True)
    except subprocess.TimeoutExpired as exc:
        # The row being measured: the first not known yet (ROWS is in measuring order).
        late = next(k for k, _, _ in ROWS if k not in rows)
        log(f"{size}: {late} took more than {TIMEOUT:g} s ({exc.cmd}): the rest not measured")
        rows.over.add(late)
    finally:
        mount.stop(timeout=60)  # (a daemon still busy past the limit is killed)
        reap()
        if not bench.rwfs_mounted(str(ws)):
            subprocess.run(["rm", "-rf", str(ws)], timeout=TIMEOUT, check=False)  # (room)


ROWS = [
    ("mount", "mount (until it is in /proc/mounts)", "s"),
    ("history_ls", f"first ls .rw/history/FILE/ after the mount ({LISTED_VERSIONS} versions)", "s"),
    ("history_cat", "cat of a small tree file, started 0.05 s after it", "s"),
    ("first_gc", f"the daemon's own first collection ({FIRST_AFTER_S:g} s in), until idle", "s"),
    ("log_last", "rwfs log --last 10", "s"),
    ("snap_list", "rwfs snapshot (the listing)", "s"),
    ("snap_mkdir", "mkdir .rw/snapshots/NAME, one more", "s"),
    ("restore", "rwfs restore SNAP FILE (one file)", "s"),
    ("gc", "rwfs gc (it keeps every snapshot's files)", "s"),
    ("gc_writer", "worst write+fsync of a writer during gc", "s"),
    ("fsck", "rwfs fsck (mounted)", "s"),
    ("rss_mount", "daemon RSS after the mount", "MiB"),
    ("rss_history", "daemon RSS after the history listing", "MiB"),
    ("rss_per_event", "  its growth over the mount's, per event", "B"),
]


def cell(rows: dict[str, float], key: str, unit: str) -> str:
    if key in getattr(rows, "over", ()):
        return f"> {TIMEOUT:g} s"
    return fmt(rows[key], unit) if key in rows else "—"


def fmt(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value / 2**20:.1f} MiB"
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.3f} s"


def table(sizes: list[int], results: dict[int, dict[str, float]], snapshots: int) -> str:
    head = ["row", *[f"{s:,} events" for s in sizes], "growth"]
    lines = [
        f"(each journal holds {snapshots} snapshots; FILE is {LISTED}, SNAP the middle one)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for key, label, unit in ROWS:
        cells = [cell(results.get(s, {}), key, unit) for s in sizes]
        first, last = results.get(sizes[0], {}), results.get(sizes[-1], {})
        growth = "—"
        if len(sizes) > 1 and first.get(key):
            if key in last:
                growth = f"{last[key] / first[key]:.1f}×"
            elif key in getattr(last, "over", ()):
                growth = f"> {TIMEOUT / first[key]:.0f}×"
        lines.append("| " + " | ".join([label, *cells, growth]) + " |")
    return "\n".join(lines)


def git_remount(files: int, tmp: Path) -> str:
    """scripts/bench_git_remount.py's measurement of rwfs (group) at ``files`` files, in
    this process: each command given our timeout, its temporary directory made in ours."""
    import bench_git_remount as g

    out = io.StringIO()
    saved_tmp = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    try:
        with contextlib.redirect_stdout(out):
            g.main([str(files), "--modes", "group", "--timeout", str(TIMEOUT)])
    finally:
        tempfile.tempdir = saved_tmp
    return out.getvalue()


def main() -> int:
    global TIMEOUT
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sizes", nargs="*", type=int, default=[10_000, 100_000], help="events")
    p.add_argument("--files", type=int, default=3000, help="live files (about)")
    p.add_argument("--snapshots", type=int, default=1000, help="snapshots in each journal")
    p.add_argument("--git-files", type=int, default=0, help="also: git status after a remount")
    p.add_argument(
        "--limit", type=float, default=TIMEOUT, help="seconds a row may take (then: > LIMIT)"
    )
    args = p.parse_args()
    sizes = sorted(args.sizes)
    TIMEOUT = args.limit
    results: dict[int, dict[str, float]] = {}
    # A SIGTERM unwinds like an exception: every mount is unmounted on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = ""
    with tempfile.TemporaryDirectory(prefix="rwfs-scale-") as t:
        tmp = Path(t)
        try:
            if args.git_files:  # (first: a run stopped short during the sizes still has it)
                out = git_remount(args.git_files, tmp)
                print(out.rstrip() + "\n", flush=True)
            for size in sizes:
                log(f"{size} events")
                results[size] = Rows(size)
                measure(size, args, tmp, results[size])  # type: ignore[arg-type]
                print(table(sizes, results, args.snapshots) + "\n", file=sys.stderr, flush=True)
        except BaseException:
            print(table(sizes, results, args.snapshots), flush=True)  # what it had
            raise
        finally:
            leftover = [
                ln for ln in Path("/proc/self/mounts").read_text().splitlines() if f" {t}/" in ln
            ]
            for ln in leftover:
                point = ln.split()[1]
                log(f"{point} is still mounted: unmounting it lazily")
                subprocess.run(["fusermount3", "-u", "-z", point], timeout=60, check=False)
    print(table(sizes, results, args.snapshots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
