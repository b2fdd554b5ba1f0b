"""The mount's basic contract: reads and writes, the journal, the control directory."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import mmap
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import Mount, check_clean, mounted_beside


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def journal(m: Mount) -> list[dict]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    return [json.loads(line) for line in (m.path / ".rw" / "journal").read_text().splitlines()]


def test_write_is_journaled_with_expected_and_intended_digests(workspace: Path) -> None:
    (workspace / "a.txt").write_bytes(b"old\n")
    m = Mount(workspace).start()
    try:
        (m.path / "a.txt").write_bytes(b"new bytes\n")
        assert (m.path / "a.txt").read_bytes() == b"new bytes\n"
        writes = [e for e in journal(m) if e["op"] == "write" and e["path"] == "a.txt"]
        assert len(writes) == 1
        assert writes[0]["expected"] == sha(b"old\n")
        assert writes[0]["intended"] == sha(b"new bytes\n")
        assert writes[0]["comm"] and writes[0]["pid"] == os.getpid()
    finally:
        m.stop()
    check_clean(m)
    # Unmounted: the raw tree holds the committed bytes and the old ones are an object.
    assert (workspace / "a.txt").read_bytes() == b"new bytes\n"
    old = sha(b"old\n").split(":")[1]
    assert (workspace / ".rw" / "objects" / old[:2] / old[2:]).read_bytes() == b"old\n"


def test_an_unmount_meeting_a_request_being_read_ends_cleanly(tmp_path: Path) -> None:
    """Closing many files right before an unmount sends RELEASEs the unmount races: Linux
    may fail the read of one with ECONNABORTED (seen in a third of such unmounts here).
    The daemon must take that as the end of the session: exit 0, no traceback, and every
    write it acknowledged committed to the tree."""
    for round in range(8):
        ws = tmp_path / f"ws{round}"
        ws.mkdir()
        for i in range(100):
            (ws / f"f{i}.txt").write_text("x\n")
        m = Mount(ws).start()
        proc = m.proc
        assert proc is not None
        (ws / "a.txt").write_text(f"round {round}\n")
        fds = [os.open(ws / f"f{i}.txt", os.O_RDONLY) for i in range(100)]
        for fd in fds:
            os.close(fd)
        m.stop()
        assert proc.returncode == 0, m.log_text()
        check_clean(m)
        assert (ws / "a.txt").read_text() == f"round {round}\n"


def test_rewriting_the_same_bytes_is_a_noop(mount: Mount) -> None:
    f = mount.path / "same.txt"
    f.write_bytes(b"x\n")
    f.write_bytes(b"x\n")
    ops = [e["op"] for e in journal(mount) if e["path"] == "same.txt"]
    assert ops == ["create", "write", "noop"]
    status = json.loads((mount.path / ".rw" / "status").read_text())
    assert status["counts"]["noops"] == 1
    assert status["counts"]["commits"] == 1


def test_control_directory_is_hidden_but_reachable(mount: Mount) -> None:
    assert ".rw" not in os.listdir(mount.path)
    names = set(os.listdir(mount.path / ".rw"))
    assert {"README", "status", "journal", "policy.toml", "ctl", "last-error"} <= names
    status = json.loads((mount.path / ".rw" / "status").read_text())
    assert status["pid"] == mount.proc.pid
    assert "journal" in (mount.path / ".rw" / "README").read_text()


def test_show_control_lists_it(workspace: Path) -> None:
    m = Mount(workspace, options=("show_control",)).start()
    try:
        assert ".rw" in os.listdir(m.path)
    finally:
        m.stop()


def test_invalid_policy_is_refused_and_old_one_kept(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    before = pol.read_text()
    with pytest.raises(OSError) as err:
        with open(pol, "w") as f:
            f.write('durability = "sometimes"\n')
    assert err.value.errno == 22  # EINVAL
    assert pol.read_text() == before
    env = json.loads((mount.path / ".rw" / "last-error").read_text())
    assert env["ok"] is False and env["errno"] == "EINVAL" and "durability" in env["message"]
    with open(pol, "w") as f:
        f.write(before.replace('durability = "group"', 'durability = "strict"'))
    assert json.loads((mount.path / ".rw" / "status").read_text())["durability"] == "strict"


def test_policy_written_by_a_shell_redirect(mount: Mount) -> None:
    # Regression: bash closes a duplicate descriptor before writing; that empty flush must
    # not apply an empty policy.
    pol = mount.path / ".rw" / "policy.toml"
    text = pol.read_text().replace("commit_interval_ms = 500", "commit_interval_ms = 250")
    res = subprocess.run(["bash", "-c", f"cat > '{pol}'"], input=text, text=True)
    assert res.returncode == 0
    assert "commit_interval_ms = 250" in pol.read_text()
    res = subprocess.run(["bash", "-c", f"printf 'durability = \"strict\"\\n' > '{pol}'"])
    assert res.returncode == 0
    assert json.loads((mount.path / ".rw" / "status").read_text())["durability"] == "strict"
    assert pol.read_text() == 'durability = "strict"\n'


def test_passthrough_paths_are_not_journaled(mount: Mount) -> None:
    (mount.path / "build").mkdir()
    (mount.path / "build" / "out.o").write_bytes(b"obj")
    (mount.path / "app.log").write_bytes(b"log line\n")
    paths = {e["path"] for e in journal(mount)}
    assert "build/out.o" not in paths and "app.log" not in paths
    assert (mount.path / "build" / "out.o").read_bytes() == b"obj"


def test_second_mount_is_refused(mount: Mount) -> None:
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "rwfs.cli", "mount", "--foreground", str(mount.workspace)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1
    assert "already" in res.stderr


def test_rename_onto_a_journaled_path_is_a_commit_of_that_path(workspace: Path) -> None:
    (workspace / "conf.ini").write_bytes(b"a = 1\n")
    m = Mount(workspace).start()
    try:
        tmp = m.path / ".conf.ini.tmp"
        tmp.write_bytes(b"a = 2\n")
        os.replace(tmp, m.path / "conf.ini")
        ren = [e for e in journal(m) if e["op"] == "rename"]
        assert len(ren) == 1
        assert ren[0]["dest"] == "conf.ini" and ren[0]["batch"].startswith("auto-")
        assert (ren[0]["expected"], ren[0]["intended"]) == (sha(b"a = 1\n"), sha(b"a = 2\n"))
        status = json.loads((m.path / ".rw" / "status").read_text())
        assert status["counts"]["commits"] == 2  # the temp file's write, then the rename
    finally:
        m.stop()
    check_clean(m)
    from rwfs.journal.store import Store

    store = Store(str(workspace / ".rw" / "journal"))
    try:
        receipts = [r for r in store.receipts() if r["path"] == "conf.ini"]
        assert [(r["state"], r["expected"], r["intended"]) for r in receipts] == [
            ("committed", sha(b"a = 1\n"), sha(b"a = 2\n"))
        ]
    finally:
        store.close()
    old = sha(b"a = 1\n").split(":")[1]
    assert (workspace / ".rw" / "objects" / old[:2] / old[2:]).read_bytes() == b"a = 1\n"


def test_streamed_hash_matches_the_bytes_after_any_write_pattern(mount: Mount) -> None:
    """A stage past 8 MiB is hashed by a thread that follows its writes; any write into
    what it has read, a truncate or a reopen must still give the journal the digest of the
    bytes on disk."""
    import hashlib
    import json as _json
    import time

    mib = 1 << 20
    f = mount.path / "big.bin"
    ordered = [(k * mib, bytes([65 + k]) * mib) for k in range(12)]
    patterns: dict[str, list[tuple[int, bytes | float]]] = {
        "in order": [(0, b"a" * mib), (mib, b"b" * mib)],
        "rewrite inside": [(0, b"a" * mib), (mib, b"b" * mib), (mib // 2, b"c" * 100_000)],
        "gap then fill": [(mib, b"b" * mib), (0, b"a" * mib)],
        "small then large": [(0, b"s" * 10), (10, b"L" * mib)],
        "large in order": [*ordered],
        "large, then a rewrite of what was hashed": [*ordered, (0, 0.3), (mib + 5, b"r" * 999)],
        "large, then a rewrite near the end": [*ordered, (11 * mib + 7, b"e" * 4096)],
        "large, out of order": [*ordered[6:], *ordered[:6], (3 * mib, b"x" * mib)],
        "large with a hole": [(0, b"h" * mib), (20 * mib, b"t" * mib)],
    }

    def check(what: str) -> None:
        (mount.path / ".rw" / "ctl").write_text("sync\n")
        want = "sha256:" + hashlib.sha256(f.read_bytes()).hexdigest()
        events = [_json.loads(x) for x in (mount.path / ".rw" / "journal").read_text().splitlines()]
        last = [e for e in events if e.get("path") == "big.bin" and e["op"] == "write"][-1]
        assert last["intended"] == want, what

    def trailed() -> int:
        stats = _json.loads((mount.path / ".rw" / "stats").read_text())
        return int(stats["counts"].get("trailing_hashes", 0))

    used = {}
    for name, writes in patterns.items():
        before = trailed()
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for off, data in writes:
                if isinstance(data, float):
                    time.sleep(data)  # let the hashing thread catch up
                else:
                    os.pwrite(fd, data, off)
        finally:
            os.close(fd)
        check(name)
        used[name] = trailed() - before
        if name in ("in order", "large in order"):  # then: truncate, and append again
            with open(f, "r+b") as out:
                out.truncate(mib // 3)
            check("truncated")
            with open(f, "ab") as out:
                out.write(b"z" * mib)
            check("appended")
    # Written strictly front to back, however far behind the hashing thread runs: the
    # seal reads nothing again (the others may or may not, as the thread keeps up).
    assert used["large in order"] == 1, used
    assert used["large with a hole"] == 1, used
    # Most of these writes went from the request straight into the stage (the C path,
    # which must still tell the trailing hash about each one).
    status = _json.loads((mount.path / ".rw" / "status").read_text())
    assert status["fast_writes"] > 40


def test_a_commit_leaves_its_directorys_times_alone(tmp_path: Path) -> None:
    """Rewriting a file leaves its directory's times alone, as on a plain filesystem,
    though the commit renames a stage into the directory. Times set on the directory
    while a commit into it is queued (tar, cp -a) are kept; a new entry moves them."""
    ws, mp, m = mounted_beside(tmp_path)

    def sync() -> None:
        (mp / ".rw" / "ctl").write_text("sync\n")

    try:
        d = mp / "d"
        d.mkdir()
        (d / "f.txt").write_text("one\n")
        sync()
        os.utime(d, ns=(1_000_000_000, 2_000_000_000))
        (d / "f.txt").write_text("two\n")
        sync()
        st = os.stat(ws / "d")  # the raw tree, beside the mount point
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_000)

        (d / "f.txt").write_text("three\n")  # queued: the group has not run yet
        os.utime(d, ns=(3_000_000_000, 4_000_000_000))
        sync()
        assert (ws / "d" / "f.txt").read_text() == "three\n"
        st = os.stat(ws / "d")
        assert (st.st_atime_ns, st.st_mtime_ns) == (3_000_000_000, 4_000_000_000)

        (d / "g.txt").write_text("new\n")  # a new entry: the directory's own change
        sync()
        assert os.stat(ws / "d").st_mtime_ns > 4_000_000_000
    finally:
        m.stop()
    check_clean(m)


def test_a_new_files_empty_inode_is_reused_as_a_later_stage(tmp_path: Path) -> None:
    """A new file's first commit replaces the empty file its create made; rwfs keeps that
    inode for the next stage rather than freeing it (see Stages.spare_link). The file
    the inode then becomes carries nothing of its past: no xattrs, its own mode, new times."""
    ws, mp, m = mounted_beside(tmp_path)

    def sync() -> None:
        (mp / ".rw" / "ctl").write_text("sync\n")

    try:
        (mp / "zero.txt").write_text("0\n")  # its empty inode is kept: the empty object
        sync()
        first, second = mp / "first.txt", mp / "second.txt"
        fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        placeholder = os.stat(ws / "first.txt").st_ino  # the raw tree, beside the mount
        os.setxattr(first, "user.origin", b"first")  # set on the empty file itself
        os.write(fd, b"first\n")
        os.close(fd)
        sync()
        assert os.stat(ws / "first.txt").st_ino != placeholder  # the stage replaced it
        time.sleep(0.1)

        fd = os.open(second, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        born = os.stat(ws / "second.txt").st_ctime_ns  # file times' own (coarse) clock
        os.write(fd, b"second\n")
        os.close(fd)
        sync()
        assert os.stat(ws / "second.txt").st_ino == placeholder, "the empty inode was not reused"
        assert (first.read_bytes(), second.read_bytes()) == (b"first\n", b"second\n")
        assert os.getxattr(first, "user.origin") == b"first"
        assert [a for a in os.listxattr(second) if a.startswith("user.")] == []
        st = os.stat(second)
        assert stat.S_IMODE(st.st_mode) == 0o640
        assert st.st_atime_ns >= born and st.st_mtime_ns >= born
    finally:
        m.stop()
    check_clean(m)


def test_saves_by_rename_take_spare_inodes_and_a_clean_unmount_leaves_none(
    tmp_path: Path,
) -> None:
    """A save by temp + rename frees no empty inode (the temporary's placeholder is a
    removed file, kept as an object), so its stages take spares made beforehand in a
    thread (Stages.keep_spares) instead of allocating an inode while the writer waits.
    They are taken like any spare, and an unmount removes those left."""
    ws, mp, m = mounted_beside(tmp_path)
    try:
        f = mp / "f.py"
        f.write_text("x = 1\n" * 50)
        (mp / ".rw" / "ctl").write_text("sync\n")
        deadline = time.monotonic() + 60  # the spares are made meanwhile, in a thread
        while len(os.listdir(ws / ".rw" / "staging")) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(100):
            tmp = mp / f".f.py.{i}.tmp"
            tmp.write_text("x = 1\n" * 50 + f"y = {i}\n")
            os.replace(tmp, f)
        assert f.read_text().endswith("y = 99\n")
        (mp / ".rw" / "ctl").write_text("sync\n")
        counts = json.loads((mp / ".rw" / "stats").read_text())["counts"]
        assert counts.get("spares_reused", 0) >= 90, counts
        assert os.listdir(ws / ".rw" / "staging"), "no spare is kept while mounted"
    finally:
        m.stop()
    check_clean(m)
    assert os.listdir(ws / ".rw" / "staging") == []


def _fallocate(fd: int, mode: int, off: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(length)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_fallocate_is_a_journaled_change_committed_at_close(mount: Mount) -> None:
    f = mount.path / "notes.txt"
    old = b"line\n" * 2000
    f.write_bytes(old)

    def writes() -> list[tuple[str, str]]:
        events = journal(mount)
        return [(e["expected"], e["intended"]) for e in events if e["op"] == "write"]

    fd = os.open(f, os.O_RDWR)
    try:
        _fallocate(fd, 0x01 | 0x02, 0, 4096)  # KEEP_SIZE | PUNCH_HOLE
        assert writes() == [(sha(b""), sha(old))]  # staged until the commit point
    finally:
        os.close(fd)
    new = b"\0" * 4096 + old[4096:]
    assert f.read_bytes() == new
    assert writes() == [(sha(b""), sha(old)), (sha(old), sha(new))]


def test_fallocate_that_breaks_a_file_is_refused_at_close(mount: Mount) -> None:
    f = mount.path / "mod.py"
    old = b"def f():\n    return 1\n"
    f.write_bytes(old)
    fd = os.open(f, os.O_RDWR)
    os.posix_fallocate(fd, 0, 4096)  # pads the file with NUL bytes: it no longer parses
    with pytest.raises(OSError) as refused:
        os.close(fd)
    assert refused.value.errno == errno.EBADMSG
    assert f.read_bytes() == old
    drafts = os.listdir(mount.path / ".rw" / "rejected")
    assert any(
        (mount.path / ".rw" / "rejected" / d).read_bytes() == old + b"\0" * (4096 - len(old))
        for d in drafts
    )


def test_fallocate_and_seek_on_control_files(mount: Mount) -> None:
    policy = mount.path / ".rw" / "policy.toml"
    text = policy.read_bytes()
    fd = os.open(policy, os.O_RDWR)
    try:
        with pytest.raises(OSError) as exc:
            _fallocate(fd, 0, 0, 10)
        assert exc.value.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert policy.read_bytes() == text
    fd = os.open(mount.path / ".rw" / "README", os.O_RDONLY)
    try:
        size = len(os.read(fd, 1 << 20))  # control files report size 0 and read as /proc's
        assert size > 5
        assert os.lseek(fd, 5, os.SEEK_DATA) == 5
        assert os.lseek(fd, 5, os.SEEK_HOLE) == size
        with pytest.raises(OSError) as exc:
            os.lseek(fd, size, os.SEEK_DATA)
        assert exc.value.errno == errno.ENXIO
    finally:
        os.close(fd)


def test_every_journal_event_has_the_specs_fields(mount: Mount) -> None:
    (mount.path / "d").mkdir()
    (mount.path / "d" / "a.txt").write_text("a\n")
    os.chmod(mount.path / "d" / "a.txt", 0o600)
    os.symlink("a.txt", mount.path / "d" / "s")
    os.rename(mount.path / "d", mount.path / "e")
    (mount.path / "e" / "s").unlink()
    (mount.path / "e" / "a.txt").unlink()
    (mount.path / "e").rmdir()
    events = journal(mount)
    assert {e["op"] for e in events} >= {"mkdir", "create", "write", "setattr", "symlink"}
    assert {e["op"] for e in events} >= {"rename", "unlink", "rmdir"}
    fields = ("lsn", "ts", "op", "path", "batch", "expected", "intended", "size")
    for e in events:  # SPEC §7.1: "at least" these, null where they do not apply
        assert all(k in e for k in (*fields, "pid", "comm", "uid")), e
    mkdir = next(e for e in events if e["op"] == "mkdir")
    assert (mkdir["batch"], mkdir["expected"], mkdir["intended"], mkdir["size"]) == (None,) * 4
    assert mkdir["pid"] == os.getpid()


def test_a_file_written_while_hard_linked_is_no_drift_for_fsck(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        a = m.path / "a.txt"
        a.write_text("one\n")
        os.link(a, m.path / "b.txt")
        (m.path / "b.txt").write_text("two\n")  # one file, two names: written in place
        os.unlink(m.path / "b.txt")
        assert a.read_text() == "two\n"
    finally:
        m.stop()
    res = m.fsck()
    assert res.returncode == 0, res.stdout + res.stderr
    m.start()  # once it has one name again, its commits are journaled again
    try:
        (m.path / "a.txt").write_text("three\n")
        writes = [e for e in journal(m) if e["op"] == "write" and e["path"] == "a.txt"]
        assert writes[-1]["expected"] == sha(b"two\n")
        assert writes[-1]["intended"] == sha(b"three\n")
    finally:
        m.stop()
    check_clean(m)


def test_a_write_through_a_link_is_journaled_for_every_name(workspace: Path) -> None:
    """Two names in two directories, one file: a write through either is a new version of
    both (history, the path index, fsck), a removal of one name keeps its bytes, and its
    undo makes the name again."""
    (workspace / "sub").mkdir()
    (workspace / "a.txt").write_text("one\n")
    m = Mount(workspace).start()
    try:
        a, b = m.path / "a.txt", m.path / "sub" / "b.txt"
        os.link(a, b)
        b.write_text("two\n")
        assert a.read_text() == "two\n"
        assert os.stat(workspace / "a.txt").st_ino == os.stat(workspace / "sub" / "b.txt").st_ino
        events = journal(m)
        link = next(e for e in events if e["op"] == "link")
        assert (link["path"], link["source"], link["intended"]) == (
            "sub/b.txt",
            "a.txt",
            sha(b"one\n"),
        )
        (write,) = [e for e in events if e["op"] == "write"]
        assert (write["expected"], write["intended"]) == (sha(b"one\n"), sha(b"two\n"))
        assert sorted([write["path"], *write["links"]]) == ["a.txt", "sub/b.txt"]
        hist = m.path / ".rw" / "history"
        for name in ("a.txt", "sub/b.txt"):
            got = [(hist / name / v).read_text() for v in sorted(os.listdir(hist / name))]
            assert got == ["one\n", "two\n"], name
        os.unlink(a)
        assert b.read_text() == "two\n" and os.stat(b).st_nlink == 1
        (unlink,) = [e for e in journal(m) if e["op"] == "unlink"]
        assert unlink["expected"] == sha(b"two\n")
        (m.path / ".rw" / "ctl").write_text(f"undo {unlink['batch']}\n")
        assert (a.read_text(), b.read_text()) == ("two\n", "two\n")
    finally:
        m.stop()
    check_clean(m)


def test_a_pre_image_shared_with_another_name_is_kept_as_a_copy(tmp_path: Path) -> None:
    """A file linked behind the mount while a stage is open: the commit keeps its old bytes
    and writes the new ones in place, into the inode the other name shares. The kept object
    must be a copy, or it would change with that name."""
    ws, mp, m = mounted_beside(tmp_path)
    try:
        (mp / "a.txt").write_text("one\n")
        with open(mp / "a.txt", "r+") as f:
            f.write("two\n")
            f.flush()  # the write is in the stage
            os.link(ws / "a.txt", ws / "b.txt")  # behind the mount: it does not see this
            os.fsync(f.fileno())  # the commit: it keeps the inode's bytes, "one"
        # In place: the link holds the commit too (a rename would have split it).
        assert os.stat(ws / "a.txt").st_ino == os.stat(ws / "b.txt").st_ino
        assert (ws / "b.txt").read_text() == "two\n"
        writes = [e for e in journal(m) if e["op"] == "write" and e["path"] == "a.txt"]
        assert (writes[-1]["expected"], writes[-1]["links"]) == (sha(b"one\n"), ["b.txt"])
        with open(ws / "b.txt", "r+") as f:
            f.write("TWO\n")  # in place, behind the mount, into the file the commit wrote
        history = mp / ".rw" / "history" / "a.txt"
        first = sorted(os.listdir(history))[0]
        assert (history / first).read_text() == "one\n"  # the kept copy did not change
    finally:
        m.stop()
    res = m.fsck()
    assert "damaged" not in res.stdout, res.stdout


def test_a_commit_queued_while_a_rename_waits_lands_before_it(workspace: Path) -> None:
    """rename(x, y) first settles the commits queued at both names. A commit that x's
    last release queues while the rename waits for y's (a large file: its stage takes a
    while to sync) must be settled too, or it would find x gone (a conflict) and its bytes
    would never reach y. (The kernel holds x's lock through the rename, which keeps most
    commit points out; it sends a release without it.)"""
    m = Mount(workspace).start()
    try:
        x, y = m.path / "x.txt", m.path / "y.txt"
        x.write_text("x old\n")
        journal(m)  # x's first version is in the tree
        y.write_bytes(os.urandom(128 << 20))  # queued, not yet synced
        fd = os.open(x, os.O_RDWR)
        mapped = mmap.mmap(fd, 0)
        os.close(fd)  # nothing written yet: the commit is left to the release
        mapped[:5] = b"x new"
        renamer = threading.Thread(target=os.rename, args=(x, y))
        renamer.start()
        time.sleep(0.02)  # the rename now waits for y's group
        mapped.close()  # written back and released: x's commit is queued meanwhile
        renamer.join(60)
        assert not renamer.is_alive()
        assert y.read_text() == "x new\n" and not x.exists()
        events = journal(m)
        assert [e for e in events if e["op"] == "conflict"] == []
        assert any(e["op"] == "write" and e["intended"] == sha(b"x new\n") for e in events)
    finally:
        m.stop()
    check_clean(m)


@pytest.mark.parametrize("remount", [False, True], ids=["known", "after_remount"])
def test_a_journaled_file_written_through_a_passthrough_link_is_journaled(
    workspace: Path, remount: bool
) -> None:
    """a.txt (journaled) and .git/y (passthrough) are one file. A write through .git/y
    changes a.txt too, so it is journaled, whether the mount knows both names or, after a
    remount, only the one written through: in place, it went around a.txt's journal."""
    (workspace / ".git").mkdir()
    m = Mount(workspace).start()
    try:
        (workspace / "a.txt").write_text("journaled\n")
        os.link(workspace / "a.txt", workspace / ".git" / "y")
        if remount:
            m.stop()
            m = Mount(workspace).start()
        with open(workspace / ".git" / "y", "r+") as f:
            f.write("TWO\n")
        with open(workspace / ".git" / "y", "a") as f:
            f.write("more\n")
        os.truncate(workspace / ".git" / "y", 12)
        assert (workspace / "a.txt").read_text() == "TWO\nnaled\nmo"
    finally:
        m.stop()
    check_clean(m)


def test_a_truncate_right_after_a_rename_onto_a_passthrough_name_holds(workspace: Path) -> None:
    """A write, then a rename onto a passthrough name while the write's commit is still
    queued, then truncate(2): the truncation went in place under that commit, and the
    commit landing undid it (the model test found it)."""
    (workspace / "node_modules").mkdir()
    m = Mount(workspace).start()
    try:
        for n in range(5):
            with open(workspace / f"a{n}", "ab") as f:
                f.write(b"\0")
            os.rename(workspace / f"a{n}", workspace / "node_modules" / f"a{n}")
            os.truncate(workspace / "node_modules" / f"a{n}", 0)
            assert (workspace / "node_modules" / f"a{n}").read_bytes() == b""
        (m.path / ".rw" / "ctl").write_text("sync\n")
        assert all(os.stat(workspace / "node_modules" / f"a{n}").st_size == 0 for n in range(5))
    finally:
        m.stop()
    check_clean(m)
    assert all((workspace / "node_modules" / f"a{n}").read_bytes() == b"" for n in range(5))
