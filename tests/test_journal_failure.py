"""Honest durability when the journal cannot commit (SPEC §3.3, §7.2 ``journal_unavailable``).

The journal fails for real: ``WORKSPACE/.rw/journal`` (the LMDB environment, nothing else)
is a small tmpfs of its own, filled to the last page by a file beside the environment,
while the tree, the stages and the intent log live on the ordinary disk. A reader
transaction held open by the test since before the daemon started keeps LMDB from reusing
the pages it frees, as a long-lived reader does: every write transaction needs new pages,
so once the tmpfs is full (and the room the daemon keeps allocated past the journal's pages
is cut off) the next one fails with ENOSPC, deterministically, and the group commit's
first step (the receipts) is the one that fails.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import pytest
import trio
from conftest import RWFS, Mount, check_clean, prepare_state, rwfs_mounted, submit_new

from rwfs.core.commits import Commit
from rwfs.core.errors import RwfsError
from rwfs.journal.store import JournalUnavailable
from rwfs.policy import DEFAULT_TEXT

# Groups form only when asked (a sync, an fsync, a strict close): a test knows which
# commits a failing group holds.
POLICY = DEFAULT_TEXT.replace("commit_interval_ms = 500", "commit_interval_ms = 60000")
QUEUED = 20


@dataclass
class Journal:
    """The workspace's LMDB directory on a tmpfs of its own, and what fills it."""

    dir: Path
    reader: lmdb.Transaction
    env: lmdb.Environment

    @property
    def filler(self) -> Path:
        return self.dir / "filler"

    def fill(self) -> None:
        """Take every free page of the tmpfs, the room the daemon keeps allocated past
        the journal's pages included (store.HEADROOM: it is cut off, as though the disk
        had filled before the daemon could allocate it)."""
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        os.truncate(self.dir / "data.mdb", used)
        with open(self.filler, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        # A write cut short by ENOSPC leaves the last pages partly used: top them up.
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while f.write(b"\0" * 512):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def free(self) -> None:
        self.filler.unlink()


def _setup(ws: Path, policy: str) -> Iterator[Journal]:
    prepare_state(ws, policy)
    jdir = ws / ".rw" / "journal"
    jdir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(jdir)], check=True)
    env = None
    try:
        env = lmdb.open(str(jdir), map_size=1 << 30, subdir=True, max_dbs=32)
        reader = env.begin()  # held for the whole test: LMDB reuses no page freed after it
        yield Journal(jdir, reader, env)
        reader.abort()
    finally:
        if env is not None:
            env.close()
        subprocess.run(["umount", "-l", str(jdir)], check=False)


@pytest.fixture
def beside(tmp_path: Path) -> Iterator[tuple[Path, Path, Journal]]:
    """A workspace (group durability) mounted beside itself, so the test sees its raw
    tree, with its journal on a tmpfs of its own."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    yield from ((ws, mp, j) for j in _setup(ws, POLICY))


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def status(m: Mount) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((m.path / ".rw" / "status").read_text())
    return got


def last_error(m: Mount) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((m.path / ".rw" / "last-error").read_text())
    return got


def sync(m: Mount) -> None:
    (m.path / ".rw" / "ctl").write_text("sync\n")


def data(i: int) -> bytes:
    return f"acknowledged version of file {i}\n".encode() * 10


def make_failing(m: Mount, j: Journal) -> list[Path]:
    """Fill the journal's disk, queue QUEUED acknowledged commits, and let their group
    fail; returns their paths in the mount."""
    sync(m)
    j.fill()
    paths = [m.path / f"f{i:02d}.txt" for i in range(QUEUED)]
    for i, p in enumerate(paths):
        p.write_bytes(data(i))  # close() succeeds: group durability acknowledges it
    with pytest.raises(OSError) as err:
        sync(m)
    assert err.value.errno == errno.EIO, "sync returned success while the group failed"
    return paths


def intent_logs(ws: Path) -> list[str]:
    return sorted(os.listdir(ws / ".rw" / "intents"))


def test_a_failing_journal_refuses_new_commits_and_lands_the_queued_ones_later(
    beside: tuple[Path, Path, Journal],
) -> None:
    ws, mp, j = beside
    m = Mount(ws, mp).start()
    try:
        paths = make_failing(m, j)
        env = last_error(m)
        assert env["error"] == "journal_unavailable" and env["errno"] == "EIO"
        assert "not durable yet" in env["message"]

        # The status says the journal is failing, since when, why, and what it owes.
        st = status(m)
        assert st["journal_ok"] is False
        assert st["journal"]["ok"] is False
        assert st["journal"]["failing_since"]
        assert "No space left on device" in st["journal"]["last_error"]
        assert st["journal"]["queued_commits"] == QUEUED
        cli = subprocess.run(
            [*RWFS, "status", "--json", str(mp)], capture_output=True, text=True, timeout=60
        )
        assert cli.returncode == 0, cli.stderr
        shown = json.loads(cli.stdout)
        assert shown["journal"]["ok"] is False and shown["journal"]["queued_commits"] == QUEUED

        # The mount shows the acknowledged bytes; the tree does not hold them yet.
        assert paths[0].read_bytes() == data(0)
        assert (ws / "f00.txt").read_bytes() == b""  # create's placeholder

        # fsync of a file whose commit is queued: EIO, and the commit stays queued.
        fd = os.open(paths[0], os.O_RDONLY)
        try:
            with pytest.raises(OSError) as err:
                os.fsync(fd)
            assert err.value.errno == errno.EIO
        finally:
            os.close(fd)
        assert status(m)["journal"]["queued_commits"] == QUEUED

        # A new commit is refused with EIO and an envelope that says why and what to do.
        fresh = m.path / "fresh.txt"
        with pytest.raises(OSError) as err:
            with open(fresh, "wb") as f:
                f.write(b"not journaled\n")
                f.flush()
                os.fsync(f.fileno())
        assert err.value.errno == errno.EIO
        env = last_error(m)
        assert env["error"] == "journal_unavailable" and env["path"] == "fresh.txt"
        assert "refused this commit" in env["message"]
        assert "keeps its previous bytes" in env["message"]
        assert env["details"]["queued"] == QUEUED
        assert fresh.read_bytes() == b""  # nothing of it was committed
        with pytest.raises(OSError) as err:
            (m.path / "f01.txt").write_bytes(b"a newer version\n")
        assert err.value.errno == errno.EIO
        assert (m.path / "f01.txt").read_bytes() == data(1)

        # A view that must include every acknowledged write says it cannot.
        with pytest.raises(OSError) as err:
            os.listdir(m.path / ".rw" / "history")
        assert err.value.errno == errno.EIO

        # Failed retries add no intent-log generations.
        before = intent_logs(ws)
        for _ in range(3):
            with pytest.raises(OSError):
                sync(m)
        assert intent_logs(ws) == before
        assert len(before) <= 2

        # Room again: the committer's next retry lands the queued commits on its own.
        j.free()
        deadline = time.monotonic() + 120
        while not status(m)["journal"]["ok"]:
            assert time.monotonic() < deadline, "the committer never retried the group"
            time.sleep(0.1)
        st = status(m)
        assert st["journal"]["ok"] is True and st["journal"]["queued_commits"] == 0
        assert st["journal"]["failing_since"] is None
        for i in range(QUEUED):
            assert (ws / f"f{i:02d}.txt").read_bytes() == data(i)
        fresh.write_bytes(b"journaled now\n")
        sync(m)
        assert (ws / "fresh.txt").read_bytes() == b"journaled now\n"
        assert len(intent_logs(ws)) == 1
    finally:
        m.stop()
    check_clean(m)


def test_umount_while_the_journal_fails_names_the_commits_left_and_the_next_mount_finishes_them(
    beside: tuple[Path, Path, Journal],
) -> None:
    ws, mp, j = beside
    m = Mount(ws, mp).start()
    try:
        make_failing(m, j)
        res = subprocess.run(
            [*RWFS, "umount", "--wait", "1", str(mp)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode != 0, "umount reported success with commits still queued"
        assert f"{QUEUED} acknowledged commits are not in the journal" in res.stderr
        assert "it could not commit since" in res.stderr
        assert "the next 'rwfs mount" in res.stderr
        assert "the journal cannot commit since" in res.stderr  # the progress line
        assert not rwfs_mounted(str(mp))
    finally:
        m.stop()
    offline = subprocess.run(
        [*RWFS, "status", "--json", str(ws)], capture_output=True, text=True, timeout=60
    )
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["intent_log_commits"] == QUEUED
    for i in range(QUEUED):
        assert (ws / f"f{i:02d}.txt").read_bytes() == b""
    j.free()
    m = Mount(ws, mp).start()
    try:
        for i in range(QUEUED):
            assert (mp / f"f{i:02d}.txt").read_bytes() == data(i)
        assert status(m)["journal"]["ok"] is True
    finally:
        m.stop()
    check_clean(m)
    for i in range(QUEUED):
        assert (ws / f"f{i:02d}.txt").read_bytes() == data(i)


def test_strict_close_gets_eio_when_its_group_cannot_be_journaled(tmp_path: Path) -> None:
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    (ws / "f.txt").write_bytes(b"old\n")
    for j in _setup(ws, POLICY.replace('durability = "group"', 'durability = "strict"')):
        m = Mount(ws, mp).start()
        try:
            sync(m)
            j.fill()
            with pytest.raises(OSError) as err:
                (mp / "f.txt").write_bytes(b"new\n")
            assert err.value.errno == errno.EIO
            env = last_error(m)
            assert env["error"] == "journal_unavailable" and env["path"] == "f.txt"
            assert (mp / "f.txt").read_bytes() == b"old\n"  # nothing was written
            assert (ws / "f.txt").read_bytes() == b"old\n"
            j.free()
            (mp / "f.txt").write_bytes(b"new\n")  # the journal commits again
            assert (ws / "f.txt").read_bytes() == b"new\n"
        finally:
            m.stop()
        check_clean(m)


# ---- in process: a group whose receipts are prepared but whose record cannot be written ----


def failing_transaction(w: Any, name: str) -> tuple[Any, Any]:
    """``w.store.write``, and a stand-in that fails the transactions of function ``name``
    as a full disk would."""
    real_write = w.store.write

    def write(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == name:
            raise JournalUnavailable("mdb_txn_commit: No space left on device")
        return real_write(fn, *args)

    return real_write, write


def test_a_group_whose_record_fails_is_recorded_by_the_retry(ws: Any, monkeypatch: Any) -> None:
    """The receipts transaction commits, the commit-record transaction does not (the
    failure is injected there, in process: on a real full disk which of the two fails
    first is not known in advance). The file is in the tree, the retry writes only the
    record, and nothing is journaled twice."""
    w = ws
    (w.tree / "f").write_bytes(b"old\n")
    real_write, record_fails = failing_transaction(w, "write_records")

    async def main() -> None:
        w.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.committer.run)
            fd = os.open(w.tree / "f", os.O_RDONLY)
            try:
                stage = await w.stages.new(fd, truncate=True)
            finally:
                os.close(fd)
            os.pwrite(stage.fd, b"new\n", 0)
            stage.sealed = True
            intended, size, _ = await w.stages.seal(stage)
            monkeypatch.setattr(w.store, "write", record_fails)
            c = await w.committer.submit(Commit(b"f", stage, intended, size, {}), wait=False)
            with pytest.raises(RwfsError) as err:
                await w.committer.sync()
            assert err.value.errno == errno.EIO
            assert err.value.envelope["error"] == "journal_unavailable"
            assert (w.tree / "f").read_bytes() == b"new\n"  # replaced: only the record is owed
            assert c.outcome == "committed" and not c.done.is_set()
            assert w.journal.status()["queued_commits"] == 1
            assert [r["state"] for r in w.store.unsettled()] == ["prepared"]
            with pytest.raises(RwfsError):
                await w.committer.sync()  # the retry fails again: still one generation behind it
            assert len(os.listdir(w.tree / ".rw" / "intents")) <= 2
            monkeypatch.setattr(w.store, "write", real_write)
            await w.committer.sync()
            assert c.done.is_set() and w.journal.ok
            assert w.store.unsettled() == []
            assert len(os.listdir(w.tree / ".rw" / "intents")) == 1
            await w.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    writes = [e for e in w.store.events() if e["op"] == "write"]
    assert [(e["path"], e["intended"]) for e in writes] == [("f", sha(b"new\n"))]
    assert sha(b"old\n") in w.store.objects()  # the pre-image is listed


def test_a_group_whose_records_waited_is_retried_when_the_next_receipts_fail(
    ws: Any, monkeypatch: Any
) -> None:
    """fsync after fsync: the first group's records wait to go in the second group's
    receipts transaction, which fails. The second writer gets EIO with nothing written;
    the first group, applied and answered, is kept and only its records are retried."""
    from rwfs.core import committer

    monkeypatch.setattr(committer, "RECORD_WAIT", 3600.0)
    w = ws
    for i in range(2):
        (w.tree / f"f{i}").write_bytes(b"old")
    real_write, prepare_fails = failing_transaction(w, "prepare")

    async def main() -> None:
        w.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.committer.run)
            first = await submit_new(w, 0, True, owner=object())  # durable; records wait
            with trio.fail_after(60):
                while w.committer._unrecorded is None:
                    await trio.sleep(0.001)
            monkeypatch.setattr(w.store, "write", prepare_fails)
            with pytest.raises(RwfsError) as err:
                await submit_new(w, 1, True, owner=object())
            assert err.value.errno == errno.EIO
            assert (w.tree / "f0").read_bytes() == b"new 0"
            assert (w.tree / "f1").read_bytes() == b"old"  # nothing of it was written
            assert first.outcome == "committed" and not first.done.is_set()
            assert w.journal.status()["queued_commits"] == 1
            assert [r["state"] for r in w.store.unsettled()] == ["prepared"]
            monkeypatch.setattr(w.store, "write", real_write)
            await w.committer.sync()
            assert first.done.is_set() and w.journal.ok
            assert w.store.unsettled() == []
            await w.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    writes = [(e["path"], e["intended"]) for e in w.store.events() if e["op"] == "write"]
    assert writes == [("f0", sha(b"new 0"))]
    assert len(os.listdir(w.tree / ".rw" / "intents")) == 1


def test_an_unmount_flushes_what_came_during_a_slow_group(ws: Any, monkeypatch: Any) -> None:
    """``close``'s wait bounds its retries of a failing journal, never a healthy flush: a
    commit queued while the last group was under way (a request still being answered,
    on a loaded machine where a group takes longer than the wait) is flushed too, not
    left to the next mount's recovery with the tree ahead of the journal."""
    w = ws
    for i in range(2):
        (w.tree / f"f{i}").write_bytes(b"old")
    real_write = w.store.write

    def slow_write(fn: Any, *args: Any, **kw: Any) -> Any:
        time.sleep(0.3)  # (in the committer's worker thread)
        return real_write(fn, *args, **kw)

    commits: list[Any] = []

    async def late() -> None:
        await trio.sleep(0.1)  # while the first group is being written
        commits.append(await submit_new(w, 1, False))

    async def main() -> None:
        w.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.committer.run)
            commits.append(await submit_new(w, 0, False))  # acknowledged, queued
            monkeypatch.setattr(w.store, "write", slow_write)
            nursery.start_soon(late)
            assert await w.committer.close(wait=0.05) == 0
            assert len(commits) == 2 and all(c.done.is_set() for c in commits)
            nursery.cancel_scope.cancel()

    trio.run(main)
    writes = sorted((e["path"], e["intended"]) for e in w.store.events() if e["op"] == "write")
    assert writes == [("f0", sha(b"new 0")), ("f1", sha(b"new 1"))]
    assert w.store.unsettled() == []
    logs = w.tree / ".rw" / "intents"
    assert [n.name for n in logs.iterdir() if n.stat().st_size] == []
