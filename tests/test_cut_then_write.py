"""An explicit truncation opens no way around the gates, through a real mount: a truncation
alone (``truncate -s N f``, ``ftruncate`` then ``close``) is a deliberate cut and is never
refused, but a write of the same user's that follows it within ``baselines.RECREATE_S`` is
judged against the bytes from before the truncation, as it would be within one open
(``ftruncate`` then ``write``), and a refusal puts those bytes back, as for a save by
removal and re-creation (docs/gates.md)."""

from __future__ import annotations

import errno
import inspect
import json
import os
import subprocess
import time
from typing import Any

import pytest
from conftest import Mount
from test_rights import as_other, shared  # noqa: F401  (shared: a fixture)

REAL = inspect.getsource(json.decoder)  # a real module of a few hundred lines
CUT = "".join(REAL.splitlines(keepends=True)[:40])  # cut off after line 40
ELIDED = CUT + "# ... rest of the module unchanged ...\n"


def events(m: Mount, **match: Any) -> list[dict[str, Any]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    got = [json.loads(line) for line in lines]
    return [ev for ev in got if all(ev.get(k) == v for k, v in match.items())]


def why(m: Mount, name: str) -> dict[str, Any]:
    return dict(json.loads((m.path / ".rw" / "why" / name).read_text()))


def sh(m: Mount, script: str, body: str = "") -> subprocess.CompletedProcess[str]:
    """``script`` in bash in the mount, with ``$BODY`` holding ``body``."""
    env = {"PATH": "/usr/bin:/bin", "BODY": body}
    return subprocess.run(
        ["bash", "-c", script], cwd=m.path, env=env, capture_output=True, text=True, timeout=60
    )


def refused_and_put_back(m: Mount, name: str, draft: str) -> None:
    """The write was refused, the file holds its bytes from before the truncation again,
    put back by rwfs after the refusal, the draft is kept and why/ tells of it."""
    f = m.path / name
    assert f.read_text() == REAL
    (refusal,) = events(m, op="refuse", path=name)
    shown = why(m, name)
    assert (shown["ok"], shown["error"], shown["lsn"]) == (False, "blocked", refusal["lsn"])
    assert shown["reason_hint"] in ("truncation", "elision"), shown
    assert "rwfs allow" in shown["message"]
    rejected = m.path / ".rw" / "rejected" / refusal["draft"]
    assert rejected.read_text() == draft
    put = events(m, op="write", path=name)[-1]
    daemon = json.loads((m.path / ".rw" / "status").read_text())["pid"]
    assert (put["pid"], put["comm"], put.get("put_back")) == (daemon, "rwfs", True), put
    assert put["refused_lsn"] == refusal["lsn"] < put["lsn"]
    assert (m.workspace / name).read_text() == REAL  # the tree too, once synced


def test_truncate_then_a_rewrite_is_judged_against_the_file_before_the_cut(
    mount: Mount,
) -> None:
    (mount.path / "cut.txt").write_text(CUT)
    (mount.path / "decoder.py").write_text(REAL)
    res = sh(mount, "truncate -s 0 decoder.py && cat cut.txt > decoder.py")
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    assert "rwfs: Your write to decoder.py was refused" in res.stderr, res
    refused_and_put_back(mount, "decoder.py", CUT)


def test_truncate_then_an_append_is_judged_against_the_file_before_the_cut(
    mount: Mount,
) -> None:
    (mount.path / "decoder.py").write_text(REAL)
    # (printf is a builtin: the refusal reaches only stderr, why/ and last-error)
    res = sh(mount, 'truncate -s 0 decoder.py && printf "%s" "$BODY" >> decoder.py', ELIDED)
    assert "rwfs: Your write to decoder.py was refused" in res.stderr, res
    refused_and_put_back(mount, "decoder.py", ELIDED)


def test_ftruncate_committed_then_a_write_of_the_same_open_file(mount: Mount) -> None:
    """fsync() after the ftruncate makes the cut a commit of its own: the write after it,
    through the same descriptor, is judged as if both were one change."""
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    fd = os.open(f, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.fsync(fd)  # the truncation alone: committed, not refused
        assert os.pwrite(fd, CUT.encode(), 0) == len(CUT)
        with pytest.raises(OSError) as info:
            os.fsync(fd)
        assert info.value.errno == errno.EBADMSG
    finally:
        os.close(fd)
    refused_and_put_back(mount, "decoder.py", CUT)


def test_truncate_then_a_save_by_rename_is_judged_against_the_file_before_the_cut(
    mount: Mount,
) -> None:
    (mount.path / "decoder.py").write_text(REAL)
    (mount.path / "tmp.py").write_text(CUT)
    res = sh(mount, "truncate -s 0 decoder.py && mv tmp.py decoder.py")
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    assert (mount.path / "tmp.py").read_text() == CUT  # the rename failed: both stay
    refused_and_put_back(mount, "decoder.py", CUT)


def test_truncate_then_remove_and_make_again_is_judged_against_the_file_before_the_cut(
    mount: Mount,
) -> None:
    (mount.path / "cut.txt").write_text(CUT)
    (mount.path / "decoder.py").write_text(REAL)
    res = sh(mount, "truncate -s 0 decoder.py && rm decoder.py && cp cut.txt decoder.py")
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    refused_and_put_back(mount, "decoder.py", CUT)


def test_a_truncation_alone_is_still_a_deliberate_cut(mount: Mount) -> None:
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    res = sh(mount, "truncate -s 100 decoder.py")
    assert res.returncode == 0, res
    assert f.read_text() == REAL[:100]
    fd = os.open(f, os.O_RDWR)
    try:
        os.ftruncate(fd, 50)
    finally:
        os.close(fd)  # its commit point: not refused
    assert f.read_text() == REAL[:50]
    assert events(mount, op="refuse") == []
    # Made longer by a write that keeps what is left: judged against the whole file, and
    # not a cut of it (the first 50 characters, then whole new lines of its own).
    more = "".join(f"VALUE_{n} = {n}\n" for n in range(400))
    res = sh(mount, 'printf "\\n%s" "$BODY" >> decoder.py', more)
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert f.read_text() == REAL[:50] + "\n" + more
    assert events(mount, op="refuse") == []


def test_rwfs_allow_lets_the_write_after_a_truncation_through(mount: Mount) -> None:
    (mount.path / "cut.txt").write_text(CUT)
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    (mount.path / ".rw" / "ctl").write_text("allow decoder.py\n")
    res = sh(mount, "truncate -s 0 decoder.py && cat cut.txt > decoder.py")
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert f.read_text() == CUT
    assert events(mount, op="refuse") == []
    write = events(mount, op="write", path="decoder.py")[-1]
    assert "truncation" in [w["gate"] for w in write["allowed"]["waived"]], write


def test_a_small_file_emptied_then_written_is_judged_against_what_it_held(
    mount: Mount,
) -> None:
    """Emptied by an O_TRUNC open with nothing written, a file of 15 lines passes the gates
    (too few lines lost to be a cut); the write that follows is judged against those
    15 lines, where a placeholder standing for all of them is an elision."""
    small = "".join(REAL.splitlines(keepends=True)[:15])
    f = mount.path / "small.py"
    f.write_text(small)
    open(f, "w").close()  # committed at this close (the opener's only descriptor)
    assert f.read_text() == ""
    draft = "# ... rest unchanged ...\n"
    with pytest.raises(OSError) as info:
        with open(f, "a") as out:
            out.write(draft)
    assert info.value.errno == errno.EBADMSG
    assert f.read_text() == small
    (refusal,) = events(mount, op="refuse", path="small.py")
    assert refusal["gate"] == "elision", refusal
    put = events(mount, op="write", path="small.py")[-1]
    assert put.get("put_back") is True and put["refused_lsn"] == refusal["lsn"], put


def test_a_tool_that_writes_back_what_the_truncation_left_changes_nothing(
    mount: Mount,
) -> None:
    """sed -i of the file a truncation emptied saves the empty file again, by rename: no
    edit, so nothing is refused and the truncation stays."""
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    res = sh(mount, "truncate -s 0 decoder.py && sed -i s/a/b/ decoder.py")
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert f.read_text() == ""
    assert events(mount, op="refuse") == []


def test_a_hard_linked_file_truncated_then_rewritten_gets_its_bytes_back(
    mount: Mount,
) -> None:
    """A hard-linked file is committed in place, so the truncation changes the very inode
    whose bytes the write is to be judged against: they are copied first."""
    (mount.path / "cut.txt").write_text(CUT)
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    os.link(f, mount.path / "other-name.py")
    res = sh(mount, "truncate -s 0 decoder.py && cat cut.txt > decoder.py")
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    refused_and_put_back(mount, "decoder.py", CUT)
    assert (mount.path / "other-name.py").read_text() == REAL  # one file, both names
    assert os.stat(f).st_ino == os.stat(mount.path / "other-name.py").st_ino


def test_another_users_write_after_a_truncation_is_judged_as_ever(shared: Mount) -> None:  # noqa: F811
    """As for a save by re-creation, only the user who truncated the file has their next
    write judged against the bytes from before: another user's write is judged against
    the file as it is (decided: docs/gates.md)."""
    m = shared
    (m.path / "cut.txt").write_text(CUT)
    f = m.path / "decoder.py"
    f.write_text(REAL)
    f.chmod(0o666)
    assert sh(m, "truncate -s 0 decoder.py").returncode == 0
    res = as_other(f"cat {m.path / 'cut.txt'} > {f}")
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert f.read_text() == CUT
    assert events(m, op="refuse") == []


def test_a_new_file_where_a_renamed_directory_held_a_cut_one_is_new(mount: Mount) -> None:
    (mount.path / "d").mkdir()
    (mount.path / "cut.txt").write_text(CUT)
    (mount.path / "d" / "m.py").write_text(REAL)
    res = sh(mount, "truncate -s 0 d/m.py && mv d e && mkdir d && cat cut.txt > d/m.py")
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert (mount.path / "d" / "m.py").read_text() == CUT
    assert (mount.path / "e" / "m.py").read_text() == ""
    assert events(mount, op="refuse") == []


def test_past_the_window_a_write_is_judged_against_what_the_truncation_left(
    mount: Mount,
) -> None:
    """The window is RECREATE_S, the one of a save by re-creation (decided: a write that
    long after the truncation is a write of the file as it is)."""
    from rwfs.core.baselines import RECREATE_S

    (mount.path / "cut.txt").write_text(CUT)
    f = mount.path / "decoder.py"
    f.write_text(REAL)
    assert sh(mount, "truncate -s 0 decoder.py").returncode == 0
    time.sleep(RECREATE_S + 0.5)
    res = sh(mount, "cat cut.txt > decoder.py")
    assert res.returncode == 0 and "refused" not in res.stderr, res
    assert f.read_text() == CUT
    assert events(mount, op="refuse") == []
