"""Explicit batches, resume and conflicts (SPEC §6.1-6.3), through real FUSE mounts.

A batch holds its writers' commits: the mount shows the new bytes, the real tree keeps the
old ones until ``commit`` (all or nothing) or ``abort``. To look at the real tree while it
is served, a test mounts the workspace at a separate mount point (``Mount(ws, mp)``); the
crash tests mount over the workspace and read the tree while the daemon is dead.

Crash tests arm a batch fault point (``RWFS_FAULT``): the daemon SIGKILLs itself inside the
``commit`` write. After the remount the §6.2 table is checked path by path, the batch's one
notice, ``resume``/``rollback``, and that mounting again adds no second notice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import Mount, as_nobody, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

# ---- helpers ----


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rw(m: Mount) -> Path:
    return m.path / ".rw"


def read_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


def bstatus(m: Mount, name: str) -> dict[str, Any]:
    got: dict[str, Any] = read_json(rw(m) / "batches" / name / "status")
    return got


def paths_of(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["path"]: p for p in st["paths"]}


def listing(m: Mount, sub: str) -> list[str]:
    return sorted(os.listdir(rw(m) / sub))


def last_error(m: Mount) -> dict[str, Any]:
    got: dict[str, Any] = read_json(rw(m) / "last-error")
    return got


def write_ctl(ctl: Path, text: bytes) -> int:
    """Write a verb in one write(); 0 if it succeeded, else the errno it failed with."""
    fd = os.open(ctl, os.O_WRONLY)
    try:
        os.write(fd, text)
        return 0
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)


# Only a guard against a hang, never a measure of speed: a ctl write that has not returned
# after this long is waiting for something that will not come (see ``write_ctl_or_stuck``).
HANG_GUARD_S = 30.0


def write_ctl_or_stuck(m: Mount, ctl: Path, text: bytes) -> tuple[int, bool]:
    """``write_ctl`` for a verb that waits for the group committer (take-intended).

    Returns (errno, stuck): stuck when the write had not returned after the hang guard; a
    ``sync`` then releases it, so that the test can go on and report the hang.
    """
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(write_ctl(ctl, text)), daemon=True)
    t.start()
    t.join(HANG_GUARD_S)
    stuck = t.is_alive()
    if stuck:
        sync(m)
        t.join(HANG_GUARD_S)
    assert result, f"{ctl} is still blocked after a sync"
    return result[0], stuck


def verb(m: Mount, batch: str, text: str | bytes) -> int:
    data = text.encode() if isinstance(text, str) else text
    return write_ctl(rw(m) / "batches" / batch / "ctl", data)


def errno_of(fn: Callable[[], Any]) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno or -1
    return 0


def events(m: Mount) -> list[dict[str, Any]]:
    (rw(m) / "ctl").write_text("sync\n")
    return [json.loads(x) for x in (rw(m) / "journal").read_text().splitlines()]


def writes_of(m: Mount, batch: str) -> list[dict[str, Any]]:
    return [e for e in events(m) if e["op"] == "write" and e.get("batch") == batch]


def notices(m: Mount, batch: str | None = None) -> list[dict[str, Any]]:
    got = [json.loads(x) for x in (rw(m) / "notices").read_text().splitlines()]
    return [n for n in got if batch is None or n.get("batch") == batch]


def poke(m: Mount) -> None:
    """Make ``.rw/last-error`` another error (an invalid policy), so that the next check of
    it sees the envelope of the failure under test, not an older one."""
    assert errno_of(lambda: (rw(m) / "policy.toml").write_text("not = [valid\n")) == errno.EINVAL
    assert last_error(m)["path"] == ".rw/policy.toml"


def sync(m: Mount) -> None:
    (rw(m) / "ctl").write_text("sync\n")


@contextmanager
def mounted(ws: Path, mp: Path | None = None, clean: bool = True, **kw: Any) -> Iterator[Mount]:
    """A mount that is always unmounted; checked clean (no traceback, fsck 0) if the body
    passed (``clean=False``: the caller checks)."""
    m = Mount(ws, mp, **kw).start()
    try:
        yield m
    finally:
        m.stop()
    if clean:
        check_clean(m)


def crash_during(m: Mount, action: Callable[[], int]) -> None:
    """Run ``action`` (a ctl write) on a daemon armed with a fault point: it must die in it."""
    try:
        got = action()
    except OSError:
        got = -1
    if got == 0:
        m.stop()
        raise AssertionError(f"the daemon survived its fault point:\n{m.log_text()}")
    try:
        code = m.wait_dead(30)
    except subprocess.TimeoutExpired:
        m.stop()
        raise AssertionError(f"the daemon did not die:\n{m.log_text()}") from None
    assert code == -9, f"the daemon exited {code}, not by its fault point:\n{m.log_text()}"


def separate(tmp_path: Path) -> tuple[Path, Path]:
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    return ws, mp


def text(name: str, tag: str, lines: int = 6) -> bytes:
    return "".join(f"{name} line {i} {tag}\n" for i in range(lines)).encode()


def edited(name: str) -> bytes:
    """``text(name, "old")`` with one line changed (line 2), as a batch would change it."""
    return text(name, "old").replace(f"{name} line 2 old".encode(), f"{name} line 2 NEW".encode())


# ---- 1. the happy path ----


def test_batch_holds_edits_until_commit_then_writes_all(tmp_path: Path) -> None:
    ws, mp = separate(tmp_path)
    (ws / "sub").mkdir()
    names = ["a.txt", "b.txt", "sub/c.txt", "d.txt", "sub/e.txt"]
    old = {n: text(n, "old") for n in names}
    for n, data in old.items():
        (ws / n).write_bytes(data)
    (ws / "run.log").write_bytes(b"")
    src = tmp_path / "c-new.txt"
    src.write_bytes(text("sub/c.txt", "copied"))
    new = {
        "a.txt": b"alpha rewritten\n" + b"and appended by python\n",
        "b.txt": old["b.txt"] + b"appended by the shell\n",
        "sub/c.txt": src.read_bytes(),
        "d.txt": old["d.txt"][:6] + b"LINE" + old["d.txt"][10:],
        "sub/e.txt": text("sub/e.txt", "fsynced"),
    }
    with mounted(ws, mp) as m:
        os.mkdir(rw(m) / "batches" / "feat")
        assert listing(m, "batches") == ["feat"]
        st = bstatus(m, "feat")
        assert (st["name"], st["state"], st["paths"], st["reasons"]) == ("feat", "open", [], [])
        assert st["scope"] == {"kind": "uid", "uid": os.getuid()}  # its opener's writes

        # Five ordinary writers; a.txt is written twice (the second builds on the draft).
        subprocess.run(["sh", "-c", f"printf 'alpha rewritten\\n' > {mp}/a.txt"], check=True)
        subprocess.run(["sh", "-c", f"echo 'appended by the shell' >> {mp}/b.txt"], check=True)
        subprocess.run(["cp", str(src), str(mp / "sub/c.txt")], check=True)
        with open(mp / "d.txt", "r+b") as f:  # in place, no truncation
            f.seek(6)
            f.write(b"LINE")
        fd = os.open(mp / "sub/e.txt", os.O_WRONLY | os.O_TRUNC)
        os.write(fd, new["sub/e.txt"])
        os.fsync(fd)  # a commit point that waits: held, not written
        os.close(fd)
        with open(mp / "a.txt", "ab") as g:
            g.write(b"and appended by python\n")

        # A passthrough path (*.log) is written in place, batch or not.
        (mp / "run.log").write_bytes(b"logged\n")
        assert (ws / "run.log").read_bytes() == b"logged\n"

        sync(m)  # anything queued would be in the tree now
        for n in names:
            assert (mp / n).read_bytes() == new[n], f"the mount must show the new {n}"
            assert (ws / n).read_bytes() == old[n], f"the real {n} changed before commit"
        assert writes_of(m, "feat") == []

        st = bstatus(m, "feat")
        assert st["state"] == "open"
        assert [p["path"] for p in st["paths"]] == names  # first-written order
        for p in st["paths"]:
            assert p["state"] == "staged"
            assert (p["expected"], p["intended"]) == (sha(old[p["path"]]), sha(new[p["path"]]))
        status = read_json(rw(m) / "status")
        assert status["counts"]["open_batches"] == 1

        diff = (rw(m) / "batches" / "feat" / "diff").read_text()
        for n in names:
            assert f"--- a/{n}\n" in diff and f"+++ b/{n}\n" in diff, f"{n} missing from diff"
        assert "+appended by the shell\n" in diff
        assert "-d.txt line 0 old\n" in diff and "+d.txt LINE 0 old\n" in diff
        assert "+alpha rewritten\n" in diff and "-a.txt line 0 old\n" in diff

        assert verb(m, "feat", "commit\n") == 0
        for n in names:
            assert (ws / n).read_bytes() == new[n], f"{n} not committed"
            assert (mp / n).read_bytes() == new[n]
        st = bstatus(m, "feat")
        assert st["state"] == "committed" and st["reasons"] == []
        for p in st["paths"]:
            assert p["state"] == "committed" and isinstance(p["receipt"], int)
        ws_events = writes_of(m, "feat")
        assert [e["path"] for e in ws_events] == names  # replaced in first-written order
        assert all(e["lsn"] < f["lsn"] for e, f in zip(ws_events, ws_events[1:], strict=False))
        for e in ws_events:
            assert (e["expected"], e["intended"]) == (sha(old[e["path"]]), sha(new[e["path"]]))
        assert read_json(rw(m) / "status")["counts"]["open_batches"] == 0

        # After the commit a write is an ordinary commit again (not held by a finished batch).
        (mp / "a.txt").write_bytes(b"after the batch\n")
        sync(m)
        assert (ws / "a.txt").read_bytes() == b"after the batch\n"
        assert len(writes_of(m, "feat")) == len(names)


# ---- 2. abort and rmdir ----


def test_abort_drops_the_drafts_and_rmdir_removes_only_finished_batches(tmp_path: Path) -> None:
    ws, mp = separate(tmp_path)
    old = {n: text(n, "old") for n in ("x.txt", "y.txt")}
    for n, data in old.items():
        (ws / n).write_bytes(data)
    with mounted(ws, mp) as m:
        os.mkdir(rw(m) / "batches" / "tmp")
        for n in old:
            (mp / n).write_bytes(text(n, "draft"))
        assert (mp / "x.txt").read_bytes() == text("x.txt", "draft")

        assert errno_of(lambda: os.rmdir(rw(m) / "batches" / "tmp")) == errno.EBUSY
        assert listing(m, "batches") == ["tmp"]
        assert last_error(m)["errno"] == "EBUSY"
        assert bstatus(m, "tmp")["state"] == "open"

        assert verb(m, "tmp", "abort\n") == 0
        for n, data in old.items():
            assert (mp / n).read_bytes() == data, f"the mount still shows the draft of {n}"
            assert (ws / n).read_bytes() == data
        st = bstatus(m, "tmp")
        assert st["state"] == "aborted"
        assert [(p["path"], p["state"]) for p in st["paths"]] == [
            ("x.txt", "dropped"),
            ("y.txt", "dropped"),
        ]
        assert writes_of(m, "tmp") == []

        # The batch no longer holds anything: a new write commits on its own.
        (mp / "x.txt").write_bytes(b"plain write\n")
        sync(m)
        assert (ws / "x.txt").read_bytes() == b"plain write\n"
        assert (mp / "x.txt").read_bytes() == b"plain write\n"

        os.rmdir(rw(m) / "batches" / "tmp")
        assert listing(m, "batches") == []
        assert not (rw(m) / "batches" / "tmp" / "status").exists()
        assert errno_of(lambda: os.rmdir(rw(m) / "batches" / "tmp")) == errno.ENOENT

        # A removed name stays taken (the journal's events keep naming that batch), and
        # a committed batch can be removed too.
        assert errno_of(lambda: os.mkdir(rw(m) / "batches" / "tmp")) == errno.EEXIST
        os.mkdir(rw(m) / "batches" / "tmp2")
        assert bstatus(m, "tmp2")["paths"] == []
        (mp / "y.txt").write_bytes(b"second batch\n")
        assert verb(m, "tmp2", "commit\n") == 0
        assert (ws / "y.txt").read_bytes() == b"second batch\n"
        os.rmdir(rw(m) / "batches" / "tmp2")
        assert listing(m, "batches") == []


# ---- 3. a failed dry run writes nothing ----


def test_dry_run_failures_write_nothing_and_keep_the_batch_open(tmp_path: Path) -> None:
    ws, mp = separate(tmp_path)
    names = ["p.txt", "q.txt", "r.txt"]
    old = {n: text(n, "old") for n in names}
    new = {n: text(n, "new") for n in names}
    for n, data in old.items():
        (ws / n).write_bytes(data)
    with mounted(ws, mp) as m:
        # ESTALE: q.txt changed behind rwfs after the batch wrote it.
        os.mkdir(rw(m) / "batches" / "stale")
        for n in names:
            (mp / n).write_bytes(new[n])
        (ws / "q.txt").write_bytes(b"changed by hand\n")
        assert verb(m, "stale", "commit\n") == errno.ESTALE
        assert (ws / "p.txt").read_bytes() == old["p.txt"]
        assert (ws / "q.txt").read_bytes() == b"changed by hand\n"
        assert (ws / "r.txt").read_bytes() == old["r.txt"]
        st = bstatus(m, "stale")
        assert st["state"] == "open"
        assert [r["path"] for r in st["reasons"]] == ["q.txt"]
        assert st["reasons"][0]["reason"] == "conflict"
        assert st["reasons"][0]["actual"] == sha(b"changed by hand\n")
        assert all(p["state"] == "staged" for p in st["paths"])
        err = last_error(m)
        assert (err["ok"], err["errno"], err["batch"]) == (False, "ESTALE", "stale")
        assert "q.txt" in err["message"]
        assert [r["path"] for r in err["details"]["reasons"]] == ["q.txt"]
        assert writes_of(m, "stale") == []
        assert (mp / "p.txt").read_bytes() == new["p.txt"], "the drafts must stay held"

        # Put q.txt back as the batch found it: the next commit goes through.
        (ws / "q.txt").write_bytes(old["q.txt"])
        assert verb(m, "stale", "commit\n") == 0
        for n in names:
            assert (ws / n).read_bytes() == new[n]
        st = bstatus(m, "stale")
        assert st["state"] == "committed" and st["reasons"] == []

        # EPERM: a path became a symlink behind rwfs.
        os.mkdir(rw(m) / "batches" / "swap")
        (mp / "p.txt").write_bytes(b"via the batch\n")
        (ws / "target.txt").write_bytes(b"not to be written through\n")
        os.unlink(ws / "p.txt")
        os.symlink("target.txt", ws / "p.txt")
        assert verb(m, "swap", "commit\n") == errno.EPERM
        assert (ws / "target.txt").read_bytes() == b"not to be written through\n"
        assert os.path.islink(ws / "p.txt")
        st = bstatus(m, "swap")
        assert st["state"] == "open" and [r["path"] for r in st["reasons"]] == ["p.txt"]
        assert last_error(m)["errno"] == "EPERM"
        assert verb(m, "swap", "abort\n") == 0
        assert os.path.islink(ws / "p.txt")


def test_dry_run_runs_the_gates_again(tmp_path: Path) -> None:
    # The syntax gate warns while the draft is held; made "reject" before the commit, the
    # dry run refuses it (EBADMSG) and nothing is written.
    ws, mp = separate(tmp_path)
    warn = DEFAULT_TEXT.replace(
        '[gates.syntax]\naction = "reject"', '[gates.syntax]\naction = "warn"'
    )
    assert warn != DEFAULT_TEXT
    prepare_state(ws, warn)
    good = b"def f():\n    return 1\n"
    (ws / "mod.py").write_bytes(good)
    (ws / "other.txt").write_bytes(b"other\n")
    with mounted(ws, mp) as m:
        os.mkdir(rw(m) / "batches" / "g")
        (mp / "other.txt").write_bytes(b"other, edited\n")
        (mp / "mod.py").write_bytes(b"def f(:\n    return 1\n")
        assert bstatus(m, "g")["state"] == "open"
        (rw(m) / "policy.toml").write_text(DEFAULT_TEXT)
        assert verb(m, "g", "commit\n") == errno.EBADMSG
        assert (ws / "mod.py").read_bytes() == good
        assert (ws / "other.txt").read_bytes() == b"other\n"
        st = bstatus(m, "g")
        assert st["state"] == "open"
        assert [(r["path"], r["reason"]) for r in st["reasons"]] == [("mod.py", "syntax")]
        assert last_error(m)["errno"] == "EBADMSG"
        assert verb(m, "g", "abort\n") == 0
        assert (mp / "mod.py").read_bytes() == good


# ---- 4. bad input ----


def test_bad_batch_names_are_refused_and_open_nothing(mount: Mount) -> None:
    m = mount
    (m.path / "f.txt").write_bytes(b"unchanged\n")
    sync(m)
    top = rw(m) / "batches"

    refused_by_rwfs = ["has space", "x" * 65, "auto-7", "tab\there", "new\nline", "a;b", "é"]
    for name in refused_by_rwfs:
        poke(m)
        got = errno_of(partial(os.mkdir, top / name))
        assert got == errno.EINVAL, f"{name!r}: {errno.errorcode.get(got, got)}"
        err = last_error(m)
        assert (err["ok"], err["errno"], err["path"]) == (False, "EINVAL", ".rw/batches")
        assert repr(name[:40])[1:-1] in err["message"], err["message"]
        assert os.listdir(top) == []

    bad_bytes = os.fsencode(str(top)) + b"/bad\xffname"
    poke(m)
    assert errno_of(lambda: os.mkdir(bad_bytes)) == errno.EINVAL
    assert last_error(m)["errno"] == "EINVAL" and last_error(m)["path"] == ".rw/batches"

    # Refused by the kernel or by rwfs: either way nothing opens.
    for name in ("x" * 10_000, "x" * 256, "..", ".", "a/b", "../escape"):
        target = f"{top}/{name}"
        got = errno_of(partial(os.mkdir, target))
        assert got != 0, f"{name[:20]!r} opened something"
        assert os.listdir(top) == []
    assert not (m.path / "escape").exists()
    assert not os.path.exists(rw(m) / "escape")
    # A file cannot be made there, only batch directories.
    assert errno_of(lambda: (top / "plain").write_bytes(b"x")) != 0
    assert os.listdir(top) == []
    assert (m.path / "f.txt").read_bytes() == b"unchanged\n"
    assert read_json(rw(m) / "status")["counts"]["open_batches"] == 0


def test_bad_verbs_are_refused_and_change_nothing(mount: Mount) -> None:
    m = mount
    (m.path / "f.txt").write_bytes(b"base\n")
    sync(m)
    top = rw(m) / "batches"
    os.mkdir(top / "good")
    # The kernel answers EEXIST for a name it has looked up; rwfs for one it has not.
    assert errno_of(lambda: os.mkdir(top / "good")) == errno.EEXIST
    assert os.listdir(top) == ["good"]
    (m.path / "f.txt").write_bytes(b"draft\n")
    before = bstatus(m, "good")
    assert [p["path"] for p in before["paths"]] == ["f.txt"]

    malformed: list[bytes] = [
        b"bogus\n",
        b"commit extra\n",
        b"abort now\n",
        b"scope bogus\n",
        b"scope\n",
        b"scope uid extra\n",
        b"\n",
        b"   \n\n",
        b"\xff\xfe\n",
        b"commit\nbogus\n",  # one bad line: nothing of the write is done
        b"COMMIT\n",
        b"resume\n",  # valid verbs, but not for an open batch
        b"rollback\n",
        b"bogus " * 50_000,  # oversized
    ]
    for data in malformed:
        poke(m)
        assert verb(m, "good", data) == errno.EINVAL, data[:30]
        err = last_error(m)
        assert (err["ok"], err["errno"]) == (False, "EINVAL"), data[:30]
        assert err["path"] == ".rw/batches/good/ctl", (data[:30], err)
        assert err["message"]
        assert bstatus(m, "good") == before, data[:30]
        assert os.listdir(top) == ["good"]
    # An empty write() runs nothing.
    assert verb(m, "good", b"") == 0
    assert bstatus(m, "good") == before
    assert (m.path / "f.txt").read_bytes() == b"draft\n"
    assert writes_of(m, "good") == []

    assert verb(m, "good", "commit\n") == 0
    assert bstatus(m, "good")["state"] == "committed"
    after = bstatus(m, "good")
    for data in [b"commit\n", b"abort\n", b"resume\n", b"rollback\n", b"scope all\n"]:
        poke(m)
        assert verb(m, "good", data) == errno.EINVAL, data
        assert last_error(m)["path"] == ".rw/batches/good/ctl"
        assert last_error(m)["batch"] == "good"
        assert bstatus(m, "good") == after
    assert [e["path"] for e in writes_of(m, "good")] == ["f.txt"]
    assert (m.path / "f.txt").read_bytes() == b"draft\n"
    assert errno_of(lambda: os.mkdir(top / "good")) == errno.EEXIST
    assert errno_of(lambda: (top / "nope" / "ctl").write_bytes(b"commit\n")) == errno.ENOENT


def test_two_concurrent_commits_commit_once(mount: Mount) -> None:
    m = mount
    names = [f"c{i}.txt" for i in range(4)]
    for n in names:
        (m.path / n).write_bytes(text(n, "old"))
    sync(m)
    os.mkdir(rw(m) / "batches" / "race")
    for n in names:
        (m.path / n).write_bytes(text(n, "new"))
    ctl = rw(m) / "batches" / "race" / "ctl"
    fds = [os.open(ctl, os.O_WRONLY) for _ in range(2)]
    results: list[int] = []
    gate = threading.Barrier(2)

    def go(fd: int) -> None:
        gate.wait()
        try:
            os.write(fd, b"commit\n")
            results.append(0)
        except OSError as exc:
            results.append(exc.errno or -1)

    threads = [threading.Thread(target=go, args=(fd,)) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for fd in fds:
        os.close(fd)
    assert sorted(results) == [0, errno.EINVAL]
    assert bstatus(m, "race")["state"] == "committed"
    assert sorted(e["path"] for e in writes_of(m, "race")) == names
    for n in names:
        assert (m.path / n).read_bytes() == text(n, "new")


# ---- 5. scope ----


def test_scope_uid_holds_only_that_users_writes() -> None:
    # pytest's temporary directories are private (0700): another user needs one it can enter.
    top = Path(tempfile.mkdtemp(prefix="rwfs-batch-scope-"))
    try:
        top.chmod(0o755)
        ws, mp = top / "ws", top / "mnt"
        ws.mkdir(mode=0o755)
        mp.mkdir(mode=0o755)
        (ws / "pub.txt").write_bytes(b"public\n")
        (ws / "pub.txt").chmod(0o666)
        (ws / "mine.txt").write_bytes(b"root's\n")
        with mounted(ws, mp, options=("allow_other",)) as m:
            os.mkdir(rw(m) / "batches" / "rootonly")
            assert verb(m, "rootonly", "scope uid\n") == 0
            assert bstatus(m, "rootonly")["scope"] == {"kind": "uid", "uid": 0}

            res = as_nobody(f"echo 'by nobody' > {mp}/pub.txt")
            assert res.returncode == 0, res.stderr
            (mp / "mine.txt").write_bytes(b"root's draft\n")
            sync(m)
            assert (ws / "pub.txt").read_bytes() == b"by nobody\n", "nobody's write was held"
            assert (ws / "mine.txt").read_bytes() == b"root's\n", "root's write was not held"
            assert [p["path"] for p in bstatus(m, "rootonly")["paths"]] == ["mine.txt"]
            pub = [e for e in events(m) if e["op"] == "write" and e["path"] == "pub.txt"]
            assert len(pub) == 1 and pub[0]["uid"] == 65534
            assert pub[0]["batch"].startswith("auto-")

            assert verb(m, "rootonly", "commit\n") == 0
            assert (ws / "mine.txt").read_bytes() == b"root's draft\n"
            assert [e["path"] for e in writes_of(m, "rootonly")] == ["mine.txt"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_scope_session_holds_only_this_sessions_writes(tmp_path: Path) -> None:
    ws, mp = separate(tmp_path)
    for n in ("here.txt", "there.txt"):
        (ws / n).write_bytes(b"old\n")
    with mounted(ws, mp) as m:
        os.mkdir(rw(m) / "batches" / "sess")
        assert verb(m, "sess", "scope session\n") == 0
        scope = bstatus(m, "sess")["scope"]
        assert scope == {"kind": "session", "sid": os.getsid(0)}
        subprocess.run(["setsid", "-w", "sh", "-c", f"echo other > {mp}/there.txt"], check=True)
        subprocess.run(["sh", "-c", f"echo mine > {mp}/here.txt"], check=True)
        sync(m)
        assert (ws / "there.txt").read_bytes() == b"other\n"
        assert (ws / "here.txt").read_bytes() == b"old\n"
        assert [p["path"] for p in bstatus(m, "sess")["paths"]] == ["here.txt"]
        # Widened back to every writer: the other session's next write is held too.
        assert verb(m, "sess", "scope all\n") == 0
        assert bstatus(m, "sess")["scope"] == {"kind": "all"}
        subprocess.run(["setsid", "-w", "sh", "-c", f"echo again > {mp}/there.txt"], check=True)
        sync(m)
        assert (ws / "there.txt").read_bytes() == b"other\n"
        assert [p["path"] for p in bstatus(m, "sess")["paths"]] == ["here.txt", "there.txt"]
        assert verb(m, "sess", "commit\n") == 0
        assert (ws / "here.txt").read_bytes() == b"mine\n"
        assert (ws / "there.txt").read_bytes() == b"again\n"


# ---- 6. crashes at every batch fault point ----

FOUR = [f"f{i}.txt" for i in range(4)]

# (fault spec, how many of the four files (in first-written order) reach the tree)
CRASHES = [
    ("batch_after_dry_run", 0),
    ("batch_after_prepare", 0),
    ("batch_after_rename", 1),
    ("batch_after_rename:3", 3),
    ("batch_before_commit_record", 4),
    ("batch_after_commit_record", 4),
]


def _crashed_batch(ws: Path, fault: str, name: str = "b") -> None:
    """Four files edited in batch ``name``, whose commit kills the daemon at ``fault``."""
    for n in FOUR:
        (ws / n).write_bytes(text(n, "old"))
    m = Mount(ws, env={"RWFS_FAULT": fault}).start()
    try:
        os.mkdir(rw(m) / "batches" / name)
        for n in FOUR:
            (m.path / n).write_bytes(edited(n))
    except BaseException:
        m.stop()
        raise
    crash_during(m, lambda: verb(m, name, "commit\n"))


@pytest.mark.parametrize(("fault", "landed"), CRASHES, ids=[c[0] for c in CRASHES])
def test_crash_in_batch_commit_then_resume(workspace: Path, fault: str, landed: int) -> None:
    ws = workspace
    _crashed_batch(ws, fault)
    # I1, and exactly the paths replaced before the crash hold the new bytes.
    for i, n in enumerate(FOUR):
        want = edited(n) if i < landed else text(n, "old")
        assert (ws / n).read_bytes() == want, f"{n} after a crash at {fault}"

    owed = FOUR[landed:]
    with mounted(ws) as m:
        st = bstatus(m, "b")
        by_path = paths_of(st)
        assert list(by_path) == FOUR
        for n in FOUR:
            assert (by_path[n]["expected"], by_path[n]["intended"]) == (
                sha(text(n, "old")),
                sha(edited(n)),
            )
        if not owed:
            # Every path landed: the batch is settled as committed, nothing was rewritten.
            assert st["state"] == "committed"
            assert all(by_path[n]["state"] == "committed" for n in FOUR)
            assert notices(m, "b") == []
            assert verb(m, "b", "resume\n") == errno.EINVAL
        else:
            assert st["state"] == "interrupted"
            for n in FOUR[:landed]:  # held the intended bytes: settled, no write
                assert by_path[n]["state"] == "committed", by_path[n]
            for n in owed:  # held the expected bytes: owed
                # (Still open at the crash, the batch had prepared no receipt yet.)
                owed_state = "owed" if fault == "batch_after_dry_run" else "prepared"
                assert by_path[n]["state"] == owed_state, by_path[n]
                assert (m.path / n).read_bytes() == text(n, "old")
            got = notices(m, "b")
            assert len(got) == 1 and got[0]["kind"] == "batch_interrupted", got
            status = read_json(rw(m) / "status")
            assert status["counts"]["interrupted_batches"] == 1
            assert errno_of(lambda: os.rmdir(rw(m) / "batches" / "b")) == errno.EBUSY
            assert verb(m, "b", "commit\n") == errno.EINVAL
            # The owed writes are allowed drift while the batch waits.
            res = m.fsck()
            assert res.returncode == 0, res.stdout + res.stderr

            assert verb(m, "b", "resume\n") == 0
            st = bstatus(m, "b")
            assert st["state"] == "committed"
            assert all(p["state"] == "committed" for p in st["paths"]), st
            assert verb(m, "b", "resume\n") == errno.EINVAL
        for n in FOUR:
            assert (m.path / n).read_bytes() == edited(n)
        # Each path was written once (landed ones are recorded, not rewritten).
        assert sorted(e["path"] for e in writes_of(m, "b")) == FOUR
        seen = notices(m)
    for n in FOUR:
        assert (ws / n).read_bytes() == edited(n)
    with mounted(ws) as m:
        assert notices(m) == seen, "a second mount must not add a notice"
        assert bstatus(m, "b")["state"] == "committed"
        os.rmdir(rw(m) / "batches" / "b")


def test_a_crash_before_a_rename_onto_a_linked_name_leaves_it_owed(workspace: Path) -> None:
    """A batch's ``sed -i`` on one name of a hard-linked file, bytes unchanged, and a
    crash before the rename: the tree holds the draft's bytes already, but under a name
    that still shares its file, so the rename is owed, not landed; ``resume`` makes it."""
    ws = workspace
    (ws / "a.txt").write_bytes(b"one\n")
    os.link(ws / "a.txt", ws / "b.txt")
    m = Mount(ws, env={"RWFS_FAULT": "batch_after_prepare"}).start()
    try:
        os.mkdir(rw(m) / "batches" / "b")
        res = subprocess.run(["sed", "-i", "s/x/X/", "a.txt"], cwd=m.path, capture_output=True)
        assert res.returncode == 0, res.stderr
    except BaseException:
        m.stop()
        raise
    crash_during(m, lambda: verb(m, "b", "commit\n"))
    assert os.stat(ws / "a.txt").st_ino == os.stat(ws / "b.txt").st_ino
    with mounted(ws) as m:
        st = bstatus(m, "b")
        assert st["state"] == "interrupted"
        assert paths_of(st)["a.txt"]["state"] == "prepared", st
        assert verb(m, "b", "resume\n") == 0
        assert bstatus(m, "b")["state"] == "committed"
        a, b = os.stat(m.path / "a.txt"), os.stat(m.path / "b.txt")
        assert a.st_ino != b.st_ino and (a.st_nlink, b.st_nlink) == (1, 1)
    a, b = os.stat(ws / "a.txt"), os.stat(ws / "b.txt")
    assert a.st_ino != b.st_ino and (a.st_nlink, b.st_nlink) == (1, 1)
    assert (ws / "a.txt").read_bytes() == (ws / "b.txt").read_bytes() == b"one\n"


def test_batch_open_at_a_crash_keeps_its_drafts(workspace: Path) -> None:
    # No commit was asked for: a crash (SIGKILL) of a daemon holding an open batch.
    ws = workspace
    for n in FOUR:
        (ws / n).write_bytes(text(n, "old"))
    m = Mount(ws).start()
    try:
        os.mkdir(rw(m) / "batches" / "wip")
        for n in FOUR:
            (m.path / n).write_bytes(edited(n))
    finally:
        m.kill()
    for n in FOUR:
        assert (ws / n).read_bytes() == text(n, "old")
    with mounted(ws) as m:
        st = bstatus(m, "wip")
        assert st["state"] == "interrupted"
        assert [(p["path"], p["intended"]) for p in st["paths"]] == [
            (n, sha(edited(n))) for n in FOUR
        ]
        got = notices(m, "wip")
        assert len(got) == 1 and got[0]["kind"] == "batch_interrupted"
        for n in FOUR:
            assert (m.path / n).read_bytes() == text(n, "old")
        diff = (rw(m) / "batches" / "wip" / "diff").read_text()
        for n in FOUR:
            assert f"-{n} line 2 old\n+{n} line 2 NEW\n" in diff, diff
        assert verb(m, "wip", "resume\n") == 0
        assert bstatus(m, "wip")["state"] == "committed"
        for n in FOUR:
            assert (m.path / n).read_bytes() == edited(n)
        assert sorted(e["path"] for e in writes_of(m, "wip")) == FOUR
        seen = notices(m)
    with mounted(ws) as m:
        assert notices(m) == seen
        for n in FOUR:
            assert (m.path / n).read_bytes() == edited(n)


def test_rollback_restores_what_an_interrupted_batch_wrote(workspace: Path) -> None:
    ws = workspace
    _crashed_batch(ws, "batch_after_rename:2")
    assert [(ws / n).read_bytes() == edited(n) for n in FOUR] == [True, True, False, False]
    with mounted(ws) as m:
        assert bstatus(m, "b")["state"] == "interrupted"
        assert len(notices(m, "b")) == 1
        assert verb(m, "b", "rollback\n") == 0
        for n in FOUR:
            assert (m.path / n).read_bytes() == text(n, "old"), n
        st = bstatus(m, "b")
        assert st["state"] == "aborted" and st.get("rolled_back") is True
        by_path = paths_of(st)
        assert [by_path[n]["state"] for n in FOUR[2:]] == ["aborted", "aborted"]
        back = [e for e in writes_of(m, "b") if e["expected"] == sha(edited(e["path"]))]
        assert sorted((e["path"], e["intended"]) for e in back) == [
            (n, sha(text(n, "old"))) for n in FOUR[:2]
        ]
        assert verb(m, "b", "resume\n") == errno.EINVAL
        assert verb(m, "b", "rollback\n") == errno.EINVAL
        seen = notices(m)
    for n in FOUR:
        assert (ws / n).read_bytes() == text(n, "old")
    with mounted(ws) as m:
        assert notices(m) == seen
        assert bstatus(m, "b")["state"] == "aborted"


def test_abort_of_an_interrupted_batch_drops_its_owed_writes(workspace: Path) -> None:
    ws = workspace
    _crashed_batch(ws, "batch_after_prepare")
    with mounted(ws) as m:
        assert bstatus(m, "b")["state"] == "interrupted"
        assert verb(m, "b", "abort\n") == 0
        st = bstatus(m, "b")
        assert st["state"] == "aborted"
        assert all(p["state"] == "aborted" for p in st["paths"]), st
        for n in FOUR:
            assert (m.path / n).read_bytes() == text(n, "old")
        assert writes_of(m, "b") == []
    with mounted(ws) as m:
        assert bstatus(m, "b")["state"] == "aborted"
        assert len(notices(m, "b")) == 1
        for n in FOUR:
            assert (m.path / n).read_bytes() == text(n, "old")


def test_resume_auto_rolls_an_interrupted_batch_forward(workspace: Path) -> None:
    ws = workspace
    auto = DEFAULT_TEXT.replace('resume = "manual"', 'resume = "auto"')
    assert auto != DEFAULT_TEXT
    prepare_state(ws, auto)
    _crashed_batch(ws, "batch_after_rename:2")
    assert [(ws / n).read_bytes() == edited(n) for n in FOUR] == [True, True, False, False]
    with mounted(ws) as m:
        st = bstatus(m, "b")
        assert st["state"] == "committed", st
        assert all(p["state"] == "committed" for p in st["paths"]), st
        for n in FOUR:
            assert (m.path / n).read_bytes() == edited(n)
        assert sorted(e["path"] for e in writes_of(m, "b")) == FOUR
        assert len(notices(m, "b")) <= 1
        seen = notices(m)
    for n in FOUR:
        assert (ws / n).read_bytes() == edited(n)
    with mounted(ws) as m:
        assert notices(m) == seen


# ---- 7. the seed's case: 500 files, a crash mid-way, hand edits while unmounted ----


def _make_socket(path: Path) -> None:
    """A UNIX socket at ``path``: open(2) fails on it (ENXIO), even for root."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
            path.name,
        ],
        cwd=path.parent,
        check=True,
    )
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_500_file_batch_killed_mid_commit_then_hand_edits_then_resume(workspace: Path) -> None:
    ws = workspace
    names = [f"d{i // 100}/f{i:03}.txt" for i in range(500)]
    for d in {n.split("/")[0] for n in names}:
        (ws / d).mkdir()
    for n in names:
        (ws / n).write_bytes(text(n, "old", 3))

    def new_of(n: str) -> bytes:
        return text(n, "old", 3).replace(f"{n} line 1 old".encode(), f"{n} line 1 NEW".encode())

    m = Mount(ws, env={"RWFS_FAULT": "batch_after_rename:200"}).start()
    try:
        os.mkdir(rw(m) / "batches" / "big")
        for n in names:
            (m.path / n).write_bytes(new_of(n))
        assert len(bstatus(m, "big")["paths"]) == 500
    except BaseException:
        m.stop()
        raise
    crash_during(m, lambda: verb(m, "big", "commit\n"))

    for i, n in enumerate(names):  # I1, and exactly the first 200 replaced
        assert (ws / n).read_bytes() == (new_of(n) if i < 200 else text(n, "old", 3)), n

    # While unmounted, three owed files are touched by hand.
    hand, landed_by_hand, swapped = names[300], names[301], names[302]
    hand_bytes = text(hand, "old", 3).replace(
        f"{hand} line 1 old".encode(), f"{hand} line 1 HAND".encode()
    )
    (ws / hand).write_bytes(hand_bytes)
    (ws / landed_by_hand).write_bytes(new_of(landed_by_hand))
    os.unlink(ws / swapped)
    _make_socket(ws / swapped)  # another kind of file: never opened, a conflict

    problems: list[str] = []  # checked last, so that one gap does not hide the others
    with mounted(ws, clean=False) as m:
        st = bstatus(m, "big")
        assert st["state"] == "interrupted"
        got = notices(m, "big")
        assert len(got) == 1 and got[0]["kind"] == "batch_interrupted"
        by_path = paths_of(st)
        assert [by_path[n]["state"] for n in names[:200]] == ["committed"] * 200
        assert by_path[landed_by_hand]["state"] == "committed"
        assert by_path[hand]["state"] == "conflict"
        assert by_path[swapped]["state"] == "conflict"
        rest = [n for n in names[200:] if n not in (hand, landed_by_hand, swapped)]
        assert len(rest) == 297
        assert {by_path[n]["state"] for n in rest} == {"prepared"}

        # The conflict: info, and the three versions and their merge.
        cid = str(by_path[hand]["conflict"])
        assert sorted(listing(m, "conflicts")) == sorted([cid, str(by_path[swapped]["conflict"])])
        cdir = rw(m) / "conflicts" / cid
        info = read_json(cdir / "info")
        assert (info["path"], info["batch"]) == (hand, "big")
        assert (info["expected"], info["intended"], info["actual"]) == (
            sha(text(hand, "old", 3)),
            sha(new_of(hand)),
            sha(hand_bytes),
        )
        assert info["reason"]
        assert (cdir / "intended").read_bytes() == new_of(hand)
        assert (cdir / "actual").read_bytes() == hand_bytes
        for view, want in (("base", text(hand, "old", 3)), ("merged", None)):
            try:
                data = (cdir / view).read_bytes()
            except OSError as exc:
                problems.append(f"conflict {view} is unreadable: {exc}")
                continue
            if want is not None and data != want:
                problems.append(f"conflict base holds {data!r}")
            if view == "merged":
                merged = data.decode()
                ok = (
                    "<<<<<<< actual\n" in merged
                    and ">>>>>>> intended\n" in merged
                    and f"{hand} line 1 HAND\n" in merged
                    and f"{hand} line 1 NEW\n" in merged
                    and f"{hand} line 0 old\n" in merged
                )
                if not ok:
                    problems.append(f"merged lacks the conflict markers or a side:\n{merged}")

        # The mount shows the tree: old bytes where the write is owed, the hand edits.
        assert (m.path / hand).read_bytes() == hand_bytes
        assert (m.path / names[250]).read_bytes() == text(names[250], "old", 3)

        assert verb(m, "big", "resume\n") == 0
        for n in rest + names[:200] + [landed_by_hand]:
            assert (m.path / n).read_bytes() == new_of(n), n
        assert (m.path / hand).read_bytes() == hand_bytes, "a conflict was overwritten"
        st = bstatus(m, "big")
        assert st["state"] == "conflicted"  # everything settled; two paths are conflicts
        writes = writes_of(m, "big")
        assert sorted(e["path"] for e in writes) == sorted(
            [n for n in names if n not in (hand, swapped)]
        ), "every landed or owed path is written (or recorded) exactly once"
        assert len(notices(m, "big")) == 1
        seen = notices(m)
    assert "Traceback" not in m.log_text()
    res = m.fsck()
    assert res.returncode == 0, res.stdout
    with mounted(ws) as m:
        assert notices(m) == seen, "a second mount must not add a notice"
        assert (m.path / hand).read_bytes() == hand_bytes
    assert problems == []


# ---- 8. conflict verbs ----


def test_conflict_verbs_keep_actual_take_intended_and_refuse_a_stale_take(
    workspace: Path,
) -> None:
    ws = workspace
    names = ["k.txt", "t.txt", "s.txt"]
    for n in names:
        (ws / n).write_bytes(text(n, "old"))
    m = Mount(ws, env={"RWFS_FAULT": "batch_after_prepare"}).start()
    try:
        os.mkdir(rw(m) / "batches" / "cv")
        for n in names:
            (m.path / n).write_bytes(edited(n))
    except BaseException:
        m.stop()
        raise
    crash_during(m, lambda: verb(m, "cv", "commit\n"))
    hand = {n: text(n, "by hand") for n in names}
    for n in names:
        (ws / n).write_bytes(hand[n])

    problems: list[str] = []  # checked last, so that a hang does not hide the rest
    with mounted(ws) as m:
        st = bstatus(m, "cv")
        by_path = paths_of(st)
        assert [by_path[n]["state"] for n in names] == ["conflict"] * 3
        assert st["state"] == "conflicted"  # nothing is owed: every path is settled
        ids = {n: str(by_path[n]["conflict"]) for n in names}
        assert listing(m, "conflicts") == sorted(ids.values())
        for n in names:
            assert (m.path / n).read_bytes() == hand[n], "a conflict overwrote the file"
        conflict_events = [e for e in events(m) if e["op"] == "conflict"]
        assert sorted(e["path"] for e in conflict_events) == sorted(names)

        def ctl(n: str, data: bytes) -> int:
            return write_ctl(rw(m) / "conflicts" / ids[n] / "ctl", data)

        assert ctl("k.txt", b"bogus\n") == errno.EINVAL
        assert ctl("k.txt", b"keep-actual please\n") == errno.EINVAL
        assert listing(m, "conflicts") == sorted(ids.values())

        # keep-actual: the file stays as it is, the conflict is settled, journaled.
        assert ctl("k.txt", b"keep-actual\n") == 0
        assert (m.path / "k.txt").read_bytes() == hand["k.txt"]
        assert ids["k.txt"] not in listing(m, "conflicts")
        resolves = [e for e in events(m) if e["op"] == "resolve"]
        assert [(e["path"], str(e["conflict"]), e["resolution"]) for e in resolves] == [
            ("k.txt", ids["k.txt"], "keep-actual")
        ]

        # take-intended: the intended bytes are committed over the actual ones. (The journal
        # was just read, so the last thing the group committer saw was a sync with nothing
        # queued.)
        got, stuck = write_ctl_or_stuck(
            m, rw(m) / "conflicts" / ids["t.txt"] / "ctl", b"take-intended\n"
        )
        if stuck:
            problems.append(
                "take-intended hung until a '.rw/ctl sync': the group committer stopped "
                "after a sync with nothing queued"
            )
        assert got == 0
        assert (m.path / "t.txt").read_bytes() == edited("t.txt")
        assert ids["t.txt"] not in listing(m, "conflicts")
        took = [e for e in events(m) if e["op"] == "write" and e["path"] == "t.txt"]
        assert [(e["expected"], e["intended"]) for e in took] == [
            (sha(hand["t.txt"]), sha(edited("t.txt")))
        ]
        assert [e["resolution"] for e in events(m) if e["op"] == "resolve"] == [
            "keep-actual",
            "take-intended",
        ]

        # take-intended after the file changed again: refused, nothing written.
        (m.path / "s.txt").write_bytes(b"changed again\n")
        sync(m)
        assert ctl("s.txt", b"take-intended\n") == errno.ESTALE
        err = last_error(m)
        assert (err["errno"], err["path"]) == ("ESTALE", "s.txt")
        assert (m.path / "s.txt").read_bytes() == b"changed again\n"
        assert ids["s.txt"] in listing(m, "conflicts")
        assert ctl("s.txt", b"resolved\n") == 0
        assert listing(m, "conflicts") == []
        assert (m.path / "s.txt").read_bytes() == b"changed again\n"
    assert (ws / "k.txt").read_bytes() == hand["k.txt"]
    assert (ws / "t.txt").read_bytes() == edited("t.txt")
    assert (ws / "s.txt").read_bytes() == b"changed again\n"
    assert problems == []


def test_sigkill_at_random_instants_during_a_large_batch_commit(workspace: Path) -> None:
    """A real SIGKILL (no fault point) while a 300-file batch commits, at a random instant:
    after remounting, every file holds its old or its new bytes, the batch is committed or
    interrupted (then resume finishes it), and fsck agrees with the tree."""
    import random
    import threading

    ws = workspace
    names = [f"f{i:03}.txt" for i in range(300)]
    for n in names:
        (ws / n).write_bytes(text(n, "old", 4))
    rng = random.Random(7)
    for attempt in range(3):
        new = {n: text(n, f"new{attempt}", 4) for n in names}
        before = {n: (ws / n).read_bytes() for n in names}
        m = Mount(ws).start()
        try:
            os.mkdir(rw(m) / "batches" / f"big{attempt}")
            for n in names:
                (m.path / n).write_bytes(new[n])

            def commit(m: Mount = m, name: str = f"big{attempt}") -> None:
                try:
                    verb(m, name, "commit\n")
                except OSError:
                    pass  # the daemon died under it (ENOTCONN): that is the point

            thread = threading.Thread(target=commit)
            thread.start()
            time.sleep(rng.uniform(0.0, 0.3))
            assert m.proc is not None
            os.kill(m.proc.pid, signal.SIGKILL)
            m.wait_dead()
            thread.join(timeout=60)
        finally:
            m.stop()
        for n in names:  # I1: old or new, never a mix
            assert (ws / n).read_bytes() in (before[n], new[n]), n
        with mounted(ws) as m:
            st = bstatus(m, f"big{attempt}")
            # Open or committing at the kill: interrupted, its drafts or receipts kept.
            assert st["state"] in ("committed", "interrupted"), st["state"]
            if st["state"] == "interrupted":
                assert len(notices(m, f"big{attempt}")) == 1
                assert verb(m, f"big{attempt}", "resume\n") == 0
            assert bstatus(m, f"big{attempt}")["state"] == "committed"
            for n in names:
                assert (m.path / n).read_bytes() == new[n], n
