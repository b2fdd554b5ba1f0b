"""Any path Linux allows (SPEC §3.3a): up to 4,095 bytes, names of up to 255 bytes of any
byte but ``/`` and NUL. The journal keys its path index by the path, and LMDB keys hold at
most 511 bytes: longer paths must still commit, rename, unlink, recover and check clean.

Paths this long cannot be named from the mount point (PATH_MAX counts the whole string), so
these tests walk the tree by directory descriptors, as a program with ``openat`` would.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import RWFS, Mount, check_clean

from rwfs.journal.store import Store

# Three 200-byte names: a path of about 600 bytes, past LMDB's 511-byte keys.
MID = [b"a" * 200, b"\xff\xfe" + b"b" * 198, b"line\nbreak" + b"c" * 190]
# Fifteen names of 255 bytes and one of 200: with a leaf, a path of about 4,050 bytes.
DEEP = [bytes([0x41 + i]) * 250 + b"\xff\xfe\n" + b"z" * 2 for i in range(15)] + [b"q" * 200]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@contextmanager
def opendir(top: Path | int, names: list[bytes], make: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``top/names...`` (made on the way if ``make``)."""
    fd = top if isinstance(top, int) else os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    fds = [] if isinstance(top, int) else [fd]
    try:
        for name in names:
            if make:
                os.mkdir(name, dir_fd=fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            fds.append(fd)
        yield fd
    finally:
        for f in fds:
            os.close(f)


def put(dir_fd: int, name: bytes, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def get(dir_fd: int, name: bytes) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def ctl(m: Mount, verb: str) -> None:
    (m.path / ".rw" / "ctl").write_text(verb + "\n")


def journal(m: Mount) -> list[dict[str, Any]]:
    ctl(m, "sync")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


def status(m: Mount) -> dict[str, Any]:
    return json.loads((m.path / ".rw" / "status").read_text())


def rel(names: list[bytes], leaf: bytes) -> str:
    return os.fsdecode(b"/".join([*names, leaf]))


def exercise(m: Mount, names: list[bytes]) -> None:
    """Write, rewrite, rename and unlink files at ``names/...`` through the mount."""
    with opendir(m.path, names, make=True) as d:
        put(d, b"file.txt", b"hello\n")
        put(d, b"file.txt", b"hello again\n")
        put(d, b"gone.txt", b"short-lived\n")
        os.unlink(b"gone.txt", dir_fd=d)
        os.rename(b"file.txt", b"moved\xff.txt", src_dir_fd=d, dst_dir_fd=d)
        put(d, b"moved\xff.txt", b"third\n")
    assert status(m)["journal_ok"] is True
    events = journal(m)
    writes = [e for e in events if e["op"] == "write"]
    assert {"path": rel(names, b"file.txt"), "intended": sha(b"hello again\n")} in [
        {"path": e["path"], "intended": e["intended"]} for e in writes
    ]
    assert [e["intended"] for e in writes if e["path"] == rel(names, b"moved\xff.txt")] == [
        sha(b"third\n")
    ]
    assert any(e["op"] == "unlink" and e["path"] == rel(names, b"gone.txt") for e in events)
    renames = [e for e in events if e["op"] == "rename"]
    assert any(e["dest"] == rel(names, b"moved\xff.txt") for e in renames)


def test_a_path_of_600_bytes_commits_renames_and_remounts(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        exercise(m, MID)
        # A directory above the long paths renamed: every path below moves with it.
        os.rename(m.path / MID[0].decode(), m.path / "top")
        moved = [b"top", *MID[1:]]
        with opendir(m.path, moved) as d:
            put(d, b"moved\xff.txt", b"fourth\n")
        events = journal(m)
        assert [e["intended"] for e in events if e["path"] == rel(moved, b"moved\xff.txt")][
            -1
        ] == sha(b"fourth\n")
        # Its history and `rwfs log` name it.
        with opendir(m.path / ".rw" / "history", [*moved, b"moved\xff.txt"]) as h:
            versions = sorted(os.listdir(h))
            assert [get(h, v.encode()) for v in versions][-1] == b"fourth\n"
        res = subprocess.run(
            [*RWFS, "log", "--json", "-C", str(m.path), rel(moved, b"moved\xff.txt")],
            capture_output=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        assert [json.loads(line)["op"] for line in res.stdout.splitlines()][-1] == "write"
        # Printed for people, a non-UTF-8 name is its own bytes, whatever the locale says.
        res = subprocess.run(
            [*RWFS, "log", "-C", str(m.path), rel(moved, b"moved\xff.txt")],
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
        )
        assert res.returncode == 0, res.stderr
        assert b"/moved\xff.txt" in res.stdout.splitlines()[-1]
    finally:
        m.stop()
    check_clean(m)
    m = Mount(workspace).start()  # a remount recovers nothing and succeeds
    try:
        with opendir(m.path, [b"top", *MID[1:]]) as d:
            assert get(d, b"moved\xff.txt") == b"fourth\n"
        assert "recovered" not in m.log_text()
    finally:
        m.stop()
    check_clean(m)


def test_a_path_of_4000_bytes_commits_and_remounts(workspace: Path) -> None:
    path = rel(DEEP, b"moved\xff.txt")
    assert 4000 < len(os.fsencode(path)) <= 4095
    m = Mount(workspace).start()
    try:
        exercise(m, DEEP)
    finally:
        m.stop()
    check_clean(m)
    m = Mount(workspace).start()
    try:
        with opendir(m.path, DEEP) as d:
            assert get(d, b"moved\xff.txt") == b"third\n"
            put(d, b"moved\xff.txt", b"after the remount\n")
        assert status(m)["journal_ok"] is True
        assert journal(m)[-1]["path"] == path
    finally:
        m.stop()
    check_clean(m)


def test_a_crash_with_long_paths_in_the_intent_log_recovers(workspace: Path) -> None:
    """The daemon dies before the group commit: recovery journals the long paths."""
    m = Mount(workspace, env={"RWFS_FAULT": "after_seal"}).start()
    with opendir(m.path, MID, make=True) as d:
        try:
            put(d, b"file.txt", b"promised\n")
        except OSError:
            pass  # the daemon may die before close() returns
    m.wait_dead()
    m = Mount(workspace).start()
    try:
        with opendir(m.path, MID) as d:
            assert get(d, b"file.txt") == b"promised\n"
        assert status(m)["journal_ok"] is True
    finally:
        m.stop()
    check_clean(m)


def test_the_store_indexes_paths_of_any_length(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "journal"))
    try:
        long_dir = b"/".join([b"d\xff" * 120] * 4)  # 963 bytes
        paths = {
            b"short": "sha256:1",
            b"x" * 511: "sha256:2",  # the longest plain key
            b"y" * 512: "sha256:3",  # the shortest hashed one
            long_dir + b"/f\n": "sha256:4",
            long_dir + b"/" + b"g" * (4095 - len(long_dir) - 1): "sha256:5",
            b"top/" + b"n" * 600: "sha256:6",
            b"top/short": "sha256:7",
        }
        store.write(lambda txn: [txn.set_path(p, d, 1) for p, d in paths.items()])
        assert {p: e["digest"] for p, e in store.paths().items()} == paths
        # A rename of a short directory moves its long paths too, and the other way round.
        store.write(lambda txn: txn.move_paths(b"top", b"t" * 300, 2))
        store.write(lambda txn: txn.move_paths(long_dir, b"s", 3))
        store.write(lambda txn: txn.swap_paths(b"s", b"t" * 300, 4))
        got = {p: e["digest"] for p, e in store.paths().items() if e["digest"]}
        assert got == {
            b"short": "sha256:1",
            b"x" * 511: "sha256:2",
            b"y" * 512: "sha256:3",
            b"t" * 300 + b"/f\n": "sha256:4",
            b"t" * 300 + b"/" + b"g" * (4095 - len(long_dir) - 1): "sha256:5",
            b"s/" + b"n" * 600: "sha256:6",
            b"s/short": "sha256:7",
        }
        # The renamed-away paths are recorded as gone, not left behind.
        assert store.paths()[b"top"]["digest"] is None
        assert store.paths()[long_dir]["digest"] is None
        assert not [p for p in store.paths() if p.startswith((b"top/", long_dir + b"/"))]
    finally:
        store.close()


def test_names_longer_than_linux_allows_are_refused_cleanly(mount: Mount) -> None:
    """A FUSE name may have 1,024 bytes; rwfs refuses what Linux would (NAME_MAX), even in
    the control directory, whose scratch files the journal keys by name."""
    for where in (mount.path, mount.path / ".rw" / "scratch"):
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for n in (256, 600):
                try:
                    put(fd, b"s" * n, b"x")
                    raise AssertionError(f"a {n}-byte name was taken in {where}")
                except OSError as exc:
                    assert exc.errno == errno.ENAMETOOLONG, exc
            put(fd, b"s" * 255, b"kept\n")
            assert get(fd, b"s" * 255) == b"kept\n"
        finally:
            os.close(fd)


def test_the_intent_log_keeps_long_records_whole(tmp_path: Path, monkeypatch: Any) -> None:
    """A record of two 4,095-byte paths of non-UTF-8 bytes is one ASCII line of ~50 KB; a
    short write() (a nearly full disk) must not tear it, and a failed append must not
    spoil the next record."""
    import rwfs.journal.intents as intents

    state_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    log = intents.IntentLog(state_fd)
    try:
        log.start(0)
        long_path = os.fsdecode(b"/".join([b"\xff\n" * 127 + b"x"] * 16))
        rec = {"kind": "event", "id": "r1", "event": {"path": long_path, "dest": long_path}}
        real_write = os.write
        calls: list[int] = []
        fail_at = [0]

        def short_write(fd: int, data: bytes) -> int:
            calls.append(len(data))
            if len(calls) == fail_at[0]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, bytes(data[:4096]))

        monkeypatch.setattr(intents.os, "write", short_write)
        log.append(rec)  # written in several short writes
        assert len(calls) > 1
        fail_at[0] = len(calls) + 2
        try:
            log.append({**rec, "id": "r2"})  # fails part way
        except OSError:
            pass
        else:
            raise AssertionError("the failed append raised nothing")
        monkeypatch.setattr(intents.os, "write", real_write)
        log.append({**rec, "id": "r3"})
        got = log.records(log.gen)
        assert [r["id"] for r in got] == ["r1", "r3"]
        assert os.fsencode(got[0]["event"]["path"]) == os.fsencode(long_path)
        assert len(os.fsencode(long_path)) == 4095
    finally:
        log.close()
        os.close(state_fd)


# ---- a store error never leaves a workspace unmountable (SPEC §3.3a) ----


def notices(m: Mount) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (m.path / ".rw" / "notices").read_text().splitlines()]


def fsck(workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RWFS, "fsck", str(workspace)], capture_output=True, text=True, timeout=120
    )


def test_a_receipt_recovery_cannot_settle_leaves_the_mount_up(workspace: Path) -> None:
    (workspace / "a.txt").write_bytes(b"v1\n")
    (workspace / "b.txt").write_bytes(b"b1\n")
    m = Mount(workspace).start()
    m.stop()
    rw = workspace / ".rw"
    store = Store(str(rw / "journal"))
    try:  # two owed writes; the stage of the first cannot be read (a directory stands there)
        owed = (("a.txt", b"v1\n", b"v2\n"), ("b.txt", b"b1\n", b"b2\n"))
        rids = store.write(
            lambda txn: [
                txn.new_receipt(
                    {
                        "batch": None,
                        "path": name,
                        "expected": sha(old),
                        "intended": sha(new),
                        "stage": f"stage-{name}",
                        "size": len(new),
                    }
                )
                for name, old, new in owed
            ]
        )
    finally:
        store.close()
    (rw / "staging" / "stage-a.txt").mkdir()
    (rw / "staging" / "stage-b.txt").write_bytes(b"b2\n")
    for _ in range(2):  # the second mount retries it, and does not notify again
        m = Mount(workspace).start()
        try:
            left = status(m)["unsettled"]
            assert [x for x in left if x.startswith(f"receipt {rids[0]} for a.txt")], left
            failed = [n for n in notices(m) if n["kind"] == "recovery_failed"]
            assert [n["item"] for n in failed] == [f"receipt {rids[0]} for a.txt"]
            assert (m.path / "a.txt").read_bytes() == b"v1\n"  # nothing written
            assert (m.path / "b.txt").read_bytes() == b"b2\n"  # the other one was performed
        finally:
            m.stop()
        assert "Traceback" not in m.log_text()
        res = fsck(workspace)
        assert res.returncode == 1 and f"receipt {rids[0]} for a.txt" in res.stdout
    # Once the stage is readable, the next mount performs the owed write.
    (rw / "staging" / "stage-a.txt").rmdir()
    (rw / "staging" / "stage-a.txt").write_bytes(b"v2\n")
    m = Mount(workspace).start()
    try:
        assert (m.path / "a.txt").read_bytes() == b"v2\n"
        assert status(m)["unsettled"] == []
    finally:
        m.stop()
    check_clean(m)


def test_an_intent_record_recovery_cannot_apply_is_held_and_retried(workspace: Path) -> None:
    (workspace / "d.txt").write_bytes(b"d\n")
    m = Mount(workspace).start()
    try:
        (m.path / "d.txt").write_bytes(b"d2\n")  # journaled
    finally:
        m.stop()
    store = Store(str(workspace / ".rw" / "journal"))
    try:
        gen = store.meta_int(b"applied_gen") + 1
    finally:
        store.close()
    # An unlink the daemon confirmed before it died, not yet in LMDB; the removed bytes it
    # adopted cannot be read (a directory stands in their place). Next to it, a create.
    (workspace / "d.txt").unlink()
    (workspace / "e.txt").write_bytes(b"e\n")
    incoming = workspace / ".rw" / "objects" / "incoming" / "adopted"
    incoming.mkdir()
    records = [
        {"kind": "event", "id": "u1", "event": {"op": "unlink", "path": "d.txt"}},
        {"kind": "event", "id": "c1", "event": {"op": "create", "path": "e.txt"}},
        {"kind": "done", "id": "u1"},
        {"kind": "done", "id": "c1"},
    ]
    records[0]["incoming"] = "adopted"
    log = workspace / ".rw" / "intents" / f"{gen:016x}.log"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    m = Mount(workspace).start()
    try:
        left = status(m)["unsettled"]
        assert [x for x in left if "(unlink d.txt)" in x], left
        assert [n for n in notices(m) if "(unlink d.txt)" in n.get("item", "")]
        ops = [(e["op"], e["path"]) for e in journal(m) if e.get("recovered")]
        assert ops == [("create", "e.txt")]  # the other record of its generation
    finally:
        m.stop()
    assert "Traceback" not in m.log_text()
    res = fsck(workspace)
    assert res.returncode == 1 and "intent record" in res.stdout
    incoming.rmdir()
    m = Mount(workspace).start()
    try:
        assert status(m)["unsettled"] == []
        ops = [(e["op"], e["path"]) for e in journal(m) if e.get("recovered")]
        assert ops == [("create", "e.txt"), ("unlink", "d.txt")]
    finally:
        m.stop()
    check_clean(m)
