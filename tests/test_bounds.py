"""Bounded work (SPEC §3.3b "Bounded"): a file's cost is what its data costs, never its
size. A file that grows past ``max_journaled_bytes`` leaves journaling at that change
(an ``unjournaled`` event, its last journaled bytes kept) and is written in place from
then on, so a small write far into a sparse file commits nothing of its size."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import Mount, check_clean, prepare_state

GiB = 1 << 30


def events(m: Mount) -> list[dict[str, Any]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def state_files(ws: Path) -> list[tuple[str, int]]:
    """Every file of the state's objects and staging areas, with its size."""
    out = []
    for sub in ("objects", "staging"):
        for d, _, names in os.walk(ws / ".rw" / sub):
            out += [(os.path.join(d, n), os.stat(os.path.join(d, n)).st_size) for n in names]
    return out


def test_a_small_write_far_into_a_file_leaves_journaling(workspace: Path) -> None:
    head = b"".join(b"line %d\n" % k for k in range(40))
    (workspace / "f.txt").write_bytes(b"first\n")
    m = Mount(workspace).start()
    try:
        fd = os.open(m.path / "f.txt", os.O_RDWR)
        try:
            os.pwrite(fd, head, 0)  # staged: not committed yet
            os.pwrite(fd, b"x" * 4096, 4 * GiB)
            os.fsync(fd)  # returns: nothing of the file's 4 GiB is hashed or copied
            os.pwrite(fd, b"in place", 8)
        finally:
            os.close(fd)
        evs = [e for e in events(m) if e.get("path") == "f.txt"]
        # The staged lines were committed at the crossing, then the file left journaling
        # with those bytes kept; nothing after it is journaled.
        assert [e["op"] for e in evs] == ["write", "unjournaled"], evs
        assert evs[0]["intended"] == sha(head) and evs[0]["size"] == len(head)
        assert evs[1]["expected"] == sha(head)
        assert evs[1]["size"] == 4 * GiB + 4096
        hist = sorted(os.listdir(m.path / ".rw" / "history" / "f.txt"))
        assert (m.path / ".rw" / "history" / "f.txt" / hist[-1]).read_bytes() == head
    finally:
        m.stop()
    check_clean(m)
    # No object or stage the size of the file: only small ones.
    assert all(size < (1 << 20) for _, size in state_files(workspace)), state_files(workspace)
    m = Mount(workspace).start()
    try:
        with open(m.path / "f.txt", "rb") as f:
            assert f.read(len(head)) == head[:8] + b"in place" + head[16:]
            f.seek(4 * GiB)
            assert f.read() == b"x" * 4096
        assert os.stat(m.path / "f.txt").st_size == 4 * GiB + 4096
    finally:
        m.stop()
    check_clean(m)
    assert os.stat(workspace / "f.txt").st_blocks * 512 < (1 << 20)  # still sparse


def test_a_new_file_written_far_past_the_limit_is_never_staged(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        fd = os.open(m.path / "sparse.bin", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.pwrite(fd, b"y" * 4096, 16 * 1024 * GiB - 8192)  # ext4's largest file
            os.fsync(fd)
        finally:
            os.close(fd)
        evs = [e for e in events(m) if e.get("path") == "sparse.bin"]
        assert [e["op"] for e in evs] == ["create", "unjournaled"], evs
        assert evs[1]["expected"] == sha(b"")
    finally:
        m.stop()
    check_clean(m)
    assert all(size < (1 << 20) for _, size in state_files(workspace))
    with open(workspace / "sparse.bin", "rb") as f:
        f.seek(16 * 1024 * GiB - 8192)
        assert f.read() == b"y" * 4096


def test_fast_writes_a_truncation_and_fallocate_cross_the_limit(workspace: Path) -> None:
    # A small limit, crossed by sequential writes (which go straight into the stage)
    # and, on other files, by an ftruncate and a fallocate.
    prepare_state(workspace, "max_journaled_bytes = 1048576\n")
    m = Mount(workspace).start()
    try:
        chunk = bytes(range(256)) * 256  # 64 KiB
        with open(m.path / "grow.dat", "wb") as f:
            for _ in range(32):  # to 2 MiB
                f.write(chunk)
        with open(m.path / "cut.dat", "wb") as f:
            f.write(b"short\n")
            f.flush()
            os.ftruncate(f.fileno(), 3 << 20)
        (m.path / "alloc.dat").write_bytes(b"allocated\n")
        fd = os.open(m.path / "alloc.dat", os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, 2 << 20)
        finally:
            os.close(fd)
        evs = events(m)
        alloc = [e for e in evs if e.get("path") == "alloc.dat" and e["op"] != "create"]
        assert [e["op"] for e in alloc] == ["write", "unjournaled"], alloc
        assert alloc[1]["expected"] == sha(b"allocated\n") and alloc[1]["size"] == 2 << 20
        grow = [e for e in evs if e.get("path") == "grow.dat" and e["op"] != "create"]
        assert [e["op"] for e in grow[-1:]] == ["unjournaled"], grow
        # What was committed before it is a prefix of the file, within the limit.
        kept = grow[-1]["expected"]
        written = [e for e in grow if e["op"] == "write"]
        assert not written or written[-1]["intended"] == kept
        assert all(e["size"] <= 1 << 20 for e in written)
        cut = [e for e in evs if e.get("path") == "cut.dat" and e["op"] != "create"]
        assert [e["op"] for e in cut] == ["write", "unjournaled"], cut
        assert cut[0]["intended"] == sha(b"short\n") == cut[1]["expected"]
    finally:
        m.stop()
    check_clean(m)
    data = (workspace / "grow.dat").read_bytes()
    assert data == chunk * 32
    assert (workspace / "cut.dat").read_bytes() == b"short\n" + bytes((3 << 20) - 6)
    assert (workspace / "alloc.dat").read_bytes() == b"allocated\n" + bytes((2 << 20) - 10)
    sizes = [size for _, size in state_files(workspace)]
    assert all(size <= 1 << 20 for size in sizes), sizes
    objects = workspace / ".rw" / "objects"
    kept_name = objects / kept[7:9] / kept[9:]
    if kept != sha(b""):
        assert data.startswith(kept_name.read_bytes())


def test_a_batch_file_cannot_grow_past_the_limit(workspace: Path) -> None:
    prepare_state(workspace, "max_journaled_bytes = 1048576\n")
    (workspace / "b.txt").write_bytes(b"base\n")
    m = Mount(workspace).start()
    try:
        os.mkdir(m.path / ".rw" / "batches" / "big")
        fd = os.open(m.path / "b.txt", os.O_RDWR)
        try:
            os.pwrite(fd, b"draft\n", 0)
            with pytest.raises(OSError) as err:
                os.pwrite(fd, b"z" * 10, 2 << 20)
            assert err.value.errno == errno.EFBIG
        finally:
            os.close(fd)
        env = json.loads((m.path / ".rw" / "last-error").read_text())
        assert env["reason_hint"] == "max_journaled_bytes" and env["path"] == "b.txt"
        assert (m.path / "b.txt").read_bytes() == b"draft\n"  # the batch's draft, unchanged
        (m.path / ".rw" / "batches" / "big" / "ctl").write_text("abort\n")
        assert (m.path / "b.txt").read_bytes() == b"base\n"
        assert not [e for e in events(m) if e["op"] == "unjournaled"]
    finally:
        m.stop()
    check_clean(m)


def test_snapshots_kept_in_memory_agree_with_the_journal(workspace: Path) -> None:
    # The daemon reads the snapshots once and keeps them (each operation then costs the
    # same however many there are): what it shows must stay what the journal holds.
    (workspace / "a.txt").write_text("v0\n")
    m = Mount(workspace).start()
    top = m.path / ".rw" / "snapshots"
    try:
        for k in range(30):
            (m.path / "a.txt").write_text(f"v{k + 1}\n")
            os.mkdir(top / f"s{k}")
        for k in range(0, 30, 3):
            os.rmdir(top / f"s{k}")
        with pytest.raises(FileExistsError):
            os.mkdir(top / "s1")
        with pytest.raises(FileNotFoundError):
            os.rmdir(top / "s0")
        shown = sorted(os.listdir(top))
        infos = {n: json.loads((top / n / "info").read_text()) for n in shown}
        assert (top / "s4" / "tree" / "a.txt").read_text() == "v5\n"
    finally:
        m.stop()
    check_clean(m)
    assert shown == sorted(f"s{k}" for k in range(30) if k % 3)
    m = Mount(workspace).start()
    try:
        assert sorted(os.listdir(top)) == shown
        assert {n: json.loads((top / n / "info").read_text()) for n in shown} == infos
        os.mkdir(top / "s0")  # a removed name can be used again
        assert (top / "s0" / "tree" / "a.txt").read_text() == "v30\n"
    finally:
        m.stop()
    check_clean(m)


def test_a_refused_stage_fails_the_change_that_would_cross_the_limit(workspace: Path) -> None:
    # Leaving journaling commits what the file held until then: its gates judge it, and
    # a refusal fails the change that would have crossed, changing nothing.
    prepare_state(workspace, "max_journaled_bytes = 1048576\n")
    good = b"".join(b"def f%d():\n    return %d\n\n" % (k, k) for k in range(30))
    (workspace / "a.py").write_bytes(good)
    m = Mount(workspace).start()
    try:
        fd = os.open(m.path / "a.py", os.O_RDWR)
        try:
            os.pwrite(fd, b"def broken(:\n", 0)
            with pytest.raises(OSError) as err:
                os.pwrite(fd, b"# tail\n", 2 << 20)
            assert err.value.errno == errno.EBADMSG
        finally:
            os.close(fd)
        assert (m.path / "a.py").read_bytes() == good
        ops = [e["op"] for e in events(m) if e.get("path") == "a.py"]
        assert "refuse" in ops and "unjournaled" not in ops, ops
        assert os.stat(m.path / "a.py").st_size == len(good)
    finally:
        m.stop()
    check_clean(m)
    assert (workspace / "a.py").read_bytes() == good


def test_verbs_never_read_a_file_past_the_limit_whole(workspace: Path) -> None:
    """A writer makes a journaled file a sparse one far past max_journaled_bytes (it leaves
    journaling); `restore` and `undo` of it then fail at once with EFBIG and an envelope,
    not after hashing every byte of it, and change nothing."""
    prepare_state(workspace, "max_journaled_bytes = 100000\n")
    m = Mount(workspace).start()
    try:
        f = m.path / "a.txt"
        f.write_text("v0\n")
        (m.path / ".rw" / "snapshots" / "s").mkdir()
        f.write_text("v1\n")
        with open(f, "r+b") as fh:  # 4 KiB at 64 GiB: a sparse file, unjournaled now
            os.pwrite(fh.fileno(), b"x" * 4096, 64 << 30)
        for verb in ("restore s a.txt", "restore s"):
            with pytest.raises(OSError) as err:
                (m.path / ".rw" / "ctl").write_text(verb + "\n")
            assert err.value.errno == errno.EFBIG, verb
            env = json.loads((m.path / ".rw" / "last-error").read_text())
            assert env["error"] == "quota_exceeded" and "a.txt" in env["message"], env
        assert os.stat(f).st_size == (64 << 30) + 4096
        assert not (m.path / ".rw" / "batches" / "restore-s").exists()
        os.truncate(f, 3)  # under the limit again: restore works
        (m.path / ".rw" / "ctl").write_text("restore s a.txt\n")
        assert f.read_text() == "v0\n"
    finally:
        m.stop()
    check_clean(m)
