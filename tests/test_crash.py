"""Crash tests: the daemon really dies (SIGKILL, at named fault points or at random) and the
workspace is really mounted again. After remount: I1 (each file holds its old or its new
bytes, never a mix), I2 (every change that reached the tree has a receipt and an event), I4
(a write whose close() succeeded survives) hold, and ``rwfs fsck`` agrees with the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.faults import POINTS
from rwfs.policy import DEFAULT_TEXT

COMMIT_POINTS = [
    p
    for p in POINTS
    if p not in ("after_unlink", "after_namespace_op") and not p.startswith("batch_")
]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def events(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def _write(path: Path, data: bytes) -> bool:
    """Write and close; True if close() reported success."""
    try:
        with open(path, "wb") as f:
            f.write(data)
        return True
    except OSError:
        return False


def _writer(
    path: Path,
    label: str,
    seed: float,
    tried: list[bytes],
    acked: dict[str, int],
    stop: threading.Event,
) -> None:
    """Write ever newer versions of one file until stopped or the mount dies."""
    r = random.Random(seed)
    k = 0
    while not stop.is_set():
        k += 1
        data = f"{path.name} {label} version {k}\n".encode() * r.randint(1, 400)
        tried.append(data)
        if not _write(path, data):
            return
        acked[path.name] = len(tried) - 1


@pytest.mark.parametrize("durability", ["group", "strict"])
@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_fault_point_during_commit(workspace: Path, point: str, durability: str) -> None:
    prepare_state(workspace, DEFAULT_TEXT.replace('"group"', f'"{durability}"'))
    old, new = b"old line\n" * 100, b"new line\n" * 120
    # A hard-linked file's commit cut mid-copy, and one whose copy was done but not recorded.
    linked = point in ("in_place_copied", "before_commit_record")
    if point == "in_place_copied":
        old = b"old line\n" * 150  # longer: the copied new bytes leave old ones after them
    (workspace / "f.txt").write_bytes(old)
    if linked:
        os.link(workspace / "f.txt", workspace / "g.txt")
    m = Mount(workspace, env={"RWFS_FAULT": point}).start()
    acked = _write(m.path / "f.txt", new)
    # The group committer reaches the point within its interval; fsync-less writers wait.
    try:
        (m.path / ".rw" / "ctl").write_text("sync\n")
    except OSError:
        pass  # the daemon died under us: that is the point
    code = m.wait_dead()
    assert code == -9, f"the daemon did not die at {point}: exit {code}\n{m.log_text()}"

    m = Mount(workspace).start()
    try:
        now = (m.path / "f.txt").read_bytes()
        assert now in (old, new), "I1: the file holds a mix"
        if linked:
            assert (m.path / "g.txt").read_bytes() == now
            assert os.stat(workspace / "g.txt").st_ino == os.stat(workspace / "f.txt").st_ino
        if acked:
            assert now == new, "I4: a write whose close() succeeded was lost"
        evs = events(m)
        writes = [e for e in evs if e["op"] == "write" and e["path"] == "f.txt"]
        if now == new:
            # I2: the change that reached the tree is journaled with both digests.
            assert [(e["expected"], e["intended"]) for e in writes] == [(sha(old), sha(new))]
            if linked:  # the other name is journaled with the write, however it was settled
                assert writes[-1].get("links") == ["g.txt"], writes
        else:
            assert writes == []
        status = json.loads((m.path / ".rw" / "status").read_text())
        assert status["counts"]["commits"] == len(writes)
    finally:
        m.stop()
    check_clean(m)
    assert os.listdir(workspace / ".rw" / "staging") == []


def test_a_second_remount_changes_nothing(workspace: Path) -> None:
    (workspace / "f.txt").write_bytes(b"a\n")
    m = Mount(workspace, env={"RWFS_FAULT": "after_prepare"}).start()
    assert _write(m.path / "f.txt", b"b\n")
    try:
        (m.path / ".rw" / "ctl").write_text("sync\n")
    except OSError:
        pass
    m.wait_dead()
    m = Mount(workspace).start()
    first = events(m)
    m.stop()
    m = Mount(workspace).start()
    try:
        again = events(m)
        assert again == first, "a remount without a crash must not journal anything"
        assert (m.path / "f.txt").read_bytes() == b"b\n"
    finally:
        m.stop()
    check_clean(m)


def test_acknowledged_write_survives_a_crash_in_a_later_session(workspace: Path) -> None:
    # Regression: each mount must number its intent log after the journal's applied
    # generation, or recovery drops the new log unread.
    (workspace / "f.txt").write_bytes(b"0\n")
    for n in range(1, 4):
        m = Mount(workspace).start()
        assert (m.path / "f.txt").read_bytes() == f"{n - 1}\n".encode()
        assert _write(m.path / "f.txt", f"{n}\n".encode())
        (m.path / ".rw" / "ctl").write_text("sync\n")
        m.stop()
    m = Mount(workspace).start()
    assert _write(m.path / "f.txt", b"acked then crashed\n")
    m.kill()
    m = Mount(workspace).start()
    try:
        assert (m.path / "f.txt").read_bytes() == b"acked then crashed\n"
    finally:
        m.stop()
    check_clean(m)


def test_unlink_keeps_the_removed_bytes_across_a_crash(workspace: Path) -> None:
    (workspace / "gone.txt").write_bytes(b"precious\n")
    m = Mount(workspace).start()
    os.unlink(m.path / "gone.txt")
    m.kill()  # before the group committer ran: only the intent log knows
    m = Mount(workspace).start()
    try:
        unlinks = [e for e in events(m) if e["op"] == "unlink"]
        assert len(unlinks) == 1 and unlinks[0]["expected"] == sha(b"precious\n")
        assert not (m.path / "gone.txt").exists()
    finally:
        m.stop()
    check_clean(m)
    h = sha(b"precious\n").split(":")[1]
    assert (workspace / ".rw" / "objects" / h[:2] / h[2:]).read_bytes() == b"precious\n"


def test_a_hard_linked_names_kept_copy_is_checked_after_a_crash(workspace: Path) -> None:
    """Removing one name of a hard-linked file keeps a copy of its bytes, not synced on
    the request path: after a daemon crash it is kept as the removal's ``expected``; a
    copy whose bytes are not what was copied (a crash of the machine cut it short,
    simulated by changing it) is dropped rather than kept as a version no file held."""
    (workspace / "f.txt").write_bytes(b"shared bytes\n")
    for name in ("g.txt", "h.txt"):
        os.link(workspace / "f.txt", workspace / name)
    incoming = workspace / ".rw" / "objects" / "incoming"
    for name, damage in (("g.txt", False), ("h.txt", True)):
        m = Mount(workspace).start()
        os.unlink(m.path / name)
        m.kill()  # before the group committer ran: only the intent log knows
        (copy,) = [p for p in incoming.iterdir() if "." in p.name]
        assert copy.name.endswith(sha(b"shared bytes\n").split(":")[1])  # what was copied
        if damage:
            copy.chmod(0o600)
            copy.write_bytes(b"shared b\0\0\0\0\0\n")
        m = Mount(workspace).start()
        try:
            (unlink,) = [e for e in events(m) if e["op"] == "unlink" and e["path"] == name]
            assert unlink.get("expected") == (None if damage else sha(b"shared bytes\n"))
            assert not (m.path / name).exists()
            assert (m.path / "f.txt").read_bytes() == b"shared bytes\n"
        finally:
            m.stop()
        assert list(incoming.iterdir()) == []
        check_clean(m)
    damaged = sha(b"shared b\0\0\0\0\0\n").split(":")[1]
    assert not (workspace / ".rw" / "objects" / damaged[:2] / damaged[2:]).exists()


def test_a_chmod_recorded_before_a_crash_is_journaled_after_it(workspace: Path) -> None:
    """A setattr is applied, then recorded in the intent log by one record (no announce
    before it): recovery journals it."""
    (workspace / "mode.txt").write_bytes(b"x\n")
    m = Mount(workspace).start()
    os.chmod(m.path / "mode.txt", 0o600)
    m.kill()  # before the group committer ran: only the intent log knows
    m = Mount(workspace).start()
    try:
        chmods = [e for e in events(m) if e["op"] == "setattr"]
        assert [(e["path"], e["mode"], e.get("recovered")) for e in chmods] == [
            ("mode.txt", 0o600, True)
        ]
        assert os.stat(m.path / "mode.txt").st_mode & 0o777 == 0o600
    finally:
        m.stop()
    check_clean(m)


def test_unlink_in_flight_at_the_crash_is_journaled(workspace: Path) -> None:
    (workspace / "doomed.txt").write_bytes(b"last words\n")
    m = Mount(workspace, env={"RWFS_FAULT": "after_unlink"}).start()
    with pytest.raises(OSError):
        os.unlink(m.path / "doomed.txt")  # the daemon dies inside this call
    assert m.wait_dead() == -9
    m = Mount(workspace).start()
    try:
        assert not (m.path / "doomed.txt").exists()
        unlinks = [e for e in events(m) if e["op"] == "unlink"]
        assert [(e["path"], e["expected"]) for e in unlinks] == [
            ("doomed.txt", sha(b"last words\n"))
        ]
    finally:
        m.stop()
    check_clean(m)


def test_sigkill_at_random_instants_under_several_writers(workspace: Path) -> None:
    rng = random.Random(1234)
    names = [f"w{i}.txt" for i in range(6)]
    before = {n: b"v0\n" * 50 for n in names}
    for n, data in before.items():
        (workspace / n).write_bytes(data)
    for round_ in range(4):
        m = Mount(workspace).start()
        # Per file: every version attempted, in order (the content names the version), and
        # the index of the last one whose close() succeeded.
        tried: dict[str, list[bytes]] = {n: [before[n]] for n in names}
        acked: dict[str, int] = {n: 0 for n in names}
        stop = threading.Event()

        threads = [
            threading.Thread(
                target=_writer,
                args=(m.path / n, f"round {round_}", rng.random(), tried[n], acked, stop),
            )
            for n in names
        ]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.2, 1.5))
        m.kill(reap=False)  # the writers stop on the dead mount, not in the raw tree
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        m.reap()
        m = Mount(workspace).start()
        try:
            for n in names:
                now = (m.path / n).read_bytes()
                # I1 + I4: a whole version, the last acknowledged one or one attempted after it.
                assert now in tried[n][acked[n] :], (
                    f"{n}: holds neither the acked nor a later version"
                )
                before[n] = now
        finally:
            m.stop()
        check_clean(m)


@pytest.mark.parametrize(
    "point", ["before_commit_record:2", "after_stage_sync:3", "after_commit_record:2"]
)
def test_fsync_after_fsync_with_the_records_of_one_group_in_the_next_ones_receipts(
    workspace: Path, point: str
) -> None:
    # File after file, each fsync'd: each group's records wait for the next group and go
    # in its receipts' transaction. Killed once the second group is applied, while its
    # records wait and its writer was answered (the third group's stages synced), and once
    # they are durable with the third group's receipts, before that group's renames.
    old = {f"f{i}.txt": f"old {i}\n".encode() for i in range(6)}
    for name, data in old.items():
        (workspace / name).write_bytes(data)
    m = Mount(workspace, env={"RWFS_FAULT": point}).start()
    synced: list[str] = []
    for name in old:
        try:
            fd = os.open(m.path / name, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, b"new " + name.encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            break  # the daemon died under us: that is the point
        synced.append(name)
    code = m.wait_dead()
    assert code == -9, f"the daemon did not die at {point}: exit {code}\n{m.log_text()}"
    assert len(synced) >= 1, "no fsync returned before the fault point"

    m = Mount(workspace).start()
    try:
        evs = events(m)
        for name, data in old.items():
            now = (m.path / name).read_bytes()
            new = b"new " + name.encode() + b"\n"
            assert now in (data, new, b""), f"I1: {name} holds a mix"
            if name in synced:
                assert now == new, f"I4: {name}'s fsync returned, and its bytes were lost"
            writes = [(e["expected"], e["intended"]) for e in evs if e.get("path") == name]
            # Each change that reached the tree is journaled once, with both digests.
            assert writes == ([] if now == data else [(sha(data), sha(now))]), (name, writes)
        lsns = [e["lsn"] for e in evs]
        assert lsns == sorted(lsns)
        order = [e["path"] for e in evs if e["op"] == "write"]
        assert order == sorted(order), "the writes are journaled in the order they were made"
    finally:
        m.stop()
    check_clean(m)
    assert os.listdir(workspace / ".rw" / "staging") == []
