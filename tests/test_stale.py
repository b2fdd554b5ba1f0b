"""Stale writes (SPEC §6.4) through a real mount: a process replaces a file it read before
another process changed it. Two real processes: the reader-writer is a child Python
process that reads, waits for a line on stdin, then writes back what it read plus its edit.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT

_READ_THEN_WRITE = """
import sys
data = open(sys.argv[1]).read()
print("read", flush=True)
sys.stdin.readline()
try:
    with open(sys.argv[1], "w") as f:
        f.write(data + sys.argv[2])
    print("ok", flush=True)
except OSError as exc:
    print(f"errno {exc.errno}", flush=True)
"""


def _lost_update(path: Path, edit: str, meanwhile: str | Callable[[], object] | None) -> str:
    """The child reads ``path``; this process appends ``meanwhile`` (if any; or calls it);
    the child writes back its read plus ``edit``. Returns the child's outcome line."""
    child = subprocess.Popen(
        [sys.executable, "-c", _READ_THEN_WRITE, str(path), edit],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "read"
    if callable(meanwhile):
        meanwhile()
    elif meanwhile is not None:
        with open(path, "a") as f:
            f.write(meanwhile)
    child.stdin.write("\n")
    child.stdin.flush()
    out = child.stdout.read().strip()
    assert child.wait(timeout=60) == 0
    return out


def _events(m: Mount) -> list[dict[str, object]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _stale_warnings(m: Mount) -> list[dict[str, object]]:
    return [
        w
        for ev in _events(m)
        for w in ev.get("warnings", [])  # type: ignore[attr-defined]
        if w["gate"] == "stale_write"
    ]


def _with_policy(workspace: Path, stale_write: str) -> Mount:
    text = DEFAULT_TEXT.replace('stale_write = "warn"', f'stale_write = "{stale_write}"')
    assert f'stale_write = "{stale_write}"' in text
    prepare_state(workspace, text)
    return Mount(workspace).start()


def test_a_lost_update_is_warned_by_default(mount: Mount) -> None:
    f = mount.path / "notes.txt"
    f.write_text("v0\n")
    assert _lost_update(f, "child edit\n", meanwhile="other edit\n") == "ok"
    # warn: the write proceeds (the other edit is lost, as without rwfs) and is recorded.
    assert f.read_text() == "v0\nchild edit\n"
    (warning,) = _stale_warnings(mount)
    assert str(warning["read"]).startswith("sha256:")
    stats = json.loads((mount.path / ".rw" / "stats").read_text())
    assert stats["counts"]["stale_writes"] == 1


def test_no_warning_without_a_change_by_another_process(mount: Mount) -> None:
    f = mount.path / "notes.txt"
    f.write_text("v0\n")
    assert _lost_update(f, "one\n", meanwhile=None) == "ok"
    # The child's own earlier write does not make its next write stale.
    assert _lost_update(f, "two\n", meanwhile=None) == "ok"
    assert f.read_text() == "v0\none\ntwo\n"
    assert _stale_warnings(mount) == []


def test_conflict_policy_refuses_with_estale_and_opens_a_conflict(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("base\n")
    m = _with_policy(workspace, "conflict")
    try:
        f = m.path / "notes.txt"
        assert _lost_update(f, "child edit\n", meanwhile="other edit\n") == "errno 116"
        assert f.read_text() == "base\nother edit\n"  # the other process's change is kept
        env = json.loads((m.path / ".rw" / "last-error").read_text())
        assert (env["error"], env["reason_hint"], env["errno"]) == (
            "stale_precondition",
            "stale_write",
            "ESTALE",
        )
        (cid,) = [p.name for p in (m.path / ".rw" / "conflicts").iterdir()]
        top = m.path / ".rw" / "conflicts" / cid
        info = json.loads((top / "info").read_text())
        assert (info["path"], info["reason"]) == ("notes.txt", "stale_write")
        assert (top / "base").read_text() == "base\n"  # what the child had read
        assert (top / "intended").read_text() == "base\nchild edit\n"
        assert (top / "actual").read_text() == "base\nother edit\n"
        merged = (top / "merged").read_text()
        assert "<<<<<<< actual" in merged and "child edit" in merged and "other edit" in merged
        # take-intended writes the child's bytes, since the file still holds "actual".
        (top / "ctl").write_text("take-intended\n")
        assert f.read_text() == "base\nchild edit\n"
        assert list((m.path / ".rw" / "conflicts").iterdir()) == []
        assert any(
            ev["op"] == "resolve" and ev.get("resolution") == "take-intended" for ev in _events(m)
        )
    finally:
        m.stop()
    check_clean(m)


def test_off_policy_neither_warns_nor_refuses(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("v0\n")
    m = _with_policy(workspace, "off")
    try:
        f = m.path / "notes.txt"
        assert _lost_update(f, "child\n", meanwhile="other\n") == "ok"
        assert f.read_text() == "v0\nchild\n"
        assert _stale_warnings(m) == []
    finally:
        m.stop()
    check_clean(m)


def test_stale_write_policy_is_validated(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    before = pol.read_text()
    try:
        pol.write_text(before.replace('stale_write = "warn"', 'stale_write = "maybe"'))
        raise AssertionError("an invalid stale_write was accepted")
    except OSError as exc:
        assert exc.errno == 22
    assert pol.read_text() == before
    assert "stale_write" in json.loads((mount.path / ".rw" / "last-error").read_text())["message"]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _replace(path: Path, data: str) -> Callable[[], None]:
    """Another process's save that replaces the file's inode: a temporary renamed over it."""

    def run() -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(data)
        os.replace(tmp, path)

    return run


def _recreate(path: Path, data: str) -> Callable[[], None]:
    """Another process's save that removes the file and makes it again (git checkout)."""

    def run() -> None:
        path.unlink()
        path.write_text(data)

    return run


def test_a_lost_update_over_a_replaced_file_is_warned(workspace: Path) -> None:
    # Made before the mount: no version of it was ever committed through the mount, so
    # what the child read is known only from the replaced inode's bytes.
    (workspace / "a.txt").write_text("v0\n")
    (workspace / "b.txt").write_text("v0\n")
    m = Mount(workspace).start()
    try:
        a, b = m.path / "a.txt", m.path / "b.txt"
        assert _lost_update(a, "child\n", meanwhile=_replace(a, "v0\nother\n")) == "ok"
        assert _lost_update(b, "child\n", meanwhile=_recreate(b, "v0\nother\n")) == "ok"
        assert a.read_text() == b.read_text() == "v0\nchild\n"
        writes = [
            ev
            for ev in _events(m)
            if ev["op"] == "write" and ev.get("intended") == _sha(b"v0\nchild\n")
        ]
        assert [ev["path"] for ev in writes] == ["a.txt", "b.txt"]
        for ev in writes:
            stale = [w for w in ev.get("warnings", []) if w["gate"] == "stale_write"]
            assert [w["read"] for w in stale] == [_sha(b"v0\n")], ev
    finally:
        m.stop()
    check_clean(m)


def test_a_replaced_file_moved_away_is_the_conflict_base(workspace: Path) -> None:
    # The file the child read is renamed away (kept, not removed: never an object), and a
    # new one is made in its place: the conflict's base is still what the child read.
    (workspace / "notes.txt").write_text("base\n")
    m = _with_policy(workspace, "conflict")
    try:
        f = m.path / "notes.txt"

        def move_away() -> None:
            os.rename(f, m.path / "notes.bak")
            f.write_text("base\nother\n")

        assert _lost_update(f, "child\n", meanwhile=move_away) == "errno 116"
        assert f.read_text() == "base\nother\n"
        (cid,) = [p.name for p in (m.path / ".rw" / "conflicts").iterdir()]
        top = m.path / ".rw" / "conflicts" / cid
        assert json.loads((top / "info").read_text())["reason"] == "stale_write"
        got = [(top / n).read_text() for n in ("base", "intended", "actual")]
        assert got == ["base\n", "base\nchild\n", "base\nother\n"]
        (top / "ctl").write_text("keep-actual\n")
    finally:
        m.stop()
    check_clean(m)


_SAVE_BY_RENAME_THEN_WRITE = """
import os, sys
path = sys.argv[1]
data = open(path).read()
with open(path + ".tmp", "w") as f:
    f.write(data + "one\\n")
os.replace(path + ".tmp", path)
with open(path, "w") as f:
    f.write(data + "one\\ntwo\\n")
os.rename(path, path + ".old")
with open(path, "w") as f:
    f.write("three\\n")
"""


def test_no_false_stale_write_over_a_replacement(workspace: Path) -> None:
    (workspace / "own.txt").write_text("v0\n")
    (workspace / "same.txt").write_text("v0\n")
    (workspace / "back.txt").write_text("v0\n")
    (workspace / "gone.txt").write_text("v0\n")
    m = _with_policy(workspace, "conflict")
    try:
        # A process that replaces the file itself (an editor's safe save, then a write in
        # place, then a rename-away save) has seen every version it writes over.
        own = m.path / "own.txt"
        subprocess.run([sys.executable, "-c", _SAVE_BY_RENAME_THEN_WRITE, str(own)], check=True)
        assert own.read_text() == "three\n"
        assert (m.path / "own.txt.old").read_text() == "v0\none\ntwo\n"
        # Replaced by another process with the very bytes the child read: nothing is lost.
        same = m.path / "same.txt"
        assert _lost_update(same, "child\n", meanwhile=_replace(same, "v0\n")) == "ok"
        # Renamed away and back: the file the child read is the file it writes.
        back = m.path / "back.txt"

        def away_and_back() -> None:
            os.rename(back, m.path / "back.bak")
            os.rename(m.path / "back.bak", back)

        assert _lost_update(back, "child\n", meanwhile=away_and_back) == "ok"
        # Removed by another process, then made again by the child: nobody's bytes lost.
        gone = m.path / "gone.txt"
        assert _lost_update(gone, "child\n", meanwhile=gone.unlink) == "ok"
        assert same.read_text() == back.read_text() == gone.read_text() == "v0\nchild\n"
        assert list((m.path / ".rw" / "conflicts").iterdir()) == []
        assert _stale_warnings(m) == []
    finally:
        m.stop()
    check_clean(m)
