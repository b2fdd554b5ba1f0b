"""Stale writes (SPEC §6.4) through a real mount: a process replaces a file it read before
another process changed it. Two real processes: the reader-writer is a child Python
process that reads, waits for a line on stdin, then writes back what it read plus its edit.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def _lost_update(path: Path, edit: str, meanwhile: str | None) -> str:
    """The child reads ``path``; this process appends ``meanwhile`` (if any); the child
    writes back its read plus ``edit``. Returns the child's outcome line."""
    child = subprocess.Popen(
        [sys.executable, "-c", _READ_THEN_WRITE, str(path), edit],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "read"
    if meanwhile is not None:
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
