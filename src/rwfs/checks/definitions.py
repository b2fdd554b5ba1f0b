"""The definitions an edit touched (functions, methods, classes), and what their bodies
hold: what the stub gate compares between a file's old and new versions.

Python is read with ``ast``, only the statements around the edit (``parsers.python_pieces``:
the entries of the innermost outline block that it touched); the other formats of the
syntax gate with tree-sitter, from the trees ``parsers.trees`` keeps, walking only the
nodes that overlap the edit. A definition is named by its qualified name (``Class.method``,
``impl Display for Point.fmt``, ``(*Server).Close``), the same in both versions when
its header and the definitions around it are the same.

A body is a *stub* when it holds no code: nothing at all (``{}``, only comments, only a
docstring), or only statements that stand in for code — ``pass``, ``...``, a ``raise`` or
``throw`` (or ``panic``) of a not-implemented error, ``todo!()``, ``unimplemented!()``,
or a trivial ``return`` (``return``, ``return null``, ``nil``…) or a print of a message,
with words saying it is not done (``TODO``, ``not implemented``…) in the body.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass
from typing import Any

from . import parsers


@dataclass(frozen=True)
class Definition:
    name: str  # qualified: the enclosing definitions' names, then its own
    line: int  # 1-based line of its header in its file
    code: int  # lines of code in its body: not blank, not comment-only, no docstring
    stub: str | None  # what stands in for code, when the body is a stub
    exempt: bool  # abstract, an overload, a Protocol's: a stub by design
    lines: tuple[bytes, ...]  # the body's lines of code, stripped


# Words that say code is not written yet (in a comment, a message, an exception's name).
NOT_DONE = re.compile(
    rb"(?i)\b(?:not[\s_-]*(?:yet[\s_-]*)?implemented|unimplemented|notimplemented\w*"
    rb"|unsupportedoperation\w*|implement[\s_-]*(?:me|this|later|here)|todo|fixme|tbd"
    rb"|stub(?:bed)?|placeholder)\b"
)
# Words that say a stub is one by design: the method is abstract, subclasses implement it.
BY_DESIGN = re.compile(
    rb"(?i)\b(?:abstract|sub-?class(?:es)?|overrid(?:e|den)|must be (?:implemented|overridden)"
    rb"|should be (?:implemented|overridden)|implemented by|derived class(?:es)?)\b"
)
_RAISE = re.compile(rb"(?:raise|throw|panic!?|abort|fail)\b|[A-Za-z_][\w:.]*Error\s*[(;]")
_MACRO = re.compile(rb"(?:todo|unimplemented)!\s*[\(\[{]")
_TRIVIAL = re.compile(
    rb"(?:return\b\s*)?(?:None|null|nil|undefined|NULL|nullptr|0|-1|0\.0|false|False|true|"
    rb"True|\"\"|''|\[\]|\{\}|\(\)|Ok\(\(\)\)|Default::default\(\)|:)?\s*;?|return\s*;?"
)
_SAY = re.compile(
    rb"(?:console\.\w+|print\w*|puts|echo|printf|fmt\.\w+|System\.(?:out|err)\.\w+"
    rb"|log(?:ger)?\.\w+|logging\.\w+|warnings\.warn|eprintln!|println!)\b"
)
_COMMENT_LINE = re.compile(rb"\s*(?:#|//|/\*|\*(?:\s|/|$))")


def _code_lines(lines: list[bytes], first: int, last: int) -> tuple[bytes, ...]:
    """Lines ``first`` to ``last`` (0-based, inclusive) of ``lines`` that hold code."""
    return tuple(
        s
        for s in (x.strip() for x in lines[first : last + 1])
        if s.strip(b"{}()[];,") and not _COMMENT_LINE.match(s)
    )


def _stub(statements: list[tuple[str, bytes]], text: bytes) -> str | None:
    """What a body of ``statements`` ((kind, text) each: "pass", "ellipsis", or "code")
    holds in place of code, when it is a stub; ``text``: the whole body, comments too."""
    if not statements:
        return "an empty body"
    strong, said = None, NOT_DONE.search(text) is not None
    for kind, s in statements:
        s = s.strip()
        if kind == "pass" or s in (b"pass", b":"):
            strong = strong or s.decode()
        elif kind == "ellipsis" or s == b"...":
            strong = strong or "..."
        elif _MACRO.match(s):
            strong = strong or s.split(b"!")[0].decode() + "!()"
        elif _RAISE.match(s) and len(s) < 300 and NOT_DONE.search(s):
            strong = strong or s.split(b"(")[0].split(b"\n")[0].decode("utf-8", "replace")[:60]
        elif _TRIVIAL.fullmatch(s) or (_SAY.match(s) and NOT_DONE.search(s) and len(s) < 300):
            continue  # a stub's only with words saying so
        else:
            return None
    if len(statements) > 3:
        return None
    if strong is not None:
        return strong
    return "a trivial statement and a TODO" if said else None


# ---- Python ----


def _py(src: bytes) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _decorators(node: ast.AST) -> list[str]:
    return [ast.unparse(d) for d in getattr(node, "decorator_list", [])]


def _abstract_class(node: ast.ClassDef) -> bool:
    words = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
    return any(re.search(r"\b(?:ABC|ABCMeta|Protocol)\b", w) for w in words)


def _py_kind(stmt: ast.stmt) -> str:
    if isinstance(stmt, ast.Pass):
        return "pass"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return "ellipsis" if stmt.value.value is Ellipsis else "string"
    return "code"


def _py_defs(
    tree: ast.Module, src: bytes, shift: int, lines: tuple[int, int], prefix: str, abstract: bool
) -> list[Definition]:
    """The definitions of ``tree`` (parsed from ``src``, whose line 1 is line ``shift + 1``
    of its file) that overlap file lines ``lines`` (1-based, inclusive)."""
    out: list[Definition] = []
    srclines = src.split(b"\n")

    def segment(stmt: ast.stmt) -> bytes:
        # (ast's offsets are in UTF-8 bytes; ast.get_source_segment splits the whole
        # source at each call)
        a, b = stmt.lineno - 1, (stmt.end_lineno or stmt.lineno) - 1
        if a == b:
            return srclines[a][stmt.col_offset : stmt.end_col_offset]
        rest = srclines[a + 1 : b] + [srclines[b][: stmt.end_col_offset]]
        return b"\n".join([srclines[a][stmt.col_offset :], *rest])

    def walk(body: list[ast.stmt], names: str, in_abstract: bool) -> None:
        for node in body:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            end = getattr(node, "end_lineno", None) or node.lineno
            if end + shift < lines[0] or first + shift > lines[1]:
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                decos = _decorators(node)
                role = next(
                    (
                        d.split(".")[-1]
                        for d in decos
                        if re.fullmatch(r"\w+\.(?:setter|deleter|getter)", d)
                    ),
                    "",
                )
                name = f"{names}{node.name}" + (f".{role}" if role else "")
                stmts = list(node.body)
                if stmts and _py_kind(stmts[0]) == "string":
                    stmts = stmts[1:]  # the docstring
                text = b"\n".join(srclines[node.lineno : end])  # the header's line aside
                stub = _stub([(_py_kind(s), segment(s)) for s in stmts], text)
                if stub == "an empty body" and len(node.body) == 1:
                    stub = "only its docstring"
                code = _code_lines(srclines, stmts[0].lineno - 1, end - 1) if stmts else ()
                exempt = (
                    any(re.search(r"abstract|overload", d) for d in decos)
                    or (in_abstract and not isinstance(node, ast.ClassDef))
                    or BY_DESIGN.search(text) is not None
                )
                out.append(Definition(name, node.lineno + shift, len(code), stub, exempt, code))
                inner = isinstance(node, ast.ClassDef) and _abstract_class(node)
                walk(node.body, name + ".", inner)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list) and sub:
                        if field == "handlers":
                            for h in sub:
                                walk(h.body, names, in_abstract)
                        else:
                            walk(sub, names, in_abstract)

    walk(tree.body, prefix, abstract)
    return out


_PY_HEADER = re.compile(
    rb"(?:[ \t]*@[^\n]*\n)*[ \t]*(?:async[ \t]+)?(class|def)[ \t]+(\w+)([^\n]*)"
)


def _py_around(
    path: bytes, old: bytes, new: bytes, spans: tuple[tuple[int, int], tuple[int, int]]
) -> tuple[list[Definition], list[Definition]] | None:
    for head, a, e, e2, around in parsers.python_pieces(path, old, new):
        if around and _PY_HEADER.match(old, around[-1]):
            # The body of a function or class: the definition whose body the edit changed
            # is not in this piece (a body replaced by a stub would go unseen), but in the
            # one around it.
            continue
        o, n = _py(head + old[a:e]), _py(head + new[a:e2])
        if o is None or n is None:
            continue
        prefix, abstract = "", False
        for at in around:
            m = _PY_HEADER.match(old, at)
            if m is not None:
                prefix += m.group(2).decode() + "."
                abstract = (
                    m.group(1) == b"class"
                    and re.search(rb"\b(?:ABC|ABCMeta|Protocol)\b", m.group(3)) is not None
                )
        hl = head.count(b"\n")
        return (
            _py_defs(o, head + old[a:e], old.count(b"\n", 0, a) - hl, spans[0], prefix, abstract),
            _py_defs(n, head + new[a:e2], new.count(b"\n", 0, a) - hl, spans[1], prefix, abstract),
        )
    n = _py(new)  # (first: a new version that does not parse is the syntax gate's)
    o = _py(old) if n is not None else None
    if o is None or n is None:
        return None
    return _py_defs(o, old, 0, spans[0], "", False), _py_defs(n, new, 0, spans[1], "", False)


# ---- tree-sitter ----

# Node types that define something with a body, per format family; their name is the
# "name" field (C and C++: the declarator's identifier).
_FUNCTIONS = frozenset(
    {
        "function_declaration",
        "generator_function_declaration",
        "method_definition",
        "method_declaration",
        "constructor_declaration",
        "function_definition",
        "function_item",
        "method",
        "singleton_method",
    }
)
_CLASSES = frozenset(
    {
        "class_declaration",
        "abstract_class_declaration",
        "class_specifier",
        "struct_specifier",
        "interface_declaration",
        "enum_declaration",
        "record_declaration",
        "impl_item",
        "trait_item",
        "mod_item",
        "namespace_definition",
        "class",
        "module",
    }
)
_FUNCTION_VALUES = frozenset(
    {"arrow_function", "function_expression", "function", "generator_function"}
)
_NAMED = frozenset(
    {"variable_declarator", "pair", "assignment_expression", "public_field_definition"}
)


def _text(node: Any) -> bytes:
    return bytes(node.text or b"")


def _ts_name(node: Any) -> str | None:
    t = node.type
    if t in _NAMED:
        value = node.child_by_field_name("value") or node.child_by_field_name("right")
        key = (
            node.child_by_field_name("name")
            or node.child_by_field_name("key")
            or node.child_by_field_name("left")
            or node.child_by_field_name("property")
        )
        if value is None or value.type not in _FUNCTION_VALUES or key is None:
            return None
        return _text(key).decode("utf-8", "replace")
    if t == "impl_item":
        body = node.child_by_field_name("body")
        head = _text(node)[: (body.start_byte - node.start_byte) if body else None]
        return b" ".join(head.split()).decode("utf-8", "replace")
    name = node.child_by_field_name("name")
    if name is None:
        decl = node.child_by_field_name("declarator")
        while decl is not None and decl.child_by_field_name("declarator") is not None:
            decl = decl.child_by_field_name("declarator")
        name = decl
    if name is None:
        return None
    label = _text(name).decode("utf-8", "replace")
    receiver = node.child_by_field_name("receiver") if t == "method_declaration" else None
    if receiver is not None:  # Go
        label = b"".join(_text(receiver).split()).decode("utf-8", "replace") + "." + label
    return label


def _ts_body(node: Any) -> Any:
    if node.type in _NAMED:
        value = node.child_by_field_name("value") or node.child_by_field_name("right")
        return value.child_by_field_name("body") if value is not None else None
    return node.child_by_field_name("body")


def _ts_statements(body: Any) -> list[tuple[str, bytes]]:
    out = []
    for c in body.named_children:
        if "comment" in c.type:
            continue
        if c.type in ("statement_list", "body_statement"):
            out.extend(_ts_statements(c))
            continue
        out.append(("code", _text(c)))
    return out


def _ts_defs(
    root: Any, data: bytes, span: tuple[int, int], lines: tuple[int, int]
) -> list[Definition]:
    """The definitions of a tree that overlap the bytes ``span`` of ``data``, walking only
    the nodes that do."""
    out: list[Definition] = []
    split = data.split(b"\n")
    todo: list[tuple[Any, str]] = [(root, "")]
    a, b = span
    while todo:
        node, names = todo.pop()
        for c in node.children:
            if c.end_byte < a or c.start_byte > b or not c.is_named:
                continue
            t = c.type
            label = None
            if t in _FUNCTIONS or t in _CLASSES or t in _NAMED:
                label = _ts_name(c)
            if label is None:
                todo.append((c, names))
                continue
            name = names + label
            body = _ts_body(c)
            if body is None and t in _FUNCTIONS:
                # Ruby's method of comments alone has no body; a Java method without one
                # is abstract (or an interface's): a stub by design
                ruby = t in ("method", "singleton_method")
                what = "an empty body" if ruby else "no body"
                out.append(Definition(name, c.start_point[0] + 1, 0, what, not ruby, ()))
            elif body is not None and not body.has_error and t not in _CLASSES:
                row, end = body.start_point[0], body.end_point[0]
                text = _text(body)
                stmts = _ts_statements(body)
                first = c.start_point[0]
                code = _code_lines(split, row, end)
                if code and code[0].endswith(b"{") and row == first:
                    code = code[1:]  # the header's line, with its brace
                if code and code[-1] == b"end":
                    code = code[:-1]
                stub = _stub(stmts, text)
                exempt = BY_DESIGN.search(text) is not None
                out.append(Definition(name, first + 1, len(code), stub, exempt, code))
            todo.append((c, name + "."))
    return out


def around(path: bytes, old: bytes, new: bytes) -> tuple[list[Definition], list[Definition]] | None:
    """The definitions of ``old`` and of ``new`` that overlap the span the edit changed;
    None when either version does not parse (Python), or the format has none."""
    start, end = parsers._changed(old, new)
    nend = end + len(new) - len(old)
    spans = (
        (old.count(b"\n", 0, start) + 1, old.count(b"\n", 0, end) + 1),
        (new.count(b"\n", 0, start) + 1, new.count(b"\n", 0, nend) + 1),
    )
    if parsers.language(path) == "python":
        return _py_around(path, old, new, spans)
    pair = parsers.trees(path, old, new)
    if pair is None:
        return None
    return (
        _ts_defs(pair[0].root_node, old, (start, end), spans[0]),
        _ts_defs(pair[1].root_node, new, (start, nend), spans[1]),
    )
