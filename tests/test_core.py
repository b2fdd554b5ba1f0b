"""In-process tests of the core (no FUSE): the journal store, the policy, and the recovery
table of SPEC §6.2 row by row, with real LMDB and real files in a temporary directory."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import submit_new

from rwfs.core.recovery import recover
from rwfs.journal.objects import ObjectStore
from rwfs.journal.store import SCHEMA_VERSION, Store
from rwfs.policy import DEFAULT_TEXT, Policy, PolicyError


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def stage(w: Any, data: bytes) -> str:
    name = os.urandom(8).hex()
    (w.tree / ".rw" / "staging" / name).write_bytes(data)
    return name


def prepared(w: Any, path: str, expected: bytes, intended: bytes) -> int:
    rid: int = w.store.write(
        lambda txn: txn.new_receipt(
            {
                "batch": None,
                "path": path,
                "expected": sha(expected),
                "intended": sha(intended),
                "stage": stage(w, intended),
                "size": len(intended),
            }
        )
    )
    return rid


def state_of(w: Any, rid: int) -> str:
    return next(r["state"] for r in w.store.receipts() if r["id"] == rid)


def test_schema_version_is_recorded_and_checked(tmp_path: Path) -> None:
    s = Store(str(tmp_path / "j"))
    with s.env.begin() as txn:
        assert txn.get(b"schema", db=s.db[b"meta"]) == SCHEMA_VERSION
    s.write(lambda txn: txn._t.put(b"schema", b"999", db=s.db[b"meta"]))
    s.close()
    with pytest.raises(RuntimeError, match="schema 999"):
        Store(str(tmp_path / "j"))


def test_events_get_increasing_lsns_and_filter_by_path(tmp_path: Path) -> None:
    s = Store(str(tmp_path / "j"))
    for p in ["a", "b", "a"]:
        s.write(lambda txn, p=p: txn.append_event({"op": "write", "path": p}))
    evs = list(s.events())
    assert [e["lsn"] for e in evs] == [1, 2, 3]
    assert [e["lsn"] for e in s.events(path="a")] == [1, 3]
    assert [e["lsn"] for e in s.events(last=2)] == [2, 3]
    s.close()


def test_events_are_read_in_chunks_without_losing_any(tmp_path: Path, monkeypatch: Any) -> None:
    from rwfs.journal import store

    monkeypatch.setattr(store, "EVENTS_CHUNK", 4)
    s = Store(str(tmp_path / "j"))
    s.write(lambda txn: [txn.append_event({"op": "write", "path": "ab"[i % 2]}) for i in range(11)])
    assert [e["lsn"] for e in s.events()] == list(range(1, 12))
    assert [e["lsn"] for e in s.events(since=5)] == list(range(6, 12))
    assert [e["lsn"] for e in s.events(path="b")] == [2, 4, 6, 8, 10]
    assert [e["lsn"] for e in s.events(path="a", last=2)] == [9, 11]
    assert [e["lsn"] for e in s.events(last=5)] == [7, 8, 9, 10, 11]
    reader = s.events()
    first = [next(reader)["lsn"] for _ in range(5)]
    s.write(lambda txn: txn.append_event({"op": "write", "path": "c"}))  # meanwhile
    assert first + [e["lsn"] for e in reader] == list(range(1, 13))
    s.close()


def test_the_newest_events_are_read_back_from_the_end(tmp_path: Path, monkeypatch: Any) -> None:
    from rwfs.journal import store

    monkeypatch.setattr(store, "EVENTS_CHUNK", 4)
    s = Store(str(tmp_path / "j"))
    s.write(
        lambda txn: [txn.append_event({"op": "write", "path": "abc"[i % 3]}) for i in range(23)]
    )
    every = list(s.events())
    for last in (1, 3, 4, 5, 9, 23, 40):
        for since in (0, 7, 22, 23):
            for path in (None, "a", "c"):

                def wanted(ev: dict[str, Any], path: str | None = path) -> bool:
                    return path is None or ev["path"] == path

                expect = [e for e in every if e["lsn"] > since and wanted(e)][-last:]
                assert s.newest(last, since, wanted) == expect, (last, since, path)
    assert s.newest(0) == []
    # It reads no further back than it must: the last 2 events read 2, not all 23.
    read = []
    real = store.codec.loads
    monkeypatch.setattr(store.codec, "loads", lambda raw: read.append(1) or real(raw))
    assert [e["lsn"] for e in s.newest(2)] == [22, 23] and len(read) == 2
    s.close()


def test_refused_drafts_are_indexed_also_in_a_store_that_predates_the_index(
    tmp_path: Path,
) -> None:
    s = Store(str(tmp_path / "j"))
    refuse = {"op": "refuse", "path": "a.py", "draft": "d1", "intended": sha(b"x")}
    s.write(lambda txn: txn.append_event({"op": "write", "path": "a.py"}))
    s.write(lambda txn: txn.append_event(dict(refuse)))
    assert s.refusals() == [{"path": "a.py", "draft": "d1", "intended": sha(b"x")}]

    def forget(txn: Any) -> None:  # as a store written before the index existed
        txn._t.drop(s.db[b"refused"], delete=False)
        txn._t.delete(b"index:refused", db=s.db[b"meta"])

    s.write(forget)
    assert s.refusals() == []
    s.close()
    s = Store(str(tmp_path / "j"))
    assert s.refusals() == [{"path": "a.py", "draft": "d1", "intended": sha(b"x")}]
    s.write(lambda txn: txn.append_event({**refuse, "draft": "d2"}))
    assert [r["draft"] for r in s.refusals()] == ["d1", "d2"]
    s.close()


def test_policy_rejects_bad_input_with_a_reason() -> None:
    assert Policy.parse(DEFAULT_TEXT).durability == "group"
    for text, word in [
        ("durability = 3", "durability"),
        ('durability = "often"', "durability"),
        ("bogus = 1", "unknown"),
        ("commit_interval_ms = 0", "commit_interval_ms"),
        ("passthrough = [1]", "passthrough"),
        ("= broken", "TOML"),
    ]:
        with pytest.raises(PolicyError, match=word):
            Policy.parse(text)


def test_passthrough_globs_match_at_any_depth() -> None:
    p = Policy()
    assert p.is_passthrough(b".git/objects/ab/cd")
    assert p.is_passthrough(b"web/node_modules/x/index.js")
    assert p.is_passthrough(b"deep/er/mod.pyc")
    assert not p.is_passthrough(b"src/app.py")
    anchored = Policy.parse('passthrough = ["/gen/**"]')
    assert anchored.is_passthrough(b"gen/x") and not anchored.is_passthrough(b"src/gen/x")


def test_recovery_row1_intended_present_is_settled_without_writing(ws: Any) -> None:
    (ws.tree / "f").write_bytes(b"new")
    before = os.stat(ws.tree / "f").st_ino
    rid = prepared(ws, "f", b"old", b"new")
    assert recover(ws)["committed"] == 1
    assert state_of(ws, rid) == "committed"
    assert os.stat(ws.tree / "f").st_ino == before  # nothing was written
    assert os.listdir(ws.tree / ".rw" / "staging") == []


def test_recovery_row2_expected_present_performs_the_owed_write(ws: Any) -> None:
    (ws.tree / "f").write_bytes(b"old")
    rid = prepared(ws, "f", b"old", b"new")
    assert recover(ws)["performed"] == 1
    assert (ws.tree / "f").read_bytes() == b"new"
    assert state_of(ws, rid) == "committed"
    objects = ObjectStore(ws.state_fd)
    assert objects.exists(sha(b"old"))  # the pre-image is kept
    assert [e["op"] for e in ws.store.events()] == ["write", "recover"]


def test_recovery_row3_unexpected_version_is_a_conflict_and_nothing_is_written(ws: Any) -> None:
    (ws.tree / "f").write_bytes(b"edited by hand")
    rid = prepared(ws, "f", b"old", b"new")
    assert recover(ws)["conflicts"] == 1
    assert (ws.tree / "f").read_bytes() == b"edited by hand"
    assert state_of(ws, rid) == "conflict"
    assert ObjectStore(ws.state_fd).exists(sha(b"new"))  # the intended bytes are kept
    ev = next(e for e in ws.store.events() if e["op"] == "conflict")
    assert ev["actual"] == sha(b"edited by hand")


def test_recovery_row4_unreadable_stays_pending_and_is_retried(ws: Any, monkeypatch: Any) -> None:
    (ws.tree / "f").write_bytes(b"old")
    rid = prepared(ws, "f", b"old", b"new")

    def unreadable(path: bytes) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ws.digests, "live", unreadable)
    assert recover(ws)["pending"] == 1
    assert state_of(ws, rid) == "prepared"
    assert (ws.tree / "f").read_bytes() == b"old"
    monkeypatch.undo()
    assert recover(ws)["performed"] == 1  # the next mount retries it
    assert (ws.tree / "f").read_bytes() == b"new"


def test_recovery_never_performs_a_damaged_stage(ws: Any) -> None:
    (ws.tree / "f").write_bytes(b"old")
    rid = prepared(ws, "f", b"old", b"new")
    name = next(r["stage"] for r in ws.store.receipts() if r["id"] == rid)
    (ws.tree / ".rw" / "staging" / name).write_bytes(b"ne")  # torn by a machine crash
    assert recover(ws)["pending"] == 1
    assert (ws.tree / "f").read_bytes() == b"old"


def test_journal_unavailable_refuses_a_strict_write_with_nothing_changed(
    ws: Any, monkeypatch: Any
) -> None:
    import trio

    from rwfs.core.commits import Commit
    from rwfs.core.errors import RwfsError
    from rwfs.journal.store import JournalUnavailable

    (ws.tree / "f").write_bytes(b"old")
    real_write = ws.store.write

    def broken(*args: Any) -> Any:
        raise JournalUnavailable("MDB_MAP_FULL")

    async def commit(data: bytes) -> Commit:
        fd = os.open(ws.tree / "f", os.O_RDONLY)
        try:
            stage = await ws.stages.new(fd, truncate=True)
        finally:
            os.close(fd)
        os.pwrite(stage.fd, data, 0)
        stage.sealed = True
        intended, size, _ = await ws.stages.seal(stage)
        c: Commit = await ws.committer.submit(Commit(b"f", stage, intended, size, {}), wait=True)
        return c

    async def main() -> None:
        ws.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            monkeypatch.setattr(ws.store, "write", broken)
            with pytest.raises(RwfsError) as err:
                await commit(b"new")
            assert err.value.errno == errno.EIO
            assert err.value.envelope["error"] == "journal_unavailable"
            assert "unchanged" in err.value.envelope["message"]
            assert (ws.tree / "f").read_bytes() == b"old"
            assert os.listdir(ws.tree / ".rw" / "staging") == []
            monkeypatch.setattr(ws.store, "write", real_write)
            done = await commit(b"new")  # the journal is back: the write goes through
            assert done.outcome == "committed"
            assert (ws.tree / "f").read_bytes() == b"new"
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [e["op"] for e in ws.store.events()] == ["write"]


# Placeholder lines models write, and ordinary lines that must not be mistaken for them.
ELIDED = [
    b"# ... rest of the code unchanged ...",
    b"    // ... existing code ...",
    b"# (unchanged)",
    b"<!-- rest of the file unchanged -->",
    b"-- ... remaining code ...",
    b"/* ... other methods ... */",
    b"    # Rest of the class remains unchanged",
    b"# [rest of code remains the same]",
]
NOT_ELIDED = [
    b"# see ... for details",
    b"x = foo(...)",
    b"...",
    b"    # ...",
    b"# TODO: handle the rest",
    b"    pass  # unchanged behaviour for old callers",
    b"# The rest of this module handles parsing.",
    b"print('rest of the file')",
    b"// Other code paths use this too",
]


def test_elision_placeholders_and_ordinary_comments() -> None:
    from rwfs.checks.placeholders import _placeholder

    assert [line for line in ELIDED if not _placeholder(line)] == []
    assert [line for line in NOT_ELIDED if _placeholder(line)] == []


def test_gates_leave_explicit_truncation_and_binary_content_to_the_caller() -> None:
    from rwfs.checks.gates import check

    cfg = Policy().gate
    old = b"".join(b"line %d\n" % i for i in range(100))
    elided = b"".join(old.splitlines(True)[:12]) + b"# ... rest of the file unchanged ...\n"
    # The last change was a truncation to a length the caller chose: a deliberate cut.
    assert check(b"a.txt", old, old[:200], cfg, cut=True) == []
    assert check(b"a.txt", old, elided, cfg, cut=True) == []
    # ... but the syntax of what was written is still judged.
    py = b"def f():\n    return 1\n" * 30
    assert [f.gate for f in check(b"m.py", py, py[:7], cfg, cut=True)] == ["syntax"]
    # A binary file (a NUL in its old bytes) is not judged by text rules.
    blob = bytes(range(256)) * 40
    assert check(b"a.txt", blob, blob[:10], cfg) == []
    assert check(b"a.txt", blob, elided, cfg) == []
    # A text file turned binary (padded with NULs, say) is a text file broken.
    assert [f.gate for f in check(b"data.json", b'{"a": 1}\n', b"\0\1 x", cfg)] == ["syntax"]


def test_gates_on_bytes() -> None:
    from rwfs.checks.gates import check

    cfg = Policy().gate
    old = b"".join(b"line %d\n" % i for i in range(100))
    assert [f.gate for f in check(b"a.txt", old, old[:200], cfg)] == ["truncation"]
    assert check(b"a.txt", old, old[: len(old) - 40], cfg) == []  # a few lines: fine
    elided = b"".join(old.splitlines(True)[:12]) + b"# ... rest of the file unchanged ...\n"
    assert "elision" in [f.gate for f in check(b"a.txt", old, elided, cfg)]
    py = b"def f():\n    return 1\n"
    (found,) = check(b"m.py", py, b"def f(:\n    return 1\n", cfg)
    assert found.gate == "syntax" and found.details["line"] == 1
    assert check(b"m.py", b"def f(:\n", b"def g(:\n", cfg) == []  # already broken
    assert check(b"m.py", b"", b"def f(:\n", cfg) == []  # a new file


def test_risk_score_follows_the_paper() -> None:
    from rwfs.checks.secrets import risk

    assert risk(b"def f():\n    return 1\n") == {
        "score": 0.0,
        "verdict": "safe",
        "detected_patterns": [],
        "matches": [],
    }
    one = risk(b"k = 'sk-ant-api03-" + b"Q" * 40 + b"'\n")
    assert (one["score"], one["verdict"], one["detected_patterns"]) == (0.35, "low", ["api_key"])
    # A second distinct match in a family adds a quarter of its weight.
    two = risk(b"AKIA" + b"A" * 16 + b" AKIA" + b"B" * 16 + b"\n")
    assert two["score"] == round(0.35 * 1.25, 3)
    pem = risk(b"-----BEGIN OPENSSH PRIVATE KEY-----\nxyz\n")
    assert pem["score"] == 0.5 and pem["verdict"] == "medium"
    assert pem["matches"] == [{"pattern": "pem_block", "line": 1, "column": 1}]
    big = risk(b"x " * 1500 + b"\n")  # a line over 2,000 characters (and no blob)
    assert big["score"] == 0.2 and big["verdict"] == "low"
    blob = risk(b"x = '" + b"0f" * 150 + b"'\n")  # 300 base64 characters in a row
    assert blob["detected_patterns"] == ["binary_hint"] and blob["score"] == 0.2
    assert risk(b"x = '" + b"0f" * 99 + b"'\n")["detected_patterns"] == []  # 198 of them


# Pieces of secrets, near misses and ordinary code, so that random texts exercise every
# pattern's prefilter and its edges (word boundaries, separators, several "@").
_RISK_PIECES = [
    b"sk-ant-",
    b"sk-",
    b"proj-",
    b"AKIA",
    b"DD_API_KEY=",
    b"datadog-app-key: ",
    b"Bearer ",
    b"ghp_",
    b"github_pat_",
    b"eyJ",
    b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlMTIz",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"aws_secret_key = ",
    b"john.doe@example.com",
    b"a@b.cd",
    b"@",
    b"john",
    b".org",
    b"(555) 123-4567",
    b"555.123.4567",
    b"123-45-6789",
    b"123",
    b"4567",
    b"-",
    b".",
    b" ",
    b"\n",
    b"_",
    b"=",
    b"'",
    b"Q" * 40,
    b"deadbeef" * 4,
    b"+/",
    b"@property\n",
    b"def f(x):",
    b"(555 123-4567",
    b"555) 123 4567",
    b"a" * 120,  # two make a base64 run past 200
    b"\0" * 50,
]


def test_risk_prefilters_find_exactly_what_the_patterns_find() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from rwfs.checks import secrets as gate

    @settings(max_examples=600, deadline=None)
    @given(st.lists(st.sampled_from(_RISK_PIECES), max_size=60))
    def check(pieces: list[bytes]) -> None:
        data = b"".join(pieces)
        # The one-pass search finds exactly the needles a substring search finds.
        for view, needles in gate._NEEDLES.needles.items():
            seen = gate._VIEWS[view](data)
            assert gate._NEEDLES.present(view, seen) == {n for n in needles if n in seen}
        for _, patterns in gate._FAMILIES.values():
            for p in patterns:
                whole: dict[bytes, int] = {}
                for m in p.regex.finditer(data):
                    whole.setdefault(m.group(0), m.start(m.lastindex or 0))
                got = gate._matches(p, data, {})
                if p.domain is not None:  # (an email: where it begins is not compared)
                    if all(len(m.split(b"@")[0]) <= 256 for m in whole):  # (gates.md)
                        assert set(got) == set(whole), (p.regex.pattern, data)
                else:  # tried only near needles: the same matches, at the same places
                    assert got == whole, (p.regex.pattern, data)

    check()
    # Every family can be found at all (the pieces are not all near misses).
    one = b"".join(_RISK_PIECES[:2]) + b"Q" * 40 + b" john.doe@example.com 123-45-6789"
    assert {"api_key", "pii"} <= set(gate.risk(one)["detected_patterns"])


def test_another_tasks_flush_does_not_leave_the_committer_waiting_out_its_interval(
    ws: Any,
) -> None:
    # The committer waits for the interval or for urgency on an event; a flush by another
    # task (a rename's or a link's settle) used to replace that event unset, so that the
    # next fsync's urgency went to an event no one waited on: it waited the interval out.
    import trio
    import trio.testing

    from rwfs.core.commits import Commit

    ws.policy.commit_interval_ms = 3_600_000  # only urgency can start a group
    for i in range(2):
        (ws.tree / f"f{i}").write_bytes(b"old")

    async def commit(i: int, wait: bool) -> Commit:
        return await submit_new(ws, i, wait)

    async def main() -> None:
        ws.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            await commit(0, wait=False)  # queued: the committer now waits for urgency
            await trio.testing.wait_all_tasks_blocked()
            await ws.committer.flush()  # another task's flush takes it
            assert (ws.tree / "f0").read_bytes() == b"new 0"
            with trio.fail_after(60):  # (the interval is an hour)
                c = await commit(1, wait=True)  # an fsync: urgent
            assert c.outcome == "committed" and (ws.tree / "f1").read_bytes() == b"new 1"
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_groups_records_go_in_the_next_groups_receipts_transaction(
    ws: Any, monkeypatch: Any
) -> None:
    # fsync after fsync: each group is one durable LMDB transaction (its receipts, with
    # the records of the group before), not two. A group's records wait for the next
    # group (here as long as it takes), and a sync writes them at once.
    import trio

    from rwfs.core import committer

    monkeypatch.setattr(committer, "RECORD_WAIT", 3600.0)
    for i in range(6):
        (ws.tree / f"f{i}").write_bytes(b"old")
    transactions: list[str] = []
    real_write = ws.store.write

    def counted(fn: Any, *args: Any) -> Any:
        transactions.append(fn.__name__)
        return real_write(fn, *args)

    async def main() -> None:
        ws.committer.open_intents()
        monkeypatch.setattr(ws.store, "write", counted)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            commits = []
            for i in range(5):  # a writer's fsync (an owner: it waits until durable)
                c = await submit_new(ws, i, True, owner=object())
                assert (
                    c.outcome == "committed" and (ws.tree / f"f{i}").read_bytes() == b"new %d" % i
                )
                with trio.fail_after(60):  # the committer's thread is done with the group
                    while ws.committer._unrecorded is None:
                        await trio.sleep(0.001)
                # Durable and in the tree; its records wait for the next group.
                assert not c.done.is_set()
                assert all(p.done.is_set() for p in commits)
                commits.append(c)
            assert transactions == ["prepare"] * 5
            await ws.committer.sync()  # the records of the last group, alone
            assert commits[-1].done.is_set() and transactions[-1] == "write_records"
            await submit_new(ws, 5, False)  # a write without fsync: a group of its own
            await ws.committer.sync()
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert transactions == ["prepare"] * 5 + ["write_records", "prepare", "write_records"]
    writes = [e for e in ws.store.events() if e["op"] == "write"]
    assert [e["path"] for e in writes] == [f"f{i}" for i in range(6)]
    assert [e["lsn"] for e in writes] == sorted(e["lsn"] for e in writes)
    assert ws.store.unsettled() == []


def test_a_stage_dropped_while_its_group_is_not_synced_keeps_its_name_until_the_sync(
    ws: Any, monkeypatch: Any
) -> None:
    # A hard-linked file is written in place: its stage is the only other copy of the new
    # bytes until the group's syncfs, which waits with its records for the next group.
    import trio

    from rwfs.core import committer

    monkeypatch.setattr(committer, "RECORD_WAIT", 3600.0)
    (ws.tree / "f0").write_bytes(b"old")
    os.link(ws.tree / "f0", ws.tree / "g0")
    staging = ws.tree / ".rw" / "staging"

    async def main() -> None:
        ws.committer.open_intents()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            c = await submit_new(ws, 0, True, owner=object())
            with trio.fail_after(60):
                while ws.committer._unrecorded is None:
                    await trio.sleep(0.001)
            assert c.info.get("in_place") and c.discard and c.stage.fd == -1
            assert (ws.tree / "g0").read_bytes() == b"new 0"  # one file, written in place
            assert os.listdir(staging) == [c.stage.name.decode()]  # dropped, name kept
            await ws.committer.sync()  # the syncfs, the records, then the name goes
            assert c.done.is_set() and os.listdir(staging) == []
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    writes = [e for e in ws.store.events() if e["op"] == "write"]
    assert [(e["path"], e.get("links")) for e in writes] == [("f0", ["g0"])]


def test_a_group_taken_is_applied_though_its_taker_is_cancelled(ws: Any) -> None:
    """A flush whose caller is cancelled once it has taken the queue (gc's collection at
    unmount, whose scope the daemon cancels) still applies and records the group: the
    commits it took are in no queue any more, and nothing else would land them."""
    import trio

    (ws.tree / "f0").write_bytes(b"old")

    async def main() -> None:
        ws.committer.open_intents()
        ws.policy.commit_interval_ms = 3_600_000  # only the flush below takes the queue
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            c = await submit_new(ws, 0, False, owner=object())
            async with ws.committer.commit_lock:  # as gc holds it (``exclusive``)
                with trio.CancelScope() as scope:
                    scope.cancel()  # cancelled before the group's thread starts
                    await ws.committer.flush_locked()
            assert ws.committer.owed_commits() == 0
            assert c.done.is_set() and c.outcome == "committed"
            assert (ws.tree / "f0").read_bytes() == b"new 0"
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [e["path"] for e in ws.store.events() if e["op"] == "write"] == ["f0"]


def test_a_long_queue_starts_a_group_and_holds_writers_back(ws: Any, monkeypatch: Any) -> None:
    # Each queued commit holds descriptors: the queue must stay bounded (SPEC §1).
    import trio

    from rwfs.core import committer

    monkeypatch.setattr(committer, "QUEUE_URGENT", 2)
    monkeypatch.setattr(committer, "QUEUE_MAX", 3)
    ws.policy.commit_interval_ms = 3_600_000  # only the queue's length can start a group
    for i in range(5):
        (ws.tree / f"f{i}").write_bytes(b"old")

    async def commit(i: int, submitted: list[int]) -> None:
        # An owner: a writer through the mount, which the queue holds back.
        await submit_new(ws, i, False, owner=object())
        submitted.append(i)

    async def main() -> None:
        ws.committer.open_intents()
        submitted: list[int] = []
        async with trio.open_nursery() as nursery:
            for i in range(3):
                await commit(i, submitted)
            assert (
                ws.committer.queued == 3 and ws.committer._urgent.is_set()
            )  # a group is due at once
            nursery.start_soon(commit, 3, submitted)
            await trio.sleep(0.2)
            assert submitted == [0, 1, 2] and ws.committer.queued == 3  # the fourth waits
            nursery.start_soon(ws.committer.run)
            with trio.fail_after(10):
                while len(submitted) < 4:
                    await trio.sleep(0.01)
            assert ws.committer.queued == 1  # a group took the first three
            await commit(4, submitted)  # two queued: another group at once
            with trio.fail_after(10):
                while ws.committer.queued:
                    await trio.sleep(0.01)
            await ws.committer.close()
            nursery.cancel_scope.cancel()
        assert submitted == [0, 1, 2, 3, 4]

    trio.run(main)
    for i in range(5):
        assert (ws.tree / f"f{i}").read_bytes() == b"new %d" % i
    assert sorted(e["path"] for e in ws.store.events()) == [f"f{i}" for i in range(5)]


def test_the_committer_leaves_a_conflicted_stage_open_until_it_is_settled(
    ws: Any, monkeypatch: Any
) -> None:
    # Until on_committed, the FUSE layer still reads a queued commit's stage: a thread
    # that closed it gave readers EBADF (or, with the number reused, another file).
    import trio

    from rwfs.core.commits import Commit
    from rwfs.core.errors import RwfsError

    (ws.tree / "f").write_bytes(b"old")
    in_thread: dict[str, Any] = {}
    real_replace = ws.landing.replace

    def replace(c: Commit) -> None:
        real_replace(c)
        in_thread["outcome"], in_thread["fd"] = c.outcome, c.stage.fd
        in_thread["open"] = c.stage.fd >= 0 and os.fstat(c.stage.fd).st_size == 3

    monkeypatch.setattr(ws.landing, "replace", replace)
    settled: list[tuple[str, int]] = []
    ws.committer.on_committed = lambda c: settled.append((c.outcome, c.stage.fd))

    async def main() -> None:
        ws.committer.open_intents()
        fd = os.open(ws.tree / "f", os.O_RDONLY)
        try:
            stage = await ws.stages.new(fd, truncate=True)
        finally:
            os.close(fd)
        os.pwrite(stage.fd, b"new", 0)
        stage.sealed = True
        intended, size, _ = await ws.stages.seal(stage)
        (ws.tree / "f").write_bytes(b"changed meanwhile")  # the commit will conflict
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.committer.run)
            with pytest.raises(RwfsError):
                await ws.committer.submit(Commit(b"f", stage, intended, size, {}), wait=True)
            await ws.committer.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert in_thread["outcome"] == "conflict" and in_thread["open"] is True
    assert settled == [("conflict", -1)]  # dropped on the loop, as it was settled
    assert os.listdir(ws.tree / ".rw" / "staging") == []
    assert ws.objects.exists(sha(b"new"))  # the conflicting draft is kept
    assert (ws.tree / "f").read_bytes() == b"changed meanwhile"


def test_a_stage_is_copied_from_its_own_descriptor(ws: Any) -> None:
    # The loop may close the inode's descriptor (a release, a commit landing) while the
    # copy runs in a worker thread, and the number may be reused at once by another file.
    import trio

    big = os.urandom(1 << 20) * 96
    (ws.tree / "big").write_bytes(big)
    (ws.tree / "other").write_bytes(b"another file" * 1000)

    async def main() -> Any:
        fd = os.open(ws.tree / "big", os.O_RDONLY)
        got: dict[str, Any] = {}

        async def stage() -> None:
            got["stage"] = await ws.stages.new(fd, truncate=False)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stage)
            await trio.sleep(0.005)  # the copy has started in its thread
            os.close(fd)
            reused = os.open(ws.tree / "other", os.O_RDONLY)  # most likely the same number
            got["reused"] = reused == fd
        os.close(reused)
        return got

    got = trio.run(main)
    s = got["stage"]
    assert s.expected == sha(big)
    assert os.pread(s.fd, len(big) + 1, 0) == big
    ws.stages.drop(s)


def test_a_trailing_hash_reads_no_further_than_the_writes_reported(tmp_path: Path) -> None:
    """A write is reported after it reached the file: a block appended but not yet
    reported is not read, so its report does not void a hash of a file written front to
    back; a write into bytes already read still does."""
    from rwfs.journal.objects import TrailingHash

    for overwrite in (False, True):
        path = tmp_path / f"f{overwrite}"
        first = os.urandom(1 << 20) * 32
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, first, 0)
        t = TrailingHash(fd, len(first))
        # Appended while the thread still reads the first bytes, and not reported yet.
        os.pwrite(fd, b"appended" * 1000, len(first))
        # The thread reads what it may, then waits: for all of it, however slow the
        # machine (a fixed sleep let the overwrite below come before the read of byte 5).
        deadline = time.monotonic() + 60
        while t._pos < len(first) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # (and would have read on, had it not stopped at the reported end)
        t.wrote(len(first), len(first) + 8000)
        if overwrite:
            os.pwrite(fd, b"x", 5)
            t.wrote(5, 6)
        got = t.finish()
        data = path.read_bytes()
        os.close(fd)
        if overwrite:
            assert got is None  # the seal hashes the whole file again
        else:
            assert got == ("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    # A write never reported: never the digest of a prefix.
    fd = os.open(tmp_path / "unreported", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"a" * 4096, 0)
    t = TrailingHash(fd, 4096)
    os.pwrite(fd, b"b" * 4096, 4096)
    assert t.finish() is None
    os.close(fd)


def test_a_digest_is_cached_only_once_the_files_last_change_is_not_racy(ws: Any) -> None:
    # Two changes in one tick of the kernel's coarse clock leave (size, mtime, ctime) as
    # they were: a digest cached then would vouch for bytes the file no longer holds.
    p = ws.tree / "f"
    p.write_bytes(b"one")
    fd = os.open(p, os.O_RDONLY)
    try:
        assert ws.digests.of_fd(fd) == sha(b"one")
        assert ws.digests.cache == {}  # changed just now: not cached
        time.sleep(0.1)
        assert ws.digests.of_fd(fd) == sha(b"one")
        assert list(ws.digests.cache.values())[0][1] == sha(b"one")
    finally:
        os.close(fd)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions run in worker threads (``trio.to_thread.run_sync``)."""
    import trio

    seen: list[str] = []
    real = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kw: Any) -> Any:
        seen.append(fn.__name__)
        return await real(fn, *args, **kw)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    return seen


def test_a_digest_is_taken_on_the_loop_when_cached_or_small(ws: Any, hops: list[str]) -> None:
    """``Digests.of`` hops to a thread only to read and hash a large file: a cached
    digest and a small file's cost less than the hop. A FIFO is never read on the loop."""
    import trio

    from rwfs.core.digests import HASH_ON_LOOP

    small, large = b"x" * HASH_ON_LOOP, b"y" * (HASH_ON_LOOP + 1)

    def digest(name: str, data: bytes) -> tuple[str, list[str]]:
        p = ws.tree / name
        p.write_bytes(data)
        fd = os.open(p, os.O_RDONLY)
        try:
            hops.clear()
            return trio.run(ws.digests.of, fd), list(hops)
        finally:
            os.close(fd)

    assert digest("small", small) == (sha(small), [])
    assert digest("large", large) == (sha(large), ["_hash"])
    time.sleep(0.1)  # no longer racy: the next read of it is cached
    fd = os.open(ws.tree / "large", os.O_RDONLY)
    try:
        for want in (["_hash"], []):  # read and cached, then from the cache with no hop
            hops.clear()
            assert trio.run(ws.digests.of, fd) == sha(large)
            assert hops == want
    finally:
        os.close(fd)
    os.mkfifo(ws.tree / "fifo")
    fd = os.open(ws.tree / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        hops.clear()
        with pytest.raises(OSError):  # not a file to hash (ESPIPE)
            trio.run(ws.digests.of, fd)
        assert hops == ["_hash"]
    finally:
        os.close(fd)


def test_a_small_rewrite_is_gated_on_the_loop_only_when_its_parse_is_kept(
    ws: Any, hops: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite of a small file whose old bytes' parse is kept is sealed and gated on the
    event loop (quicker than a thread hop), with the same findings the gates give in a
    worker thread; one whose parse is not kept, or a larger file, goes to a thread."""
    import trio

    from rwfs.checks import gates, parsers
    from rwfs.core import gating

    monkeypatch.setattr(parsers, "_kept", parsers._Kept())
    f = ws.tree / "m.py"

    def module(n: int, k: int) -> bytes:
        return b"".join(b"def f%d(x):\n    return x + %d\n\n" % (i, i * k) for i in range(n))

    async def rewrite(data: bytes) -> tuple[list[str], list[gates.Finding]]:
        hops.clear()
        fd = os.open(f, os.O_RDONLY)
        try:
            stage = await ws.stages.new(fd, truncate=True, expected="x")
            os.pwrite(stage.fd, data, 0)
            stage.sealed = True
            findings = (await ws.stages.seal(stage, (b"m.py", fd)))[2]
        finally:
            os.close(fd)
        ws.stages.drop(stage)
        return [h for h in hops if h in ("work", "run_now")], findings

    async def main() -> None:
        f.write_bytes(module(60, 1))
        assert await rewrite(module(60, 2)) == (["work"], [])  # the old parse is not kept
        f.write_bytes(module(60, 2))  # committed: its parse is kept now
        assert await rewrite(module(60, 3)) == ([], [])
        f.write_bytes(module(60, 3))
        broken = module(60, 3).replace(b"return x + 6\n", b"return (x + 6\n")
        where, findings = await rewrite(broken)
        assert where == [] and [x.gate for x in findings] == ["syntax"]
        assert findings[0].action == "reject" and "does not parse" in findings[0].message
        assert gates.check(b"m.py", module(60, 3), broken, ws.policy.gate)[0].message == (
            findings[0].message
        )
        big = module(200, 2)  # over GATES_ON_LOOP, though its parse is kept
        assert len(big) > gating.GATES_ON_LOOP
        f.write_bytes(big)
        parsers.parse_errors(b"m.py", big)
        assert parsers.quick(b"m.py", lambda: big)
        assert parsers.quick(b"notes.txt", lambda: pytest.fail("no format: nothing to read"))
        assert (await rewrite(module(200, 3)))[0] == ["work"]

    trio.run(main)
