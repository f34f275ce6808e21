"""Readable English for HICO's verb and object identifiers.

``sit_on`` -> "sitting on", ``hair_drier`` -> "a hair drier". HICO's own
``vname_ing`` has two misspellings ("controling", "spining"); questions use
the corrected gerund so a model is never asked about a typo.
"""

from __future__ import annotations

# Gerunds whose last consonant doubles (CVC stress rule), listed rather than
# inferred: English stress cannot be read off spelling.
_DOUBLED = {"cut", "drag", "flip", "hit", "hop", "hug", "pet", "run", "set", "sip", "spin",
            "stab", "stir", "stop", "swim", "tag", "zip", "control", "put", "get", "begin", "sit"}
_IRREGULAR = {"lie": "lying", "tie": "tying", "die": "dying", "see": "seeing", "free": "freeing"}

# Objects that take no article in a question ("Is someone carrying skis?").
_NO_ARTICLE = {"skis", "scissors", "broccoli"}
_SPELLING = {"tv": "TV"}


def gerund(verb: str) -> str:
    """``ride`` -> ``riding``; particles are kept: ``sit_on`` -> ``sitting_on``."""
    if verb == "no_interaction":
        return verb
    head, sep, rest = verb.partition("_")
    if head in _IRREGULAR:
        ing = _IRREGULAR[head]
    elif head in _DOUBLED:
        ing = head + head[-1] + "ing"
    elif head.endswith("e") and not head.endswith(("ee", "ye", "oe")) and len(head) > 2:
        ing = head[:-1] + "ing"
    else:
        ing = head + "ing"
    return ing + sep + rest


def verb_phrase(verb: str) -> str:
    """Readable gerund phrase of a HICO verb: ``sit_on`` -> "sitting on"."""
    return gerund(verb).replace("_", " ")


def object_name(obj: str) -> str:
    """``hair_drier`` -> "hair drier"; ``tv`` -> "TV"."""
    return _SPELLING.get(obj, obj.replace("_", " "))


def object_with_article(obj: str) -> str:
    """Object with its indefinite article: "an apple", "a hair drier", "skis"."""
    name = object_name(obj)
    if obj in _NO_ARTICLE:
        return name
    article = "an" if name[0].lower() in "aeiou" else "a"
    return f"{article} {name}"


def hoi_phrase(verb: str, obj: str) -> str:
    """An MC option with object: "riding a horse"."""
    return f"{verb_phrase(verb)} {object_with_article(obj)}"
