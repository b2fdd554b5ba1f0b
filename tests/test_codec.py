"""The journal's JSON (journal/codec.py): orjson where it can, json where it cannot, and
the same records either way, for paths of any bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rwfs.journal import codec
from rwfs.journal.intents import IntentLog
from rwfs.journal.store import Store, u64

ODD = os.fsdecode(b"dir/\xff\xfe name \xc3\xa9\xe2\x80\x94.txt")  # not UTF-8, then UTF-8

VALUES: list[Any] = [
    {"op": "write", "path": "a.txt", "size": 3, "batch": None, "ok": True},
    {"path": ODD, "links": [ODD, "b"]},  # surrogate escapes: json writes them
    {"path": "caf\u00e9 \u2014 \U0001f600"},  # non-ASCII, valid UTF-8
    {"events": {1: {"expected": "sha256:" + "a" * 64}}},  # a key that is not a string
    {"ino": 2**64 - 1, "off": -(2**63)},  # the ends of what the system's numbers reach
    [1, 2.5, None, 'x\n"y"'],
]


@pytest.mark.parametrize("value", VALUES)
def test_what_codec_writes_is_ascii_json_that_json_reads_as_json_wrote_it(value: Any) -> None:
    raw = codec.dumps(value)
    assert raw.isascii() and b"\n" not in raw
    assert json.loads(raw) == json.loads(json.dumps(value))
    assert codec.loads(raw) == json.loads(json.dumps(value))
    assert codec.loads(memoryview(raw)) == codec.loads(raw.decode())


def test_codec_reads_what_json_wrote_and_refuses_what_is_not_json() -> None:
    for value in VALUES:
        assert codec.loads(json.dumps(value).encode()) == json.loads(json.dumps(value))
    for bad in (b"", b"{", b'{"a": 1}!', b"\xff"):
        with pytest.raises(ValueError):
            codec.loads(bad)


def test_a_path_of_any_bytes_round_trips_through_the_journal(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "journal"))
    try:
        ev = {"op": "write", "path": ODD, "expected": None, "intended": "sha256:" + "b" * 64}
        lsn = store.write(lambda txn: txn.append_event(dict(ev)))
        [got] = store.events(path=ODD)
        assert (got["lsn"], got["path"], got["intended"]) == (lsn, ODD, ev["intended"])
        with store.env.begin() as txn:
            raw = bytes(txn.get(u64(lsn), db=store.db[b"events"]))
        assert raw.isascii()
    finally:
        store.close()


def test_an_intent_record_with_a_path_of_any_bytes_is_one_ascii_line(tmp_path: Path) -> None:
    (tmp_path / "intents").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        log = IntentLog(fd)
        log.start(0)
        rec = {"kind": "commit", "id": "c1", "path": ODD, "info": {"comm": "caf\u00e9"}}
        log.append(rec)
        gen = log.gen
        assert log.records(gen) == [rec]
        data = (tmp_path / "intents" / f"{gen:016x}.log").read_bytes()
        assert data.isascii() and data.count(b"\n") == 1
    finally:
        os.close(fd)
