"""What stands for left-out text: the placeholder vocabulary (``// ... rest unchanged``,
``# TODO: keep the old code``, ``[...]``) and the markers and stand-ins the elision gate
looks for, with the prose, docstrings and examples where such words are not evidence."""

import ast
import re
import textwrap
import warnings
from bisect import bisect_left
from collections import Counter

from .findings import CLOSER


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
WHOLE = re.compile(
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


OPENS = frozenset(b"{#/;*<-\"'rRbBuUfF")  # how a line of WHOLE can begin


_DOTS = re.compile(rb"\.\.\.|\xe2\x80\xa6|\. \. \.")


_WORD = re.compile(r"[a-z0-9]+")


_PASS = re.compile(rb"pass|return|\{\s*\}|\(\s*\)")


# How a line looks to elision: nothing, like a placeholder (a comment alone, ``pass``, an
# ellipsis: what stands in for code in a mass deletion), an ellipsis standing for code
# (``...``, ``# ...``, ``/* ... */``; ``def f():  # unchanged``), a placeholder phrase.
NONE, LIKE, WEAK, STRONG = range(4)


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


def marker(line: bytes) -> int:
    """What a line (stripped) is to elision: NONE, LIKE, WEAK or STRONG."""
    if not line or len(line) > _LONGEST:
        return NONE  # a placeholder is a short line; a minified one is code
    dots = b"..." in line or b"\xe2\x80\xa6" in line or b". . ." in line
    whole = WHOLE.match(line) if line[0] in OPENS else None
    if dots and _ELLIPSIS.fullmatch(line):
        return WEAK
    if whole is not None or _BARE.fullmatch(line):
        text = (whole.group(2) if whole is not None else line).strip(_AROUND)
        comment = whole is not None and whole.group(1)[-1:] not in b"\"'"
        if whole is not None and not comment and whole.group(1)[-3:] not in (b'"""', b"'''"):
            # A string in quotes alone on its line is a value (an element of a list, an
            # argument), unless an ellipsis says it stands for something.
            if line.endswith(b",") or not dots:
                return LIKE if dots else NONE
        if not text:
            return WEAK if dots and whole is not None else (LIKE if comment else NONE)
        if _said(text, dots and whole is not None):  # a bare "...rest" is a JS spread
            return STRONG
        if comment:
            return LIKE
    commented = b"#" in line or b"//" in line or b"/*" in line
    trailing = _TRAILING.search(line) if commented else None
    if trailing is not None:
        text = trailing.group(1).strip(_AROUND)
        if (not text and _DOTS.search(trailing.group(1))) or (text and _said(text, dots)):
            return WEAK
    if dots or _PASS.fullmatch(line):
        return LIKE
    return NONE


def _placeholder(line: bytes) -> bool:
    """A placeholder phrase: a line that says code was left out."""
    return marker(line.strip()) == STRONG


# Python's comments and strings, as far as telling a docstring's text from code needs.
_PY_TOKEN = re.compile(rb"#[^\n]*|\"\"\"|'''|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?")


def in_docstring(data: bytes, offset: int) -> bool:
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


def anchors(before: list[bytes], after: list[bytes]) -> tuple[list[int], list[int]]:
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


DATA = ("json", "yaml", "toml")


# A data file's entry that is only an ellipsis: as the key (``"...": "..."``, ``"…"``,
# ``- ...``, ``"..." = "..."``) or as the value (``key: ...``, ``"rest": "…"``).
ELLIPSIS_KEY = re.compile(
    rb"(?:-\s*)?([\"']?)(?:\.\.\.|\xe2\x80\xa6)\1(?:\s*[:=]\s*[^\s].{0,30})?\s*,?"
)


ELLIPSIS_VALUE = re.compile(
    rb"(?:-\s*)?[\"']?[\w.$@/ -]{1,60}[\"']?\s*[:=]\s*([\"']?)(?:\.\.\.|\xe2\x80\xa6)\1\s*,?"
)


# The longest text (characters) of a comment taken for a stand-in: a stand-in is short.
_STANDIN_TEXT = 100


# At most this many new comment lines stand where a block was; more is prose written
# there (an explanation), not a stand-in.
STANDIN_NOTES = 3


RST_COMMENT = re.compile(rb"\.\.(?:\s+(?!_|\[|\|)(?![\w-]+::).*)?")


def is_prose(path: bytes) -> bool:
    return path.lower().endswith(_PROSE)


def sentence(line: bytes) -> bool:
    """Prose: whether a line is text (a paragraph's line, a bullet, a quotation), not a
    comment or a bracketed line."""
    if standin(line, True):
        return False
    whole = WHOLE.match(line) if line[0] in OPENS else None
    return whole is None or whole.group(1)[:1] in b"*\"'" or whole.group(1)[-1:] in b"\"'"


def standin(line: bytes, prose: bool, data: bool = False) -> bool:
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
        elif line.startswith(b"..") and RST_COMMENT.fullmatch(line):
            text = line[2:]
        else:
            return False
    else:
        whole = WHOLE.match(line) if line[0] in OPENS else None
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
DIRECTIVE = re.compile(
    rb"(?:#|//|/\*)\s*(?:eslint-(?:disable|enable)|@ts-(?:ignore|expect-error|nocheck)"
    rb"|prettier-ignore|istanbul\s+ignore|c8\s+ignore|noqa\b|type:\s*ignore|pylint:"
    rb"|mypy:|pyright:|fmt:\s*(?:off|on|skip)|pragma\b|NOLINT|clang-format|biome-ignore"
    rb"|jshint|jscs:|global\s|exported\s|deno-lint-ignore|nosec\b|nolint\b)"
)


_QUOTED = re.compile(rb"\s*[rRbBuUfF]{0,2}[\"']")


def argument(lines: list[bytes], j: int) -> bool:
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


def in_example(new: bytes, at: int) -> bool:
    """Whether the line of docs at offset ``at`` is a bare ellipsis in a code sample:
    indented (a reST literal block) or inside a Markdown fence."""
    end = new.find(b"\n", at)
    line = new[at : len(new) if end < 0 else end]
    if not line.strip() or line.strip().strip(b".\xe2\x80\xa6 "):
        return False
    return line[:1] in b" \t" or len(_FENCE.findall(new, 0, at)) % 2 == 1


def filler(line: bytes, prose: bool, data: bool) -> bool:
    """A line that puts nothing new where a block was: a closing token, ``pass``, an
    ellipsis, a comment."""
    if CLOSER.fullmatch(line) or _PASS.fullmatch(line) or _ELLIPSIS.fullmatch(line):
        return True
    if standin(line, prose, data):
        return True
    whole = WHOLE.match(line) if line[0] in OPENS and not prose else None
    return whole is not None and whole.group(1)[-1:] not in b"\"'"  # a comment, if long


def prose_lines(old: bytes, a: int, span: list[bytes], i1: int, i2: int) -> bool:
    """Python: whether the old lines ``span[i1:i2]`` (the span begins at ``a`` in
    ``old``) are a docstring's text: inside a string, or strings alone once dedented."""
    at = a + sum(len(line) + 1 for line in span[:i1])
    if in_docstring(old, at):
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
