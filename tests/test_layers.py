"""The paper's other layers (SPEC §8) through a real mount: the scratchpad, chunked
composition (including a daemon crash between chunks) and the handoff note."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import Mount, check_clean, prepare_state

from rwfs.policy import DEFAULT_TEXT


def _errno(fn: object) -> int:
    try:
        fn()  # type: ignore[operator]
    except OSError as exc:
        return int(exc.errno or 0)
    raise AssertionError("no error")


def test_scratch_stores_by_digest_outside_the_tree(mount: Mount) -> None:
    scratch = mount.path / ".rw" / "scratch"
    secret = b"token sk-ant-" + b"Q" * 30 + b"\n"
    (scratch / "creds.txt").write_bytes(secret)
    (scratch / "same.txt").write_bytes(secret)
    assert sorted(p.name for p in scratch.iterdir()) == ["creds.txt", "same.txt"]
    assert (scratch / "creds.txt").read_bytes() == secret
    assert not (mount.path / "creds.txt").exists()  # never in the tree
    (scratch / "same.txt").unlink()
    assert [p.name for p in scratch.iterdir()] == ["creds.txt"]
    assert (scratch / "creds.txt").read_bytes() == secret  # dedup: the other name still reads
    assert _errno(lambda: (scratch / "sub").mkdir()) in (1, 13, 38)  # no directories there


def test_scratch_readable_false_is_a_deposit_box(workspace: Path) -> None:
    prepare_state(
        workspace, DEFAULT_TEXT.replace("scratch_readable = true", "scratch_readable = false")
    )
    m = Mount(workspace).start()
    try:
        box = m.path / ".rw" / "scratch" / "pii.csv"
        box.write_bytes(b"name,ssn\nx,123-45-6789\n")
        assert [p.name for p in box.parent.iterdir()] == ["pii.csv"]
        assert _errno(box.read_bytes) == 13  # EACCES: written, not readable
        env = json.loads((m.path / ".rw" / "last-error").read_text())
        assert env["reason_hint"] == "scratch" and "write-only" in env["message"]
    finally:
        m.stop()
    check_clean(m)


def test_chunks_compose_checks_contiguity_and_commits_through_the_gates(mount: Mount) -> None:
    session = mount.path / ".rw" / "chunks" / "big"
    session.mkdir()
    (session / "part-001").write_text("def f():\n")
    (session / "part-003").write_text("    return 3\n")
    assert "part 2" in (session / "preview").read_text()
    assert _errno(lambda: (session / "ctl").write_text("compose big.py\n")) == 22
    assert not (mount.path / "big.py").exists()
    (session / "part-002").write_text("    x = 1\n")
    (session / "ctl").write_text("expect 4\n")
    assert "expects 4" in (session / "preview").read_text()
    (session / "ctl").write_text("expect 3\n")
    assert (session / "preview").read_text() == "def f():\n    x = 1\n    return 3\n"
    (session / "ctl").write_text("compose big.py\n")
    assert (mount.path / "big.py").read_text() == "def f():\n    x = 1\n    return 3\n"
    # Composing over a good file with a broken composition is refused like any write.
    (session / "part-003").write_text("    return (3\n")
    assert _errno(lambda: (session / "ctl").write_text("compose big.py\n")) == 74  # EBADMSG
    assert (mount.path / "big.py").read_text().endswith("return 3\n")
    for bad in ("compose ../out.py", "compose /etc/x", "compose .rw/x", "compose", "expect x"):
        assert _errno(lambda bad=bad: (session / "ctl").write_text(bad + "\n")) in (1, 22), bad
    assert _errno(lambda: (session / "notapart").write_text("x")) == 22
    (mount.path / ".rw" / "ctl").write_text("sync\n")
    ops = [
        json.loads(line)["op"] for line in (mount.path / ".rw" / "journal").read_text().splitlines()
    ]
    assert ops.count("refuse") == 1


def test_chunks_survive_a_daemon_crash(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        session = m.path / ".rw" / "chunks" / "s"
        session.mkdir()
        (session / "part-001").write_text("one\n")
        (session / "part-002").write_text("two\n")
        assert m.proc is not None
        os.kill(m.proc.pid, signal.SIGKILL)
        m.wait_dead()
    finally:
        m.stop()
    m = Mount(workspace).start()
    try:
        session = m.path / ".rw" / "chunks" / "s"
        assert sorted(p.name for p in session.iterdir()) == [
            "ctl",
            "part-001",
            "part-002",
            "preview",
        ]
        (session / "part-003").write_text("three\n")
        (session / "ctl").write_text("compose out.txt\n")
        assert (m.path / "out.txt").read_text() == "one\ntwo\nthree\n"
    finally:
        m.stop()
    check_clean(m)


def test_handoff_records_the_last_good_state_and_warns_of_drift(mount: Mount) -> None:
    handoff = mount.path / ".rw" / "handoff"
    assert "No handoff yet" in handoff.read_text()
    (mount.path / "a.py").write_text("a = 1\n")
    (mount.path / "b.py").write_text("b = 1\n")
    handoff.write_text("---\ntask_id: t1\nstatus: partial\n---\n# Next\nFinish b.py\n")
    text = handoff.read_text()
    assert text.startswith("---\n") and "task_id: t1" in text and "# Next\nFinish b.py\n" in text
    assert "path: a.py" in text and "path: b.py" in text and "drift: []" in text
    (mount.path / "b.py").write_text("b = 2\n")  # changed since the note
    text = handoff.read_text()
    assert "drift: b.py has changed" in text and "drift: []" not in text
    # A second note lists only what was committed since the first; the first is archived.
    (mount.path / "c.py").write_text("c = 1\n")
    handoff.write_text("# Second\n")
    text = handoff.read_text()
    assert "path: c.py" in text and "path: a.py" not in text
    (old,) = list((mount.path / ".rw" / "handoffs").iterdir())
    assert "Finish b.py" in old.read_text()


def test_fsck_finds_an_object_the_scratchpad_needs_missing(workspace: Path) -> None:
    m = Mount(workspace).start()
    try:
        (m.path / ".rw" / "scratch" / "note.bin").write_bytes(b"kept outside the tree\n")
    finally:
        m.stop()
    assert m.fsck().returncode == 0
    objects = workspace / ".rw" / "objects"
    (victim,) = [p for p in objects.glob("??/*") if p.read_bytes() == b"kept outside the tree\n"]
    victim.unlink()
    res = m.fsck()
    assert res.returncode == 1 and "scratch file note.bin" in res.stdout


def test_a_control_write_over_its_limit_applies_nothing(mount: Mount) -> None:
    pol = mount.path / ".rw" / "policy.toml"
    before = pol.read_text()
    with pytest.raises(OSError) as err:
        with open(pol, "w") as f:
            f.write(before + "#" * (2 << 20))  # a valid policy, but over 1 MiB
    assert err.value.errno == 27  # EFBIG
    assert pol.read_text() == before
