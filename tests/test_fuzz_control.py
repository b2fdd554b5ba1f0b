"""Bad input to every control file changes nothing (SPEC §9 "Bad input"), fuzzed with
hypothesis through a real mount: whatever is written to a verb file, the policy, the handoff
note, or given as a new batch's, snapshot's or chunk session's name, the tree and the journal
stay as they were, the daemon keeps serving, and a refusal leaves an envelope with a plain
message in ``.rw/last-error``."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Mount, check_clean
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import write_bytes

FUZZ = settings(
    max_examples=int(os.environ.get("RWFS_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Words that the verbs take, and words no verb should take quietly.
VERBS = ["sync", "undo", "restore", "gc", "commit", "abort", "resume", "rollback", "scope"]
VERBS += ["expect", "compose", "keep-actual", "take-intended", "resolved"]
JUNK = ["..", "../x", "/etc/passwd", ".rw/ctl", "-rf", "--help", "a" * 300, "x\0y", "é", ""]
JUNK += ["nosuch", "run-999", "auto-1", "s", "b", "*", "$(id)", "'", '"', "\\"]

words = st.lists(st.sampled_from(VERBS + JUNK) | st.text(max_size=20), min_size=1, max_size=5)
line = words.map(lambda ws: " ".join(ws))
texts = st.one_of(
    st.lists(line, min_size=1, max_size=4).map(lambda ls: "\n".join(ls) + "\n"),
    st.text(max_size=200),
    st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
)


@pytest.fixture
def fuzzed(workspace: Path) -> Iterator[Mount]:
    (workspace / "a.py").write_text("x = 1\n")
    (workspace / "d").mkdir()
    (workspace / "d" / "b.txt").write_text("b\n")
    m = Mount(workspace).start()
    try:
        os.mkdir(m.path / ".rw" / "batches" / "b")  # an open batch, for its ctl
        os.mkdir(m.path / ".rw" / "chunks" / "c")
        (m.path / ".rw" / "ctl").write_text("sync\n")
        yield m
    finally:
        m.stop()
    check_clean(m)


def _state(m: Mount) -> tuple[dict[str, bytes], int]:
    """The tree as the mount shows it (``.rw`` aside) and the journal's length."""
    tree = {}
    for dirpath, dirs, files in os.walk(m.path):
        if dirpath == str(m.path):
            dirs[:] = [d for d in dirs if d != ".rw"]
        for f in files:
            p = Path(dirpath) / f
            tree[str(p.relative_to(m.path))] = p.read_bytes()
    lines = (m.path / ".rw" / "journal").read_text().splitlines()
    events = [json.loads(ln) for ln in lines]
    return tree, len([e for e in events if e["op"] != "gc"])  # (a gc verb journals itself)


def _refused_cleanly(m: Mount, before: tuple[dict[str, bytes], int], err: OSError | None) -> None:
    assert m.proc is not None and m.proc.poll() is None, "the daemon died"
    assert _state(m) == before, "bad input changed the tree or the journal"
    if err is not None:
        env = json.loads((m.path / ".rw" / "last-error").read_text())
        assert env["ok"] is False and env["errno"] == errno.errorcode[err.errno or 0], env
        assert isinstance(env["message"], str) and len(env["message"]) > 20, env


@FUZZ
@given(text=texts)
def test_fuzzed_verbs_change_nothing(fuzzed: Mount, text: str) -> None:
    m = fuzzed
    data = text.encode("utf-8", "surrogatepass")
    for ctl in ("ctl", "batches/b/ctl", "chunks/c/ctl"):
        before = _state(m)
        err = write_bytes(m.path / ".rw" / ctl, data)
        _refused_cleanly(m, before, err)  # (what succeeded must have changed nothing either)


@FUZZ
@given(text=st.one_of(texts, st.sampled_from(["[gates.truncation]\nmin_ratio = 7.5\n"])))
def test_fuzzed_policies_change_nothing_in_the_tree(fuzzed: Mount, text: str) -> None:
    m = fuzzed
    policy = m.path / ".rw" / "policy.toml"
    old = policy.read_bytes()
    before = _state(m)
    err = write_bytes(policy, text.encode("utf-8", "surrogateescape"))
    _refused_cleanly(m, before, err)
    if "7.5" in text:  # a ratio out of its range, which would turn the gate off
        assert err is not None
    if err is not None:
        assert err.errno == errno.EINVAL
        assert policy.read_bytes() == old, "a refused policy replaced the old one"
    elif text:  # (an open and close with nothing written writes nothing)
        assert policy.read_bytes() == text.encode("utf-8", "surrogateescape")
        policy.write_bytes(old)  # back, for the next example


NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")


@FUZZ
@given(name=st.text(min_size=1, max_size=80) | st.sampled_from(JUNK + ["-x", ".", "auto-x"]))
def test_fuzzed_names_are_refused_unless_plain(fuzzed: Mount, name: str) -> None:
    m = fuzzed
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:
        return
    if b"/" in raw or b"\0" in raw or not raw or len(raw) > 255:
        return  # not one name: the kernel refuses it before rwfs sees it
    for top in ("snapshots", "batches", "chunks"):
        before = _state(m)
        try:
            os.mkdir(m.path / ".rw" / top / name)
            err = None
        except OSError as exc:
            err = exc
        if err is None:
            assert NAME.fullmatch(name) and name not in (".", ".."), (top, name)
            assert top != "batches" or not name.startswith("auto-"), name  # batches of one
            continue
        assert err.errno in (errno.EINVAL, errno.EEXIST, errno.EPERM, errno.ENAMETOOLONG), err
        _refused_cleanly(m, before, None)
