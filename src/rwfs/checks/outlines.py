"""The outlines of Python and YAML: a full parse that also gives each block of the file
(``outline``), and the parse of the entries an edit touched in their block's context
(``piece``), for parsers.py's quick reparse."""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from .parsing import (
    Block,
    CannotJudge,
    Error,
    at_line_start,
    line_starts,
    odd_line_breaks,
)

# Blocks shorter than this are not kept: an edit in one reparses its enclosing entry.
MIN_BLOCK = 1024


def _python(data: bytes) -> tuple[Error | None, ast.Module | None]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences: not errors
            return None, ast.parse(data)
    except SyntaxError as exc:
        return (exc.lineno or 0, exc.msg), None
    except ValueError as exc:  # null bytes
        return (0, str(exc)), None


_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.M)


_CLAUSE = re.compile(rb"(?:elif|else|except|finally|case)\b")


_INDENT = re.compile(rb"[ \t\f]*")


class PythonOutline:
    """Blocks are statement lists (module, bodies of class, def, if, for, while, with,
    try and their clauses); their shape is their indent. Their head is ``if 1:`` at each
    enclosing statement's indent: the parser does not care which compound statement a
    body belongs to."""

    def outline(self, data: bytes) -> tuple[Error | None, list[Block] | None]:
        err, tree = _python(data)
        if tree is None:
            return err, None
        cookie = _CODING.search(b"\n".join(data.split(b"\n", 2)[:2]))
        if (
            odd_line_breaks(data)
            or (cookie and cookie.group(1).lower().replace(b"_", b"-") not in (b"utf-8", b"utf8"))
            or b"barry_as_FLUFL" in data  # a __future__ import that changes the grammar
        ):
            return None, None
        blocks: list[Block] = []
        starts = self._walk(data, line_starts(data), tree.body, b"", blocks)
        if starts:
            blocks.append(Block(b"", b"", tuple(starts), len(data)))
        return None, blocks

    def piece(self, block: Block, text: bytes) -> tuple[list[int], list[Block]] | None:
        src = block.head + text
        _, tree = _python(src)
        if tree is None:
            return None
        body: list[ast.stmt] = tree.body
        for _ in range(block.head.count(b"\n")):  # the region must stay in the head's blocks
            if len(body) != 1 or not isinstance(body[0], ast.If) or body[0].orelse:
                return None
            body = body[0].body
        lines = line_starts(src)
        if body and self._indent(src, lines, body[0]) != block.shape:
            return None  # indented unlike the entries around it
        nested: list[Block] = []
        skip = len(block.head)
        starts = self._walk(src, lines, body, block.head, nested)
        return [x - skip for x in starts], [b.shifted(-skip) for b in nested]

    @staticmethod
    def _first_line(stmt: ast.stmt) -> int:
        return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])

    def _indent(self, data: bytes, lines: list[int], stmt: ast.stmt) -> bytes:
        at = lines[self._first_line(stmt) - 1]
        return data[at : _INDENT.match(data, at).end()]  # type: ignore[union-attr]

    def _walk(
        self, data: bytes, lines: list[int], body: list[ast.stmt], head: bytes, out: list[Block]
    ) -> list[int]:
        """The offsets of the statements of ``body`` that begin a line, adding the blocks
        nested in them to ``out``."""
        starts = []
        for stmt in body:
            first = self._first_line(stmt)
            at = lines[first - 1]
            indent = _INDENT.match(data, at).end() - at  # type: ignore[union-attr]
            begins = (
                data[at + indent : at + indent + 1] == b"@"
                if first != stmt.lineno
                else stmt.col_offset == indent and not _CLAUSE.match(data, at + indent)
            )
            if begins and at_line_start(data, lines, first - 1, indent) is not None:
                starts.append(at)
            own = lines[stmt.lineno - 1]
            inner = head + data[own : _INDENT.match(data, own).end()] + b"if 1:\n"  # type: ignore[union-attr]
            for sub in self._bodies(stmt):
                subs = self._walk(data, lines, sub, inner, out)
                end_line = sub[-1].end_lineno or sub[-1].lineno
                end = lines[end_line] if end_line < len(lines) else len(data)
                if subs and end - subs[0] >= MIN_BLOCK:
                    out.append(Block(inner, self._indent(data, lines, sub[0]), tuple(subs), end))
        return starts

    @staticmethod
    def _bodies(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
        if isinstance(stmt, ast.Match):
            return  # case bodies sit two levels in; the match is reparsed whole
        for name in ("body", "orelse", "finalbody"):
            sub = getattr(stmt, name, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                yield sub
        for handler in getattr(stmt, "handlers", []):
            yield handler.body


# ---- YAML ----


# libyaml's parser when the wheel has it (about ten times faster), else PyYAML's own.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)


_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


_NODE = (yaml.ScalarEvent, yaml.AliasEvent, *_OPEN)


def _yaml_events(data: bytes) -> tuple[Error | None, list[Any] | None]:
    try:
        return None, list(yaml.parse(data, Loader=_YAML_LOADER))  # syntax only, no objects
    except yaml.YAMLError as exc:
        return _yaml_error(exc), None


def _yaml_error(exc: yaml.YAMLError) -> Error:
    if "maximum nesting depth" in str(exc):  # libyaml's limit (1,000), not YAML's
        raise CannotJudge("it is nested deeper than the yaml parser goes")
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        return exc.problem_mark.line + 1, str(exc.problem or exc)
    return 0, str(exc)


def _column(event: Any) -> int:
    return int(event.start_mark.column)


@dataclass
class _Open:
    """A block collection being walked."""

    kind: str  # "map" or "seq"
    column: int
    head: bytes | None  # None: not reached through entries that begin lines
    starts: list[int]
    children: int = 0
    begins: bool = False  # whether the current entry begins a line


class YamlOutline:
    """Blocks are block mappings and sequences whose keys (or dashes) begin lines; their
    shape is (kind, column). Their head is ``a:`` or ``-`` at each enclosing column."""

    def outline(self, data: bytes) -> tuple[Error | None, list[Block] | None]:
        # Events are walked as they come: a list of them all costs more in garbage
        # collection than the parse itself.
        odd = odd_line_breaks(data) or data.startswith((b"\xff\xfe", b"\xfe\xff"))
        blocks: list[Block] | None = [] if not odd else None
        docs = 0
        walked = False
        try:
            events = yaml.parse(data, Loader=_YAML_LOADER)  # syntax only, no objects
            for e in events:
                if type(e) is yaml.DocumentStartEvent:
                    docs += 1
                elif blocks is not None and isinstance(e, _OPEN) and not walked:
                    walked = True  # the first document's root collection
                    shape = (self._kind(e), _column(e))
                    nested: list[Block] = []
                    starts = self._walk(data, line_starts(data), e, events, b"", nested)
                    if not e.flow_style and starts:
                        blocks = [*nested, Block(b"", shape, tuple(starts), len(data))]
        except yaml.YAMLError as exc:
            return _yaml_error(exc), None
        return None, (blocks if docs == 1 else None)

    def piece(self, block: Block, text: bytes) -> tuple[list[int], list[Block]] | None:
        src = block.head + text
        _, events = _yaml_events(src)
        if events is None:
            return None
        docs = [
            e for e in events if isinstance(e, (yaml.DocumentStartEvent, yaml.DocumentEndEvent))
        ]
        if not docs:
            return [], []  # only comments: the region's entries were removed
        if len(docs) != 2 or any(e.explicit for e in docs):
            return None
        nodes = [e for e in events if isinstance(e, (*_NODE, *_CLOSE))]
        for line in block.head.splitlines():  # each head line: a collection of one entry
            if not nodes or self._kind(nodes[0]) != ("map" if line.endswith(b":") else "seq"):
                return None
            nodes = nodes[2:-1] if line.endswith(b":") else nodes[1:-1]
            if not nodes or self._span(nodes) != len(nodes):
                return None  # the region left its block
        first = nodes[0]
        if isinstance(first, yaml.ScalarEvent) and len(nodes) == 1:
            # an empty value: every entry of the region was removed
            return ([], []) if (first.value, first.anchor, first.tag) == ("", None, None) else None
        if (
            not isinstance(first, _OPEN)
            or first.flow_style
            or (self._kind(first), _column(first)) != block.shape
        ):
            return None
        nested: list[Block] = []
        skip = len(block.head)
        rest = iter(nodes[1:])
        starts = self._walk(src, line_starts(src), first, rest, block.head, nested)
        return [x - skip for x in starts], [b.shifted(-skip) for b in nested]

    @staticmethod
    def _kind(event: Any) -> str:
        return {yaml.MappingStartEvent: "map", yaml.SequenceStartEvent: "seq"}.get(type(event), "")

    @staticmethod
    def _span(nodes: list[Any]) -> int:
        """How many events the first node of ``nodes`` takes, with its children."""
        depth = 0
        for i, e in enumerate(nodes):
            depth += isinstance(e, _OPEN) - isinstance(e, _CLOSE)
            if depth == 0:
                return i + 1
        return len(nodes)

    def _walk(
        self,
        data: bytes,
        lines: list[int],
        root: Any,
        events: Iterator[Any],
        head: bytes,
        out: list[Block],
    ) -> list[int]:
        """The entries that begin lines of the collection ``root`` opens, reading its
        events from ``events``; adds the block collections nested in it (reached through
        such entries) to ``out``."""
        stack = [_Open(self._kind(root), _column(root), None if root.flow_style else head, [])]
        for e in events:
            kind = type(e)
            if kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                done = stack.pop()
                if not stack:
                    return done.starts
                if done.head is not None and done.starts:
                    end = self._end(data, lines, e.start_mark)
                    if end is not None and end - done.starts[0] >= MIN_BLOCK:
                        out.append(
                            Block(done.head, (done.kind, done.column), tuple(done.starts), end)
                        )
                continue
            if (
                kind is not yaml.ScalarEvent
                and kind is not yaml.AliasEvent
                and not isinstance(e, _OPEN)
            ):
                continue
            parent = stack[-1]
            if parent.kind == "seq" or not parent.children & 1:  # a new entry
                parent.begins = False
                mark = e.start_mark
                col = parent.column
                if mark.column == col if parent.kind == "map" else mark.column > col:
                    at = at_line_start(data, lines, mark.line, col)
                    if at is not None and (
                        parent.kind == "map" or data[at + col : at + col + 1] == b"-"
                    ):
                        parent.begins = True
                        parent.starts.append(at)
            parent.children += 1
            if isinstance(e, _OPEN):
                link = None
                if parent.head is not None and parent.begins and not e.flow_style:
                    step = b"a:\n" if parent.kind == "map" else b"-\n"
                    link = parent.head + b" " * parent.column + step
                stack.append(_Open(self._kind(e), _column(e), link, []))
        return []

    @staticmethod
    def _end(data: bytes, lines: list[int], mark: Any) -> int | None:
        """Where a block collection ends: the start of the line of the token after it (only
        blanks before it on that line), or the end of the file."""
        if mark.line >= len(lines):
            return len(data)
        at = lines[mark.line]
        return None if data[at : at + mark.column].strip(b" ") else at
