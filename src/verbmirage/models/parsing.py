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
# A leading option letter followed by ".", ")" or ":" ("B. riding", "(B) riding", "B: riding"). A letter
# followed by a space is a word ("A man is riding"), not an answer.
_MARKED_LETTER = re.compile(r"^\W*?\(?([A-Z])[.):]")


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
    """(letter, rule): an option letter, else an exact option text.

    A letter counts only when it stands alone ("B", "(B)", "**B**") or leads
    the answer followed by ".", ")" or ":" ("B. riding", "B) riding"); so
    "A man is riding" is not option A.
    """
    if not text:
        return UNKNOWN, "empty"
    letters = ascii_uppercase[: len(options)]
    alone = re.sub(r"^\W+|\W+$", "", text)
    match = _MARKED_LETTER.match(text.strip())
    letter = alone if len(alone) == 1 else match.group(1) if match else None
    if letter is not None and letter in letters:
        return letter, "letter"
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


# ---- the decision: the answer the model actually gives --------------------------------------------------
# A token that spells a whole yes/no word ("Yes", " no", "NO."): the same rule picks the yes/no ids whose mass
# gives P(yes), so a first token that scores as "yes" also decides "yes".
_YES_NO_TOKEN = re.compile(r"(yes|no)[.,!]?", re.IGNORECASE)


def yes_no_token(token: str | None) -> str | None:
    """"yes"/"no" when ``token`` alone spells that word, else None."""
    match = _YES_NO_TOKEN.fullmatch((token or "").strip())
    return match.group(1).lower() if match else None


def decide_yes_no(first_token: str, continued: str | None, decoding: str = "greedy") -> tuple[str, str, str]:
    """(prediction, raw_answer, parse_rule) of a YN answer decoded token by token.

    The first answer token decides when it spells yes or no. Otherwise the
    answer as decoded further (``continued``, first token included) is
    parsed by its first word; None means the backend could not decode further,
    so the answer is unknown.
    """
    word = yes_no_token(first_token)
    if word is not None:
        return word, first_token, f"{decoding}:first-token"
    if continued is None:
        return UNKNOWN, first_token, f"{decoding}:first-token"
    answer, rule = parse_yes_no(continued)
    return answer, continued, f"{decoding}:{rule}"


def decide_choice(first_token: str, continued: str | None, options: tuple[str, ...],
                  decoding: str = "greedy") -> tuple[str, str, str]:
    """(letter, raw_answer, parse_rule) of an MC answer: the first token if it is an option letter, else the parse."""
    letter = letter_token(first_token, len(options))
    if letter is not None and first_token.strip() == letter:
        return letter, first_token, f"{decoding}:first-token"
    if continued is None:
        return UNKNOWN, first_token, f"{decoding}:first-token"
    answer, rule = parse_choice(continued, options)
    return answer, continued, f"{decoding}:{rule}"
