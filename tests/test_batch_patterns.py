"""Explicit batches against every way programs write a file, through real FUSE mounts.

Each test mounts a workspace at a separate mount point, so the raw tree stays visible:
while a batch is open the tree must keep its base bytes and the mount must show the
drafts; after ``commit`` the tree holds exactly the drafts, every file with its own bytes
and its own inode number; after ``abort`` the tree and the mount are exactly as before.

The first tests are regressions: two files that shared one inode inside a batch (a
committed file got another file's bytes), a stale-write conflict inside a batch that hid
the batch's draft and broke ``rwfs log``, and gates that stopped running once ``sed -i``
had saved a file in a batch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import RWFS, Mount, check_clean, prepare_state
from test_stale import _lost_update

from rwfs.policy import DEFAULT_TEXT

A = b'def a():\n    return "a"\n'
B = b"one\ntwo\n"
C = b'def c():\n    return "c"\n'
BASE = {"a.py": A, "b.txt": B, "c.py": C}
BROKEN = b"def a(:\n    return\n"  # a Python syntax error where the file parsed before


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@contextmanager
def batch_mount(
    tmp_path: Path, files: dict[str, bytes], policy: str | None = None
) -> Iterator[Mount]:
    """``files`` in a fresh workspace mounted beside it (the raw tree stays readable at
    ``m.workspace``); always unmounted, then checked clean (no traceback, fsck agrees)."""
    ws, mp = tmp_path / "ws", tmp_path / "mnt"
    ws.mkdir()
    mp.mkdir()
    for name, data in files.items():
        (ws / name).write_bytes(data)
    if policy is not None:
        prepare_state(ws, policy)
    m = Mount(ws, mp).start()
    try:
        yield m
    finally:
        m.stop()
    check_clean(m)


def ctl(m: Mount, name: str, verb: str) -> int:
    """Write a verb to a batch's ctl in one write(); 0, or the errno it failed with."""
    fd = os.open(m.path / ".rw" / "batches" / name / "ctl", os.O_WRONLY)
    try:
        os.write(fd, verb.encode() + b"\n")
        return 0
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)


def sh(cwd: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def ok(cwd: Path, cmd: str) -> None:
    res = sh(cwd, cmd)
    assert res.returncode == 0, f"{cmd}: {res.returncode} {res.stderr}"


def files_of(top: Path) -> dict[str, bytes]:
    """Every regular file directly in ``top`` (``.rw`` aside) and its bytes."""
    return {
        p.name: p.read_bytes()
        for p in sorted(top.iterdir())
        if p.name != ".rw" and p.is_file() and not p.is_symlink()
    }


def assert_distinct_inodes(top: Path) -> None:
    """What ``ls -li`` shows: one inode number per file, except for hard links."""
    by_ino: dict[int, list[str]] = {}
    for p in sorted(top.iterdir()):
        if p.name != ".rw":
            by_ino.setdefault(p.lstat().st_ino, []).append(p.name)
    for ino, names in by_ino.items():
        if len(names) > 1:
            first = (top / names[0]).lstat()
            assert first.st_nlink >= len(names), f"{names} share inode {ino} in {top}"
            assert len({(top / n).read_bytes() for n in names}) == 1


def status(m: Mount, name: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((m.path / ".rw" / "batches" / name / "status").read_bytes())
    return got


def rwfs_log(ws: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RWFS, "log", "-C", str(ws)], capture_output=True, text=True, timeout=60, check=False
    )


# ---- 1. two files never share an inode inside a batch ----


def test_a_new_file_never_takes_the_inode_of_an_earlier_draft(tmp_path: Path) -> None:
    """A file created in a batch was found by the inode number of its first stage; once
    that stage was replaced and freed, the next new file's stage got the number, and the
    new file resolved to the old one: both names showed one file, and commit wrote one
    file's bytes over the other."""
    a2 = b'def a():\n    return "A2"\n'
    new = b'def new():\n    return "new"\n'
    g = b"var g = 2;\n"
    c2 = C
    with batch_mount(tmp_path, {"a.py": A, "c.py": C}) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        ok(mp, 'sed -i \'s/"a"/"A1"/\' a.py')
        ok(mp, "printf 'def a():\\n    return \"A2\"\\n' > a.py")
        ok(mp, "printf 'def new():\\n    return \"new\"\\n' > new.py")
        ok(mp, "printf 'var g = 1;\\n' > tmp && mv tmp g.js")
        ok(mp, "printf 'var g = 2;\\n' > g.js")
        ok(mp, "cp c.py c2.py")
        want = {"a.py": a2, "c.py": C, "c2.py": c2, "g.js": g, "new.py": new}
        assert files_of(mp) == want
        assert_distinct_inodes(mp)
        assert len({(mp / n).stat().st_ino for n in want}) == len(want)
        assert files_of(m.workspace) == {"a.py": A, "c.py": C}  # the tree waits
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == want
        assert files_of(mp) == want
        assert_distinct_inodes(mp)
        assert len({(mp / n).stat().st_ino for n in want}) == len(want)
        assert status(m, "b1")["state"] == "committed"


# ---- 2. a stale write inside a batch ----


def lost_update(path: Path, edit: str, meanwhile: bytes) -> str:
    """A child process reads ``path``; this process writes ``meanwhile`` over it; the child
    then writes back what it read plus ``edit``. Returns the child's outcome line."""
    return _lost_update(path, edit, lambda: path.write_bytes(meanwhile))


STALE_CONFLICT = DEFAULT_TEXT.replace('stale_write = "warn"', 'stale_write = "conflict"')


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "existing-file"])
def test_a_stale_write_in_a_batch_keeps_the_draft_and_records_real_digests(
    tmp_path: Path, existing: bool
) -> None:
    """The refused write used to drop the file's view: a new file vanished (listed, but
    ENOENT), an existing one showed its base; the conflict said ``expected: "unknown"``
    and its merge lacked the batch's change; ``rwfs log`` then crashed."""
    assert 'stale_write = "conflict"' in STALE_CONFLICT
    with batch_mount(tmp_path, {"a.py": A}, STALE_CONFLICT) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        f = mp / ("a.py" if existing else "new.py")
        first = b"x = 1\n" if not existing else A
        if not existing:
            f.write_bytes(first)  # a draft of the batch, read by the child below
        other = first + b"y = 2\n"
        assert lost_update(f, "z = 3\n", meanwhile=other) == f"errno {errno.ESTALE}"
        # The batch's draft (the other writer's) is what the mount shows, still.
        assert f.name in os.listdir(mp)
        assert f.read_bytes() == other
        assert os.stat(f).st_size == len(other)
        (cid,) = os.listdir(mp / ".rw" / "conflicts")
        top = mp / ".rw" / "conflicts" / cid
        info = json.loads((top / "info").read_bytes())
        assert (info["path"], info["reason"], info["batch"]) == (f.name, "stale_write", "b1")
        assert info["expected"] == sha(first)  # what the child read
        assert info["actual"] == sha(other)  # the draft it would have erased
        assert info["intended"] == sha(first + b"z = 3\n")
        assert (top / "base").read_bytes() == first
        assert (top / "actual").read_bytes() == other
        merged = (top / "merged").read_bytes()
        assert b"y = 2" in merged and b"z = 3" in merged
        event = [
            json.loads(x)
            for x in (mp / ".rw" / "journal").read_text().splitlines()
            if json.loads(x)["op"] == "conflict"
        ]
        assert [(e["expected"], e["actual"]) for e in event] == [(sha(first), sha(other))]
        res = rwfs_log(mp)
        assert res.returncode == 0, res.stderr
        assert "conflict" in res.stdout
        # The batch still holds the draft: commit writes it.
        assert ctl(m, "b1", "commit") == 0
        assert (m.workspace / f.name).read_bytes() == other
    res = rwfs_log(m.workspace)  # unmounted: read from the journal itself
    assert res.returncode == 0, res.stderr


def test_log_prints_any_event_shape() -> None:
    """``rwfs log`` shortens digests; a value that is not one must not crash it."""
    from rwfs.cli.reading import short

    assert short("sha256:" + "ab" * 32) == "ab" * 6
    for odd in ("unknown", "", None, 7, "sha256:", ":x"):
        assert isinstance(short(odd), str)


# ---- 3. the gates run at every commit point of a batch ----


def test_gates_run_in_a_batch_after_sed_i(tmp_path: Path) -> None:
    """After ``sed -i`` in a batch the file is the batch's draft, with no file of its own
    in the tree: its next commit points were gated against nothing (as a new file), so a
    broken write was taken and refused only at ``commit``."""
    a1 = A.replace(b'"a"', b'"A1"')
    with batch_mount(tmp_path, {"a.py": A}) as m:
        mp = m.path
        (tmp_path / "broken.py").write_bytes(BROKEN)
        os.mkdir(mp / ".rw" / "batches" / "b1")
        ok(mp, 'sed -i \'s/"a"/"A1"/\' a.py')
        res = sh(mp, f"cp {tmp_path / 'broken.py'} a.py")
        assert res.returncode != 0 and "Bad message" in res.stderr, res
        assert (mp / "a.py").read_bytes() == a1  # the batch's previous draft
        with pytest.raises(OSError) as exc:
            with open(mp / "a.py", "wb") as f:
                f.write(BROKEN)
        assert exc.value.errno == errno.EBADMSG
        assert (mp / "a.py").read_bytes() == a1
        # A rename of a broken temporary file onto it is a commit of it too.
        res = sh(mp, "sed -i 's/return \"A1\"/return (/' a.py")
        assert res.returncode != 0 and "Bad message" in res.stderr, res
        assert (mp / "a.py").read_bytes() == a1
        assert sorted(os.listdir(mp)) == sorted(["a.py", *_sed_leftovers(mp)])
        for leftover in _sed_leftovers(mp):
            os.unlink(mp / leftover)
        assert (m.workspace / "a.py").read_bytes() == A
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {"a.py": a1}


def _sed_leftovers(top: Path) -> list[str]:
    """The temporary file a refused ``sed -i`` leaves (as it does outside a batch)."""
    return [n for n in os.listdir(top) if n.startswith("sed")]


def test_gates_judge_a_batch_draft_of_a_file_empty_in_the_tree(tmp_path: Path) -> None:
    """A file empty in the tree: its batch draft is what the next write can break."""
    with batch_mount(tmp_path, {"e.py": b""}) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        (mp / "e.py").write_bytes(A)
        with pytest.raises(OSError) as exc:
            with open(mp / "e.py", "wb") as f:
                f.write(BROKEN)
        assert exc.value.errno == errno.EBADMSG
        assert (mp / "e.py").read_bytes() == A
        assert ctl(m, "b1", "commit") == 0
        assert (m.workspace / "e.py").read_bytes() == A


LONG = "".join(f"line {i}\n" for i in range(40)).encode()


@pytest.mark.parametrize("how", ["fsync", "cp-after-sed"])
def test_every_commit_point_of_a_batch_is_gated(tmp_path: Path, how: str) -> None:
    """A cut-off rewrite of the batch's draft (its 40 lines cut to one), at an ``fsync``,
    and by ``cp`` of a short file over a draft ``sed -i`` made: refused at once, the draft
    kept, as outside a batch."""
    with batch_mount(tmp_path, {"long.txt": b"first\n" + LONG}) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        if how == "cp-after-sed":
            ok(mp, "sed -i 's/first/FIRST/' long.txt")
        else:
            (mp / "long.txt").write_bytes(b"FIRST\n" + LONG)
        draft = b"FIRST\n" + LONG
        if how == "fsync":
            fd = os.open(mp / "long.txt", os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, b"FIRST\n")
                with pytest.raises(OSError) as exc:
                    os.fsync(fd)
                assert exc.value.errno == errno.EBADMSG
            finally:
                os.close(fd)
        else:
            (tmp_path / "short.txt").write_bytes(b"FIRST\n")
            res = sh(mp, f"cp {tmp_path / 'short.txt'} long.txt")
            assert res.returncode != 0 and "Bad message" in res.stderr, res
        assert (mp / "long.txt").read_bytes() == draft
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {"long.txt": draft}


def test_a_truncate_of_a_batch_draft_is_held_not_refused(tmp_path: Path) -> None:
    """``truncate(2)`` to a length the caller chose is a deliberate change, never refused
    by the gates (SPEC §4.1): the batch holds the cut draft, and commits it."""
    with batch_mount(tmp_path, {"long.txt": b"first\n" + LONG}) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        (mp / "long.txt").write_bytes(b"FIRST\n" + LONG)
        res = sh(mp, "truncate -s 6 long.txt")
        assert res.returncode == 0, res
        assert (mp / "long.txt").read_bytes() == b"FIRST\n"
        assert files_of(m.workspace) == {"long.txt": b"first\n" + LONG}
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {"long.txt": b"FIRST\n"}


def test_a_refused_first_write_of_a_new_file_leaves_it_empty(tmp_path: Path) -> None:
    """As outside a batch: the create happened, the refused bytes did not."""
    secret = b"KEY = 'AKIA" + b"Q7" * 8 + b"'\nTOKEN = 'ghp_" + b"a1" * 18 + b"'\n"
    policy = DEFAULT_TEXT.replace('reject_at = "off"', 'reject_at = "medium"')
    with batch_mount(tmp_path, {}, policy) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        with pytest.raises(OSError) as exc:
            with open(mp / "s.py", "wb") as f:
                f.write(secret)
        assert exc.value.errno == errno.EBADMSG
        assert os.listdir(mp) == ["s.py"]
        assert (mp / "s.py").read_bytes() == b""
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {"s.py": b""}


# ---- 4. every way programs write, in a batch, then commit or abort ----


def _inplace(mp: Path) -> None:
    fd = os.open(mp / "a.py", os.O_WRONLY)
    try:
        os.pwrite(fd, b'"A"', A.index(b'"a"'))
    finally:
        os.close(fd)


def _o_trunc(mp: Path) -> None:
    (mp / "b.txt").write_bytes(b"new\n")


def _append(mp: Path) -> None:
    with open(mp / "b.txt", "ab") as f:
        f.write(b"three\n")


def _os_replace(mp: Path) -> None:
    (mp / ".a.py.tmp").write_bytes(A.replace(b'"a"', b'"A"'))
    os.replace(mp / ".a.py.tmp", mp / "a.py")


def _new_file(mp: Path) -> None:
    (mp / "new.py").write_bytes(b"N = 1\n")


def _truncate(mp: Path) -> None:
    os.truncate(mp / "b.txt", 4)


def _edit_then_sed_then_rm(mp: Path) -> None:
    (mp / "a.py").write_bytes(A.replace(b'"a"', b'"x"'))
    ok(mp, 'sed -i \'s/"x"/"A"/\' a.py && rm a.py')


def _rm_recreate_rm(mp: Path) -> None:
    ok(mp, "rm a.py && printf 'A = 1\\n' > a.py && rm a.py")


def _rm_recreate_mv(mp: Path) -> None:
    ok(mp, "rm a.py && printf 'A = 1\\n' > a.py")
    os.replace(mp / "a.py", mp / "d.py")


def _rewrite_r_plus(mp: Path) -> None:
    """Read, then rewrite from the start and cut what is left (an in-place save)."""
    with open(mp / "b.txt", "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(data.replace(b"two\n", b"2\n"))
        f.truncate()


def _edit_then_sed(mp: Path) -> None:
    (mp / "a.py").write_bytes(A.replace(b'"a"', b'"x"'))
    ok(mp, 'sed -i \'s/"x"/"A"/\' a.py')


def _sed_then_append(mp: Path) -> None:
    ok(mp, 'sed -i \'s/"a"/"A"/\' a.py')
    with open(mp / "a.py", "ab") as f:
        f.write(b"# more\n")


A_UP = A.replace(b'"a"', b'"A"')
# name -> (what it does in the mount, the files the mount then shows)
PATTERNS: dict[str, tuple[Callable[[Path], None], dict[str, bytes]]] = {
    "in-place": (_inplace, {**BASE, "a.py": A_UP}),
    "o_trunc": (_o_trunc, {**BASE, "b.txt": b"new\n"}),
    "rewrite-r+": (_rewrite_r_plus, {**BASE, "b.txt": b"one\n2\n"}),
    "edit-then-sed-i": (_edit_then_sed, {**BASE, "a.py": A_UP}),
    "sed-i-then-append": (_sed_then_append, {**BASE, "a.py": A_UP + b"# more\n"}),
    "append": (_append, {**BASE, "b.txt": B + b"three\n"}),
    "sed-i": (lambda mp: ok(mp, 'sed -i \'s/"a"/"A"/\' a.py'), {**BASE, "a.py": A_UP}),
    "os.replace": (_os_replace, {**BASE, "a.py": A_UP}),
    "mv-onto": (lambda mp: ok(mp, "mv c.py a.py"), {"a.py": C, "b.txt": B}),
    "cp-onto": (lambda mp: ok(mp, "cp c.py a.py"), {**BASE, "a.py": C}),
    "cp-new": (lambda mp: ok(mp, "cp c.py d.py"), {**BASE, "d.py": C}),
    "rm-recreate": (
        lambda mp: ok(mp, "rm a.py && printf 'A = 1\\n' > a.py"),
        {**BASE, "a.py": b"A = 1\n"},
    ),
    "new-file": (_new_file, {**BASE, "new.py": b"N = 1\n"}),
    "unlink": (lambda mp: ok(mp, "rm b.txt"), {"a.py": A, "c.py": C}),
    "truncate": (_truncate, {**BASE, "b.txt": b"one\n"}),
    "truncate-cmd": (lambda mp: ok(mp, "truncate -s 0 b.txt"), {**BASE, "b.txt": b""}),
    "edit-sed-rm": (_edit_then_sed_then_rm, {"b.txt": B, "c.py": C}),
    "rm-recreate-rm": (_rm_recreate_rm, {"b.txt": B, "c.py": C}),
    "rm-recreate-mv": (_rm_recreate_mv, {"b.txt": B, "c.py": C, "d.py": b"A = 1\n"}),
    "mv-temp-new": (
        lambda mp: ok(mp, "printf 'T = 1\\n' > t && mv t d.py && printf 'T = 2\\n' >> d.py"),
        {**BASE, "d.py": b"T = 1\nT = 2\n"},
    ),
}


@pytest.mark.parametrize("end", ["commit", "abort"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_write_pattern_in_a_batch(tmp_path: Path, pattern: str, end: str) -> None:
    do, want = PATTERNS[pattern]
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        do(mp)
        assert files_of(mp) == want
        assert sorted(os.listdir(mp)) == sorted(want)
        assert_distinct_inodes(mp)
        assert files_of(m.workspace) == BASE  # nothing reached the tree yet
        assert ctl(m, "b1", end) == 0
        final = want if end == "commit" else BASE
        assert status(m, "b1")["state"] == ("committed" if end == "commit" else "aborted")
        assert files_of(m.workspace) == final
        assert sorted(os.listdir(m.workspace)) == sorted([*final, ".rw"])
        assert files_of(mp) == final
        assert sorted(os.listdir(mp)) == sorted(final)
        assert_distinct_inodes(mp)
        # Each file reads its own bytes through a fresh open, by name and by inode.
        for name, data in final.items():
            assert (mp / name).read_bytes() == data


# ---- hard links ----


def test_link_of_a_file_the_batch_does_not_hold_is_made_at_once(tmp_path: Path) -> None:
    """(docs/batches.md: ``link`` reaches the tree at once, like ``mkdir``.)"""
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        ok(mp, "ln b.txt l.txt")
        assert (m.workspace / "l.txt").read_bytes() == B
        assert os.stat(mp / "l.txt").st_ino == os.stat(mp / "b.txt").st_ino
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {**BASE, "l.txt": B}
        assert_distinct_inodes(mp)


@pytest.mark.parametrize("how", ["edited", "created", "sed-i", "deleted-target"])
def test_link_of_a_batch_draft_fails_with_exdev_and_changes_nothing(
    tmp_path: Path, how: str
) -> None:
    """The tree does not hold the draft: a link there would link the base (or nothing)."""
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        src, dst = "a.py", "l.py"
        if how == "edited":
            (mp / "a.py").write_bytes(A_UP)
        elif how == "created":
            src = "n.py"
            (mp / src).write_bytes(b"N = 1\n")
        elif how == "sed-i":
            ok(mp, 'sed -i \'s/"a"/"A"/\' a.py')
        else:
            src, dst = "b.txt", "c.py"
            ok(mp, "rm c.py")
        view = files_of(mp)
        with pytest.raises(OSError) as exc:
            os.link(mp / src, mp / dst)
        assert exc.value.errno == errno.EXDEV
        assert files_of(mp) == view
        assert files_of(m.workspace) == BASE
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == view
        assert_distinct_inodes(mp)


def test_a_file_the_batch_deletes_is_the_batchs_whoever_makes_it_again(tmp_path: Path) -> None:
    """``scope session``: a process in another session (``setsid``) makes again a file
    the batch deletes; the batch holds the new file, as it holds every file it changes."""
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        assert ctl(m, "b1", "scope session") == 0
        os.unlink(mp / "a.py")
        ok(mp, "setsid -w sh -c \"printf 'A = 1\\n' > a.py\"")
        assert (mp / "a.py").read_bytes() == b"A = 1\n"
        assert files_of(m.workspace) == BASE
        ok(mp, "setsid -w rm a.py")
        assert "a.py" not in os.listdir(mp)  # deleted again: the batch's deletion
        assert files_of(m.workspace) == BASE
        ok(mp, "setsid -w sh -c \"printf 'A = 2\\n' > a.py\"")
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {**BASE, "a.py": b"A = 2\n"}
        assert files_of(mp) == {**BASE, "a.py": b"A = 2\n"}


@pytest.mark.parametrize("existing", [False, True], ids=["created", "edited"])
def test_a_draft_removed_while_open_stays_readable_through_its_descriptor(
    tmp_path: Path, existing: bool
) -> None:
    """POSIX keeps a removed file for the descriptors still open on it; in a batch, the
    removed file is the batch's draft (it read as the base, or failed, before)."""
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        name = "b.txt" if existing else "t.txt"
        (mp / name).write_bytes(b"draft\n")
        fd = os.open(mp / name, os.O_RDWR)
        try:
            os.unlink(mp / name)
            assert os.pread(fd, 100, 0) == b"draft\n"
            os.pwrite(fd, b"DR", 0)
            assert os.pread(fd, 100, 0) == b"DRaft\n"
            assert os.fstat(fd).st_nlink == 0
        finally:
            os.close(fd)
        assert name not in os.listdir(mp)
        assert files_of(m.workspace) == BASE
        assert ctl(m, "b1", "commit") == 0
        want = {k: v for k, v in BASE.items() if k != name}
        assert files_of(m.workspace) == want
        assert files_of(mp) == want


def test_a_draft_replaced_by_a_rename_stays_readable_through_its_descriptor(
    tmp_path: Path,
) -> None:
    """``sed -i`` over a file open elsewhere: that descriptor keeps the file it opened (the
    batch's earlier draft), as it keeps a file replaced by rename outside a batch."""
    with batch_mount(tmp_path, BASE) as m:
        mp = m.path
        os.mkdir(mp / ".rw" / "batches" / "b1")
        (mp / "a.py").write_bytes(A.replace(b'"a"', b'"x"'))
        fd = os.open(mp / "a.py", os.O_RDONLY)
        try:
            ok(mp, 'sed -i \'s/"x"/"A"/\' a.py')
            assert os.pread(fd, 100, 0) == A.replace(b'"a"', b'"x"')
        finally:
            os.close(fd)
        assert (mp / "a.py").read_bytes() == A_UP
        assert ctl(m, "b1", "commit") == 0
        assert files_of(m.workspace) == {**BASE, "a.py": A_UP}


def test_abort_shows_a_deleted_name_again_in_a_listing_cached_empty(tmp_path: Path) -> None:
    """A directory listed while the batch deleted its only file lists nothing; after
    ``abort`` the kernel must list it again (an empty cached listing has no page to drop:
    ``.`` and ``..`` keep one there)."""
    with batch_mount(tmp_path, {}) as m:
        (m.path / "d").mkdir()
        (m.path / "d" / "c.py").write_bytes(b"")
        assert sorted(os.listdir(m.path / "d")) == ["c.py"]
        os.mkdir(m.path / ".rw" / "batches" / "b")
        ok(m.path, "sed -i s/a/A/ d/c.py && mv d/c.py a.py")
        assert os.listdir(m.path / "d") == []  # cached by the kernel
        assert ctl(m, "b", "abort") == 0
        assert os.listdir(m.path / "d") == ["c.py"]
        assert not (m.path / "a.py").exists()
        listed = subprocess.run(["ls", "-a", "d"], cwd=m.path, capture_output=True, text=True)
        assert listed.stdout.split() == [".", "..", "c.py"]


@pytest.mark.parametrize("script", ["s/x/X/", "s/one/two/"], ids=["same bytes", "new bytes"])
def test_a_save_by_rename_onto_one_name_of_a_linked_file_gives_it_a_file_of_its_own(
    tmp_path: Path, script: str
) -> None:
    """``sed -i`` in a batch on one name of a hard-linked file: once the batch commits,
    the name is a file of its own, as rename(2) makes it, even when sed changed no byte
    (the draft's bytes are the tree's: once, the commit counted that as landed and left
    the names one file, so a later write through one changed the other). The other
    name's file gets no link from the object store either (its st_nlink stays true)."""
    with batch_mount(tmp_path, {}) as m:
        (m.path / "a.txt").write_bytes(b"one\n")  # (journaled: its bytes are an object)
        os.link(m.path / "a.txt", m.path / "b.txt")
        os.mkdir(m.path / ".rw" / "batches" / "b")
        ok(m.path, f"sed -i {script} a.txt")
        assert ctl(m, "b", "commit") == 0
        want = b"one\n" if script == "s/x/X/" else b"two\n"
        assert files_of(m.workspace) == {"a.txt": want, "b.txt": b"one\n"}
        for top in (m.workspace, m.path):
            a, b = os.stat(top / "a.txt"), os.stat(top / "b.txt")
            assert a.st_ino != b.st_ino, top
            assert (a.st_nlink, b.st_nlink) == (1, 1), top
        with open(m.path / "a.txt", "ab") as f:
            f.write(b"more\n")
            f.flush()
            os.fsync(f.fileno())  # (in the tree once fsync returns)
        assert files_of(m.path) == {"a.txt": want + b"more\n", "b.txt": b"one\n"}
        assert files_of(m.workspace) == {"a.txt": want + b"more\n", "b.txt": b"one\n"}


@contextmanager
def linked_draft(tmp_path: Path, write: str) -> Iterator[Mount]:
    """``b.txt`` and ``a/f.txt``, two names of one file made in the tree (the mount has
    seen neither), and batch ``b`` open with a draft of the file written through
    ``a/f.txt`` by the shell command ``write``."""
    with batch_mount(tmp_path, {"b.txt": b"zzz\n"}) as m:
        (m.workspace / "a").mkdir()
        os.link(m.workspace / "b.txt", m.workspace / "a" / "f.txt")
        os.mkdir(m.path / ".rw" / "batches" / "b")
        ok(m.path, write)
        yield m


@pytest.mark.parametrize("away", ["rm", "mv"])
@pytest.mark.parametrize("seen", [True, False], ids=["other name looked up", "other name unseen"])
def test_removing_the_name_a_linked_draft_is_held_under_leaves_it_to_the_other(
    tmp_path: Path, away: str, seen: bool
) -> None:
    """In a batch, a write through one name of a hard-linked file (``cp`` onto it), a
    truncate through the other (or none: the mount never looks that name up), then
    ``rm`` (or ``mv``, which copies and removes in a batch) of the first, the name the
    draft is held under: the other name still shows the draft, and the commit gives it
    the draft. Once, the removal took the draft with it: the other name went back to the
    base bytes, and the writes, each told it succeeded, were lost."""
    with linked_draft(tmp_path, "printf 'new bytes\\n' | cp /dev/stdin a/f.txt") as m:
        if seen:
            os.truncate(m.path / "b.txt", 3)
        want = b"new" if seen else b"new bytes\n"
        ok(m.path, "rm a/f.txt" if away == "rm" else "mv a/f.txt moved.txt")
        moved = {"moved.txt": want} if away == "mv" else {}
        assert files_of(m.path) == {"b.txt": want, **moved}
        assert files_of(m.workspace) == {"b.txt": b"zzz\n"}
        assert ctl(m, "b", "commit") == 0
        assert files_of(m.workspace) == {"b.txt": want, **moved}
        assert os.listdir(m.workspace / "a") == []
        assert os.stat(m.workspace / "b.txt").st_nlink == 1
        assert files_of(m.path) == {"b.txt": want, **moved}


@pytest.mark.parametrize("seen", [True, False], ids=["other name looked up", "other name unseen"])
def test_a_save_by_rename_onto_the_name_a_linked_draft_is_held_under(
    tmp_path: Path, seen: bool
) -> None:
    """As above, with ``sed -i`` in place of the removal: the name sed saves gets a file
    of its own, and the file's other name keeps the draft, seen by the mount or not."""
    with linked_draft(tmp_path, "printf 'new bytes\\n' | cp /dev/stdin a/f.txt") as m:
        if seen:
            assert (m.path / "b.txt").read_bytes() == b"new bytes\n"
        ok(m.path, "sed -i s/new/old/ a/f.txt")
        assert (m.path / "a" / "f.txt").read_bytes() == b"old bytes\n"
        assert (m.path / "b.txt").read_bytes() == b"new bytes\n"
        assert ctl(m, "b", "commit") == 0
        assert (m.workspace / "a" / "f.txt").read_bytes() == b"old bytes\n"
        assert files_of(m.workspace) == files_of(m.path) == {"b.txt": b"new bytes\n"}
        assert os.stat(m.workspace / "b.txt").st_nlink == 1


def test_a_linked_drafts_other_name_made_again_in_the_batch_does_not_take_the_draft(
    tmp_path: Path,
) -> None:
    """The draft of a hard-linked file held under ``a/f.txt``; ``b.txt``, its other name,
    removed and made again in the batch (a new file there); then ``rm a/f.txt``: the
    draft has no name left (the tree's ``b.txt`` is the batch's new file now), so it goes,
    and the new ``b.txt`` keeps its own bytes."""
    with linked_draft(tmp_path, "printf 'draft\\n' > a/f.txt") as m:
        ok(m.path, "rm b.txt && printf 'mine\\n' > b.txt")
        ok(m.path, "rm a/f.txt")
        assert files_of(m.path) == {"b.txt": b"mine\n"}
        assert ctl(m, "b", "commit") == 0
        assert files_of(m.workspace) == files_of(m.path) == {"b.txt": b"mine\n"}
        assert os.listdir(m.workspace / "a") == []


def test_a_save_by_rename_onto_one_name_of_a_linked_draft_leaves_the_other_the_draft(
    tmp_path: Path,
) -> None:
    with batch_mount(tmp_path, {"a.txt": b"one\n"}) as m:
        os.link(m.path / "a.txt", m.path / "b.txt")
        os.mkdir(m.path / ".rw" / "batches" / "b")
        (m.path / "b.txt").write_bytes(b"two\n")  # the draft of the file both names are
        assert (m.path / "a.txt").read_bytes() == b"two\n"
        ok(m.path, "sed -i s/two/three/ a.txt")  # a.txt alone gets a new file
        assert files_of(m.path) == {"a.txt": b"three\n", "b.txt": b"two\n"}
        assert files_of(m.workspace) == {"a.txt": b"one\n", "b.txt": b"one\n"}
        assert ctl(m, "b", "commit") == 0
        assert files_of(m.workspace) == {"a.txt": b"three\n", "b.txt": b"two\n"}
        assert os.stat(m.workspace / "a.txt").st_ino != os.stat(m.workspace / "b.txt").st_ino
