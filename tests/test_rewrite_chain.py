"""Rewrites of one file that do not wait for each other's group (issue 18, item 3): a
rewrite opened while the previous version's commit is queued builds on that version. Each
version is still its own journaled commit, in order, and recovery after a SIGKILL at any
point of such a chain neither loses an acknowledged version nor calls a superseded one a
conflict."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

SLOW = DEFAULT_TEXT.replace("commit_interval_ms = 500", "commit_interval_ms = 60000")


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def version(n: int) -> bytes:
    return "".join(f"x_{i} = {n + 1000 if i == n % 50 else i}\n" for i in range(50)).encode()


def writes(m: Mount, name: str) -> list[tuple[str, str]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    evs = [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]
    return [(e["expected"], e["intended"]) for e in evs if e["op"] == "write" and e["path"] == name]


def test_rewrites_build_on_queued_versions_and_each_is_journaled(workspace: Path) -> None:
    prepare_state(workspace, SLOW)  # nothing commits until asked: every rewrite is queued
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        for n in range(1, 21):
            if n % 3 == 0:  # append to the queued version, in place
                with open(f, "ab") as out:
                    out.write(b"# more\n")
                data = f.read_bytes()
                assert data.endswith(b"# more\n") and data.startswith(b"x_0 = ")
            else:
                f.write_bytes(version(n))
                assert f.read_bytes() == version(n)
        last = f.read_bytes()
        status = json.loads((m.path / ".rw" / "status").read_text())
        assert status["counts"]["commits"] == 20, status  # (status syncs before it counts)
        chain = writes(m, "m.py")
        assert len(chain) == 20 and chain[-1][1] == sha(last)
        assert chain[0][0] == sha(version(0))
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chain)), "a version was skipped"
        history = sorted((m.path / ".rw" / "history" / "m.py").iterdir())
        assert len(history) == 21 and history[-1].read_bytes() == last
    finally:
        m.stop()
    check_clean(m)


def test_a_refused_rewrite_on_a_queued_version_leaves_that_version(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f = m.path / "m.py"
        f.write_bytes(version(1))  # queued
        with pytest.raises(OSError):
            f.write_bytes(version(2).replace(b"x_3 = 3\n", b"x_3 = (3\n"))  # a syntax error
        assert f.read_bytes() == version(1)  # the queued version, not the tree's
        why = json.loads((m.path / ".rw" / "why" / "m.py").read_text())
        assert why["expected"] == sha(version(1)), why
        f.write_bytes(version(1))  # the queued bytes again: a no-op
        assert f.read_bytes() == version(1)
        assert writes(m, "m.py") == [(sha(version(0)), sha(version(1)))]
    finally:
        m.stop()
    check_clean(m)


@pytest.mark.parametrize("point", ["after_seal:3", "after_prepare", "after_rename:1",
                                   "after_rename:2", "before_commit_record"])  # fmt: skip
def test_a_crash_in_a_chain_of_rewrites(workspace: Path, point: str) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace, env={"RWFS_FAULT": point}).start()
    acked = []
    for n in (1, 2, 3):
        try:
            (m.path / "m.py").write_bytes(version(n))
            acked.append(n)
        except OSError:
            break
    try:
        (m.path / ".rw" / "ctl").write_text("sync\n")
    except OSError:
        pass  # the daemon died under us: that is the point
    assert m.wait_dead() == -9, m.log_text()

    m = Mount(workspace).start()
    try:
        now = (m.path / "m.py").read_bytes()
        held = [n for n in range(4) if version(n) == now]
        # A version whose close() failed may have landed (its intent was logged).
        assert held and held[0] >= acked[-1], f"acknowledged {acked}, the file holds {held}"
        acked += list(range(acked[-1] + 1, held[0] + 1))
        assert not list((m.path / ".rw" / "conflicts").iterdir()), (
            "a superseded version became a conflict"
        )
        chain = writes(m, "m.py")
        assert chain == [(sha(version(n - 1)), sha(version(n))) for n in acked], chain
    finally:
        m.stop()
    check_clean(m)


def test_a_batch_opened_while_a_version_is_queued_takes_it_as_its_base(workspace: Path) -> None:
    prepare_state(workspace, SLOW)
    (workspace / "m.py").write_bytes(version(0))
    m = Mount(workspace).start()
    try:
        f, rw = m.path / "m.py", m.path / ".rw"
        f.write_bytes(version(1))  # queued
        (rw / "batches" / "b").mkdir()
        f.write_bytes(version(2))  # the batch's draft, built on version 1
        diff = (rw / "batches" / "b" / "diff").read_text()
        assert "-x_1 = 1001" in diff and "+x_2 = 1002" in diff, diff
        (rw / "batches" / "b" / "ctl").write_text("abort\n")
        assert f.read_bytes() == version(1)
        assert writes(m, "m.py") == [(sha(version(0)), sha(version(1)))]
    finally:
        m.stop()
    check_clean(m)


def test_recovery_reads_chains_of_receipts_in_one_pass() -> None:
    # In-process: the chains recovery finds among unsettled receipts (recovery._chains).
    from rwfs.core.recovery import _chains

    def r(n: int, path: str, expected: str, intended: str) -> dict:
        return {"id": n, "path": path, "expected": expected, "intended": intended}

    receipts = [r(1, "a", "E", "I1"), r(2, "a", "I1", "I2"), r(3, "b", "I1", "X"),
                r(4, "a", "I2", "I3"), r(5, "a", "E", "Z")]  # fmt: skip
    chains = _chains(receipts)
    digests, place = chains[1]
    assert (digests, place) == ({"I1": 1, "I2": 2, "I3": 3}, 1)
    assert chains[4] == (digests, 3) and chains[2][1] == 2
    assert chains[3] == ({"X": 1}, 1)  # another path: no chain with a's
    assert chains[5] == ({"Z": 1}, 1)  # the same base again: a chain of its own
    long = [r(n, "a", f"D{n - 1}", f"D{n}") for n in range(1, 5001)]
    assert _chains(long)[1][0]["D5000"] == 5000  # (linear: this is instant)


def test_a_chmod_reaches_the_queued_version_under_an_open_rewrite(workspace: Path) -> None:
    # Found by tests/test_model.py: the mode went to the open stage only, which then ended
    # as a no-op, and the queued version landed with the old mode.
    prepare_state(workspace, SLOW)
    m = Mount(workspace).start()
    try:
        f = m.path / "d"
        f.write_bytes(b"\0")  # queued, mode 0644
        held = os.open(f, os.O_RDWR)
        try:
            os.pwrite(held, b"\0", 0)  # an open stage built on the queued version
            os.chmod(f, 0o600)
            fd = os.open(f, os.O_RDWR)
            try:
                os.pwrite(fd, b"\0", 0)
                os.fsync(fd)  # the same bytes: a no-op; the queued version lands
            finally:
                os.close(fd)
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
        finally:
            os.close(held)
        (m.path / ".rw" / "ctl").write_text("sync\n")
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    finally:
        m.stop()
    assert stat.S_IMODE(os.stat(workspace / "d").st_mode) == 0o600
    check_clean(m)
