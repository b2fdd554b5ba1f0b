"""The truncation gate: a file cut short (its end gone, a definition or a block left
unclosed), told from a deletion of whole definitions or blocks."""

import re
import textwrap
from typing import Any

from . import parsers
from .findings import CLOSER, Finding, common_lines, lines_of
from .placeholders import WEAK, marker

# What a cut-off write may have after the lines it kept: the cut line's first part, blank
# lines, a lone closing token, or a marker saying it was cut. At most this many lines (and
# _TAIL_TEXT of them not blank); more is new text, not the debris of a cut.
_TAIL_LINES = 8


_TAIL_TEXT = 3


def _debris(line: bytes) -> bool:
    s = line.strip()
    return not s or CLOSER.fullmatch(s) is not None or marker(s) >= WEAK


# A top-level statement that defines something (ast class names, tree-sitter node types).
_DEFINITION = re.compile(r"(?i)function|class|method|struct|impl|interface|enum|module")


def one_definition(path: bytes, lines: list[bytes], new: bytes) -> bool:
    """Whether ``lines`` (of the old file, dedented) are one whole definition of the path's
    format (a function, a class, a method) and ``new`` parses: a deliberate deletion."""
    text = textwrap.dedent(b"\n".join(lines).decode("utf-8", "surrogateescape"))
    raw = text.encode("utf-8", "surrogateescape")
    gone = parsers.statements(path, raw)
    if gone is None and parsers.language(path) in _CLASSY:
        gone = _members(path, raw)  # a method, which stands only in a class
    if not gone or len(gone) != 1 or not _DEFINITION.search(gone[0]):
        return False
    return parsers.statements(path, new) is not None


# Formats whose methods (a class's members) do not parse on their own.
_CLASSY = ("javascript", "typescript", "tsx", "java")


def _members(path: bytes, text: bytes) -> list[str] | None:
    """The kinds of the members ``text`` holds, read as a class's body (tree-sitter)."""
    lang = parsers.language(path)
    assert lang is not None
    root = parsers._ts_parser(lang).parse(b"class _ {\n" + text + b"\n}\n").root_node
    if root.has_error or len(root.named_children) != 1:
        return None
    body = root.named_children[0].child_by_field_name("body")
    if body is None:
        return None
    return [c.type for c in body.named_children if "comment" not in c.type]


# What JavaScript defines without a declaration: a function or class assigned
# (``exports.f = function``, ``C.prototype.m = …``).
_FUNCTION_VALUE = frozenset(
    ("function_expression", "function", "arrow_function", "generator_function", "class")
)


_SCRIPTS = ("javascript", "typescript", "tsx")


# Formats whose whole statements close every bracket they open (strings and comments aside).
_BRACED = (*_SCRIPTS, "java", "go", "c", "cpp")  # (Rust: a lifetime is no quote)


_PAIRS = ((b"{", b"}"), (b"(", b")"), (b"[", b"]"))

# Strings and comments, taken out of deleted lines before their brackets are counted.
_STRINGS = re.compile(
    rb"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|`(?:\\.|[^`\\])*`|//[^\n]*|/\*.*?\*/", re.S
)


def _shape(node: Any) -> tuple[str, bytes]:
    """What a top-level JavaScript statement is to the truncation gate: ``definition``
    (declared, or a function or class assigned), ``block`` and its callee (a call
    whose last argument is a function: ``describe(…, function () {…})``, ``it(…)``,
    ``names.forEach(function…)``: a test, a callback run once) or ``other``."""
    node = parsers.exported(node)
    if _DEFINITION.search(node.type):
        return "definition", b""
    if node.type != "expression_statement" or not node.named_children:
        return "other", b""
    expr = node.named_children[0]
    if expr.type == "assignment_expression":
        right = expr.child_by_field_name("right")
        if right is not None and right.type in _FUNCTION_VALUE:
            return "definition", b""
    elif expr.type == "call_expression":
        args = expr.child_by_field_name("arguments")
        callee = expr.child_by_field_name("function")
        given = [a for a in args.named_children if "comment" not in a.type] if args else []
        if callee is not None and given and given[-1].type in _FUNCTION_VALUE:
            return "block", callee.text or b""
    return "other", b""


def _shapes(path: bytes, text: bytes) -> list[tuple[str, bytes]] | None:
    """The top-level statements of ``text`` (lines of the old file, dedented) as the
    truncation gate sees them (``_shape``; Python's and the other formats' by their kind
    alone), when they parse on their own in the path's format (a method in a class), or
    None."""
    lang = parsers.language(path)
    if lang in _SCRIPTS:
        root = parsers._ts_parser(lang).parse(text).root_node
        if not root.has_error:
            return [_shape(c) for c in root.named_children if "comment" not in c.type]
    else:
        kinds = parsers.statements(path, text)
        if kinds is not None:
            return [("definition" if _DEFINITION.search(k) else "other", b"") for k in kinds]
    if lang in _CLASSY:
        members = _members(path, text)  # a method, which stands only in a class
        if members is not None:
            return [("definition" if _DEFINITION.search(k) else "other", b"") for k in members]
    return None


def _deleted(path: bytes, lines: list[bytes], new: bytes, kept: list[bytes] | None) -> bool:
    """Whether ``lines`` of the old file, gone, are a deletion, not a cut: one whole
    definition or block, or (``kept``: the lines the new text kept before them, when it
    kept the old file's end too) blocks of callees that each keep a call at the same
    indentation there: the last tests of a ``describe`` deleted. And ``new`` parses."""
    raw = b"\n".join(lines)
    if parsers.language(path) in _BRACED:
        code = _STRINGS.sub(b"", raw)
        if any(code.count(a) != code.count(b) for a, b in _PAIRS):
            return False  # not whole statements: a quick answer, before any parse
    text = textwrap.dedent(raw.decode("utf-8", "surrogateescape"))
    shapes = _shapes(path, text.encode("utf-8", "surrogateescape"))
    if not shapes:
        return False
    if len(shapes) > 1 or shapes[0][0] == "other":
        if kept is None or not all(kind == "block" for kind, _ in shapes):
            return False
        # Tests pruned: each callee keeps a call in the block that held them (its kept
        # lines: back to the last kept line indented less), at their indentation.
        first = next(x for x in lines if x.strip())
        indent = first[: len(first) - len(first.lstrip())]
        start = len(kept)
        while start and (not kept[start - 1].strip() or kept[start - 1].startswith(indent)):
            start -= 1
        block = [x for x in kept[start:] if x.startswith(indent)]
        for callee in {callee for _, callee in shapes}:
            if not any(x.startswith(indent + callee + b"(") for x in block):
                return False  # a family gone whole: more than tests pruned
    return parsers.statements(path, new) is not None


def _closed(path: bytes, was: bytes, cut: bytes | None, rest: list[bytes], new: bytes) -> bool:
    """JSON: whether the lines after the kept ones only close what is open (``cut``: the
    old line ``was`` with its comma dropped, the last kept entry) and the new text
    parses: the file's last entries deleted. A cut-off JSON text parses only if its
    closing brackets were written for it."""
    if parsers.language(path) != "json" or not rest:
        return False
    if cut is not None and was.rstrip(b",") != cut:
        return False
    if not all(t.strip() in (b"}", b"]", b"},", b"],", b"") for t in rest):
        return False
    return not parsers.parse_errors(path, new)[1]


def truncation(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """The new bytes are the old ones cut short: the old file's tail is gone.

    Lines are compared without their line ends and trailing whitespace, and a short tail
    of debris after the kept lines (see ``_debris``) does not hide the cut. A tail that
    is one whole definition (the last function or class, deleted; in JavaScript also a
    function assigned or a block, ``_shape``) and leaves a file that parses is not a cut;
    nor are lines gone before the old file's own last lines, kept (the closing lines of
    the block that held them), that are one such definition or tests pruned."""
    min_lines, min_ratio = cfg["min_lines"], cfg["min_ratio"]
    # A quick count first: more than min_lines lines lost shows in the count of line ends.
    if old.count(b"\n") - new.rstrip().count(b"\n") + _TAIL_LINES <= min_lines:
        return None
    before, after = lines_of(old), lines_of(new)
    kept = common_lines(before, after)
    tail = after[kept:]
    if len(tail) > _TAIL_LINES or kept == len(before):
        return None
    partial = bool(tail) and bool(tail[0].strip()) and before[kept].startswith(tail[0])
    if partial:
        tail = tail[1:]  # the cut line's first part
    if sum(1 for t in tail if t.strip()) > _TAIL_TEXT or not all(map(_debris, tail)):
        return None
    lost = len(before) - kept
    if lost <= min_lines or lost / max(len(before), 1) <= min_ratio:
        return None
    if not tail and not partial and _deleted(path, old.split(b"\n")[kept:], new, None):
        return None  # the last definition deleted, and the file is whole without it
    ends = len(before) - len(tail)
    if tail and not partial and ends > kept and before[ends:] == tail:
        # The new text ends as the old one did (the closing lines of a block that held the
        # lines gone): they went from inside it, the file is not cut off.
        if _deleted(path, old.split(b"\n")[kept:ends], new, after[:kept]):
            return None
    if _closed(path, before[kept], after[kept] if partial else None, tail, new):
        return None  # a data file's last entries deleted, and its brackets closed
    if not after:
        # Emptied: what a writer that opened the file and never wrote leaves, too. Never
        # let through: only the writer can say that it is meant (``rwfs allow``).
        said = f"the new text is empty: all {lost} lines of the old file are gone"
    else:
        said = (
            f"the new text is the old text cut off after line {kept}: its last "
            f"{lost} of {len(before)} lines are gone"
        )
    return Finding(
        "truncation", said, {"line": kept + 1, "lines_lost": lost, "lines_before": len(before)}
    )
