"""How a ctl file splits what is written to it into verbs and words (no mount)."""

from __future__ import annotations

import os
import shlex

import pytest

from rwfs.control.nodes import split_verbs


def test_blanks_separate_words_and_newlines_verbs() -> None:
    assert split_verbs("sync\n\n  restore  s1 a.py\tb.py \n") == [
        ["sync"],
        ["restore", "s1", "a.py", "b.py"],
    ]


@pytest.mark.parametrize(
    "name",
    [
        "my file.txt",
        "two\nlines",
        'it\'s "quoted"',
        "back\\slash",
        "tab\there",
        os.fsdecode(b"odd \xff\xfe bytes"),
        "",
    ],
)
def test_a_quoted_path_of_any_bytes_is_one_word(name: str) -> None:
    text = f"restore s1 {shlex.quote(name)} other\nsync\n"
    assert split_verbs(text) == [["restore", "s1", name, "other"], ["sync"]]


def test_a_backslash_before_a_newline_continues_the_line() -> None:
    assert split_verbs("restore s1 \\\n a.py\n") == [["restore", "s1", "a.py"]]


@pytest.mark.parametrize("text", ["restore s1 'open", 'restore "open', "restore 'a\nb"])
def test_an_unterminated_quote_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        split_verbs(text)
