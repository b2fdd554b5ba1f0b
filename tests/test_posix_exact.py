"""POSIX-exact metadata and explicit truncation, through a real mount (issue 16).

The cases pjdfstest and fsx found, kept as tests of our own:

- the caller's mode is honoured exactly, whatever umask the daemon was started under
  (pjdfstest chmod/12, open/02, open/03, rename/21);
- ``open(O_TRUNC)`` of a non-empty file updates mtime and ctime (open/00);
- a write by another user clears the set-user-ID and set-group-ID bits (chmod/12);
- ``truncate()`` and ``ftruncate()`` to any length succeed and stick, for text and binary
  files, gates on (truncate/00, ftruncate/00); written text is still gated;
- random writes, truncations and close/reopen agree with a model (``fsx -c``).

The default policy is used (every gate at its default action): these are the cases where
the gates must not get in the way.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, as_nobody, check_clean


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sync(m: Mount) -> None:
    (m.path / ".rw" / "ctl").write_text("sync\n")


def events(m: Mount) -> list[dict]:
    sync(m)
    return [json.loads(x) for x in (m.path / ".rw" / "journal").read_text().splitlines()]


def mode_of(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def start_under_umask(m: Mount, umask: int) -> Mount:
    """Start the daemon with this umask (it inherits the test process's)."""
    old = os.umask(umask)
    try:
        return m.start()
    finally:
        os.umask(old)


@pytest.fixture
def shared_top() -> Iterator[Path]:
    """A directory other users can enter (pytest's own are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="rwfs-posix-exact-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---- modes ----

FILE_MODES = (0o4777, 0o2755, 0o6777, 0o666, 0o620, 0o600, 0o1644)
# (mkdir(2) ignores a set-group-ID bit in its mode: the parent's decides.)
DIR_MODES = (0o777, 0o1777, 0o700, 0o750)


def _made_modes(root: Path, caller_umask: int) -> dict[str, int]:
    """Make files, directories and nodes under ``caller_umask``; their modes."""
    got: dict[str, int] = {}
    old = os.umask(caller_umask)
    try:
        for n, mode in enumerate(FILE_MODES):
            os.close(os.open(root / f"f{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
            got[f"f{n}"] = mode
            with open(
                os.open(root / f"w{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode), "wb"
            ) as f:
                f.write(b"written at create\n")  # a stage and a commit replace the inode
            got[f"w{n}"] = mode
        for n, mode in enumerate(DIR_MODES):
            os.mkdir(root / f"d{n}", mode)
            got[f"d{n}"] = mode
        for n, mode in enumerate((0o666, 0o640, 0o4755)):
            os.mknod(root / f"p{n}", stat.S_IFIFO | mode)
            got[f"p{n}"] = mode
            os.mknod(root / f"c{n}", stat.S_IFCHR | mode, os.makedev(1, 3))
            got[f"c{n}"] = mode
    finally:
        os.umask(old)
    return got


@pytest.mark.parametrize("daemon_umask", [0o022, 0o077])
def test_modes_are_the_callers_whatever_the_daemons_umask(
    tmp_path: Path, daemon_umask: int
) -> None:
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    plain = tmp_path / "plain"  # the same calls on the backing filesystem itself
    m = start_under_umask(Mount(ws, mp), daemon_umask)
    try:
        for caller_umask in (0, 0o022):
            (mp / f"u{caller_umask:o}").mkdir()
            (plain / f"u{caller_umask:o}").mkdir(parents=True)
            asked = _made_modes(mp / f"u{caller_umask:o}", caller_umask)
            _made_modes(plain / f"u{caller_umask:o}", caller_umask)
            sync(m)
            for name, mode in asked.items():
                want = mode & ~caller_umask
                assert mode_of(plain / f"u{caller_umask:o}" / name) == want  # ext4 alone
                for root in (mp, ws):  # the mount, and its raw tree
                    got = mode_of(root / f"u{caller_umask:o}" / name)
                    assert got == want, (
                        f"{root.name}/{name}: mode {got:o}, asked {mode:o} under umask "
                        f"{caller_umask:o} (daemon umask {daemon_umask:o})"
                    )
        # A hard link and a rename keep the mode (pjdfstest rename/21).
        os.link(mp / "u0" / "w0", mp / "u0" / "w0.link")
        os.rename(mp / "u0" / "f0", mp / "u0" / "f0.moved")
        assert mode_of(mp / "u0" / "f0.moved") == 0o4777
        assert mode_of(mp / "u0" / "w0.link") == 0o4777
    finally:
        m.stop()
    check_clean(m)
    # rwfs's own state keeps its own modes, named in the code, not the daemon's umask.
    rw = ws / ".rw"
    want_state = {
        rw: 0o700,
        rw / "journal": 0o700,
        rw / "journal" / "data.mdb": 0o600,
        rw / "journal" / "lock.mdb": 0o600,
        rw / "staging": 0o700,
        rw / "intents": 0o700,
        rw / "objects": 0o700,
        rw / "objects" / "incoming": 0o700,
        rw / "lock": 0o600,
        rw / "policy.toml": 0o600,
    }
    for p, want in want_state.items():
        assert mode_of(p) == want, f"{p}: {mode_of(p):o}, want {want:o}"
    for sub in (rw / "objects").iterdir():  # (an object linked from a file keeps its mode)
        assert mode_of(sub) == 0o700
    assert all(mode_of(p) == 0o600 for p in (rw / "intents").iterdir())


# ---- times ----


def test_o_trunc_updates_mtime_and_ctime(mount: Mount) -> None:
    M = mount.path
    # Spare inodes (a new file's placeholder, replaced by its first commit) become later
    # stages: an O_TRUNC open must not show a spare's older times (pjdfstest open/00).
    for i in range(4):
        (M / f"new{i}.txt").write_bytes(b"new\n")
    sync(mount)
    time.sleep(0.01)  # the clock moves on (coarse ticks): the spares are older
    (M / "f.txt").write_bytes(b"some bytes\n" * 10)
    sync(mount)
    before = os.stat(M / "f.txt")
    time.sleep(0.01)
    fd = os.open(M / "f.txt", os.O_WRONLY | os.O_TRUNC)
    try:
        opened = os.fstat(fd)
    finally:
        os.close(fd)
    for st in (opened, os.stat(M / "f.txt")):
        assert st.st_size == 0
        assert st.st_mtime_ns > before.st_mtime_ns, "O_TRUNC did not update mtime"
        assert st.st_ctime_ns > before.st_ctime_ns, "O_TRUNC did not update ctime"
    sync(mount)  # the truncation is committed: the committed file keeps the new mtime
    after = os.stat(M / "f.txt")
    assert after.st_size == 0 and after.st_mtime_ns > before.st_mtime_ns


# ---- set-user-ID and set-group-ID bits ----


def test_a_write_by_another_user_clears_setuid_and_setgid(shared_top: Path) -> None:
    ws = shared_top / "ws"
    ws.mkdir(mode=0o777)
    ws.chmod(0o777)
    m = Mount(ws, options=("allow_other",)).start()
    try:
        for name in ("write", "truncate", "by-owner", "sgid-no-x"):
            p = ws / name
            p.write_bytes(b"line\n" * 5)
            os.chmod(p, 0o6777 if name != "sgid-no-x" else 0o2766)
        res = as_nobody(f"printf 'more\\n' >> {ws}/write")
        assert res.returncode == 0, res.stderr
        res = as_nobody(f"truncate -s 2 {ws}/truncate")
        assert res.returncode == 0, res.stderr
        res = as_nobody(f"printf 'more\\n' >> {ws}/sgid-no-x")
        assert res.returncode == 0, res.stderr
        with open(ws / "by-owner", "ab") as f:  # root: CAP_FSETID keeps the bits
            f.write(b"more\n")
        want = {"write": 0o0777, "truncate": 0o0777, "by-owner": 0o6777, "sgid-no-x": 0o2766}
        sync(m)
        for name, mode in want.items():
            assert mode_of(ws / name) == mode, f"{name}: {mode_of(ws / name):o}"
        assert (ws / "write").read_bytes() == b"line\n" * 5 + b"more\n"
        assert (ws / "truncate").read_bytes() == b"li"
    finally:
        m.stop()
    check_clean(m)
    for name, mode in want.items():  # the raw tree, after the commits
        assert mode_of(ws / name) == mode, f"raw {name}: {mode_of(ws / name):o}"


def test_a_file_created_by_another_user_keeps_the_setuid_bit_it_asked_for(
    shared_top: Path,
) -> None:
    ws = shared_top / "ws"
    ws.mkdir(mode=0o777)
    ws.chmod(0o777)
    m = Mount(ws, options=("allow_other",)).start()
    try:
        (ws / "sg").mkdir()
        os.chown(ws / "sg", 0, 4242)
        os.chmod(ws / "sg", 0o2777)
        code = (
            "import os; os.umask(0); "
            f"os.close(os.open('{ws}/mine', os.O_CREAT | os.O_WRONLY, 0o4755)); "
            f"os.mknod('{ws}/fifo', 0o10000 | 0o4640); "
            f"os.close(os.open('{ws}/sg/f', os.O_CREAT | os.O_WRONLY, 0o644)); "
            f"os.mkdir('{ws}/sg/d', 0o755)"
        )
        res = as_nobody(f'python3 -c "{code}"')
        assert res.returncode == 0, res.stderr
        for name, mode in (("mine", 0o4755), ("fifo", 0o4640)):
            st = os.lstat(ws / name)
            assert (st.st_uid, st.st_gid) == (65534, 65534)
            assert stat.S_IMODE(st.st_mode) == mode, f"{name}: {stat.S_IMODE(st.st_mode):o}"
        # In a set-group-ID directory: the directory's group; a subdirectory inherits
        # the bit (as on ext4).
        for name, mode in (("sg/f", 0o644), ("sg/d", 0o2755)):
            st = os.lstat(ws / name)
            assert (st.st_uid, st.st_gid) == (65534, 4242), name
            assert stat.S_IMODE(st.st_mode) == mode, f"{name}: {stat.S_IMODE(st.st_mode):o}"
    finally:
        m.stop()
    check_clean(m)


# ---- explicit truncation ----

TEXT = b"".join(b"line %d of a text file the gates know how to read\n" % n for n in range(200))
BINARY = random.Random(16).randbytes(20_000) + b"\0"  # random bytes (with a NUL)


def _kept(ws: Path, digest: str) -> bool:
    h = digest.split(":")[1]
    return (ws / ".rw" / "objects" / h[:2] / h[2:]).exists()


@pytest.mark.parametrize("how", ["truncate", "ftruncate"])
def test_truncate_to_any_length_succeeds_and_sticks(workspace: Path, how: str) -> None:
    lengths = {"one": 1, "zero": 0, "larger": 50_000, "half": 5_000}
    files = {
        f"{kind}-{n}.txt": (data, ln)
        for kind, data in (("text", TEXT), ("bin", BINARY))
        for n, ln in lengths.items()
    }
    for name, (data, _) in files.items():
        (workspace / name).write_bytes(data)
    m = Mount(workspace).start()
    try:
        for name, (_, length) in files.items():
            if how == "truncate":
                os.truncate(m.path / name, length)  # a commit of its own
            else:
                fd = os.open(m.path / name, os.O_RDWR)
                try:
                    os.ftruncate(fd, length)
                finally:
                    os.close(fd)  # the commit point: must not fail
        want = {
            n: (d[:ln] + b"\0" * (ln - len(d)) if ln > len(d) else d[:ln])
            for n, (d, ln) in files.items()
        }
        for name, data in want.items():
            assert (m.path / name).read_bytes() == data, name
        evs = [e for e in events(m) if e["op"] == "write"]
        for name, (data, _) in files.items():
            got = [e for e in evs if e["path"] == name]
            assert [(e["expected"], e["intended"]) for e in got] == [
                (sha(data), sha(want[name]))
            ], name
        status = json.loads((m.path / ".rw" / "status").read_text())
        assert status["counts"]["refusals"] == 0
    finally:
        m.stop()
    check_clean(m)
    for name, (data, _) in files.items():
        assert (workspace / name).read_bytes() == want[name]
        assert _kept(workspace, sha(data)), f"{name}: the pre-image is not kept (no undo)"
    _holds_after_remount(workspace, want)


def _holds_after_remount(workspace: Path, want: dict[str, bytes]) -> None:
    """Mounted again, the mount shows each file's bytes (and the daemon ends clean)."""
    m = Mount(workspace).start()
    try:
        for name, data in want.items():
            assert (m.path / name).read_bytes() == data, name
    finally:
        m.stop()
    check_clean(m)


def test_written_text_is_still_judged_around_truncations(mount: Mount) -> None:
    M = mount.path
    for name in ("cut-off.txt", "cut-then-write.txt", "write-then-cut.txt", "trunc-write.txt"):
        (M / name).write_bytes(TEXT)
    sync(mount)
    # O_TRUNC and a write of a prefix: written text cut off, refused at close().
    with pytest.raises(OSError) as exc:
        with open(M / "cut-off.txt", "wb") as f:
            f.write(TEXT[:300])
    assert exc.value.errno == 74  # EBADMSG
    # An ftruncate, then a write: written text again, judged (decided: the last change
    # decides, docs/gates.md).
    with pytest.raises(OSError) as exc:
        fd = os.open(M / "cut-then-write.txt", os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, TEXT[:300])
        finally:
            os.close(fd)
    assert exc.value.errno == 74
    # A write, then an ftruncate to the length the writer chose: the cut is deliberate.
    fd = os.open(M / "write-then-cut.txt", os.O_RDWR)
    try:
        os.pwrite(fd, b"LINE 0 REWRITTEN\n", 0)
        os.ftruncate(fd, 300)
    finally:
        os.close(fd)
    # truncate(2) of a file open elsewhere: committed at its last close, never refused.
    fd = os.open(M / "trunc-write.txt", os.O_RDONLY)
    os.truncate(M / "trunc-write.txt", 10)
    os.close(fd)
    sync(mount)
    assert (M / "cut-off.txt").read_bytes() == TEXT
    assert (M / "cut-then-write.txt").read_bytes() == TEXT
    assert (M / "write-then-cut.txt").read_bytes() == (b"LINE 0 REWRITTEN\n" + TEXT[17:])[:300]
    assert (M / "trunc-write.txt").read_bytes() == TEXT[:10]


def test_binary_content_is_not_judged_by_text_rules(mount: Mount) -> None:
    M = mount.path
    (M / "blob.txt").write_bytes(BINARY)
    (M / "blob2.txt").write_bytes(BINARY)
    (M / "data.json").write_text(json.dumps({"k": list(range(400))}, indent=1))
    sync(mount)
    # Binary bytes rewritten as a prefix of themselves: no truncation gate.
    (M / "blob.txt").write_bytes(BINARY[:100])
    # Binary bytes replaced by a placeholder line: no elision gate.
    (M / "blob2.txt").write_bytes(b"header\n# ... rest of the file unchanged ...\n")
    sync(mount)
    assert (M / "blob.txt").read_bytes() == BINARY[:100]
    assert (M / "blob2.txt").read_bytes() == b"header\n# ... rest of the file unchanged ...\n"
    assert json.loads((M / ".rw" / "status").read_text())["counts"]["refusals"] == 0
    # A text file turned binary is a text file broken (decided: the old bytes say what
    # the file is): valid JSON overwritten with binary bytes is refused.
    with pytest.raises(OSError) as exc:
        (M / "data.json").write_bytes(b"\0\1\2 not json at all")
    assert exc.value.errno == 74


# ---- fsx-like: random writes, truncations, close and reopen against a model ----


def _fsx(path: Path, seed: int, ops: int, binary: bool) -> bytes:
    rng = random.Random(seed)
    model = bytearray(path.read_bytes())
    fd = os.open(path, os.O_RDWR)
    try:
        for n in range(ops):
            op = rng.choice(
                ("write", "write", "truncate", "truncate", "reopen", "reopen_trunc", "read")
            )
            if op == "write":
                off = rng.randrange(0, len(model) + 2000)
                if binary:
                    data = rng.randbytes(rng.randrange(1, 3000))
                else:
                    data = b"".join(
                        b"op %d seed %d %s\n" % (n, seed, rng.choice((b"a", b"bb", b"ccc")))
                        for _ in range(rng.randrange(1, 40))
                    )
                assert os.pwrite(fd, data, off) == len(data)
                if off > len(model):
                    model.extend(b"\0" * (off - len(model)))
                model[off : off + len(data)] = data
            elif op == "truncate":
                length = rng.randrange(0, len(model) + 3000)
                os.ftruncate(fd, length)
                if length < len(model):
                    del model[length:]
                else:
                    model.extend(b"\0" * (length - len(model)))
            elif op in ("reopen", "reopen_trunc"):
                os.close(fd)  # a commit point: a call that succeeded is never undone
                flags = os.O_RDWR | (os.O_TRUNC if op == "reopen_trunc" else 0)
                fd = os.open(path, flags)
                if op == "reopen_trunc":
                    model.clear()
                assert os.pread(fd, len(model) + 1, 0) == bytes(model), f"op {n}: {op}"
            else:
                assert os.pread(fd, len(model) + 1, 0) == bytes(model), f"op {n}: read"
            assert os.fstat(fd).st_size == len(model), f"op {n}: {op}: size"
    finally:
        os.close(fd)
    return bytes(model)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_fsx_like_close_reopen_around_truncates(workspace: Path, binary: bool) -> None:
    start = TEXT if not binary else BINARY
    for i in range(3):
        (workspace / f"fsx{i}.txt").write_bytes(start)
    m = Mount(workspace).start()
    try:
        want = {f"fsx{i}.txt": _fsx(m.path / f"fsx{i}.txt", 100 + i, 150, binary) for i in range(3)}
        for name, data in want.items():
            assert (m.path / name).read_bytes() == data
        sync(m)
        status = json.loads((m.path / ".rw" / "status").read_text())
        assert status["counts"]["refusals"] == 0
    finally:
        m.stop()
    check_clean(m)
    _holds_after_remount(workspace, want)


def test_the_daemon_runs_with_umask_0(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    m = start_under_umask(Mount(ws), 0o077)
    try:
        assert m.proc is not None  # --foreground: the daemon is this process
        with open(f"/proc/{m.proc.pid}/status") as f:
            umask = next(line.split()[1] for line in f if line.startswith("Umask:"))
        assert int(umask, 8) == 0
    finally:
        m.stop()
    check_clean(m)
