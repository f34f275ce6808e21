"""Blind baselines: they never open the image, so they bound what text alone gets.

- ``always_yes``: says yes to everything, picks option A.
- ``random``: a coin per question, seeded by (seed, question_id) so results do
  not depend on batch order or sharding.
- ``prior``: P(yes | verb, object) from training-split label frequencies
  (:func:`training_frequencies`); MC picks the option with the highest prior.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.core.io import read_table
from verbmirage.core.text import hoi_phrase, verb_phrase
from verbmirage.data.hico import NO_INTERACTION, HicoAnnotations
from verbmirage.models.base import (
    NO,
    YES,
    ModelContext,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
)


def _yes_no(p_yes: float, rule: str) -> YesNoResult:
    prediction = YES if p_yes >= 0.5 else NO
    return YesNoResult(p_yes, prediction, prediction, max(p_yes, 1 - p_yes), rule)


def _choice(probs: np.ndarray, rule: str) -> MultipleChoiceResult:
    best = int(np.argmax(probs))
    letter = option_letter(best)
    return MultipleChoiceResult(tuple(float(p) for p in probs), letter, letter, float(probs[best]), rule)


class AlwaysYes(VisionLanguageModel):
    """A blind baseline: answers yes to every yes/no question and the first option of every multiple choice."""

    backend = "always_yes"
    uses_images = False

    def _score_yes_no(self, questions):
        return [_yes_no(1.0, "constant") for _ in questions]

    def _score_multiple_choice(self, questions):
        return [_choice(np.eye(len(q.options))[0], "constant") for q in questions]


class RandomGuess(VisionLanguageModel):
    """A blind baseline: a seeded coin per question (yes/no) or a uniform option (multiple choice)."""

    backend = "random"
    uses_images = False

    def __init__(self, name: str, seed: int = 0):
        super().__init__(name)
        self.seed = seed

    def _rng(self, question: Question) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(question.question_id.encode())])

    def _score_yes_no(self, questions):
        return [_yes_no(float(self._rng(q).random()), "random") for q in questions]

    def _score_multiple_choice(self, questions):
        return [_choice(self._rng(q).dirichlet(np.ones(len(q.options))), "random") for q in questions]


def training_frequencies(anno: HicoAnnotations) -> pd.DataFrame:
    """Label frequencies of the training split, the language prior's only knowledge.

    One row per ``kind`` (and ``phrase``, the class as MC options spell it):
    ``hoi`` (verb, object): positives among training
    images where the object is present and the label is not ambiguous;
    ``verb``: images where the verb is done among images with an object it
    applies to; ``object``: images where the object is present.
    """
    labels = anno.labels["train"]
    hois = anno.hois
    present = ~np.isnan(labels)
    positive = labels == 1
    rows = []
    for hoi_id, verb, obj in zip(hois.hoi_id, hois.verb, hois.object):
        if verb == NO_INTERACTION:
            continue
        column = labels[:, hoi_id]
        rows.append(("hoi", verb, obj, int((column == 1).sum()), int(np.isin(column, (1, -1)).sum())))
    object_present = {
        obj: present[:, hois.hoi_id[hois.object == obj].to_numpy()].any(axis=1) for obj in sorted(set(hois.object))
    }
    for verb in sorted(set(hois.verb) - {NO_INTERACTION}):
        ids = hois.hoi_id[hois.verb == verb].to_numpy()
        applicable = np.any([object_present[o] for o in set(hois.object[hois.verb == verb])], axis=0)
        rows.append(("verb", verb, None, int(positive[:, ids].any(axis=1).sum()), int(applicable.sum())))
    for obj, mask in object_present.items():
        rows.append(("object", None, obj, int(mask.sum()), len(mask)))
    table = pd.DataFrame(rows, columns=["kind", "verb", "object", "positives", "total"])
    table.insert(3, "phrase", [hoi_phrase(v, o) if k == "hoi" else verb_phrase(v) if k == "verb" else None
                               for k, v, o in zip(table.kind, table.verb, table.object)])
    # Laplace smoothing keeps unseen pairs away from an absolute 0 or 1.
    table["p_yes"] = (table.positives + 1) / (table.total + 2)
    return table


class LanguagePrior(VisionLanguageModel):
    """A blind baseline: P(yes | verb, object) from the training split's label frequencies, never the image."""

    backend = "prior"
    uses_images = False

    def __init__(self, name: str, context: ModelContext, stats: str | None = None):
        super().__init__(name)
        path = Path(stats) if stats else context.train_stats
        if path is None:
            raise ValueError(f"models.{name}: the prior backend needs training-split statistics")
        table = read_table(path)  # a damaged file is named
        self._by_key, self._by_phrase = {}, {}
        for verb, obj, phrase, p in zip(table.verb, table.object, table.phrase, table.p_yes):
            verb, obj = (None if pd.isna(verb) else verb), (None if pd.isna(obj) else obj)
            self._by_key[(verb, obj)] = float(p)
            if not pd.isna(phrase):
                self._by_phrase[phrase] = float(p)  # how an MC option spells this class
        self._fallback = float(table.p_yes.mean())

    def _score_yes_no(self, questions):
        return [_yes_no(self._by_key.get((q.verb, q.object), self._fallback), "train-frequency") for q in questions]

    def _score_multiple_choice(self, questions):
        results = []
        for q in questions:
            priors = np.array([self._by_phrase.get(option, self._fallback) for option in q.options])
            results.append(_choice(priors / priors.sum(), "train-frequency"))
        return results
