"""Parsers for the syntax gate, and how each one reparses an edited file quickly.

``parse_errors(path, data, previous)`` gives a file's format and its first syntax error.
A commit usually changes a few lines of a file whose previous version was parsed a moment
before, so each format keeps something of that parse, per path, and parses the next
version only around the edit:

- tree-sitter formats keep the last tree; tree-sitter reparses only what the edit touched.
- Python, YAML and Bash keep the last version's *outline*: its blocks (the module, a class
  or function body, a mapping or sequence, the script's top level), where each of their
  entries begins a line, and a few synthetic lines that recreate each block's context
  (``if 1:`` at the enclosing indents; ``a:`` or ``-`` at the enclosing columns). An edit
  inside a block is checked by parsing only the entries it touched, after those lines:
  the rest of the file parsed before in the same context and has not changed. If that
  piece does not parse, or leaves its block, the whole file is parsed, and that result
  (with its error line) is the answer. Whether the shortcut ever answers differently from
  a full parse is checked by property tests with random edits (tests/test_core.py).

TOML is parsed by rtoml (Rust; ten times faster than tomllib), and by tomllib when rtoml
refuses, so that nothing Python's own parser reads is refused.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import threading
import tomllib
import warnings
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Any

from .outlines import PythonOutline, YamlOutline
from .parsing import (
    Block,
    CannotJudge,
    Error,
    Outliner,
    Parser,
    at_line_start,
    line_starts,
    odd_line_breaks,
)

# Per-path state is kept for files up to _KEEP_BYTES, for at most _KEEP_PATHS paths
# and about _KEEP_TOTAL bytes of memory. A checkout of a branch and back again changes
# hundreds of files twice, and each second parse is quick only if the first is still kept.
_KEEP_BYTES = 2 << 20


_KEEP_PATHS = 4096


_KEEP_TOTAL = 128 << 20


# What a kept version costs, in bytes of memory a byte of the file: the bytes themselves
# and an outline (measured: a third of a byte a byte of Python), or a tree-sitter tree
# (measured: 27-29 bytes a byte of JavaScript, or of Python read by another grammar).
OUTLINE_COST = 2


TREE_COST = 30


class _Kept:
    """A least-recently-used map (format, path) -> (bytes, what their parse left), shared
    by the worker threads."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, bytes], tuple[bytes, Any, int]] = {}
        self._bytes = 0  # the estimated memory of what is kept
        self._lock = threading.Lock()

    def get(self, key: tuple[str, bytes], data: bytes) -> Any:
        with self._lock:
            hit = self._items.get(key)
        return hit[1] if hit is not None and hit[0] == data else None

    def put(self, key: tuple[str, bytes], data: bytes, state: Any, cost: int) -> None:
        """Keep ``state``, what parsing ``data`` left, which costs ``cost`` bytes a byte."""
        if len(data) > _KEEP_BYTES:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += len(data) * cost - (old[2] if old else 0)
            self._items[key] = (data, state, len(data) * cost)
            while len(self._items) > _KEEP_PATHS or self._bytes > _KEEP_TOTAL:
                first = next(iter(self._items))  # the least recently parsed
                self._bytes -= self._items.pop(first)[2]


_kept = _Kept()


# ---- edits ----


def _common_prefix(a: bytes, b: bytes, limit: int | None = None) -> int:
    """The length of the longest common prefix (at most ``limit``), by halving: each step
    compares slices in C."""
    lo, hi = 0, min(len(a), len(b), limit if limit is not None else len(a))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# The last answer of _changed: every gate of one commit asks it of the same two texts.
_last_change: tuple[bytes, bytes, tuple[int, int]] = (b"", b"", (0, 0))


def _changed(old: bytes, new: bytes) -> tuple[int, int]:
    """(start, end) of the span of ``old`` an edit replaced: between the common prefix
    and the common suffix. The new bytes of that span end at ``end + len(new) - len(old)``."""
    global _last_change
    a, b, span = _last_change
    if a is old and b is new:
        return span
    start = _common_prefix(old, new)
    limit = min(len(old), len(new)) - start
    span = start, len(old) - _common_prefix(old[::-1], new[::-1], limit)
    _last_change = (old, new, span)
    return span


def _reparse(fmt: Outliner, old: bytes, blocks: list[Block], new: bytes) -> list[Block] | None:
    """The blocks of ``new``, given those of ``old`` (which parsed), when the entries the
    edit touched parse in their block's context; None when they do not (or the edit is not
    inside any kept block), and only a full parse can tell.

    The innermost block holding the edit is tried first, then up to two around it: an
    edit can leave its block (a function added after the last method of a class)."""
    start, end = _changed(old, new)
    delta = len(new) - len(old)
    inside = sorted(
        (b for b in blocks if b.starts[0] <= start and end <= b.end),
        key=lambda b: b.end - b.starts[0],
    )
    for block in inside[:3]:
        a = block.starts[bisect_right(block.starts, start) - 1]
        k = bisect_left(block.starts, end)
        e = block.starts[k] if k < len(block.starts) else block.end
        text = new[a : e + delta]
        if text and (not text.endswith(b"\n") or text.endswith((b"\\\n", b"\\\r\n"))):
            continue  # a line continued into the next entry: not a clean cut
        found = fmt.piece(block, text)
        if found is not None:
            return _moved(blocks, block, a, e, delta, *found)
    return None


def _moved(
    blocks: list[Block],
    block: Block,
    a: int,
    e: int,
    delta: int,
    starts: list[int],
    nested: list[Block],
) -> list[Block]:
    """``blocks`` after ``block``'s entries in old[a:e] were replaced by a piece
    ``delta`` bytes longer, whose entries begin at ``starts`` and hold ``nested``."""
    out = []
    for b in blocks:
        if b is block:
            kept = [x for x in b.starts if x < a] + [a + x for x in starts]
            kept += [x + delta for x in b.starts if x >= e]
            if kept:
                out.append(Block(b.head, b.shape, tuple(kept), b.end + delta))
        elif b.end <= a:
            out.append(b)  # before the piece
        elif b.starts[0] >= e:  # after it
            out.append(b.shifted(delta))
        elif b.starts[0] < a:  # around it
            moved = tuple(x + delta if x >= e else x for x in b.starts)
            out.append(Block(b.head, b.shape, moved, b.end + delta))
        # else: inside the piece, replaced by ``nested``
    out += [b.shifted(a) for b in nested]
    return out


def _outlined(lang: str, fmt: Outliner) -> Parser:
    def parse(
        data: bytes, path: bytes | None = None, previous: bytes | None = None
    ) -> Error | None:
        key = (lang, path or b"")
        if path is not None and previous is not None:
            blocks = _kept.get(key, previous)
            if blocks is not None:
                blocks = _reparse(fmt, previous, blocks, data)
                if blocks is not None:
                    _kept.put(key, data, blocks, OUTLINE_COST)
                    return None
        err, blocks = fmt.outline(data)
        if err is None and path is not None and blocks:
            _kept.put(key, data, blocks, OUTLINE_COST)
        return err

    return parse


# Each grammar from its own wheel: format -> (module, function).
_GRAMMARS = {
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "java": ("tree_sitter_java", "language"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "ruby": ("tree_sitter_ruby", "language"),
    "bash": ("tree_sitter_bash", "language"),
}


_parsers = threading.local()  # a tree-sitter Parser is not safe to share between threads


def _ts_parser(lang: str) -> Any:
    cache = _parsers.__dict__
    parser = cache.get(lang)
    if parser is None:
        import tree_sitter

        module, func = _GRAMMARS[lang]
        grammar = getattr(importlib.import_module(module), func)()
        parser = cache[lang] = tree_sitter.Parser(tree_sitter.Language(grammar))
    return parser


def _ts_error(root: Any) -> Error | None:
    if not root.has_error:
        return None
    node = _first_error(root)
    if node is None:
        return 0, "syntax error"
    return node.start_point[0] + 1, (
        f"missing {node.type!r}" if node.is_missing else "syntax error"
    )


def _first_error(node: Any) -> Any:
    """The first ERROR or MISSING node, depth first (where a parser gave up). A loop, not
    a recursion: a tree can be as deep as the file is nested."""
    todo = [node]
    while todo:
        node = todo.pop()
        if node.is_error or node.is_missing:
            return node
        todo.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    return None


def _tree_sitter(lang: str) -> Parser:
    """Parse from the path's last tree, told which bytes changed: tree-sitter then
    reparses only around them (about a millisecond instead of ten at 100 KB)."""

    def parse(
        data: bytes, path: bytes | None = None, previous: bytes | None = None
    ) -> Error | None:
        return _ts_error(_ts_tree(lang, data, path, previous).root_node)

    return parse


def _ts_tree(lang: str, data: bytes, path: bytes | None, previous: bytes | None) -> Any:
    """The tree of ``data``: the one kept for it (another gate of this commit parsed it
    already), else parsed from the tree kept for ``previous``, else in full; kept."""
    key = (lang, path or b"")
    if path is not None:
        done = _kept.get(key, data)
        if done is not None:
            return done
    old_tree = None
    if path is not None and previous is not None:
        kept = _kept.get(key, previous)
        if kept is not None:
            old_tree = kept.copy()  # trees are shared between threads: edit a copy
            _edit(old_tree, previous, data)
    parser = _ts_parser(lang)
    tree = parser.parse(data, old_tree) if old_tree is not None else parser.parse(data)
    if path is not None:
        _kept.put(key, data, tree, TREE_COST)
    return tree


def trees(path: bytes, old: bytes, new: bytes) -> tuple[Any, Any] | None:
    """The tree-sitter trees of ``old`` and ``new`` (None for a format without a grammar),
    for gates that compare definitions: ``old``'s is the one kept for it (or a full parse,
    not kept), ``new``'s is parsed from it and kept, so the syntax gate after them parses
    nothing again. Read them only: a kept tree is shared between threads."""
    lang = language(path)
    if lang not in _GRAMMARS:
        return None
    if lang == "bash":  # outlined, not kept as a tree (_BashOutline): parsed whole
        return _ts_parser(lang).parse(old), _ts_parser(lang).parse(new)
    before = _kept.get((lang, path), old)
    if before is None:
        before = _ts_parser(lang).parse(old)
    return before, _ts_tree(lang, new, path, old)


def python_pieces(
    path: bytes, old: bytes, new: bytes
) -> Iterator[tuple[bytes, int, int, int, list[int]]]:
    """Where an edit of Python lies, innermost first, from the outline kept for ``old``:
    (head, a, e, e_new, around) such that ``head + old[a:e]`` is whole statements of
    ``old`` and ``head + new[a:e_new]`` what the edit made of them (it may not parse: the
    edit can leave its block); ``around``: where the statements enclosing them begin
    (``class C(ABC):``, ``def f():``, decorators first), outermost first. Nothing when no
    outline is kept: parse the files whole."""
    blocks = _kept.get(("python", path), old)
    if not blocks:
        return
    start, end = _changed(old, new)
    delta = len(new) - len(old)
    inside = sorted(
        (b for b in blocks if b.starts[0] <= start and end <= b.end),
        key=lambda b: b.end - b.starts[0],
    )
    for i, block in enumerate(inside[:3]):
        a = block.starts[bisect_right(block.starts, start) - 1]
        k = bisect_left(block.starts, end)
        e = block.starts[k] if k < len(block.starts) else block.end
        around = [b.starts[bisect_right(b.starts, start) - 1] for b in reversed(inside[i + 1 :])]
        yield block.head, a, e, e + delta, around


def _edit(tree: Any, old: bytes, new: bytes) -> None:
    """Tell a tree of ``old`` which bytes became ``new``."""
    start, old_end = _changed(old, new)
    new_end = old_end + len(new) - len(old)
    tree.edit(
        start_byte=start,
        old_end_byte=old_end,
        new_end_byte=new_end,
        start_point=_point(old, start),
        old_end_point=_point(old, old_end),
        new_end_point=_point(new, new_end),
    )


def _point(data: bytes, offset: int) -> tuple[int, int]:
    """(row, column) of a byte offset, as tree-sitter counts them (bytes)."""
    row = data.count(b"\n", 0, offset)
    return row, offset - (data.rfind(b"\n", 0, offset) + 1)


class _BashOutline:
    """tree-sitter-bash reuses little of an old tree (its scanner keeps state), so Bash is
    outlined instead: one block, the script's top-level commands that begin lines."""

    def outline(self, data: bytes) -> tuple[Error | None, list[Block] | None]:
        root = _ts_parser("bash").parse(data).root_node
        err = _ts_error(root)
        if err is not None:
            return err, None
        if odd_line_breaks(data):
            return None, None
        starts = self._starts(data, root)
        return None, [Block(b"", None, tuple(starts), len(data))] if starts else []

    def piece(self, block: Block, text: bytes) -> tuple[list[int], list[Block]] | None:
        root = _ts_parser("bash").parse(text).root_node
        if root.has_error:  # an unended here-document is one too (MISSING heredoc_end)
            return None
        return self._starts(text, root), []

    @staticmethod
    def _starts(data: bytes, root: Any) -> list[int]:
        lines = line_starts(data)
        out = []
        for node in root.children:
            row, col = node.start_point
            at = at_line_start(data, lines, row, col)
            if at is not None:
                out.append(at)
        return out


# ---- JSON, TOML ----


def _json(data: bytes, path: bytes | None = None) -> Error | None:
    try:
        json.loads(_uncommented(data) if path is not None and _jsonc(path) else data)
    except UnicodeDecodeError as exc:
        return 0, str(exc)
    except json.JSONDecodeError as exc:
        return exc.lineno, exc.msg
    return None


# JSON files whose readers take comments and trailing commas (JSONC): TypeScript's and
# VS Code's configuration, ESLint's, dev containers', Babel's, and any ``*.jsonc``.
_JSONC = re.compile(
    rb"(?:^|/)(?:[tj]sconfig[\w.-]*\.json|\.eslintrc\.json|\.babelrc(?:\.json)?"
    rb"|\.?devcontainer\.json|\.vscode/[^/]+\.json|[^/]+\.jsonc)$",
    re.IGNORECASE,
)


_JSONC_COMMENT = re.compile(rb'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.S)


_JSONC_COMMA = re.compile(rb'"(?:\\.|[^"\\\n])*"|,(?=\s*[}\]])')


def _jsonc(path: bytes) -> bool:
    return _JSONC.search(path) is not None


def _uncommented(data: bytes) -> bytes:
    """JSONC as JSON: comments blanked (their line breaks kept, so that lines still count)
    and trailing commas dropped; strings untouched."""

    def blank(m: re.Match[bytes]) -> bytes:
        t = m.group()
        return t if t[:1] == b'"' else re.sub(rb"[^\n]", b" ", t)

    return _JSONC_COMMA.sub(blank, _JSONC_COMMENT.sub(blank, data))


def _toml(data: bytes) -> Error | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return 0, str(exc)
    try:
        import rtoml

        rtoml.loads(text)
        return None
    except Exception:  # rtoml refused (or is missing): tomllib decides, and says where
        pass
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        return (int(m.group(1)) if m else 0), str(exc).split(" (at ")[0]
    return None


# ---- formats ----


PARSERS: dict[str, Parser] = {
    **{lang: _tree_sitter(lang) for lang in _GRAMMARS if lang != "bash"},
    "bash": _outlined("bash", _BashOutline()),
    "python": _outlined("python", PythonOutline()),
    "yaml": _outlined("yaml", YamlOutline()),
    "json": lambda data, path=None, previous=None: _json(data, path),
    "toml": lambda data, path=None, previous=None: _toml(data),
}


_SUFFIXES = {
    ".py": "python",
    ".pyi": "python",
    ".json": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".java": "java",
    ".go": "go",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hh": "cpp",
    ".hpp": "cpp",
    ".hxx": "cpp",
    ".rb": "ruby",
    ".sh": "bash",
    ".bash": "bash",
}


def language(path: bytes) -> str | None:
    """The format of a file, from its name (None: not a format rwfs can parse)."""
    name = path.rsplit(b"/", 1)[-1].decode("utf-8", "replace").lower()
    dot = name.rfind(".")
    return _SUFFIXES.get(name[dot:]) if dot > 0 else None


def parse_errors(
    path: bytes, data: bytes, previous: bytes | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """(format, errors) of a file's bytes: errors is empty when it parses. ``previous``:
    the bytes this version replaces, whose parse (if kept) makes this one quick."""
    lang = language(path)
    if lang is None:
        return None, []
    err = _guarded(lang, PARSERS[lang], data, path, previous)
    return lang, ([] if err is None else [{"line": err[0], "message": err[1]}])


def _guarded(lang: str, parse: Parser, *args: Any) -> Error | None:
    """``parse(*args)``, its failures turned into CannotJudge (raised): a parser that
    cannot decide must not take the commit down with it (RecursionError in ``json`` and
    ``tomllib`` at a few thousand levels, MemoryError, a parser's own bug)."""
    try:
        return parse(*args)
    except CannotJudge:
        raise
    except RecursionError:
        raise CannotJudge(f"it is nested deeper than the {lang} parser goes") from None
    except MemoryError:
        raise CannotJudge(f"the {lang} parser ran out of memory") from None
    except Exception as exc:  # the type only: an exception's text can quote the bytes
        raise CannotJudge(f"the {lang} parser failed ({type(exc).__name__})") from None


def quick(path: bytes, previous: Callable[[], bytes]) -> bool:
    """Whether a version of ``path`` that replaces the bytes ``previous()`` reads is parsed
    in microseconds: the path has no format rwfs parses, one parsed whole that fast (JSON,
    TOML), or the parse of those bytes is kept, so that only around the edit is parsed
    again. ``previous`` is called only for a format whose parse is kept."""
    lang = language(path)
    if lang is None or lang in ("json", "toml"):
        return True
    return _kept.get((lang, path), previous()) is not None


def statements(path: bytes, data: bytes) -> list[str] | None:
    """The kinds of the top-level statements ``data`` holds (comments aside: ``ast`` class
    names for Python, tree-sitter node types otherwise) when it parses on its own in the
    path's format; None when it does not, or for a format without statements (JSON,
    TOML, YAML). Nothing is kept: this is for the truncation gate's rare questions."""
    lang = language(path)
    if lang == "python":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return [type(s).__name__ for s in ast.parse(data).body]
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return None
    if lang not in _GRAMMARS:
        return None
    root = _ts_parser(lang).parse(data).root_node
    if root.has_error:
        return None
    return [exported(c).type for c in root.named_children if "comment" not in c.type]


def exported(node: Any) -> Any:
    """What an ``export`` statement declares (``export function f``, ``export class C``,
    ``export default class``), else the node: a definition exported is a definition."""
    if node.type == "export_statement":
        declared = node.child_by_field_name("declaration") or node.child_by_field_name("value")
        if declared is not None:
            return declared
    return node


# Files parsed ahead are at most this large: most parsers hold the GIL throughout, and a
# request arriving meanwhile waits (about 40 ms at this size).
PRIME_BYTES = 256 << 10


def prime(path: bytes, data: bytes) -> bool:
    """Parse a file ahead of its next commit, keeping what the parse leaves (unless it is
    kept already), so that the commit parses only around its edit. True when it parsed."""
    lang = language(path)
    if lang is None or lang in ("json", "toml") or len(data) > PRIME_BYTES:
        return False  # JSON and TOML keep nothing: they are fast in full
    if _kept.get((lang, path), data) is not None:
        return False
    try:
        _guarded(lang, PARSERS[lang], data, path)
    except CannotJudge:
        return False  # the commit will say so
    return True
