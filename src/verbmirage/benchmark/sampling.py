"""What every question builder shares (HICO's sets, CharadesEgo's, Pangea's training questions; docs/questions.md):
seeded random streams, uniform draws from a pool, the MC prompt and its circular rotations, and content ids.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from string import ascii_uppercase

import numpy as np

from verbmirage.benchmark.question_sets import MC_STEM


@dataclass
class Draft:
    """One question before ids and tags are attached."""

    prompt: str
    answer: str
    verb: str | None = None
    object: str | None = None
    hoi_id: int | None = None
    options: list[str] = field(default_factory=list)
    group_key: tuple = ()
    rotation: int = 0


def named_rng(seed: int, *names: str) -> np.random.Generator:
    """The random stream of one named item (an image in a question set, a source): it depends on the seed and
    the names only, so a set does not depend on the order of its items or on other sets.

    ``Generator(PCG64(...))`` is what ``np.random.default_rng(...)`` returns, without its per-call error-state
    wrapper (a third of the cost, at ~48K generators for HICO's five sets)."""
    return np.random.Generator(np.random.PCG64([seed, *[zlib.crc32(name.encode()) for name in names]]))


def draw(rng: np.random.Generator, pool: Iterable, k: int) -> list:
    """Up to k distinct items of ``pool``, drawn uniformly (pool sorted first for determinism)."""
    pool = sorted(pool)
    k = min(k, len(pool))
    if k == 0:
        return []
    return [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]


def mc_prompt(stem: str, options: list[str]) -> str:
    """The stem, then one line a lettered option: ``A. ...``."""
    return "\n".join([stem] + [f"{ascii_uppercase[k]}. {text}" for k, text in enumerate(options)])


def circular(texts: list[str], correct: int, rng, base: Draft) -> list[Draft]:
    """Shuffle the options once, then one draft per rotation ``keys[i:] + keys[:i]``."""
    order = [int(i) for i in rng.permutation(len(texts))]
    drafts = []
    for rotation in range(len(order)):
        rotated = order[rotation:] + order[:rotation]
        options = [texts[i] for i in rotated]
        drafts.append(
            Draft(
                prompt=mc_prompt(MC_STEM, options),
                answer=ascii_uppercase[rotated.index(correct)],
                verb=base.verb,
                object=base.object,
                hoi_id=base.hoi_id,
                options=options,
                group_key=(texts[correct], tuple(sorted(texts))),
                rotation=rotation,
            )
        )
    return drafts


def content_hash(*parts) -> str:
    """A short stable id of JSON-serialisable content."""
    return hashlib.blake2b(_compact_json(parts).encode(), digest_size=8).hexdigest()


def _compact_json(value) -> str:
    """``json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))``, written directly for
    the strings, integers, None and lists that question ids are made of (json.dumps' set-up per call costs
    more than the encoding of a short id; a question set hashes every row twice). Anything else goes to
    json.dumps itself, so the text, and with it every id, is the same."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is list or kind is tuple:  # strings inline (the usual item), anything else through this function
        return "[" + ",".join([encode_basestring_ascii(item) if type(item) is str else _compact_json(item)
                               for item in value]) + "]"
    if value is None:
        return "null"
    if kind is int:  # not bool, not an int subclass with its own repr
        return int.__repr__(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
