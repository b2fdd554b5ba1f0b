"""Retention runs by itself (docs/history.md, GC and retention): the object store is kept
under its budget and old versions go by age without any verb, a write that would meet
ENOSPC goes through because old versions go, and nothing that is needed ever goes."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

MIB = 1 << 20


def policy(**keys: object) -> str:
    text = DEFAULT_TEXT
    for key, value in keys.items():
        lines = text.splitlines()
        (n,) = [k for k, line in enumerate(lines) if line.startswith(f"{key} = ")]
        lines[n] = f"{key} = {value}"
        text = "\n".join(lines) + "\n"
    return text


def ctl(m: Mount, text: str) -> None:
    (m.path / ".rw" / "ctl").write_text(text + "\n")


def events(m: Mount) -> list[dict[str, Any]]:
    ctl(m, "sync")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def wait_for(m: Mount, done: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
    """Wait (up to a minute: a bound, not a measure) until the journal shows ``done``."""
    deadline = time.monotonic() + 60
    while not done(evs := events(m)):
        if time.monotonic() > deadline:
            gcs = [e for e in evs if e["op"] == "gc"]
            pytest.fail(f"no {what} came by itself; gc events: {gcs}\n{m.log_text()}")
        time.sleep(0.1)


def store_bytes(ws: Path) -> int:
    """The bytes the objects take on disk (what is waiting to be hashed aside)."""
    top = ws / ".rw" / "objects"
    total = 0
    for sub in os.listdir(top):
        if sub in ("incoming", "trash"):
            continue
        for name in os.listdir(top / sub):
            total += os.stat(top / sub / name).st_blocks * 512
    return total


def versions(m: Mount, path: str) -> list[bytes]:
    top = m.path / ".rw" / "history" / path
    return [(top / name).read_bytes() for name in sorted(p.name for p in top.iterdir())]


def test_overwrites_keep_the_store_under_a_small_budget_by_themselves(tmp_path: Path) -> None:
    workspace, point = tmp_path / "ws", tmp_path / "mnt"  # (the raw store stays visible)
    workspace.mkdir()
    point.mkdir()
    prepare_state(workspace, policy(retain_bytes=MIB))
    m = Mount(workspace, point).start()
    try:
        f = m.path / "data.bin"
        written = []
        for i in range(40):
            written.append(os.urandom(128 << 10))
            f.write_bytes(written[-1])
            if i == 5:
                ctl(m, "sync")
                (m.path / ".rw" / "snapshots" / "early").mkdir()
        # No verb: the store went over its budget, and the daemon collected by itself.
        wait_for(
            m,
            lambda evs: any(e["op"] == "gc" for e in evs) and store_bytes(workspace) <= MIB,
            "collection under the budget",
        )
        gcs = [e for e in events(m) if e["op"] == "gc"]
        assert {e.get("reason") for e in gcs} <= {"budget", "mount"}, gcs
        assert all(e["kept_bytes"] <= MIB and e["budget"] == MIB for e in gcs[-1:]), gcs
        # The current version and the snapshot's are intact; every listed version reads.
        assert f.read_bytes() == written[-1]
        tree = m.path / ".rw" / "snapshots" / "early" / "tree"
        assert (tree / "data.bin").read_bytes() == written[5]
        listed = versions(m, "data.bin")
        assert listed[-1] == written[-1] and written[5] in listed
        assert 3 <= len(listed) < 12 and all(v in written for v in listed)
        # The newest go last: what is kept besides the snapshot's is the latest versions.
        rest = [v for v in listed if v != written[5]]
        assert rest == written[-len(rest) :]
    finally:
        m.stop()
    check_clean(m)


def test_old_versions_go_by_age_once_the_policy_says_so(mount: Mount) -> None:
    f = mount.path / "a.txt"
    for i in range(5):
        f.write_text(f"v{i}\n")
    (mount.path / "gone.txt").write_text("bytes of a removed file\n")
    (mount.path / "gone.txt").unlink()
    ctl(mount, "sync")
    assert versions(mount, "a.txt") == [f"v{i}\n".encode() for i in range(5)]
    assert not [e for e in events(mount) if e["op"] == "gc"]  # 30 days keep them
    pol = mount.path / ".rw" / "policy.toml"
    pol.write_text(pol.read_text().replace("retain_days = 30", "retain_days = 0"))
    # (woken by the policy's change: the age, or the mount's first collection if it had
    # not run yet, which judges by the same policy)
    wait_for(
        mount,
        lambda evs: any(e.get("reason") in ("age", "mount") for e in evs),
        "collection by age",
    )
    assert versions(mount, "a.txt") == [b"v4\n"]
    top = mount.path / ".rw" / "history" / "gone.txt"
    assert not top.exists() or not list(top.iterdir())
    (gc,) = [e for e in events(mount) if e["op"] == "gc"]
    assert gc["removed"] >= 5 and gc["freed_bytes"] > 0, gc  # (and the empty start)


@pytest.mark.parametrize("min_free", ["0", None])
def test_a_write_that_would_fill_the_disk_goes_through_as_old_versions_go(
    small_fs: Path, min_free: str | None
) -> None:
    # Forty 1 MiB versions do not fit in 16 MiB. min_free_ratio = 0: only ENOSPC makes
    # room; the default policy: the daemon also collects when the disk is nearly full.
    # (Each write is fsynced: commits queued faster than the group committer lands them
    # hold their stages, which no collection can free.)
    ws = small_fs / "ws"
    ws.mkdir()
    if min_free is not None:
        prepare_state(ws, policy(min_free_ratio=min_free))
    (ws / "keep.txt").write_bytes(b"kept\n")
    m = Mount(ws, log=small_fs.parent / "daemon.log").start()  # (not on the full disk)
    try:
        f = m.path / "big.bin"
        first = os.urandom(MIB)
        f.write_bytes(first)
        ctl(m, "sync")
        (m.path / ".rw" / "snapshots" / "first").mkdir()
        for _ in range(40):
            last = os.urandom(MIB)
            try:
                with open(f, "wb") as out:
                    out.write(last)
                    os.fsync(out.fileno())
            except OSError as exc:
                assert exc.errno != errno.ENOSPC, f"history made a write fail:\n{m.log_text()}"
                raise
        assert f.read_bytes() == last
        assert (m.path / ".rw" / "snapshots" / "first" / "tree" / "big.bin").read_bytes() == first
        assert (m.path / "keep.txt").read_bytes() == b"kept\n"
        gcs = [e for e in events(m) if e["op"] == "gc"]
        assert gcs and {e.get("reason") for e in gcs} <= {"disk_full", "low_space"}, gcs
        if min_free == "0":
            assert {e.get("reason") for e in gcs} == {"disk_full"}, gcs
        assert sum(e["removed"] for e in gcs) >= 25
    finally:
        m.stop()
    check_clean(m)


def test_collections_keep_batches_drafts_snapshots_and_scratch(workspace: Path) -> None:
    prepare_state(workspace, policy(retain_days=0, retain_bytes=1))
    m = Mount(workspace).start()
    try:
        rw = m.path / ".rw"
        (m.path / "s.txt").write_text("at the snapshot\n")
        ctl(m, "sync")
        (rw / "snapshots" / "snap").mkdir()
        (m.path / "s.txt").write_text("since\n")
        good = "".join(f"def f{i}():\n    return {i}\n" for i in range(30))
        (m.path / "m.py").write_text(good)
        with pytest.raises(OSError):
            (m.path / "m.py").write_text(good.replace("f5():", "f5(:"))  # refused
        (draft,) = list((rw / "rejected").iterdir())
        (rw / "scratch" / "note.md").write_text("a note\n")
        (m.path / "b.txt").write_text("before the batch\n")
        for i in range(6):
            (m.path / "c.txt").write_text(f"churn {i}\n")
        (rw / "batches" / "held").mkdir()
        (m.path / "b.txt").write_text("held by the batch\n")
        (m.path / "c.txt").write_text("churn, in the batch\n")

        def churn_gone(evs: list[dict[str, Any]]) -> bool:
            # (The batch's draft is not journaled yet: not a version.)
            return any(e["op"] == "gc" for e in evs) and versions(m, "c.txt") == [b"churn 5\n"]

        wait_for(m, churn_gone, "collection of the churn")
        # Everything that is needed is still there.
        assert (rw / "snapshots" / "snap" / "tree" / "s.txt").read_text() == "at the snapshot\n"
        assert draft.read_text() == good.replace("f5():", "f5(:")
        assert (rw / "scratch" / "note.md").read_text() == "a note\n"
        assert (m.path / "m.py").read_text() == good
        ctl(m, "restore snap s.txt")
        assert (m.path / "s.txt").read_text() == "at the snapshot\n"
        (rw / "batches" / "held" / "ctl").write_text("commit\n")
        assert (m.path / "b.txt").read_text() == "held by the batch\n"
        assert (m.path / "c.txt").read_text() == "churn, in the batch\n"
    finally:
        m.stop()
    check_clean(m)


def test_versions_of_a_large_file_cost_what_changed_where_extents_are_shared(xfs: Path) -> None:
    # Twenty 4 KiB writes into a 10 MiB file: each version shares all but the written
    # block with the next (a reflink), so all twenty-one fit a budget of 8 MiB.
    ws = xfs / "ws"
    ws.mkdir()
    prepare_state(ws, policy(retain_bytes=8 * MIB))
    data = bytearray(os.urandom(10 * MIB))
    (ws / "big.bin").write_bytes(data)
    original = bytes(data)
    m = Mount(ws).start()
    try:
        before = os.statvfs(xfs)
        for i in range(20):
            with open(m.path / "big.bin", "r+b") as f:
                f.seek(i * 512 << 10)
                f.write(b"%04d" % i * 1024)
                os.fsync(f.fileno())
            data[i * 512 << 10 : (i * 512 << 10) + 4096] = b"%04d" % i * 1024
        after = os.statvfs(xfs)
        ctl(m, "gc")
        (gc,) = [e for e in events(m) if e["op"] == "gc"]
        assert gc["removed"] == 0 and gc["kept_bytes"] < 8 * MIB, gc
        listed = versions(m, "big.bin")
        assert len(listed) == 21 and listed[-1] == bytes(data)
        assert listed[0] == original
        # What the disk holds for them agrees: far less than 20 copies of the file.
        grown = (before.f_bfree - after.f_bfree) * before.f_frsize
        assert grown < 8 * MIB, f"twenty versions took {grown / MIB:.1f} MiB"
    finally:
        m.stop()
    check_clean(m)


READ_THEN_WRITE = """
import sys
path = sys.argv[1]
with open(path, "rb") as f:
    seen = f.read()
print("read", flush=True)
sys.stdin.readline()  # meanwhile, another process changes the file
try:
    with open(path, "wb") as f:
        f.write(seen + b"mine\\n")
    print("written")
except OSError as exc:
    print("errno", exc.errno)
"""


def test_a_conflicts_actual_bytes_stay_after_the_file_changes_again(workspace: Path) -> None:
    # conflicts/ID/actual reads the bytes the writer would have erased from their object;
    # once the file changed again they are an old version, and still needed.
    prepare_state(workspace, policy(stale_write='"conflict"', retain_days=0))
    m = Mount(workspace).start()
    try:
        f = m.path / "f.txt"
        f.write_text("base\n")
        ctl(m, "sync")
        child = subprocess.Popen(
            [sys.executable, "-c", READ_THEN_WRITE, str(f)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "read\n"
        f.write_text("other\n")  # this process: the change the child would erase
        child.stdin.write("go\n")
        child.stdin.close()
        assert child.stdout.read().strip() == f"errno {errno.ESTALE}"
        child.wait(30)
        (cid,) = os.listdir(m.path / ".rw" / "conflicts")
        top = m.path / ".rw" / "conflicts" / cid
        assert (top / "actual").read_text() == "other\n"
        f.write_text("third\n")  # "other" is an old version now
        ctl(m, "gc")
        assert (top / "actual").read_text() == "other\n"
        assert (top / "intended").read_text() == "base\nmine\n"
    finally:
        m.stop()
    check_clean(m)


def test_a_plan_gives_back_what_became_needed_after_it(tmp_path: Path) -> None:
    """In-process: the daemon plans a collection without the commit lock, from the journal
    at an LSN; what an event after it names (a write back to bytes the plan dropped) and
    what a commit not yet recorded names stay (gc.confirm)."""
    from rwfs.features import gc
    from rwfs.features.history import History
    from rwfs.journal.store import Store
    from rwfs.policy import Policy

    v = [f"sha256:{c * 64}" for c in "abcdef"]
    s = Store(str(tmp_path / "journal"))
    try:
        for old, new in zip(v, v[1:4], strict=False):  # a: v0 -> v1 -> v2 -> v3
            s.write(
                lambda txn, o=old, n=new: txn.append_event(
                    {"op": "write", "path": "a", "expected": o, "intended": n}
                )
            )
        found = {d: 10 for d in v[:4]}
        at = s.meta_int(b"lsn")
        policy = Policy.parse("retain_days = 0\n")
        p = gc.plan(s, History(s), policy, found, time.time() + 86400)
        assert sorted(p.drop) == v[:3]  # every old version, by age; the newest stays
        # After the plan: a write back to v0's bytes, and a commit queued that names v1.
        s.write(
            lambda txn: txn.append_event(
                {"op": "write", "path": "b", "expected": None, "intended": v[0]}
            )
        )
        q = gc.confirm(s, p, found, at, frozenset({v[1]}))
        assert q.drop == [v[2]] and q.freed == 10 and q.kept == 30
        assert sorted(gc.confirm(s, p, found, s.meta_int(b"lsn"), frozenset()).drop) == v[:3]
    finally:
        s.close()
