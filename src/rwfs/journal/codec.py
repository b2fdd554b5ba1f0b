"""JSON of the journal's records and rows, encoded and decoded by orjson (several times
faster than ``json`` on the committer's path: a file's records and history rows are a
dozen encodings), falling back on ``json`` for what orjson refuses: the surrogate escapes
that stand for a path's non-UTF-8 bytes (``os.fsdecode``). The text is ASCII either way
(non-ASCII characters escaped, as ``json.dumps`` does): ``json`` reads it back the same."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """``obj`` as one line of ASCII JSON."""
    try:
        out = orjson.dumps(obj)
    except TypeError:  # (orjson.JSONEncodeError: a lone surrogate, a key not a string)
        return json.dumps(obj).encode()
    return out if out.isascii() else json.dumps(obj).encode()


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    """What ``dumps`` (or ``json.dumps``) wrote; ValueError if it is not JSON. (Integers
    are exact within 64 bits, signed or not: every number a record holds, an inode number
    or a size, is.)"""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # (a lone surrogate's escape, or not JSON: json says)
        return json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
