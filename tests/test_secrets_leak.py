"""A secret's value never leaves its file (SPEC §3.3b, "No secret copied").

Secrets of five kinds are planted through a real mount, with the secrets gate warning and,
separately, refusing; then every place rwfs reports a finding is read, and no piece of 8
characters or more of any planted value may appear in it: the journal (``.rw/journal``,
``rwfs log``), ``.rw/risk/``, ``.rw/why/``, ``.rw/last-error``, the writer's stderr and
the ``rwfs run`` summary. The values are made up, shaped like real ones.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RWFS, Mount, check_clean, prepare_state, rwfs_mounted

from rwfs.checks import gates
from rwfs.checks import secrets as secrets_gate
from rwfs.policy import DEFAULT_TEXT

# Letters outside a-f where it matters, so that no piece of a value is also a piece of a
# digest (hex) or of a word the reports hold.
SSN = "219-09-9999"
AWS_ID = "AKIAQZXWVUTSRPONMLKJ"
AWS_SECRET = "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"
GITHUB = "ghp_" + "QzWx9RtYu8IoPl7KjHgSzXcVbNm6QwErTyUi"
PEM_BODY = "MIIEowIBAAKCAQEAzQxW7yVqRtPlKjHgZxUvNmOpQrStUvWxYzQ"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiJxd2VydHkiLCJuYW1lIjoiWm9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
PLANTED = {
    "ssn": SSN,
    "aws_id": AWS_ID,
    "aws_secret": AWS_SECRET,
    "github": GITHUB,
    "pem": PEM_BODY,
    "jwt": JWT,
}
TEXT = (
    "# settings\n"
    f"owner_ssn = {SSN}\n"
    f"aws_access_key_id = {AWS_ID}\n"
    f'aws_secret_access_key = "{AWS_SECRET}"\n'
    f"token: {GITHUB}\n"
    "-----BEGIN RSA PRIVATE KEY-----\n"
    f"{PEM_BODY}\n"
    "-----END RSA PRIVATE KEY-----\n"
    f"session = {JWT}\n"
)


def pieces(value: str, n: int = 8) -> set[str]:
    return {value[i : i + n] for i in range(len(value) - n + 1)}


def assert_no_leak(where: str, text: str) -> None:
    for kind, value in PLANTED.items():
        leaked = sorted(p for p in pieces(value) if p in text)
        assert not leaked, f"{where} holds part of the planted {kind}: {leaked[:3]}"


def write_as_subprocess(path: Path, source: Path) -> subprocess.CompletedProcess[str]:
    """A writer that never heard of rwfs, its stderr a pipe (what rwfs tells a writer)."""
    code = (
        "import sys\n"
        "data = open(sys.argv[1]).read()\n"
        "f = open(sys.argv[2], 'w')\n"
        "f.write(data)\n"
        "f.close()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(source), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def rwfs_log(m: Mount, *args: str) -> str:
    res = subprocess.run(
        [*RWFS, "log", *args, "-C", str(m.path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return res.stdout + res.stderr


def read_reports(m: Mount, name: str) -> dict[str, str]:
    (m.path / ".rw" / "ctl").write_text("sync\n")
    rw = m.path / ".rw"
    out = {
        ".rw/journal": (rw / "journal").read_text(),
        "rwfs log --json": rwfs_log(m, "--json"),
        "rwfs log": rwfs_log(m),
        ".rw/risk": (rw / "risk" / name).read_text(),
        ".rw/last-error": (rw / "last-error").read_text(),
    }
    for f in sorted((rw / "why").rglob("*")):
        if f.is_file():
            out[f".rw/why/{f.name}"] = f.read_text()
    return out


def test_risk_names_kind_line_and_column_only() -> None:
    report = secrets_gate.risk(TEXT.encode())
    assert set(report["detected_patterns"]) >= {
        "api_key",
        "aws_secret",
        "github_pat",
        "jwt",
        "pem_block",
        "pii",
    }
    at = {(m["pattern"], m["line"], m["column"]) for m in report["matches"]}
    assert ("pii", 2, 13) in at  # the SSN after "owner_ssn = "
    assert ("api_key", 3, 21) in at  # the access key id
    assert ("aws_secret", 4, 26) in at  # the secret itself, after its key name
    assert ("github_pat", 5, 8) in at
    assert ("pem_block", 6, 1) in at
    assert ("jwt", 9, 11) in at
    assert all(set(m) == {"pattern", "line", "column"} for m in report["matches"])
    assert_no_leak("risk()", json.dumps(report))
    # Columns count characters: an "é" before a key is one column.
    (m,) = secrets_gate.risk("é AKIAQZXWVUTSRPONMLKJ\n".encode())["matches"]
    assert (m["line"], m["column"]) == (1, 3)


def test_a_placeholder_line_holding_a_secret_is_not_quoted() -> None:
    old = "".join(f"line_{i} = {i}\n" for i in range(40)).encode()
    new = old.split(b"\n", 5)[0] + f"\nkey = '{AWS_ID}'  # unchanged\n".encode()
    found = gates.elision(old, new, {"min_lines": 10, "mass_ratio": 0.5, "cut_ratio": 0.8})
    assert found is not None and found.gate == "elision"
    assert_no_leak("the elision message", found.message)
    assert "AKIA" not in found.message


@pytest.mark.parametrize("mode", ["warn", "reject"])
def test_no_planted_secret_leaves_its_file(tmp_path: Path, mode: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    reject_at = "medium" if mode == "reject" else "off"
    prepare_state(ws, DEFAULT_TEXT.replace('reject_at = "off"', f'reject_at = "{reject_at}"'))
    source = tmp_path / "plant.txt"
    source.write_text(TEXT)
    m = Mount(ws).start()
    try:
        target = m.path / "settings.cfg"
        target.write_text("# settings\n")
        res = write_as_subprocess(target, source)
        if mode == "reject":
            assert res.returncode != 0 and "Bad message" in res.stderr
            assert "rwfs: Your write to settings.cfg was refused" in res.stderr
            assert target.read_text() == "# settings\n"
            env = json.loads((m.path / ".rw" / "last-error").read_text())
            assert env["reason_hint"] == "secrets" and env["errno"] == errno.errorcode[74]
            assert env["details"]["matches"] and "line 2, column 13" in env["message"]
            assert "take the secret out of the text" in env["suggested_action"]
        else:
            assert res.returncode == 0, res.stderr
            assert target.read_text() == TEXT
            # A refusal first, so that last-error and why/ hold a secrets envelope too.
            (m.path / ".rw" / "policy.toml").write_text(
                DEFAULT_TEXT.replace('reject_at = "off"', 'reject_at = "medium"')
            )
            again = write_as_subprocess(m.path / "other.cfg", source)
            assert again.returncode != 0
        assert_no_leak("the writer's stderr", res.stderr)
        reports = read_reports(m, "settings.cfg")
        if mode == "warn":
            assert "secrets" in reports[".rw/journal"]  # the warning is recorded
        else:
            assert ".rw/why/settings.cfg" in reports
        for where, text in reports.items():
            assert_no_leak(where, text)
        assert_no_leak("the daemon's log", m.log_text())
    finally:
        m.stop()
    check_clean(m)


def test_rwfs_run_summary_names_no_secret(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".git").mkdir()
    prepare_state(project, DEFAULT_TEXT.replace('reject_at = "off"', 'reject_at = "medium"'))
    source = tmp_path / "plant.txt"
    source.write_text(TEXT)
    try:
        res = subprocess.run(
            [*RWFS, "run", "--", "sh", "-c", 'cp "$PLANT" secrets.cfg'],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PLANT": str(source)},
        )
    finally:
        if rwfs_mounted(str(project)):
            subprocess.run(["fusermount3", "-u", "-z", str(project)], capture_output=True)
            raise AssertionError("rwfs run left the project mounted")
    out = res.stdout + res.stderr
    assert "refused secrets.cfg" in out, out
    assert_no_leak("the rwfs run summary", out)
    assert (project / "secrets.cfg").read_text() == ""  # created by cp, its write refused


def test_old_events_are_redacted_when_read(tmp_path: Path) -> None:
    """An event written before this rule kept the first 16 characters of each match:
    every reader of the journal drops them."""
    from rwfs.journal.store import Store

    ws = tmp_path / "ws"
    ws.mkdir()
    prepare_state(ws, DEFAULT_TEXT)
    (ws / "old.cfg").write_text(TEXT)
    old = {
        "gate": "secrets",
        "verdict": "high",
        "detected_patterns": ["github_pat", "pii"],
        "matches": [
            {"pattern": "github_pat", "match": GITHUB[:16]},
            {"pattern": "pii", "match": SSN},
        ],
    }
    store = Store(str(ws / ".rw" / "journal"))
    try:
        store.write(
            lambda txn: txn.append_event({"op": "noop", "path": "old.cfg", "warnings": [old]})
        )
        (ev,) = store.events()
        assert ev["warnings"][0]["matches"] == [
            {"pattern": "github_pat", "redacted": True},
            {"pattern": "pii", "redacted": True},
        ]
    finally:
        store.close()
    m = Mount(ws).start()
    try:
        journal = (m.path / ".rw" / "journal").read_text()
        assert '"redacted": true' in journal
        for where, text in (("journal", journal), ("log", rwfs_log(m, "--json"))):
            assert_no_leak(where, text)
    finally:
        m.stop()
    check_clean(m)
