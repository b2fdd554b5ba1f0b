"""A deliberate change has a sanctioned way through the gates: ``rwfs allow PATH`` (or
``allow PATH`` in ``.rw/ctl``) lets the caller's next write of PATH through the gates that
judge whether a file was broken, once, journaled as allowed; the refusal names it."""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import RWFS, Mount, check_clean, prepare_state
from test_rights import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)

from rwfs.checks.allowances import WAIVES, Allowance, Allowances, allow_hint, waivable, waive
from rwfs.checks.findings import Finding

LINES = "".join(f"line {i} of a long test file, with enough words to count\n" for i in range(120))
KEPT = "".join(LINES.splitlines(True)[:15])  # the first 15 lines: most of the file deleted


def rwfs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RWFS, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def events(m: Mount, **match: Any) -> list[dict[str, Any]]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    got = [json.loads(line) for line in lines]
    return [ev for ev in got if all(ev.get(k) == v for k, v in match.items())]


def envelope(m: Mount, path: str = "") -> dict[str, Any]:
    where = m.path / ".rw" / ("why/" + path if path else "last-error")
    return dict(json.loads(where.read_text()))


def refused(path: Path, text: str) -> OSError:
    with pytest.raises(OSError) as info:
        with open(path, "w") as f:
            f.write(text)
    assert info.value.errno == errno.EBADMSG, info.value
    return info.value


def ctl(m: Mount, text: str) -> None:
    with open(m.path / ".rw" / "ctl", "w") as f:
        f.write(text)


def ctl_fails(m: Mount, text: str) -> OSError:
    with pytest.raises(OSError) as info:
        ctl(m, text)
    return info.value


def allowed(m: Mount) -> list[dict[str, Any]]:
    return list(json.loads((m.path / ".rw" / "allowed").read_text())["allowed"])


def test_a_deliberate_deletion_goes_through_by_the_way_its_refusal_names(
    mount: Mount, tmp_path: Path
) -> None:
    m = mount
    f = m.path / "tests.txt"
    f.write_text(LINES)
    refused(f, KEPT)  # "drop most of these tests": refused as a truncation
    assert f.read_text() == LINES
    env = envelope(m, "tests.txt")
    hint = env["allow"]
    # The next step names the verb, usable from any directory, and how to write the draft.
    assert hint["command"] == f"rwfs allow {m.path}/tests.txt", hint
    assert hint["ctl"] == "allow tests.txt"
    assert hint["then"] == f"cp {m.path}/{env['draft']} {m.path}/tests.txt"
    assert hint["command"] in env["message"] and hint["then"] in env["message"]
    assert "deliberate" in env["suggested_action"]

    res = rwfs(*shlex.split(hint["command"])[1:], cwd=tmp_path)  # from outside the mount
    assert res.returncode == 0, res.stderr
    assert "allowed tests.txt" in res.stdout
    [grant] = events(m, op="allow", path="tests.txt")
    assert grant["state"] == "granted" and grant["uid"] == 0 and grant["waives"] == list(WAIVES)
    [open_one] = allowed(m)
    assert open_one["path"] == "tests.txt" and open_one["uid"] == 0
    assert open_one["lsn"] == grant["lsn"]
    status = json.loads(rwfs("status", "--json", cwd=m.path).stdout)
    assert status["allowed"] == [open_one]  # rwfs status shows it too

    subprocess.run(shlex.split(hint["then"]), check=True, timeout=30)  # the refused draft
    assert f.read_text() == KEPT
    [write] = events(m, op="write", path="tests.txt", intended=env["intended"])
    assert write["allowed"]["lsn"] == grant["lsn"] and write["allowed"]["uid"] == 0
    assert write["allowed"]["comm"] == grant["comm"]  # who granted it
    assert "truncation" in [w["gate"] for w in write["allowed"]["waived"]]
    assert allowed(m) == []  # used up
    assert json.loads((m.path / ".rw" / "why" / "tests.txt").read_text())["ok"] is True

    f.write_text(LINES)  # (growing it back is no cut)
    refused(f, KEPT)  # the next deliberate-looking cut is gated again
    assert f.read_text() == LINES
    log = rwfs("log", "tests.txt", cwd=m.path)
    assert " allow " in log.stdout


def test_an_allowance_is_its_users_alone(shared: Mount) -> None:  # noqa: F811
    m = shared
    pub = m.path / "pub.txt"  # root's, writable by all
    pub.write_text(LINES)
    os.chmod(pub, 0o666)
    mine = m.path / "mine.txt"  # root's, 0644: the other user may not write it
    mine.write_text(LINES)
    cut = m.path.parent / "cut.txt"
    cut.write_text(KEPT)
    os.chmod(cut, 0o644)
    ctl(m, "allow pub.txt\n")  # root's allowance

    res = as_other(f"cp {cut} {pub}")  # nobody's write is not let through by it
    assert res.returncode != 0 and "Bad message" in res.stderr, res
    assert pub.read_text() == LINES
    assert [(a["path"], a["uid"]) for a in allowed(m)] == [("pub.txt", 0)]

    res = as_other(f"echo 'allow mine.txt' > {m.path}/.rw/ctl")  # not theirs to write
    assert res.returncode != 0
    assert envelope(m)["errno"] == "EACCES"
    res = as_other(f"echo 'allow pub.txt' > {m.path}/.rw/ctl")  # their own allowance
    assert res.returncode == 0, res.stderr
    assert sorted((a["path"], a["uid"]) for a in allowed(m)) == [
        ("pub.txt", 0),
        ("pub.txt", OTHER),
    ]
    res = as_other(f"cp {cut} {pub}")
    assert res.returncode == 0, res.stderr
    assert pub.read_text() == KEPT
    [write] = events(m, op="write", path="pub.txt", uid=OTHER)
    assert write["allowed"]["uid"] == OTHER
    assert [(a["path"], a["uid"]) for a in allowed(m)] == [("pub.txt", 0)]  # root's stays


def test_the_ctl_form_cancelling_and_bad_input(mount: Mount) -> None:
    m = mount
    f = m.path / "f.txt"
    f.write_text(LINES)
    (m.path / "sub").mkdir()
    (m.path / "link").symlink_to("f.txt")
    (m.path / "-dash.txt").write_text(LINES)
    before = len(events(m, op="allow"))
    bad = [
        "allow",
        "allow /etc/passwd",
        "allow ../outside.txt",
        "allow sub/../../outside.txt",
        "allow .rw/ctl",
        "allow .rw",
        "allow -dash.txt",
        "allow --secrets f.txt",
        "allow nodir/new.txt",
        "allow f.txt/x",
        "allow sub",
        "allow .",
        "allow link",
        "allow ''",
        "allow f.txt nodir/new.txt",  # one bad path: nothing at all is allowed
        "allow --cancel f.txt",  # none to cancel
    ]
    for text in bad:
        err = ctl_fails(m, text + "\n")
        assert err.errno == errno.EINVAL, (text, err)
        env = envelope(m)
        assert env["error"] == "policy_violation" and env["reason_hint"] == "verb", env
        assert env["message"].startswith("Nothing was"), env
    ctl_fails(m, "allow -dash.txt\n")
    assert "./-dash.txt" in envelope(m)["message"]
    assert allowed(m) == []
    assert len(events(m, op="allow")) == before  # nothing journaled
    for path in ("/etc/passwd", "../outside.txt", ".rw/ctl", "sub", "nodir/x.txt", "link"):
        res = rwfs("allow", path, cwd=m.path)
        assert res.returncode == 1, (path, res)
        assert res.stderr.startswith("rwfs: Nothing was allowed"), (path, res.stderr)
    assert allowed(m) == []

    assert rwfs("allow", cwd=m.path).stdout == "rwfs: no allowances\n"
    ctl(m, "allow ./-dash.txt sub/new.txt\n")  # a name that could be made is fine too
    assert sorted(a["path"] for a in allowed(m)) == ["-dash.txt", "sub/new.txt"]
    listed = rwfs("allow", cwd=m.path).stdout.splitlines()
    assert sorted(x.split("\t")[:2] for x in listed) == [
        ["-dash.txt", "uid 0"],
        ["sub/new.txt", "uid 0"],
    ]
    res = rwfs("allow", "--cancel", "--", "-dash.txt", "sub/new.txt", cwd=m.path)
    assert res.returncode == 0, res.stderr
    assert allowed(m) == []
    assert [e["state"] for e in events(m, op="allow", path="-dash.txt")] == [
        "granted",
        "cancelled",
    ]
    refused(m.path / "-dash.txt", KEPT)  # cancelled: gated

    ctl(m, "allow f.txt\n")  # the ctl form
    f.write_text(KEPT)
    assert f.read_text() == KEPT
    write = events(m, op="write", path="f.txt")[-1]
    assert write["allowed"]["lsn"] == events(m, op="allow", path="f.txt")[-1]["lsn"]


def test_a_secret_is_never_waived(workspace: Path) -> None:
    prepare_state(workspace, '[gates.secrets]\nreject_at = "high"\n')
    m = Mount(workspace).start()
    try:
        f = m.path / "conf.txt"
        f.write_text(LINES)
        key = (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow"
            + "A" * 60
            + "\n-----END RSA PRIVATE KEY-----\n"
        )
        leak = 'aws_secret_access_key = "' + "a1B2c3D4" * 5 + '"\n'
        ctl(m, "allow conf.txt\n")
        refused(f, KEPT + key + leak)
        env = envelope(m, "conf.txt")
        assert "allow" not in env, env  # no way around a secret is offered
        assert [a["path"] for a in allowed(m)] == ["conf.txt"]  # and it was not used
    finally:
        m.stop()
    check_clean(m)


def test_a_batch_commit_takes_its_writers_allowance(mount: Mount) -> None:
    m = mount
    f = m.path / "f.txt"
    f.write_text(LINES)
    batch = m.path / ".rw" / "batches" / "trim"
    batch.mkdir()
    lines = LINES.splitlines(True)
    for keep in (100, 85, 70, 56, 44, 34, 26):  # each write loses few lines: not refused
        f.write_text("".join(lines[:keep]))
    with pytest.raises(OSError) as info:
        (batch / "ctl").write_text("commit\n")
    assert info.value.errno == errno.EBADMSG
    env = envelope(m)
    assert env["reason_hint"] == "truncation"
    assert f"rwfs allow {m.path}/f.txt" in env["message"], env["message"]
    assert (m.path / ".rw" / "batches" / "trim" / "status").exists()
    ctl(m, "allow f.txt\n")
    (batch / "ctl").write_text("commit\n")
    assert json.loads((batch / "status").read_text())["state"] == "committed"
    [write] = events(m, op="write", path="f.txt", batch="trim")
    assert [w["gate"] for w in write["allowed"]["waived"]] == ["truncation"]
    assert allowed(m) == []

    # Used by a write into a batch, it goes with the batch's change of the path.
    g = m.path / "g.txt"
    g.write_text(LINES)
    (m.path / ".rw" / "batches" / "cut").mkdir()
    refused(g, KEPT)
    ctl(m, "allow g.txt\n")
    g.write_text(KEPT)  # held by the batch
    g.write_text(KEPT + "one more line\n")  # and changed again there
    (m.path / ".rw" / "batches" / "cut" / "ctl").write_text("commit\n")
    assert (m.path / "g.txt").read_text() == KEPT + "one more line\n"
    [write] = events(m, op="write", path="g.txt", batch="cut")
    assert write["allowed"]["uid"] == 0


def test_a_rename_or_a_compose_onto_the_file_uses_it(mount: Mount) -> None:
    m = mount
    f = m.path / "f.txt"
    f.write_text(LINES)
    tmp = m.path / "f.txt.tmp"
    tmp.write_text(KEPT)
    with pytest.raises(OSError) as info:
        os.rename(tmp, f)  # an editor's save: a commit of f.txt
    assert info.value.errno == errno.EBADMSG
    ctl(m, "allow f.txt\n")
    os.rename(tmp, f)
    assert f.read_text() == KEPT
    [ev] = events(m, op="rename", dest="f.txt")
    assert ev["allowed"]["uid"] == 0 and ev["allowed"]["waived"][0]["gate"] == "truncation"
    assert allowed(m) == []

    g = m.path / "g.txt"
    g.write_text(LINES)
    parts = m.path / ".rw" / "chunks" / "c"
    parts.mkdir()
    (parts / "part-001").write_text(KEPT)
    with pytest.raises(OSError) as info:
        (parts / "ctl").write_text("compose g.txt\n")
    assert info.value.errno == errno.EBADMSG
    ctl(m, "allow g.txt\n")
    (parts / "ctl").write_text("compose g.txt\n")
    assert g.read_text() == KEPT
    [ev] = events(m, op="write", path="g.txt", intended=envelope(m, "g.txt")["intended"])
    assert ev["allowed"]["uid"] == 0 and allowed(m) == []


def test_agents_md_names_the_way() -> None:
    res = rwfs("agents-md")
    assert "rwfs allow" in res.stdout and "allow PATH" in res.stdout


# ---- the core, without a mount ----


def test_waive_keeps_what_an_allowance_does_not_cover() -> None:
    cut = Finding("truncation", "cut short")
    secret = Finding("secrets", "a key")
    warned = Finding("syntax", "x", action="warn")
    a = Allowance(b"f", 0, 1, "t", "t", 1e18)
    assert waivable([cut, warned]) and not waivable([cut, secret])
    assert waive([cut, warned], a) == [warned]
    assert [w["gate"] for w in a.waived] == ["truncation"]
    box = Allowances()
    box.grant(a)
    assert box.take(1, b"f") is None and box.take(0, b"g") is None  # another user, path
    assert box.take(0, b"f") is a and box.take(0, b"f") is None  # once
    box.grant(Allowance(b"f", 0, 1, "t", "t", 0.0))  # expired
    assert box.peek(0, b"f") is None
    hint = allow_hint("-x y.txt", ".rw/rejected/ID", None)
    assert hint["ctl"] == "allow './-x y.txt'" and hint["command"] == "rwfs allow './-x y.txt'"


def test_let_through_is_the_writers_once_and_never_past_a_secret(ws: Any) -> None:
    a = Allowance(b"f", 5, 1, "t", "t", 1e18, by={"pid": 9, "comm": "agent", "uid": 5})
    ws.allowances.grant(a)
    cut, secret = Finding("truncation", "cut short"), Finding("secrets", "a key")
    assert ws.gating.let_through(b"f", {"uid": 6}, [cut]) == ([cut], None)  # another user's write
    assert ws.gating.let_through(b"f", {}, [cut]) == ([cut], None)  # rwfs's own
    assert ws.gating.let_through(b"f", {"uid": 5}, [cut, secret]) == ([cut, secret], None)
    left, used = ws.gating.let_through(b"f", {"uid": 5}, [cut])
    assert left == [] and used is a
    record = a.record()
    assert record["comm"] == "agent" and record["lsn"] == 1
    assert record["waived"] == [{"gate": "truncation", "message": "cut short"}]
    assert ws.gating.let_through(b"f", {"uid": 5}, [cut]) == ([cut], None)  # once
    ws.allowances.give_back(a)  # the write failed after all
    assert ws.gating.let_through(b"f", {"uid": 5}, [cut])[1] is a
