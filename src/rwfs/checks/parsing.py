"""What a parser of the syntax gate answers (``Error``, ``CannotJudge``), and the
outline of blocks a format keeps of a version to parse the next one only around an edit
(``Block``; parsers.py's docstring tells how)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Error = tuple[int, str]  # (line, message) of the first syntax error


class CannotJudge(Exception):
    """A parser could not say whether the bytes parse: they are nested deeper than it can
    go (RecursionError, libyaml's depth limit), it ran out of memory, or it failed. The
    message says which, in words, and never quotes the bytes."""


Parser = Callable[..., Error | None]  # (data, path=None, previous=None)


def line_starts(data: bytes) -> list[int]:
    return [0, *(m.end() for m in re.finditer(b"\n", data))]


# ---- outlines: reparse only the entries of a block that an edit touched ----


@dataclass(frozen=True)
class Block:
    """A run of entries that can be parsed apart from the rest of the file."""

    head: bytes  # the lines that recreate the block's context
    shape: Any  # what its entries must still form (a format's own notion)
    starts: tuple[int, ...]  # offsets where entries begin, each at a line start
    end: int  # where the block's last entry ends (a line start or the end of the file)

    def shifted(self, by: int) -> Block:
        """The same block, ``by`` bytes further on."""
        return Block(self.head, self.shape, tuple(x + by for x in self.starts), self.end + by)


class Outliner(Protocol):
    def outline(self, data: bytes) -> tuple[Error | None, list[Block] | None]:
        """A full parse: the first error, else the file's blocks (None: none can be
        trusted, e.g. for an unusual line ending)."""

    def piece(self, block: Block, text: bytes) -> tuple[list[int], list[Block]] | None:
        """Parse ``text``, entries of ``block``, after its head: None unless it parses
        and stays inside the block; else the offsets (in ``text``) of the entries that
        begin a line, and the blocks inside them."""


def odd_line_breaks(data: bytes) -> bool:
    """Line breaks other than \\n and \\r\\n, which parsers count as lines where a count of
    \\n would not: then no outline is kept."""
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return True
    return b"\xc2\x85" in data or b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data


def at_line_start(data: bytes, lines: Sequence[int], line: int, col: int) -> int | None:
    """The offset of 0-based ``line`` if only blanks come before ``col`` on it and the line
    before does not continue into it (a trailing backslash); else None."""
    if line >= len(lines):
        return None
    at = lines[line]
    if data[at : at + col].strip(b" \t\f") or (at >= 2 and data[at - 2 : at] == b"\\\n"):
        return None
    return at
