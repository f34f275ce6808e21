"""Turning answer tokens and texts into "yes"/"no"/letters, shared by all backends.

Scoring backends read probabilities of answer tokens; generative ones (API
models, beam search) parse the text. Both paths use these normalisations so
that " Yes", "yes." and "YES" count the same.
"""

from __future__ import annotations

import re
from string import ascii_uppercase

from verbmirage.models.base import NO, UNKNOWN, YES

_WORD = re.compile(r"[A-Za-z]+")
_LETTER = re.compile(r"^\W*\(?([A-Z])(?:\)|\.|:|,|\s|$)")


def normalise_token(token: str) -> str:
    """" Yes", "yes.", "▁YES" -> "yes" (the first run of letters, lower case)."""
    match = _WORD.search(token)
    return match.group(0).lower() if match else ""


def parse_yes_no(text: str | None) -> tuple[str, str]:
    """(answer, rule): the first word if it is yes/no, else "unknown"."""
    if not text:
        return UNKNOWN, "empty"
    word = normalise_token(text)
    if word in (YES, NO):
        return word, "first-word"
    return UNKNOWN, "unparsed"


def parse_choice(text: str | None, options: tuple[str, ...]) -> tuple[str, str]:
    """(letter, rule): a leading option letter ("B", "(B)", "B. riding"), else an exact option text."""
    if not text:
        return UNKNOWN, "empty"
    letters = ascii_uppercase[: len(options)]
    match = _LETTER.match(text.strip())
    if match and match.group(1) in letters:
        return match.group(1), "letter"
    cleaned = text.strip().rstrip(".").lower()
    for letter, option in zip(letters, options):
        if cleaned == option.lower():
            return letter, "option-text"
    return UNKNOWN, "unparsed"


def letter_token(token: str, n_options: int) -> str | None:
    """The option letter a single token stands for ("B", " B", "B."), or None."""
    stripped = token.strip().strip("().:").strip()
    letters = ascii_uppercase[:n_options]
    return stripped if len(stripped) == 1 and stripped in letters else None
