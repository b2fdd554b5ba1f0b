"""The syntax gate: new bytes that no longer parse where the old ones did (parsers.py
parses; a file that did not parse before is left alone)."""

from . import parsers
from .findings import Finding
from .secrets import holds_secret


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
