"""Gates: checks that refuse a write that would break a file (SPEC §4).

Each gate looks at the previous bytes of a file and the sealed new bytes and returns a
``Finding`` or None. ``check`` runs the gates in the order of SPEC §4.1 and gives each
finding the action the policy sets for that gate and path (``reject``, ``warn``, ``off``).
Pure functions over bytes: no FUSE, no I/O; the caller runs them in a worker thread.

A new file (no previous bytes) is never refused: there is nothing it could have broken.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ahocorasick_rs import BytesAhoCorasick

from . import definitions, parsers

# Gates read at most this much of a file; larger files are left alone (their content is
# not what a model writes by hand, and reading them would slow every commit).
MAX_GATED_BYTES = 8 << 20


@dataclass
class Finding:
    gate: str
    message: str  # what the gate saw, in plain words
    details: dict[str, Any] = field(default_factory=dict)
    action: str = "reject"


# ---- lines ----


def _lines(data: bytes) -> list[bytes]:
    """The file's lines as truncation compares them: no line ends (LF or CRLF), no trailing
    whitespace, and no blank lines at the end."""
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _lf(data: bytes) -> bytes:
    return data.replace(b"\r\n", b"\n")


def _common_lines(a: list[bytes], b: list[bytes]) -> int:
    """How many lines ``a`` and ``b`` have in common at their start."""
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k


# ---- truncation ----

# What a cut-off write may have after the lines it kept: the cut line's first part, blank
# lines, a lone closing token, or a marker saying it was cut. At most this many lines (and
# _TAIL_TEXT of them not blank); more is new text, not the debris of a cut.
_TAIL_LINES = 8
_TAIL_TEXT = 3
_CLOSER = re.compile(
    rb"[)\]};,>]+|(?:end|fi|done|esac|endif|endfor|endwhile|endfunction)\b;?"
    rb"|</[\w.:-]+>|\"\"\"|'''|\*/|-->|`"
)


def _debris(line: bytes) -> bool:
    s = line.strip()
    return not s or _CLOSER.fullmatch(s) is not None or _marker(s) >= _WEAK


# A top-level statement that defines something (ast class names, tree-sitter node types).
_DEFINITION = re.compile(r"(?i)function|class|method|struct|impl|interface|enum|module")


def _one_definition(path: bytes, lines: list[bytes], new: bytes) -> bool:
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
_QUOTED = re.compile(
    rb"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|`(?:\\.|[^`\\])*`|//[^\n]*|/\*.*?\*/", re.S
)


def _shape(node: Any) -> tuple[str, bytes]:
    """What a top-level JavaScript statement is to the truncation gate: ``definition``
    (declared, or a function or class assigned), ``block`` and its callee (a call
    whose last argument is a function: ``describe(…, function () {…})``, ``it(…)``,
    ``names.forEach(function…)``: a test, a callback run once) or ``other``."""
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
        code = _QUOTED.sub(b"", raw)
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
    before, after = _lines(old), _lines(new)
    kept = _common_lines(before, after)
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


# ---- elision ----


def _table(words: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in words.split(","))


# The placeholder vocabulary: what models write where they left code out. A comment (in
# any of the comment syntaxes below), a string standing alone (a docstring) or a bare line
# of words is a placeholder when its words, lower-cased and without punctuation, make one
# whole phrase of PLACEHOLDER_PHRASES; with an ellipsis in the line, LOOSE_PHRASES are
# enough. In a phrase, {thing}, {qual}, {state} and {alone} stand for a word (or words) of
# PLACEHOLDER_WORDS.
PLACEHOLDER_WORDS: dict[str, tuple[str, ...]] = {
    # what was left out
    "thing": _table(
        "code, codes, file, files, class, classes, function, functions, func, funcs, "
        "method, methods, module, modules, implementation, implementations, impl, body, "
        "bodies, content, contents, test, tests, import, imports, logic, field, fields, "
        "property, properties, case, cases, handler, handlers, route, routes, definition, "
        "definitions, helper, helpers, line, lines, section, sections, part, parts, "
        "config, configuration, settings, setup, style, styles, rule, rules, entry, "
        "entries, item, items, member, members, declaration, declarations, functionality, "
        "component, components, script, program, text, details, stuff, source, export, "
        "exports, type, types, key, keys, value, values, option, options, argument, "
        "arguments, statement, statements, block, blocks, output, data, docstring, "
        "docstrings, comments, attributes, constants, variables, endpoints, views, "
        "models, utils, utilities, hooks, commands, steps, tasks, jobs, dependencies, "
        "fixtures, examples, checks, branches, loop, loops, codebase, things, elements, "
        "sql, queries, markup, html, css, tags, rows, records"
    ),
    # which of it ("other", "more", "your" only with an ellipsis or a state: "# Other
    # helper functions" is a heading, "# your code here" a placeholder)
    "qual": _table(
        "existing, previous, prior, original, remaining, unchanged, same, earlier, "
        "omitted, elided, skipped, truncated, hidden, unmodified, untouched, preceding"
    ),
    "loose": _table("other, more, your"),
    # what became of it
    "state": _table(
        "unchanged, untouched, unmodified, identical, intact, omitted, elided, truncated, "
        "skipped, hidden, snipped, not shown, not changed, not "
        "included, not repeated, not modified, left out, the same, same, as is, as "
        "before, as above, as previously, as it was, as they were, as in the original, as "
        "in original, like before, from before, from above, from the original, here, goes "
        "here, go here, would go here, continues, follows, stays, remains"
    ),
    # said alone, a placeholder
    "alone": _table(
        "unchanged, omitted, elided, truncated, snip, snipped, skipped, cut, etc, and so "
        "on, and so forth, for brevity, as before, unchanged for brevity, remains the "
        "same, remain the same, stays the same, is unchanged, are unchanged, nothing "
        "changed, nothing else changed, output truncated, content truncated, text "
        "truncated, truncated output, same as before, same as above, same as original, "
        "same as the original, same as previous, same as earlier, same as the old, same "
        "as the previous version"
    ),
}
_VERB = "(?:(?:is|are|remains?|stays?|left|kept|was|were|being|has been|have been) )?"
_WHY = "(?: (?:for (?:brevity|clarity|space|length|simplicity|readability)|here|below|etc))*"
PLACEHOLDER_PHRASES: tuple[str, ...] = (
    "(?:\\d+ )*(?:(?:{qual}|{loose}) )?{thing}(?: {thing})? " + _VERB + "{state}" + _WHY,
    "(?:\\d+ )*{qual} {thing}(?: {thing})?(?: here)?",
    "(?:the )?(?:rest|remainder)(?: of (?:the |this |your |my )?{thing}(?: {thing})?)?"
    " " + _VERB + "{state}" + _WHY,
    "(?:the )?(?:rest|remainder) of (?:the |this |your |my )?{thing}(?: {thing})?",
    "everything else " + _VERB + "{state}" + _WHY,
    "no (?:other |more |further )?changes?(?: (?:below|above|after|before|beyond|past|from"
    "|to|in) (?:this|here|that|the|there)?(?: ?(?:line|point|{thing}))?)?" + _WHY,
    "{alone}" + _WHY,
    "keep (?:the |all )?(?:existing|rest|original|previous|current|remaining|other)"
    "(?: of the)?(?: {thing}(?: {thing})?)?(?: " + _VERB + "{state})?",
    "(?:\\d+ )+(?:more |other |additional )?{thing} " + _VERB + "(?:{state}|removed)" + _WHY,
)
LOOSE_PHRASES: tuple[str, ...] = (
    "(?:(?:{qual}|{loose}) )?{thing}(?: {thing})?",
    "{qual}|{loose}",
    "(?:the )?(?:rest|remainder)(?: of it)?",
    "everything else",
    "and more",
    "(?:\\d+ )+(?:more |other |additional )?{thing}",
)


def _vocabulary(phrases: tuple[str, ...]) -> re.Pattern[str]:
    words = {
        name: "(?:" + "|".join(sorted(set(ws), key=len, reverse=True)) + ")"
        for name, ws in PLACEHOLDER_WORDS.items()
    }
    return re.compile("|".join("(?:" + p.format(**words) + ")" for p in phrases))


_STRICT = _vocabulary(PLACEHOLDER_PHRASES)
_LOOSE = _vocabulary(LOOSE_PHRASES)
# Every word a phrase can hold (a quick test before the phrases; numbers aside).
_LEXICON = frozenset(
    w
    for text in (*PLACEHOLDER_WORDS.values(), PLACEHOLDER_PHRASES, LOOSE_PHRASES, (_VERB, _WHY))
    for t in text
    for w in re.findall("[a-z]+", t)
)

# A line that is a comment (or a string) and nothing else: the opener, the text, the closer.
# The comment syntaxes of every format the syntax gate knows, and a few more (HTML, SQL,
# Lua, Lisp, INI); a JSX comment is wrapped in braces.
_WHOLE = re.compile(
    rb"^\{?\s*(#+|//+!?|/\*+!?|<!--|--+|;+|\*+|[rRbBuUfF]{0,2}(?:\"\"\"|'''|\"|'))"
    rb"(.*?)(?:\*+/|-->|\"\"\"|'''|\"|')?\s*\}?,?$"
)
# A comment after code on its line (``def f():  # unchanged``).
_TRAILING = re.compile(rb"\S\s+(?:#+|//+|/\*+)(?!.*(?:\s#|//))(.*?)(?:\*/)?$")
# A line of words alone (no code): what a bare placeholder line may hold.
_BARE = re.compile(rb"(?:[A-Za-z0-9 \t.,:;!?'\"()\[\]{}<>-]|\xe2\x80\xa6)+")
_AROUND = b" \t.:;,()[]{}*=~_-!\xe2\x80\xa6"  # blanks, dots, brackets, rules, the ellipsis
# A bare ellipsis line: ``...``, ``…``, ``[...]``, ``(...)``, ``{ ... }``.
_ELLIPSIS = re.compile(
    rb"(?:\.\.\.|\xe2\x80\xa6|\. \. \.)"
    rb"|[\[({<]\s*(?:\.\.\.|\xe2\x80\xa6)\s*[\])}>],?"
)
_LONGEST = 400  # bytes: the longest line looked at as a placeholder
_OPENS = frozenset(b"{#/;*<-\"'rRbBuUfF")  # how a line of _WHOLE can begin
_DOTS = re.compile(rb"\.\.\.|\xe2\x80\xa6|\. \. \.")
_WORD = re.compile(r"[a-z0-9]+")
_PASS = re.compile(rb"pass|return|\{\s*\}|\(\s*\)")

# How a line looks to elision: nothing, like a placeholder (a comment alone, ``pass``, an
# ellipsis: what stands in for code in a mass deletion), an ellipsis standing for code
# (``...``, ``# ...``, ``/* ... */``; ``def f():  # unchanged``), a placeholder phrase.
_NONE, _LIKE, _WEAK, _STRONG = range(4)


def _words(text: bytes) -> str:
    return " ".join(_WORD.findall(text.decode("utf-8", "replace").lower().replace("'", "")))


def _said(text: bytes, dots: bool) -> bool:
    """Whether text (a comment's, stripped) is a placeholder phrase."""
    if text.startswith(b"<") and text.endswith(b">"):
        text = text[1:-1].strip(_AROUND)
    words = _words(text)
    if not all(w in _LEXICON or w.isdigit() for w in words.split()):
        return False  # a word no phrase has
    return bool(words) and (
        _STRICT.fullmatch(words) is not None or (dots and _LOOSE.fullmatch(words) is not None)
    )


def _marker(line: bytes) -> int:
    """What a line (stripped) is to elision: _NONE, _LIKE, _WEAK or _STRONG."""
    if not line or len(line) > _LONGEST:
        return _NONE  # a placeholder is a short line; a minified one is code
    dots = b"..." in line or b"\xe2\x80\xa6" in line or b". . ." in line
    whole = _WHOLE.match(line) if line[0] in _OPENS else None
    if dots and _ELLIPSIS.fullmatch(line):
        return _WEAK
    if whole is not None or _BARE.fullmatch(line):
        text = (whole.group(2) if whole is not None else line).strip(_AROUND)
        comment = whole is not None and whole.group(1)[-1:] not in b"\"'"
        if whole is not None and not comment and whole.group(1)[-3:] not in (b'"""', b"'''"):
            # A string in quotes alone on its line is a value (an element of a list, an
            # argument), unless an ellipsis says it stands for something.
            if line.endswith(b",") or not dots:
                return _LIKE if dots else _NONE
        if not text:
            return _WEAK if dots and whole is not None else (_LIKE if comment else _NONE)
        if _said(text, dots and whole is not None):  # a bare "...rest" is a JS spread
            return _STRONG
        if comment:
            return _LIKE
    commented = b"#" in line or b"//" in line or b"/*" in line
    trailing = _TRAILING.search(line) if commented else None
    if trailing is not None:
        text = trailing.group(1).strip(_AROUND)
        if (not text and _DOTS.search(trailing.group(1))) or (text and _said(text, dots)):
            return _WEAK
    if dots or _PASS.fullmatch(line):
        return _LIKE
    return _NONE


def _placeholder(line: bytes) -> bool:
    """A placeholder phrase: a line that says code was left out."""
    return _marker(line.strip()) == _STRONG


# Python's comments and strings, as far as telling a docstring's text from code needs.
_PY_TOKEN = re.compile(rb"#[^\n]*|\"\"\"|'''|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?")


def _in_docstring(data: bytes, offset: int) -> bool:
    """Python: whether ``offset`` is inside a triple-quoted string (a docstring, a
    doctest), by a scan of the comments and strings before it: a millisecond or two at
    100 KB, where ``ast`` takes tens."""
    pos = 0
    while (m := _PY_TOKEN.search(data, pos, offset)) is not None:
        quote = m.group()
        pos = m.end()
        if quote in (b'"""', b"'''"):
            close = data.find(quote, pos)
            while close >= 0 and _escaped(data, close):
                close = data.find(quote, close + 1)
            if close < 0 or close >= offset:
                return True
            pos = close + 3
    return False


def _escaped(data: bytes, at: int) -> bool:
    n = 0
    while at - n > 0 and data[at - n - 1] == 0x5C:  # backslashes before it
        n += 1
    return n % 2 == 1


def _anchors(before: list[bytes], after: list[bytes]) -> tuple[list[int], list[int]]:
    """Lines found once in each version, matched in order (as patience diff does): the
    indices in ``after`` and in ``before`` of each, both increasing. Between two anchors
    lies what an edit did there."""
    olds, news = Counter(before), Counter(after)
    at = {x: i for i, x in enumerate(before) if olds[x] == 1 and news[x] == 1 and x}
    pairs = [(j, at[x]) for j, x in enumerate(after) if x in at]
    # The longest run of pairs whose old indices increase too (patience sorting).
    tops: list[int] = []  # old index ending the best run of each length
    ends: list[int] = []  # the pair ending it
    back = [-1] * len(pairs)
    for k, (_, i) in enumerate(pairs):
        n = bisect_left(tops, i)
        back[k] = ends[n - 1] if n else -1
        if n == len(tops):
            tops.append(i)
            ends.append(k)
        else:
            tops[n], ends[n] = i, k
    run = []
    k = ends[-1] if ends else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    run.reverse()
    return [j for j, _ in run], [i for _, i in run]


# Formats of prose: a line of words there is a sentence (a bullet, a paragraph), never a
# placeholder; only a comment (``<!-- -->``, reStructuredText's ``..``), a bracketed line
# (``[...]``) or a line of the placeholder vocabulary that opens like a comment stands for
# left-out text.
_PROSE = (b".md", b".markdown", b".rst", b".txt", b".text", b".adoc")
_DATA = ("json", "yaml", "toml")
# A data file's entry that is only an ellipsis: as the key (``"...": "..."``, ``"…"``,
# ``- ...``, ``"..." = "..."``) or as the value (``key: ...``, ``"rest": "…"``).
_ELLIPSIS_KEY = re.compile(
    rb"(?:-\s*)?([\"']?)(?:\.\.\.|\xe2\x80\xa6)\1(?:\s*[:=]\s*[^\s].{0,30})?\s*,?"
)
_ELLIPSIS_VALUE = re.compile(
    rb"(?:-\s*)?[\"']?[\w.$@/ -]{1,60}[\"']?\s*[:=]\s*([\"']?)(?:\.\.\.|\xe2\x80\xa6)\1\s*,?"
)
# The longest text (characters) of a comment taken for a stand-in: a stand-in is short.
_STANDIN_TEXT = 100
# At most this many new comment lines stand where a block was; more is prose written
# there (an explanation), not a stand-in.
_STANDIN_NOTES = 3
_RST_COMMENT = re.compile(rb"\.\.(?:\s+(?!_|\[|\|)(?![\w-]+::).*)?")


def _prose(path: bytes) -> bool:
    return path.lower().endswith(_PROSE)


def _sentence(line: bytes) -> bool:
    """Prose: whether a line is text (a paragraph's line, a bullet, a quotation), not a
    comment or a bracketed line."""
    if _standin(line, True):
        return False
    whole = _WHOLE.match(line) if line[0] in _OPENS else None
    return whole is None or whole.group(1)[:1] in b"*\"'" or whole.group(1)[-1:] in b"\"'"


def _standin(line: bytes, prose: bool, data: bool = False) -> bool:
    """A comment, or a string alone on its line, short: what can stand where a block of
    the old file was, whatever its words and language. In prose only a comment or a
    bracketed line: a sentence is text; in a data file only a comment: a string is a
    value."""
    if not line or len(line) > 4 * _STANDIN_TEXT or (data and line[:1] in b"\"'"):
        return False
    if prose:
        if line.startswith(b"<!--"):
            text = line[4:].removesuffix(b"-->")
        elif line.startswith(b"[") and line.endswith(b"]"):
            text = line[1:-1]
        elif line.startswith(b"..") and _RST_COMMENT.fullmatch(line):
            text = line[2:]
        else:
            return False
    else:
        whole = _WHOLE.match(line) if line[0] in _OPENS else None
        if whole is None:
            return False
        opener, text = whole.group(1), whole.group(2)
        if opener[-1:] in b"\"'":
            triple = opener[-3:] in (b'"""', b"'''")
            if (not triple and line.endswith(b",")) or opener[-1:] in text:
                return False  # an element of a list, a key and its value: not a statement
    words = text.decode("utf-8", "replace").strip(" \t.:;,()[]{}*=~_-!#/\u2026")
    return 0 < len(words) <= _STANDIN_TEXT


# A comment that tells a tool what to do with the next line: never a note standing for code.
_DIRECTIVE = re.compile(
    rb"(?:#|//|/\*)\s*(?:eslint-(?:disable|enable)|@ts-(?:ignore|expect-error|nocheck)"
    rb"|prettier-ignore|istanbul\s+ignore|c8\s+ignore|noqa\b|type:\s*ignore|pylint:"
    rb"|mypy:|pyright:|fmt:\s*(?:off|on|skip)|pragma\b|NOLINT|clang-format|biome-ignore"
    rb"|jshint|jscs:|global\s|exported\s|deno-lint-ignore|nosec\b|nolint\b)"
)
_QUOTED = re.compile(rb"\s*[rRbBuUfF]{0,2}[\"']")


def _argument(lines: list[bytes], j: int) -> bool:
    """Whether line ``j`` is a string that is part of a longer expression: the line above
    it opens a bracket, ends with a comma or an operator, or is a string too (implicit
    concatenation), or the line below is a string or closes the bracket."""
    if not _QUOTED.match(lines[j]) or lines[j].lstrip().startswith((b'"""', b"'''")):
        return False
    above = next((x.strip() for x in reversed(lines[:j]) if x.strip()), b"")
    below = next((x.strip() for x in lines[j + 1 :] if x.strip()), b"")
    if (above and above[-1:] in b"([{,+\\") or (below and below[:1] in b")]}"):
        return True
    return any(_QUOTED.match(x) and not x.startswith((b'"""', b"'''")) for x in (above, below))


_FENCE = re.compile(rb"(?m)^[ \t]*(?:```|~~~)")


def _in_example(new: bytes, at: int) -> bool:
    """Whether the line of docs at offset ``at`` is a bare ellipsis in a code sample:
    indented (a reST literal block) or inside a Markdown fence."""
    end = new.find(b"\n", at)
    line = new[at : len(new) if end < 0 else end]
    if not line.strip() or line.strip().strip(b".\xe2\x80\xa6 "):
        return False
    return line[:1] in b" \t" or len(_FENCE.findall(new, 0, at)) % 2 == 1


def _filler(line: bytes, prose: bool, data: bool) -> bool:
    """A line that puts nothing new where a block was: a closing token, ``pass``, an
    ellipsis, a comment."""
    if _CLOSER.fullmatch(line) or _PASS.fullmatch(line) or _ELLIPSIS.fullmatch(line):
        return True
    if _standin(line, prose, data):
        return True
    whole = _WHOLE.match(line) if line[0] in _OPENS and not prose else None
    return whole is not None and whole.group(1)[-1:] not in b"\"'"  # a comment, if long


def _prose_lines(old: bytes, a: int, span: list[bytes], i1: int, i2: int) -> bool:
    """Python: whether the old lines ``span[i1:i2]`` (the span begins at ``a`` in
    ``old``) are a docstring's text: inside a string, or strings alone once dedented."""
    at = a + sum(len(line) + 1 for line in span[:i1])
    if _in_docstring(old, at):
        return True
    text = textwrap.dedent(b"\n".join(span[i1:i2]).decode("utf-8", "surrogateescape"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = ast.parse(text).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return bool(body) and all(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in body
    )


def _head(new: bytes, a: int, after: list[bytes], j: int) -> bytes:
    """The last line before line ``j`` of the span that starts at ``a`` in ``new`` (its
    lines ``after``, stripped) that is not blank: b"" when there is none."""
    p = j - 1
    while p >= 0 and not after[p]:
        p -= 1
    if p >= 0:
        return after[p]
    for line in reversed(new[:a].split(b"\n")):
        if line.strip():
            return line.strip()
    return b""


def _new_stub(head: bytes, had: Callable[[bytes], bool]) -> bool:
    """Whether an ellipsis after the line ``head`` is a doctest's (after ``>>>`` or
    ``...``) or the body of a definition the old file did not have (an ``@overload``, a
    protocol's method): then it stands for nothing that was there."""
    if head.startswith((b">>>", b"...")):
        return True
    return head.endswith((b":", b"{")) and not had(head)


_FAMILY = re.compile(r"_*([a-z0-9]+|[A-Z][a-z0-9]*)")


def _pruned(path: bytes, old: bytes, new: bytes) -> bool:
    """Python: whether ``new`` is ``old`` with functions deleted, each of a family (the
    first word of its name: ``test`` in ``test_parse``, ``testParse``) that keeps members
    in the same class or module, and every other statement still there (imports,
    assignments, classes, fixtures): tests pruned, not a fragment of the file kept."""
    if parsers.language(path) != "python" or len(old) > 1 << 20:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            was, now = ast.parse(old), ast.parse(new)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    pruned = 0

    def same(a: list[ast.stmt], b: list[ast.stmt]) -> bool:
        nonlocal pruned
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
        defs = (*funcs, ast.ClassDef)
        kept = {s.name: s for s in b if isinstance(s, defs)}
        others = Counter(ast.dump(s) for s in b if not isinstance(s, defs))
        families = Counter(_family(s.name) for s in b if isinstance(s, funcs))
        for s in a:
            if isinstance(s, ast.ClassDef):
                c = kept.get(s.name)
                if not isinstance(c, ast.ClassDef) or not same(s.body, c.body):
                    return False
            elif isinstance(s, funcs):
                if s.name not in kept:
                    if not families[_family(s.name)]:
                        return False  # a function gone with all of its family
                    pruned += 1
                elif ast.dump(s) != ast.dump(kept[s.name]):
                    return False  # a function kept, but changed: cut inside it
            else:
                key = ast.dump(s)
                if not others[key]:
                    return False  # a statement gone that is not a function
                others[key] -= 1
        return True

    return same(was.body, now.body) and pruned > 0


def _family(name: str) -> str:
    m = _FAMILY.match(name)
    return m.group(1).lower() if m else name


# ---- elision: an ellipsis the old file had, as a stub ----

_NEAR = 12  # lines: how far a stub's head, or what follows a line, is looked for


def _kept_stub(old: bytes, stub: list[bytes]) -> bool:
    """Whether the old file has the lines ``stub`` (stripped: a definition's head and its
    ``...`` body) one after the other: a stub moved or kept, not a body left out."""
    pattern = b"".join(rb"[ \t]*" + re.escape(x) + rb"[ \t\r]*\n" for x in stub[:-1])
    pattern = rb"(?m)^" + pattern + rb"(?:[ \t\r]*\n)*[ \t]*" + re.escape(stub[-1]) + rb"[ \t\r]*$"
    return re.search(pattern, old) is not None


# ---- elision: what a stand-in is not: a comment kept, reworded, over kept code ----

_NOTE_WORD = re.compile(r"\w{4,}")  # the words two comments are compared by
_TITLE_RULE = re.compile(rb"([=\-~^\"'`*+#:._])\1{2,}")  # a reST title's under- or overline


def _comment(line: bytes) -> bool:
    """A comment alone on its line (stripped), not a string."""
    whole = _WHOLE.match(line) if line[:1] and line[0] in _OPENS else None
    return whole is not None and whole.group(1)[-1:] not in b"\"'"


def _note_words(lines: list[bytes]) -> set[str]:
    return {w for x in lines for w in _NOTE_WORD.findall(x.decode("utf-8", "replace").lower())}


def _reworded(note: list[bytes], was: list[bytes]) -> bool:
    """Whether the new comment ``note`` (its lines) says mostly what one comment of the old
    lines ``was`` said (a run of comment lines): at least two words in common, and at
    least half of the words of each. A comment reworded is the old file's, not a
    stand-in for what went."""
    words = _note_words(note)
    if len(words) < 2:
        return False
    block: list[bytes] = []
    for x in [*was, b""]:
        if _comment(x):
            block.append(x)
            continue
        if block:
            said = _note_words(block)
            shared = len(words & said)
            if shared >= 2 and 2 * shared >= max(len(words), len(said)):
                return True
            block = []
    return False


def _title(lines: list[bytes], i: int) -> bool:
    """reST: whether the stripped line ``lines[i]`` begins a section title: a line of
    text over a rule as long as it (with the same rule over it, or none)."""

    def rule(k: int, text: bytes) -> bool:
        wide = len(text.decode("utf-8", "replace"))
        return k < len(lines) and bool(_TITLE_RULE.fullmatch(lines[k])) and len(lines[k]) >= wide

    if i >= len(lines) or not lines[i]:
        return False
    if _TITLE_RULE.fullmatch(lines[i]):  # an overline: the title is the next line
        return i + 1 < len(lines) and bool(lines[i + 1]) and rule(i + 2, lines[i + 1])
    return rule(i + 1, lines[i])


def _sections(removed: list[bytes], below: list[bytes]) -> bool:
    """Prose: whether the lines ``removed`` were whole sections (they begin with a title,
    blank lines and reST comments aside) and the lines ``below`` a stand-in begin another
    (blank lines and transitions aside): a comment between sections marks the document's
    structure (where release notes go, where an include starts), it stands for no text."""
    p = 0
    while p < len(removed) and (not removed[p] or _RST_COMMENT.fullmatch(removed[p])):
        p += 1
    if not _title(removed, p):
        return False
    q = 0
    while q < len(below) and (
        not below[q] or (_TITLE_RULE.fullmatch(below[q]) and not _title(below, q))
    ):
        q += 1
    return _title(below, q)


def _indent_of(line: bytes) -> bytes:
    return line[: len(line) - len(line.lstrip())]


# ---- elision: most of a file deleted, not a fragment of it ----


def _moved_out(old: bytes, new: bytes, prose: bool, data: bool) -> bool:
    """Whether the new text is the old one with runs of lines deleted where the old
    file's layout parted them, and at most lines of code put in: whole definitions moved
    out or deleted. At each seam, two lines now side by side that the old text parted
    with a blank line are parted with one still, unless the second is indented deeper (a
    block's head over its new first statement) or closes a block. A fragment a model
    writes glues what it kept, or leaves a note there."""
    before = [x.strip() for x in old.split(b"\n")]
    raw = new.split(b"\n")
    where: dict[bytes, list[int]] = {}
    for i, x in enumerate(before):
        where.setdefault(x, []).append(i)
    cur, prev, indent = -1, b"", b""
    for line in raw:
        x = line.strip()
        at = where.get(x)
        k = bisect_left(at, cur + 1) if at else 0
        if not at or k == len(at):
            if not at and x and (_marker(x) != _NONE or _standin(x, prose, data) or _comment(x)):
                return False  # a note put where lines were (a line of the old file moved is none)
            prev, indent = (b"\0" if x else b""), _indent_of(line)  # code put there, or a blank
            continue
        p = at[k]
        # A block's head over its first line, a block's last line over its closer.
        inner = len(_indent_of(line)) > len(indent) or _CLOSER.fullmatch(x) is not None
        if p > cur + 1 and prev and x and not inner:
            # The line before, where it stands last before this one in the old file.
            q = cur
            if prev in where:
                q = max(cur, where[prev][bisect_left(where[prev], p) - 1])
            if any(not y for y in before[q + 1 : p]):
                return False  # two lines the old file parted with a blank line, glued
        cur, prev, indent = p, x, _indent_of(line)
    return True


# Names a line at the margin defines or imports (Python, JavaScript, TypeScript and kin):
# what a deletion takes away with it, and what a fragment still uses.
_DEFINES = re.compile(
    rb"(?:export\s+(?:default\s+)?)?(?:declare\s+)?(?:async\s+)?"
    rb"(?:def|class|function\*?|interface|type|enum|struct|const|let|var)\s+([A-Za-z_$][\w$]*)"
    rb"|([A-Za-z_$][\w$]*)\s*(?::[^=]+)?=(?!=)"
)
_IMPORTS = re.compile(
    rb"(?:from\s+[\w.]+\s+)?import\s+\(?([\w., \t]+?)\)?\s*$"
    rb"|(?:const|let|var|import)\s+(?:\{([\w$, \t:]+)\}|([A-Za-z_$][\w$]*))\s*(?:=\s*require\(|from\b)"
)
_NAME = re.compile(rb"[A-Za-z_$][\w$]*")


def _bound(raw: list[bytes], uses: Counter[bytes] | None = None) -> tuple[set[bytes], set[bytes]]:
    """The names the unindented lines ``raw`` define, and those they import; ``uses``
    counts the names the other lines hold."""
    defined: set[bytes] = set()
    imported: set[bytes] = set()
    for line in raw:
        m = None
        if line[:1].isalpha() or line[:1] in (b"_", b"$"):  # unindented: a statement
            m = _IMPORTS.match(line.rstrip())
        if m is None and uses is not None:
            uses.update(_NAME.findall(line))
        if not line[:1].isalpha() and line[:1] not in (b"_", b"$"):
            continue
        if m is not None:
            names = next(x for x in m.groups() if x is not None)
            for part in names.split(b","):
                words = _NAME.findall(part)
                if words:
                    imported.add(words[-1])  # "a as b", "{a: b}": b is bound
            continue
        m = _DEFINES.match(line)
        if m is not None:
            defined.add(m.group(1) or m.group(2))
    return defined, imported


_PP_IF = re.compile(rb"(?m)^[ \t]*#[ \t]*if")
_PP_ENDIF = re.compile(rb"(?m)^[ \t]*#[ \t]*endif\b")


def _unbalanced(text: bytes) -> bool:
    """C's preprocessor: whether the text's conditionals (``#if``, ``#ifdef``, ``#ifndef``)
    and their ``#endif`` lines are not as many."""
    return len(_PP_IF.findall(text)) != len(_PP_ENDIF.findall(text))


def _fragment(old: bytes, old_raw: list[bytes], new: bytes) -> bool:
    """Whether what a deletion kept still needs what it took: a name the old file
    defined or imported, gone with the lines deleted, that the new text uses; or
    imports the new text has none of which it uses. Then it is a fragment of the file."""
    was_defined, was_imported = _bound(old_raw)
    uses: Counter[bytes] = Counter()  # of the new text's names, outside its imports
    now_defined, now_imported = _bound(new.split(b"\n"), uses)
    gone = (was_defined | was_imported) - now_defined - now_imported
    if any(uses[name] for name in gone):
        return True
    if _unbalanced(new) and not _unbalanced(old):
        return True  # an "#endif" kept, its "#if" deleted
    return bool(now_imported) and not any(uses[name] for name in now_imported)


def elision(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """Code left out: something stands where lines of the old file were removed.

    Signals, each needing ``min_lines`` lines of the old file gone: a placeholder phrase
    on a new line (not in a docstring, nor a sentence of prose); an ellipsis (``...``,
    ``# ...``, a data file's ``"…": "…"``) that stands where at least _ELLIPSIS_LINES lines
    were, unless the old file had it there (or the whole stub it ends), or it is a
    doctest's, a new definition's body or YAML's document end; a stand-in, a new short
    comment or string, in any words, where at least ``min_lines`` lines vanished from the
    file with nothing new in their place (one whole definition of under a third of the
    file, deleted with a note, an old comment reworded, a comment over kept code the old
    file had a comment over, a reST comment between whole sections, aside); and a mass
    deletion, most (``mass_ratio``) of the old file's lines gone with a new
    placeholder-like line (a comment alone, ``pass``, an ellipsis) where they were, or
    nearly all (``cut_ratio``) gone with nothing new at all (unless only functions of
    families that keep members went: tests pruned; or it is a deletion by its structure,
    see ``_deleted`` and ``_fragment``). Only the lines an edit changed are looked at,
    so an edit session's commit costs a scan of a few lines."""
    min_lines = cfg["min_lines"]
    mass_ratio, cut_ratio = cfg["mass_ratio"], cfg["cut_ratio"]
    if (b"\r" in old or b"\r" in new) and _lf(old) == _lf(new):
        return None  # line ends changed, nothing else
    lang = parsers.language(path)
    python, prose, data = lang == "python", _prose(path), lang in _DATA
    start, end = parsers._changed(old, new)
    a = new.rfind(b"\n", 0, start) + 1
    b = new.find(b"\n", max(start, end + len(new) - len(old)))
    region = new[a : len(new) if b < 0 else b]
    first = new.count(b"\n", 0, a)
    marks: list[tuple[int, int, bytes]] = []  # (line index in new, kind, line)
    offsets: dict[int, int] = {}  # where each of them begins in new
    lines = region.split(b"\n")
    # A long changed span (a rename throughout the file) is mostly lines the old file has:
    # they stand for nothing, save an ellipsis (the old file's "..." can be a new one's).
    known = {x.strip() for x in old.split(b"\n")} if len(lines) > _KNOWN_FROM else set()
    at = a
    for n, raw in enumerate(lines, first):
        line = raw.strip()
        if line in known and b"..." not in line and b"\xe2\x80\xa6" not in line:
            at += len(raw) + 1
            continue
        kind = _marker(line)
        if kind == _STRONG and prose and _sentence(line):
            kind = _LIKE  # a sentence of prose, a bullet or a quote that uses the words
        if kind < _WEAK and (b"..." in line or b"\xe2\x80\xa6" in line):
            if _ELLIPSIS_KEY.fullmatch(line) or (data and _ELLIPSIS_VALUE.fullmatch(line)):
                kind = _WEAK
        if kind == _NONE and _standin(line, prose, data):
            kind = _LIKE
        if kind == _LIKE and (_DIRECTIVE.search(line) or _argument(lines, n - first)):
            kind = _NONE  # a tool's directive, a string that continues a call: not a note
        if kind != _NONE:
            marks.append((n, kind, line))
            offsets[n] = at
        at += len(raw) + 1
    n_old, n_new = old.count(b"\n"), new.count(b"\n")
    shrunk = n_old - n_new >= max(min_lines, mass_ratio * n_old / 2)
    spanned = old.count(b"\n", start, end) >= min_lines  # a block of the old file replaced
    if not shrunk and not any(kind >= _WEAK or spanned for _, kind, _ in marks):
        return None
    # The lines outside the changed span are the same in both versions: every count, the
    # anchors and each gap are computed over the span alone (indices from line ``first``).
    ob = len(old) if b < 0 else b - (len(new) - len(old))
    span = old[a:ob].split(b"\n")
    before = [line.strip() for line in span]
    after = [line.strip() for line in lines]
    old_count = Counter(x for x in before if x)
    new_count = Counter(x for x in after if x)
    lost = old_count - new_count  # what the new text has nowhere
    removed = sum(lost.values())
    if removed < min_lines:
        return None

    def had(line: bytes) -> bool:
        """Whether the old file has this line (stripped), in the span or around it."""
        if line in old_count:
            return True
        pattern = rb"(?m)^[ \t]*" + re.escape(line) + rb"[ \t\r]*$"
        return re.search(pattern, old[:a]) is not None or re.search(pattern, old[ob:]) is not None

    def found(signal: str, n: int, text: bytes, message: str, **more: Any) -> Finding:
        # The line is quoted, unless it holds a secret (a placeholder comment after a key).
        quote = "" if holds_secret(text) else f" ({text.decode(errors='replace')[:60]!r})"
        return Finding(
            "elision",
            f"line {n + 1}{quote} {message}",
            {"line": n + 1, "lines_removed": removed, "signal": signal, **more},
        )

    # A rewrite is a text of its own, whose comments are its own ("# ... and so on ..." in
    # a table): one that shares less than a quarter of its distinct lines with the old
    # file, and has enough of them to be a file (a new function and "# ... existing
    # code ..." is not one). An edit that kept half the file is none.
    if len(lines) * 2 > n_new:
        everything = Counter(x.strip() for x in old.split(b"\n"))
        distinct = {x.strip() for x in new.split(b"\n") if len(x.strip()) >= _DISTINCT}
        shared = len(distinct & everything.keys())
        if len(distinct) >= _REWRITE_LINES and shared < _REWRITE_SHARE * len(distinct):
            return None

    def docstring(n: int) -> bool:
        return python and _in_docstring(new, offsets[n])

    strong = [
        (n, line)
        for n, kind, line in marks
        if kind == _STRONG and not docstring(n) and not had(line)
    ]
    if strong:
        n, text = strong[0]
        return found(
            "placeholder",
            n,
            text,
            f"stands for code that was left out: {removed} lines of the old file are gone",
            placeholders=len(strong),
        )
    # An ellipsis anchors nothing: matched with an old "..." (a doctest's, a stub's) it
    # would hide the lines it stands for.
    aligned = list(after)
    for n, kind, _ in marks:
        if kind == _WEAK:
            aligned[n - first] = b"\0%d" % n
    js, iis = _anchors(before, aligned)
    gaps: dict[int, Gap] = {}

    def gap(n: int) -> Gap:
        """What the edit did between the anchors around line n (of the new file)."""
        n -= first
        k = bisect_left(js, n)
        if k < len(js) and js[k] == n:
            return Gap(0, 0, iis[k], iis[k], 0, 0, 0, n, n, 0)  # a line kept from the old file
        if k not in gaps:
            jb, ib = (js[k - 1], iis[k - 1]) if k else (-1, -1)
            ja, ia = (js[k], iis[k]) if k < len(js) else (len(after), len(before))
            was = Counter(x for x in before[ib + 1 : ia] if x)
            now = Counter(x for x in after[jb + 1 : ja] if x)
            gone, put = was - now, now - was
            code = notes = 0
            for x, v in put.items():
                if _standin(x, prose, data):
                    notes += v
                elif not _filler(x, prose, data):
                    code += v
            # Of the lines gone, those the file has nowhere now, and of these those that
            # were text of their own (not comments or closers: commented-out code and a
            # licence header define nothing).
            vanished = substance = 0
            for x, v in gone.items():
                if lost[x]:
                    vanished += min(v, lost[x])
                    substance += 0 if _filler(x, prose, data) else min(v, lost[x])
            gaps[k] = Gap(
                sum(gone.values()),
                sum(put.values()),
                ib + 1,
                ia,
                vanished,
                code,
                notes,
                jb + 1,
                ja,
                substance,
            )
        return gaps[k]

    def below(n: int) -> list[bytes]:
        """The stripped lines of the new file after line n (a few)."""
        at = offsets[n]
        return [x.strip() for x in new[at : at + 200 * _NEAR].split(b"\n", _NEAR)[1:_NEAR]]

    def stub_kept(j: int) -> bool:
        """Whether the ellipsis at line j of the span is the body of a stub the old file
        has whole: its head (the lines since a blank one, at most _NEAR) and the ellipsis."""
        u = j - 1
        while u >= 0 and after[u] and j - u <= _NEAR:
            u -= 1
        head = after[u + 1 : j]
        if u < 0 and j < _NEAR:
            return False  # its head begins before the span: not looked for
        return bool(head) and head[-1].endswith((b":", b"{")) and _kept_stub(old, [*head, after[j]])

    def document_end(j: int) -> bool:
        """YAML: whether the ``...`` at line j of the span, at the margin, ends a
        document: nothing follows it but blank lines and comments, or a new document."""
        if lines[j][:1] != b".":
            return False
        for x in [*after[j + 1 :], *(y.strip() for y in below_span())]:
            if x.startswith(b"---"):
                return True
            if x and not x.startswith(b"#"):
                return False
        return True

    def below_span() -> list[bytes]:
        """The first lines of the new file after the span (as they are)."""
        return new[len(new) if b < 0 else b + 1 :].split(b"\n", _NEAR)[:_NEAR]

    def heading(j: int, g: Gap, e: int) -> bool:
        """Whether the comment at line j of the span is right over a line of code the
        old file has there (at the end of the gap, or in what it kept at the gap's end),
        which the old file also had a comment over: it says what that code does."""
        if j + 1 == g.new_end:
            oi = g.end
        elif g.new_end - e <= j + 1 < g.new_end:
            oi = g.end - (g.new_end - (j + 1))
        else:
            return False
        raw = lines[j + 1] if j + 1 < len(lines) else (below_span() or [b""])[0]
        code = raw.strip()
        if not code or _filler(code, prose, data) or _indent_of(raw) != _indent_of(lines[j]):
            return False
        p = oi - 1
        while p >= 0 and not before[p]:
            p -= 1
        return p >= 0 and _comment(before[p])

    for n, kind, text in marks:
        if kind != _WEAK:
            continue
        g = gap(n)
        if g.gone < _ELLIPSIS_LINES or docstring(n):
            continue  # a doctest's or a docstring's ellipsis
        if text in before[g.first : g.end] or _new_stub(_head(new, a, after, n - first), had):
            continue  # the old file had it there; a doctest's; a new definition's body
        if stub_kept(n - first):
            continue  # a definition's stub the old file had (moved, or kept over new lines)
        if lang == "yaml" and document_end(n - first):
            continue  # YAML's document end marker, not an ellipsis
        if prose and g.put > _ELLIPSIS_LINES and _in_example(new, offsets[n]):
            continue  # docs written anew around it: an example's own "...", not a cut
        return found(
            "ellipsis",
            n,
            text,
            f"stands where {g.gone} lines of the old file were: {removed} lines of the "
            "old file are gone",
        )
    for n, _, text in marks:
        if not _standin(text, prose, data) or docstring(n) or had(text):
            continue
        g = gap(n)
        if g.vanished < min_lines or g.code or g.notes > _STANDIN_NOTES:
            continue
        if g.substance < _ELLIPSIS_LINES:
            continue  # comments gone (a licence header, commented-out code): no code
        j = n - first
        note = [text]
        if not prose:
            u = j - 1
            while u >= g.new_first and _comment(after[u]):
                note.insert(0, after[u])
                u -= 1
            u = j + 1
            while u < g.new_end and _comment(after[u]):
                note.append(after[u])
                u += 1
            if _reworded(note, before[g.first : g.end]):
                continue  # an old comment there, reworded: the old file's, no stand-in
        # What the edit took out there: the old lines between what it kept around them.
        was, now = before[g.first : g.end], after[g.new_first : g.new_end]
        k = _common_lines(was, now)
        e = _common_lines(was[k:][::-1], now[k:][::-1])
        i1, i2 = g.first + k, g.end - e
        if i2 - i1 < (n_old + 1) / 3 and _one_definition(path, span[i1:i2], new):
            continue  # one definition deleted, and a note where it was
        if python and _prose_lines(old, a, span, i1, i2):
            continue  # a docstring shortened: its text is prose
        if not prose and heading(j, g, e):
            continue  # a comment over code that stays, where the old file had one
        if prose and lines[j][:2] == b".." and _sections(before[i1:i2], below(n)):
            continue  # a reST comment between sections: the document's structure
        return found(
            "stand-in",
            n,
            text,
            f"stands where {g.vanished} lines of the old file were, which the new text "
            f"no longer has, with nothing new in their place: {removed} lines are gone",
        )
    if removed < mass_ratio * (n_old + 1):
        return None  # fewer than the ratio of its lines, blank ones counted
    total = max(_nonblank(old), 1)
    if removed < mass_ratio * total:
        return None
    added = sum((new_count - old_count).values())
    kept = _nonblank(new)
    if added <= min(removed // 5, kept - added):  # mostly old lines: not a rewrite
        for n, kind, text in marks:
            g = gap(n)
            if g.gone < min_lines or g.put > max(3, g.gone // 20) or g.code > g.gone // 20:
                continue  # new text stands there, not a placeholder
            if docstring(n) or text in before[g.first : g.end]:
                continue
            if kind != _WEAK and (had(text) or g.substance < _ELLIPSIS_LINES):
                continue  # a line of the old file is no evidence; nor a note over notes
            return found(
                "mass",
                n,
                text,
                f"stands where {g.gone} lines of the old file were: {removed} of its "
                f"{total} lines are gone in one write",
            )
    if not kept or removed < cut_ratio * total or added > kept // 20:
        return None
    # Nearly all gone, nothing new: unless it is one definition deleted whole.
    k = _common_lines(before, after)
    e = _common_lines(before[k:][::-1], after[k:][::-1])
    if k + e == len(after) and _one_definition(path, span[k : len(before) - e], new):
        return None  # one definition deleted, and the file is whole without it
    if _pruned(path, old, new):
        return None  # functions of families that keep members deleted: tests pruned
    if (
        _moved_out(old, new, prose, data)  # whole files: a seam can be where the span begins
        and not _fragment(old, span, new)
        and (not parsers.parse_errors(path, new)[1] or parsers.parse_errors(path, old)[1])
    ):
        return None  # whole runs deleted at the seams of the old layout: moved out
    return Finding(
        "elision",
        f"{removed} of the old file's {total} lines are gone in one write, and nothing "
        "new stands in their place: what is left is a fragment of the file",
        {"line": first + k + 1, "lines_removed": removed, "signal": "cut"},
    )


_BLANK = re.compile(rb"(?m)^[ \t\r\f\v]*$")


def _nonblank(data: bytes) -> int:
    """How many lines of ``data`` hold more than whitespace."""
    lines = data.count(b"\n") + 1
    return lines - len(_BLANK.findall(data))


class Gap(NamedTuple):
    """What an edit did between two anchors: old lines gone and new lines put there (as
    counts of lines), where the old lines were, how many of the gone lines the new text
    has nowhere, and how many of the put lines are code and how many comments."""

    gone: int
    put: int
    first: int
    end: int
    vanished: int
    code: int
    notes: int
    new_first: int
    new_end: int
    substance: int


# A changed span longer than this many lines is scanned only where its lines are new.
_KNOWN_FROM = 64
# An ellipsis counts as a placeholder where it stands for at least this many lines.
_ELLIPSIS_LINES = 3
# A new text of at least _REWRITE_LINES distinct lines (of _DISTINCT characters or more)
# that shares less than _REWRITE_SHARE of them with the old one is a rewrite.
_REWRITE_SHARE = 0.25
_REWRITE_LINES = 40
_DISTINCT = 6


# ---- stubs ----


def stub(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """An implemented body replaced by a stub: a function, method or class of the old
    file whose body held at least ``min_lines`` lines of code, and that the new file
    keeps (by its qualified name, through the parse trees) with a body that holds none
    (``pass``, ``...``, ``raise NotImplementedError``, ``throw new Error("TODO")``,
    ``todo!()``, a lone TODO comment, nothing: ``definitions.py`` says which).

    Not a stub: a new definition, a deleted one, one whose new version is abstract, an
    overload, a Protocol's or an ABC's method (or says subclasses implement it), a body
    that now calls something, and a body that moved: half or more of its lines that the
    old file held once are still in the new file (a helper took them)."""
    min_lines = cfg["min_lines"]
    start, end = parsers._changed(old, new)
    # A body of min_lines lines gone shows in the old span (all but its first and last
    # line can match the stub's, by prefix and suffix).
    if old.count(b"\n", start, end) < max(min_lines - 2, 1):
        return None
    found = definitions.around(path, old, new)
    if found is None:
        return None  # a version that does not parse: the syntax gate's matter
    before, after = found
    now: dict[str, list[definitions.Definition]] = {}
    for d in after:
        now.setdefault(d.name, []).append(d)
    counts: Counter[bytes] | None = None
    kept: set[bytes] = set()
    for d in before:
        if d.stub is not None or d.code < min_lines or d.name not in now:
            continue
        if any(n.stub is None or n.exempt for n in now[d.name]):
            continue  # still implemented, or a stub by design
        if counts is None:
            counts = Counter(x.strip() for x in old.split(b"\n"))
            kept = {x.strip() for x in new.split(b"\n")}
        own = [x for x in d.lines if len(x) >= _DISTINCT and counts[x] == 1]
        if own and 2 * sum(x in kept for x in own) >= len(own):
            continue  # its lines moved elsewhere in the file
        n = now[d.name][0]
        return Finding(
            "stub",
            f"the body of {d.name} (line {n.line}) is now a stub ({n.stub}) where it held "
            f"{d.code} lines of code: its implementation is gone",
            {"line": n.line, "name": d.name, "stub": n.stub, "lines_before": d.code},
        )
    return None


# ---- duplication ----

_HEADING = re.compile(rb"#{1,6}\s|([=~^-])\1{2,}$")  # an ATX heading; a setext or reST rule
_OPENER = re.compile(rb".*(?:[{:\[(=]|=>|\bdo|\bthen)$")
_TEXT_SUFFIXES = (b".md", b".markdown", b".mdx", b".txt", b".rst")


def _indent(line: bytes) -> int:
    return len(line) - len(line.lstrip())


def duplication(old: bytes, new: bytes, cfg: dict[str, Any], path: bytes = b"") -> Finding | None:
    """The new text repeats, word for word, a block of at least ``min_lines`` lines (not
    blank; half of them different, three of six characters or more) that the old text
    held once or not at all: a file pasted twice, a function written out twice.

    A repeat of a block the old file held twice already is its structure (a lockfile's
    entries, a table), not an accident. Nor is a block repeated under different headers
    (each copy the body of its own line above it, less indented, an opener ending with
    ``{`` or ``:``, or a Markdown heading): a test copied and renamed, the same fields
    under two keys of a lockfile, a README's sections. Only a repeat that one of the
    lines the edit changed belongs to is looked for."""
    k = cfg["min_lines"]
    start, end = parsers._changed(old, new)
    nend = end + len(new) - len(old)
    if k < 2 or new.count(b"\n", start, nend) < k - 1:
        return None  # fewer new lines than a repeat needs
    lines = new.split(b"\n")
    rows = [i for i, x in enumerate(lines) if x.strip()]
    seq = [lines[i].strip() for i in rows]
    first = new.count(b"\n", 0, start)
    last = first + new.count(b"\n", start, nend)
    at: dict[tuple[bytes, ...], list[int]] = {}
    for j in range(len(seq) - k + 1):
        at.setdefault(tuple(seq[j : j + k]), []).append(j)
    olds: Counter[tuple[bytes, ...]] | None = None
    old_seq: list[bytes] = []
    old_lines: Counter[bytes] | None = None
    rewrite = False
    text = path.lower().endswith(_TEXT_SUFFIXES)
    fmt = parsers.language(path)
    unit = None if fmt is None else _KEY if fmt in _DATA else _UNIT
    sig = None if fmt in (None, "python", "ruby", "bash", *_DATA) else _SIGNATURE
    for window, where in at.items():
        if len(where) < 2 or where[-1] - where[0] < k:
            continue
        if not any(rows[j] <= last and rows[j + k - 1] >= first for j in where):
            continue  # no copy touches the edit: the old file had them
        distinct = set(window)
        if 2 * len(distinct) < k or sum(len(x) >= _DISTINCT for x in distinct) < 3:
            continue  # a run of the same few lines: a table's filler, not a block
        if olds is None:
            old_seq = [s for s in (x.strip() for x in old.split(b"\n")) if s]
            olds = Counter(tuple(old_seq[j : j + k]) for j in range(len(old_seq) - k + 1))
        held = olds[window]
        if held > 1 or len(where) <= held:
            continue
        if not held:
            # New text written twice, unless the old file repeated it but for a line or
            # two (a rename through overloads that were alike already).
            # Nor in a rewrite (a text of its own, whose repeats are its own): the new
            # text must be mostly the old one's lines.
            if old_lines is None:
                old_lines = Counter(old_seq)
                mine = {x for x in seq if len(x) >= _DISTINCT}
                ours = sum(1 for x in mine if x in old_lines)
                rewrite = 2 * ours < len(mine)
            if rewrite or sum(old_lines[x] < 2 for x in window) <= 2:
                continue
        p = where[0]
        q = next(j for j in where if j - p >= k)
        while p > 0 and seq[p - 1] == seq[q - 1] and q - 1 > p + k - 1:
            p, q = p - 1, q - 1
        size = k
        while q + size < len(seq) and p + size < q and seq[p + size] == seq[q + size]:
            size += 1
        whole = p == 0 and 2 * size >= len(old_seq)  # most of the old file, from its top
        if not whole and _reused(lines, rows, p, q, size, text, unit, sig):
            continue
        a, b = rows[p] + 1, rows[p + size - 1] + 1
        c, d = rows[q] + 1, rows[q + size - 1] + 1
        once = "once" if held else "nowhere"
        return Finding(
            "duplication",
            f"lines {c}-{d} repeat lines {a}-{b} word for word ({size} lines), a block the "
            f"old file held {once}: the text was pasted or written out twice",
            {"line": c, "lines": size, "first": a, "held_before": held},
        )
    return None


def _reused(
    lines: list[bytes],
    rows: list[int],
    p: int,
    q: int,
    size: int,
    text: bool,
    unit: re.Pattern[bytes] | None,
    sig: re.Pattern[bytes] | None,
) -> bool:
    """Whether two copies of ``size`` non-blank lines (from ``p`` and ``q``) are a block
    reused, not a block written twice: in docs, a repeat that holds no heading (an example
    shown twice); in code, copies in two different blocks (two tests' setup, a method of
    two classes), an overload's signature, the bodies of headers of their own, the ends
    of blocks of their own (a copied body edited above), or (in a format rwfs parses)
    copies of which no line begins a definition at their least indent (statements)."""
    if text:
        held = _section(lines, rows, p, size)
        return held is None or held != _section(lines, rows, q, size)
    if all(_COMMENTED.match(lines[rows[j]]) for j in range(p, p + size)):
        return True  # two definitions' comments alike: their code is not
    if _enclosing(lines, rows, p, size) != _enclosing(lines, rows, q, size):
        return True
    start = rows[p - 1] if p else 0
    if any(_OVERLOAD.match(x) for x in lines[start : rows[q + size - 1]]):
        return True
    if p > 0 and q > p + size and _headed(lines, rows, p, text) and _headed(lines, rows, q, text):
        return True
    if _tail(lines, rows, p, size) and _tail(lines, rows, q, size):
        return True
    if unit is None:
        return False
    least = min(_indent(lines[rows[j]]) for j in range(p, p + size))
    return not any(
        _indent(lines[rows[j]]) == least
        and (unit.match(lines[rows[j]]) or (sig is not None and sig.match(lines[rows[j]])))
        for j in range(p, p + size)
    )


_OVERLOAD = re.compile(rb"\s*@[\w.]*overload\b")
_COMMENTED = re.compile(rb"\s*(?:#|//|/\*|\*(?:\s|/|$))")


def _level(lines: list[bytes], rows: list[int], j: int, styles: list[bytes]) -> int | None:
    """The level of non-blank line ``j`` as a heading (an ATX heading: its ``#``s; a title
    underlined by a setext or reST rule: its rule's rank among the file's rules so far,
    ``styles``, which it extends), or None."""
    line = lines[rows[j]].rstrip()
    if line.startswith(b"#"):
        return len(line) - len(line.lstrip(b"#")) if _HEADING.match(line) else None
    if not (j + 1 < len(rows) and rows[j + 1] == rows[j] + 1 and line.strip()):
        return None
    rule = lines[rows[j + 1]].rstrip()
    if _HEADING.match(rule) is None or rule.startswith(b"#") or len(rule) < len(line) // 2:
        return None
    if rule[:1] not in styles:
        styles.append(rule[:1])
    return 10 + styles.index(rule[:1])


def _section(lines: list[bytes], rows: list[int], j: int, size: int) -> bytes | None:
    """For a copy of ``size`` non-blank lines from ``j`` in docs: None when it holds no
    heading (an example shown twice, a list's items); otherwise the title of the section
    that holds it, the nearest heading above it of a level above its own headings' (two
    versions' sections in a changelog each hold their "Changes" subsection)."""
    styles: list[bytes] = []
    levels = [_level(lines, rows, i, styles) for i in range(j + size)]
    own = [x for x in levels[j:] if x is not None]
    if not own:
        return None
    top = min(own)
    for i in range(j - 1, -1, -1):
        level = levels[i]
        if level is not None and level < top:
            return lines[rows[i]].strip()
    return b""


def _enclosing(lines: list[bytes], rows: list[int], j: int, size: int) -> list[bytes]:
    """The headers of the blocks that hold the copy of ``size`` non-blank lines from ``j``,
    innermost first: each, the nearest line above the last less indented than it (a
    header's last line, ``):``, stands for the line that began it)."""
    least = min(_indent(lines[rows[i]]) for i in range(j, j + size))
    out: list[bytes] = []
    head = -1  # the non-blank line that began the last header found
    for i in range(j - 1, -1, -1):
        line = lines[rows[i]]
        if _indent(line) < least:
            least = _indent(line)
            if line.lstrip()[:1] in b")]}":
                least += 1  # its first line is above, as indented
            else:
                out.append(line.strip())
                head = i
        elif i == head - 1 and _indent(line) == least and line.rstrip()[-1:] in b"(,[":
            out[-1] = line.strip() + out[-1]  # a call's arguments, one a line: its header
            head = i
    return out


def _tail(lines: list[bytes], rows: list[int], j: int, size: int) -> bool:
    """Whether the copy of ``size`` non-blank lines from ``j`` ends a block: the line after
    it is less indented than its first."""
    if j + size >= len(rows):
        return False
    return _indent(lines[rows[j + size]]) < _indent(lines[rows[j]])


# A line that begins a definition: a keyword that defines, a signature ``name(...) {``
# (no ``if (...) {``), a shell function; in data (JSON, YAML, TOML), a key or a table.
_NOT_A_NAME = (
    rb"(?!(?:if|for|while|switch|catch|return|else|do|elif|until|with|new|throw|delete"
    rb"|case|sizeof|await|yield|typeof|not|and|or|in|is)\b)"
)
_UNIT = re.compile(
    rb"\s*(?:(?:export|public|private|protected|static|async|pub(?:\([\w:]+\))?|final"
    rb"|abstract|override|inline|virtual|extern|unsafe|default)\s+)*"
    rb"(?:def|class|function\*?|func|fn|impl|trait|struct|enum|interface|module|namespace"
    rb"|type|sub|proc|package|import|from|#\s*include|#\s*define|use|mod|template|record"
    rb"|const|let|var)\b"
    rb"|[\w-]+\s*\(\)\s*(?:\{\s*)?$"  # a shell function, at column 0
)
# In the formats with braces, a signature: name(...) { on one line (JavaScript's
# methods), types and a name then "(" (C, C++, Java), a name at column 0 (GNU style).
_SIGNATURE = re.compile(
    rb"\s*"
    + _NOT_A_NAME
    + rb"[\w<>\[\],*&:~.#$ ]*[\w>\]*&$]\s*\([^;]*\)\s*(?:const\s*)?(?:throws\s[\w., ]+)?\{\s*$"
    + rb"|\s*"
    + _NOT_A_NAME
    + rb"(?:[\w:<>,*&]+[\s*&]+)+"
    + _NOT_A_NAME
    + rb"[*&]*[\w:~]+\s*\((?!.*;\s*$)"
    + rb"|"
    + _NOT_A_NAME
    + rb"[A-Za-z_][\w:~]*\s*\((?!.*;\s*$)"
)
_KEY = re.compile(rb"\s*(?:[\"']?[\w.-]+[\"']?\s*[:=]|\[)")
_DATA = ("json", "yaml", "toml")


def _headed(lines: list[bytes], rows: list[int], j: int, text: bool) -> bool:
    """Whether the copy that begins at non-blank line ``j`` is the body of the line above
    it: that line is less indented, opens a block, or (in text) is a heading."""
    above, first = lines[rows[j - 1]], lines[rows[j]]
    s = above.strip()
    if first.strip() == b"{" or _indent(above) < _indent(first) or _OPENER.match(s):
        return True
    return text and _HEADING.match(s) is not None


# ---- syntax ----


def syntax(path: bytes, old: bytes, new: bytes) -> Finding | None:
    """A regression: the old version parsed and the new one does not."""
    lang, errors = parsers.parse_errors(path, new, old)
    if not errors:
        return None
    if parsers.parse_errors(path, old, new)[1]:
        return None  # it was broken already: not this write's doing
    err = errors[0]
    if holds_secret(err["message"].encode("utf-8", "replace")):
        err = {**err, "message": "syntax error"}  # a parser's message that quotes a secret
    return Finding(
        "syntax",
        f"the new {lang} does not parse (line {err['line']}: {err['message']}), "
        "while the previous version did",
        {"format": lang, **err},
    )


# ---- secrets: the "Resilient Write" paper's L0 risk score ----

# Most of a file matches none of the patterns, and scanning it with a regex that starts
# with \b or a lookbehind costs about half a millisecond per 100 KB per pattern. So each
# pattern runs only where cheap byte searches say it could match: "needles" that any match
# contains, searched in a "view" of the bytes (as they are, lower-cased, or with every
# digit turned into 0 or every base64 character into "a"). One Aho-Corasick pass finds
# which of a view's needles occur (37 substring searches took three times as long).
# Emails are searched only near an "@". The result is what the patterns alone would give
# (a test checks it), save for an email whose local part is longer than 256 bytes.
_DIGITS = bytes(ord("0") if chr(c).isdigit() and c < 128 else c for c in range(256))
_BASE64 = bytes(
    ord("a") if (c < 128 and chr(c).isalnum()) or chr(c) in "+/" else ord(" ") for c in range(256)
)
_VIEWS: dict[str, Callable[[bytes], bytes]] = {
    "raw": lambda data: data,
    "lower": bytes.lower,
    "digits": lambda data: data.translate(_DIGITS),
    "base64": lambda data: data.translate(_BASE64),
}


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[bytes]
    needles: tuple[bytes, ...]  # a match holds at least one of these, in ``view``
    view: str = "raw"
    # An email: run only where the part from the "@" on matches ``domain``, starting at
    # most 256 bytes before the "@" (RFC 5321 allows a local part of 64).
    domain: re.Pattern[bytes] | None = None


def _p(regex: bytes, *needles: bytes, view: str = "raw", domain: bytes = b"") -> _Pattern:
    return _Pattern(re.compile(regex), needles, view, re.compile(domain) if domain else None)


# Pattern families and weights (the paper's §3.1). A family's contribution is damped:
# w * min(1.5, 1 + 0.25 * (distinct matches - 1)).
_FAMILIES: dict[str, tuple[float, list[_Pattern]]] = {
    "api_key": (
        0.35,
        [
            _p(rb"sk-ant-[A-Za-z0-9_-]{20,}", b"sk-ant-"),
            _p(rb"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}", b"sk-"),
            _p(rb"\bAKIA[0-9A-Z]{16}\b", b"AKIA"),
            _p(
                rb"(?i)\b(?:datadog|dd)[_-]?(?:api|app)[_-]?key\W{0,3}[:=]\s*['\"]?[a-f0-9]{32,40}",
                *(
                    a + b + c
                    for a in (b"dd", b"dog")
                    for b in (b"", b"_", b"-")
                    for c in (b"api", b"app")
                ),
                view="lower",
            ),
            _p(rb"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{20,}=*", b"bearer", view="lower"),
        ],
    ),
    "github_pat": (
        0.35,
        [
            _p(rb"\bgh[pousr]_[A-Za-z0-9]{36,}", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
            _p(rb"\bgithub_pat_[A-Za-z0-9_]{22,}", b"github_pat_"),
        ],
    ),
    "jwt": (
        0.25,
        [_p(rb"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", b"eyJ")],
    ),
    "pem_block": (0.50, [_p(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", b"-----BEGIN ")]),
    "aws_secret": (
        0.40,
        [
            _p(
                rb"(?i)aws[A-Za-z0-9_.-]{0,30}(?:secret|key)[A-Za-z0-9_.-]{0,20}['\"]?\s*[:=]\s*['\"]?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
                b"aws",
                view="lower",
            )
        ],
    ),
    "pii": (
        0.15,
        [
            _p(
                rb"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
                b"@",
                domain=rb"@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
            ),
            _p(rb"\b\d{3}-\d{2}-\d{4}\b", b"000-00-0000", view="digits"),
            _p(
                rb"(?<![\d-])\(?\d{3}\)?[-. ]\d{3}[-. ]\d{4}(?![\d-])",
                *(b"%c000%c0000" % (a, b) for a in b"-. " for b in b"-. "),
                view="digits",
            ),
        ],
    ),
    "binary_hint": (0.20, [_p(rb"[A-Za-z0-9+/]{200,}={0,2}", b"a" * 200, view="base64")]),
}


class _Needles:
    """Which of each view's needles occur in the bytes: one pass per view."""

    def __init__(self) -> None:
        by_view: dict[str, list[bytes]] = {}
        for _, patterns in _FAMILIES.values():
            for p in patterns:
                by_view.setdefault(p.view, []).extend(p.needles)
        self.needles = {v: sorted(set(ns)) for v, ns in by_view.items()}
        self.automata = {v: BytesAhoCorasick(ns) for v, ns in self.needles.items()}

    def present(self, view: str, data: bytes) -> set[bytes]:
        names = self.needles[view]
        if len(names) == 1:  # a plain search: overlapping matches of one needle add nothing
            return set(names) if names[0] in data else set()
        hits = self.automata[view].find_matches_as_indexes(data, overlapping=True)
        return {names[i] for i, _, _ in hits}


_NEEDLES = _Needles()
VERDICTS = (("high", 0.70), ("medium", 0.40), ("low", 0.10))
_RANK = {"off": 99, "high": 3, "medium": 2, "low": 1, "safe": 0}
_CONTROLS = bytes(c for c in range(32) if c < 9 or c > 13)


def _matches(p: _Pattern, data: bytes, present: dict[str, set[bytes]]) -> dict[bytes, int]:
    """Each distinct match of ``p`` and where its first occurrence begins (the value's
    own group where the pattern has one: an AWS secret after its key name)."""
    if p.view not in present:
        present[p.view] = _NEEDLES.present(p.view, _VIEWS[p.view](data))
    if not any(n in present[p.view] for n in p.needles):
        return {}
    found: dict[bytes, int] = {}
    if p.domain is None:
        for m in p.regex.finditer(data):
            found.setdefault(m.group(0), m.start(m.lastindex or 0))
        return found
    done, at = 0, data.find(b"@")
    while at >= 0:
        tail = p.domain.match(data, at)
        if tail is not None:
            hit = p.regex.search(data, max(at - 256, done), tail.end())
            if hit is not None:
                found.setdefault(hit.group(0), hit.start())
                done = hit.end()
        at = data.find(b"@", at + 1)
    return found


_CONTROL = re.compile(b"[" + re.escape(_CONTROLS) + b"]")


def where(data: bytes, offset: int) -> dict[str, int]:
    """The 1-based line and column (in characters of the line read as UTF-8) of a byte
    offset: how a finding points at what it found without copying it."""
    start = data.rfind(b"\n", 0, offset) + 1
    before = data[start:offset]
    column = (len(before) if before.isascii() else len(before.decode("utf-8", "replace"))) + 1
    return {"line": data.count(b"\n", 0, start) + 1, "column": column}


def risk(data: bytes) -> dict[str, Any]:
    """The risk score of content: ``{score, verdict, detected_patterns, matches}``.

    A match is named by its family, line and column, never by its value or any part of
    it (SPEC §3.3b): the report goes to the journal, the envelope and log pipelines.
    """
    score = 0.0
    found: dict[str, dict[bytes, int]] = {}
    present: dict[str, set[bytes]] = {}
    for family, (weight, patterns) in _FAMILIES.items():
        hits: dict[bytes, int] = {}
        for p in patterns:
            for m, at in _matches(p, data, present).items():
                hits[m] = min(at, hits.get(m, at))
        if hits:
            found[family] = hits
            score += weight * min(1.5, 1.0 + 0.25 * (len(hits) - 1))
    head = data[:65536]
    controls = len(head) - len(head.translate(None, _CONTROLS))
    if data and controls > len(head) // 10 and "binary_hint" not in found:
        first = _CONTROL.search(head)
        found["binary_hint"] = {b"": first.start() if first is not None else 0}
        score += _FAMILIES["binary_hint"][0]
    if len(data) > 100 << 10:
        score += 0.15
    if max(map(len, data.split(b"\n"))) > 2000:
        score += 0.20
    score = max(0.0, min(1.0, score))
    verdict = next((name for name, floor in VERDICTS if score >= floor), "safe")
    return {
        "score": round(score, 3),
        "verdict": verdict,
        "detected_patterns": sorted(found),
        "matches": [
            {"pattern": f, **where(data, at)}
            for f in sorted(found)
            for at in sorted(found[f].values())[:5]
        ],
    }


def holds_secret(text: bytes) -> bool:
    """Whether a short text (a line a gate would quote, a parser's message) holds a match
    of any pattern family: then it is not quoted."""
    present: dict[str, set[bytes]] = {}
    return any(_matches(p, text, present) for _, ps in _FAMILIES.values() for p in ps)


def secrets(new: bytes, cfg: dict[str, Any]) -> Finding | None:
    """The new content's risk score reaches the policy's ``warn_at`` or ``reject_at``."""
    report = risk(new)
    rank = _RANK[report["verdict"]]
    if rank >= _RANK[cfg["reject_at"]]:
        action = "reject"
    elif rank >= _RANK[cfg["warn_at"]]:
        action = "warn"
    else:
        return None
    kinds = ", ".join(report["detected_patterns"]) or "a large file with long lines"
    if report["matches"]:
        first = min(report["matches"], key=lambda m: (m["line"], m["column"]))
        kinds += f", the first at line {first['line']}, column {first['column']}"
    found = Finding(
        "secrets",
        f"it looks like it holds secrets or personal data ({kinds}; "
        f"risk {report['verdict']}, score {report['score']})",
        report,
    )
    found.action = action
    return found


# ---- running them ----

# (stub and duplication before syntax: stub reads the old version's kept tree, and the new
# one it parses from it is kept for the syntax gate, which then parses nothing again)
GATES = ("truncation", "elision", "stub", "duplication", "syntax", "secrets")


# The gates that read the bytes as lines of text (source code, config).
TEXT_GATES = ("truncation", "elision", "stub", "duplication", "syntax")


def is_binary(data: bytes) -> bool:
    """Binary content: it holds a NUL byte, which no text format has (git's rule, over
    the whole content rather than its first 8,000 bytes)."""
    return b"\0" in data


def check(
    path: bytes,
    old: bytes,
    new: bytes,
    config: Callable[[str, bytes], dict[str, Any]],
    cut: bool = False,
) -> list[Finding]:
    """Every finding of every gate that is not ``off`` for ``path``, in gate order.

    ``config(gate, path)`` gives the gate's settings for this path (``action`` and its
    thresholds), after per-path overrides.

    Gates judge written text. ``cut``: the new bytes' last change is a truncation to a
    length the caller chose (truncate(2), ftruncate(2), O_TRUNC), a deliberate cut that
    the truncation and elision gates do not judge. A binary file (its old bytes hold a
    NUL) is never judged by the text gates: it has no lines or syntax to break. A text
    file whose new bytes hold NULs (padded with zeros, binary written over source) is
    still judged: that is a text file broken. The secrets gate's risk score, which has
    a family of its own for binary blobs, looks at both.
    """
    if len(old) > MAX_GATED_BYTES or len(new) > MAX_GATED_BYTES:
        return []
    binary = is_binary(old)
    out = []
    for gate in GATES:
        cfg = config(gate, path)
        if cfg["action"] == "off" or (not old and gate != "secrets"):
            continue  # a new file has nothing to break; it can still hold a secret
        if (binary and gate in TEXT_GATES) or (cut and gate in ("truncation", "elision")):
            continue
        try:
            found = _judge(gate, path, old, new, cfg)
        except Exception as exc:  # whatever it was, the write is not judged: say so
            unsure = cannot_judge(gate, exc, config("cannot_judge", path))
            if unsure is not None:
                out.append(unsure)
            continue
        if found is not None:
            out.append(found)
    return out


def _judge(gate: str, path: bytes, old: bytes, new: bytes, cfg: dict[str, Any]) -> Finding | None:
    if gate == "truncation":
        found = truncation(old, new, cfg, path)
    elif gate == "elision":
        found = elision(old, new, cfg, path)
    elif gate == "stub":
        found = stub(old, new, cfg, path)
    elif gate == "duplication":
        found = duplication(old, new, cfg, path)
    elif gate == "syntax":
        found = syntax(path, old, new)
    else:
        found = secrets(new, cfg)
        if found is not None and found.action == "reject" and cfg["action"] != "reject":
            found.action = cfg["action"]  # "warn" caps what the score may do
        return found
    if found is not None:
        found.action = cfg["action"]
    return found


def cannot_judge(gate: str, exc: BaseException, cfg: dict[str, Any]) -> Finding | None:
    """The finding of a gate that could not decide (policy ``[gates.cannot_judge]``:
    ``warn`` by default, so that bytes no parser can read are still written, and said so)."""
    if cfg["action"] == "off":
        return None
    if isinstance(exc, parsers.CannotJudge):
        reason = str(exc)
    elif isinstance(exc, RecursionError):
        reason = "it is nested deeper than the gate goes"
    elif isinstance(exc, MemoryError):
        reason = "the gate ran out of memory"
    else:  # the type only: an exception's text can quote the bytes
        reason = f"the gate failed ({type(exc).__name__})"
    found = Finding(
        "cannot_judge",
        f"the {gate} gate could not judge the new bytes: {reason}",
        {"by": gate, "reason": reason},
    )
    found.action = cfg["action"]
    return found
