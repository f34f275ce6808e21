"""HICO question sets (paper "Probing on Query Conditions", Appendix A; docs/questions.md).

Sampling protocol (also in ``docs/questions.md``), per test image I with
positive HOIs H_I (label 1), ambiguous HOIs A_I (label 0) and present objects
O_I (any label that is not NaN); ``no_interaction`` is never used:

- ``yn_obj``: for every object o of H_I with p positives and a pool of n HOIs
  of o that are neither in H_I nor in A_I, ``min(p, n // k)`` positives are
  asked ("yes"), each with k negatives of its own drawn without replacement
  from the pool ("no"), so Yes:No is exactly 1:k (the paper's 1:2).
  k = ``negatives_per_positive`` (2). Protocol ``all_positives`` (the former
  default): every positive is asked and ``k * p`` negatives are drawn, fewer
  if the pool is smaller (Yes:No about 1:1.5 on HICO).
- ``yn_verb``: the same per image, with the verbs V_I of H_I ("something")
  and the pool of verbs plausible for some object in O_I that are neither in
  V_I nor verbs of A_I.
- ``mc_obj`` / ``mc_verb``: one question per positive HOI / verb whose
  negative pool (as above) holds at least ``mc_options - 1`` entries; the
  negatives are drawn independently of the YN draw. Options are shuffled once,
  then asked in every circular rotation (one row each, same ``group_id``).
- ``obj_exist``: on the images both verb sets ask (so Fig. 4b compares them on
  the same images), every object of O_I ("yes") and ``k * |O_I|`` objects
  absent from the image ("no"). ``person`` is left out: every HICO image shows
  a person, so "Is there a person?" has no trustworthy "no".
- ``yn_ko`` (Known Object, HICO's mAP protocol): every HOI labelled +1 ("yes")
  or -1 ("no") in the image, with the ``yn_obj`` prompt; ambiguous (0) and
  unannotated (NaN: object absent) labels are skipped. No sampling: it is the
  whole ranking task that average precision scores (``analysis/known_object.py``).

Each image has its own random stream derived from (seed, qset, image name),
so a question set does not depend on the order of images or on other sets.
"""

from __future__ import annotations

import multiprocessing
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from verbmirage.benchmark.sampling import Draft, circular, content_hash, draw, named_rng
from verbmirage.core.text import hoi_phrase, object_name, object_with_article, verb_phrase
from verbmirage.data.hico import NO_INTERACTION, HicoAnnotations

#: dataset -> question set -> (unique questions, questions the main experiments asked, Yes:No), Appendix A.
PAPER_COUNTS = {
    # HICO: "47K unique YN questions", "16.6K unique MC questions", Yes:No ~ 1:2 (the paper does not say
    # whether a number counts one set or both of its kind: it stands beside each).
    "hico": {"yn_obj": (47_000, None, "1:2"), "yn_verb": (47_000, None, "1:2"),
             "mc_obj": (16_600, None, ""), "mc_verb": (16_600, None, "")},
    # CharadesEgo: "76K unique YN questions and 36K unique MC questions, and we use 28K YN questions and 10K MC
    # questions for experiment", Yes:No ~ 1:1 (over both views: it stands beside each view's set).
    "charadesego": {"yn_exo": (76_000, 28_000, "1:1"), "yn_ego": (76_000, 28_000, "1:1"),
                    "mc_exo": (36_000, 10_000, ""), "mc_ego": (36_000, 10_000, "")},
}
PROTOCOLS = {
    # YN sampling (docs/questions.md): "paired" asks only positives that get k negatives of their own, so
    # Yes:No is exactly 1:k; "all_positives" asks every positive with up to k negatives each (the former default).
    "paired": "min(p, n // k) positives per object (yn_verb: per image), k distinct negatives each",
    "all_positives": "every positive, k * p negatives or the whole pool if smaller",
}
OBJECTS_ALWAYS_PRESENT = frozenset({"person"})
_PLURAL_OBJECTS = frozenset({"skis", "scissors"})


@dataclass(frozen=True)
class QuestionSettings:
    """Sampling settings (config key ``questions``)."""

    seed: int = 0
    negatives_per_positive: int = 2
    mc_options: int = 4
    rare_threshold: float = 0.2
    common_verbs: tuple[str, ...] = ("hold", "ride", "sit_on", "straddle", "carry")
    split: str = "test"
    protocol: str = "paired"  # one of PROTOCOLS: how the YN sets pair positives with negatives

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"questions.protocol: unknown protocol '{self.protocol}'; known: {list(PROTOCOLS)}")

    @classmethod
    def from_config(cls, config: dict) -> "QuestionSettings":
        known = {k: v for k, v in config.items() if k in cls.__dataclass_fields__}
        if "common_verbs" in known:
            known["common_verbs"] = tuple(known["common_verbs"])
        return cls(**known)


@dataclass(frozen=True)
class Vocabulary:
    """Which verbs go with which objects, from the 600 HOI classes."""

    verb_of: tuple[str, ...]
    object_of: tuple[str, ...]
    hois_of_object: dict[str, tuple[int, ...]] = field(default_factory=dict)
    objects_of_verb: dict[str, frozenset[str]] = field(default_factory=dict)
    objects: tuple[str, ...] = ()
    verbs_of_object: dict[str, frozenset[str]] = field(default_factory=dict)  # the inverse of objects_of_verb

    @classmethod
    def from_hois(cls, hois: pd.DataFrame) -> "Vocabulary":
        hois_of_object: dict[str, list[int]] = defaultdict(list)
        objects_of_verb: dict[str, set[str]] = defaultdict(set)
        verbs_of_object: dict[str, set[str]] = defaultdict(set)
        for hoi_id, verb, obj in zip(hois.hoi_id, hois.verb, hois.object):
            if verb == NO_INTERACTION:
                continue
            hois_of_object[obj].append(int(hoi_id))
            objects_of_verb[verb].add(obj)
            verbs_of_object[obj].add(verb)
        return cls(
            verb_of=tuple(hois.verb),
            object_of=tuple(hois.object),
            hois_of_object={o: tuple(ids) for o, ids in hois_of_object.items()},
            objects_of_verb={v: frozenset(objs) for v, objs in objects_of_verb.items()},
            objects=tuple(sorted(set(hois.object))),
            verbs_of_object={o: frozenset(verbs) for o, verbs in verbs_of_object.items()},
        )

    def verbs_for_objects(self, objects: Iterable[str]) -> set[str]:
        """Verbs plausible for at least one of ``objects`` (a union over the objects, not a scan of all verbs)."""
        verbs: set[str] = set()
        for obj in objects:
            verbs |= self.verbs_of_object.get(obj, frozenset())
        return verbs


@dataclass(frozen=True)
class ImageLabels:
    """The label sets of one image (SPEC notation)."""

    image_id: str
    image: str
    positives: frozenset[int]  # H_I without no_interaction
    ambiguous: frozenset[int]  # A_I
    present_objects: frozenset[str]  # O_I
    negatives: frozenset[int] = frozenset()  # HOIs labelled -1, without no_interaction

    @classmethod
    def from_row(cls, image_id: str, image: str, row: np.ndarray, vocab: Vocabulary) -> "ImageLabels":
        positives = {int(i) for i in np.flatnonzero(row == 1) if vocab.verb_of[i] != NO_INTERACTION}
        return cls(
            image_id=image_id,
            image=image,
            positives=frozenset(positives),
            ambiguous=frozenset(int(i) for i in np.flatnonzero(row == 0)),
            present_objects=frozenset(vocab.object_of[i] for i in np.flatnonzero(~np.isnan(row))),
            negatives=frozenset(int(i) for i in np.flatnonzero(row == -1) if vocab.verb_of[i] != NO_INTERACTION),
        )


def _hoi_negative_pool(obj: str, labels: ImageLabels, vocab: Vocabulary) -> set[int]:
    """HOIs plausible for ``obj`` that are neither positive nor ambiguous in the image."""
    return set(vocab.hois_of_object[obj]) - labels.positives - labels.ambiguous


def _verb_negative_pool(labels: ImageLabels, vocab: Vocabulary) -> set[str]:
    """Verbs plausible for an object in the image, neither done nor ambiguous there."""
    positive_verbs = {vocab.verb_of[i] for i in labels.positives}
    ambiguous_verbs = {vocab.verb_of[i] for i in labels.ambiguous}
    return vocab.verbs_for_objects(labels.present_objects) - positive_verbs - ambiguous_verbs


@lru_cache(maxsize=None)
def _yes_no_obj_prompt(verb: str, obj: str) -> str:
    return f"Is someone {verb_phrase(verb)} {object_with_article(obj)}?"


@lru_cache(maxsize=None)
def _yes_no_verb_prompt(verb: str) -> str:
    return f"Is someone {verb_phrase(verb)} something?"


@lru_cache(maxsize=None)
def _object_exists_prompt(obj: str) -> str:
    if obj in _PLURAL_OBJECTS:
        return f"Are there {object_name(obj)} in the image?"
    return f"Is there {object_with_article(obj)} in the image?"


def _asked_count(positives: int, pool: int, s: QuestionSettings) -> int:
    """How many of ``positives`` a YN set asks, given a negative pool of size ``pool`` (see PROTOCOLS)."""
    if s.protocol == "all_positives":
        return positives
    return min(positives, pool // s.negatives_per_positive)


def _asked_positives(rng, positives: list, pool: set, s: QuestionSettings) -> list:
    """The positives asked: all, or a seeded draw when the pool cannot give each k negatives of its own."""
    count = _asked_count(len(positives), len(pool), s)
    return positives if count == len(positives) else draw(rng, positives, count)


def _positives_by_object(labels: ImageLabels, vocab: Vocabulary) -> dict[str, list[int]]:
    by_object: dict[str, list[int]] = defaultdict(list)
    for hoi in sorted(labels.positives):
        by_object[vocab.object_of[hoi]].append(hoi)
    return dict(sorted(by_object.items()))


def verb_sets_ask(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings) -> bool:
    """Whether ``yn_obj`` and ``yn_verb`` both ask this image something (counts only, no draw)."""
    by_object = any(
        _asked_count(len(hois), len(_hoi_negative_pool(obj, labels, vocab)), s)
        for obj, hois in _positives_by_object(labels, vocab).items()
    )
    verbs = {vocab.verb_of[i] for i in labels.positives}
    return by_object and _asked_count(len(verbs), len(_verb_negative_pool(labels, vocab)), s) > 0


def build_yn_obj(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    drafts = []
    for obj, positives in _positives_by_object(labels, vocab).items():
        pool = _hoi_negative_pool(obj, labels, vocab)
        positives = _asked_positives(rng, positives, pool, s)
        negatives = draw(rng, pool, s.negatives_per_positive * len(positives))
        for hoi, answer in [(h, "yes") for h in positives] + [(h, "no") for h in negatives]:
            verb = vocab.verb_of[hoi]
            drafts.append(Draft(_yes_no_obj_prompt(verb, obj), answer, verb, obj, hoi))
    return drafts


def build_yn_verb(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    pool = _verb_negative_pool(labels, vocab)
    positives = _asked_positives(rng, sorted({vocab.verb_of[i] for i in labels.positives}), pool, s)
    negatives = draw(rng, pool, s.negatives_per_positive * len(positives))
    return [
        Draft(_yes_no_verb_prompt(verb), answer, verb=verb)
        for verb, answer in [(v, "yes") for v in positives] + [(v, "no") for v in negatives]
    ]


_hoi_option = lru_cache(maxsize=None)(hoi_phrase)  # MC option texts: a few hundred distinct, asked thousands of times
_verb_option = lru_cache(maxsize=None)(verb_phrase)


def build_mc_obj(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    drafts = []
    for hoi in sorted(labels.positives):
        obj = vocab.object_of[hoi]
        pool = _hoi_negative_pool(obj, labels, vocab)
        if len(pool) < s.mc_options - 1:
            continue
        chosen = [hoi] + draw(rng, pool, s.mc_options - 1)
        texts = [_hoi_option(vocab.verb_of[h], obj) for h in chosen]
        drafts += circular(texts, 0, rng, Draft("", "", vocab.verb_of[hoi], obj, hoi))
    return drafts


def build_mc_verb(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    pool = _verb_negative_pool(labels, vocab)
    if len(pool) < s.mc_options - 1:
        return []
    drafts = []
    for verb in sorted({vocab.verb_of[i] for i in labels.positives}):
        chosen = [verb] + draw(rng, pool, s.mc_options - 1)
        drafts += circular([_verb_option(v) for v in chosen], 0, rng, Draft("", "", verb))
    return drafts


def build_obj_exist(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    if not verb_sets_ask(labels, vocab, s):  # the control set lives on the verb sets' images
        return []
    positives = sorted(labels.present_objects - OBJECTS_ALWAYS_PRESENT)
    absent = set(vocab.objects) - labels.present_objects - OBJECTS_ALWAYS_PRESENT
    negatives = draw(rng, absent, s.negatives_per_positive * len(positives))
    return [
        Draft(_object_exists_prompt(obj), answer, object=obj)
        for obj, answer in [(o, "yes") for o in positives] + [(o, "no") for o in negatives]
    ]


def build_yn_ko(labels: ImageLabels, vocab: Vocabulary, s: QuestionSettings, rng) -> list[Draft]:
    """Known Object: every HOI labelled +1 or -1 in the image, in HOI order (no sampling, ``rng`` unused)."""
    drafts = []
    for hoi in sorted(labels.positives | labels.negatives):
        verb, obj = vocab.verb_of[hoi], vocab.object_of[hoi]
        drafts.append(Draft(_yes_no_obj_prompt(verb, obj), "yes" if hoi in labels.positives else "no", verb, obj, hoi))
    return drafts


#: How each of HICO's sets (:data:`verbmirage.benchmark.question_sets.QUESTION_SETS`: its kind, what it asks)
#: drafts one image's questions.
BUILDERS: dict[str, Callable[[ImageLabels, Vocabulary, QuestionSettings, np.random.Generator], list[Draft]]] = {
    "yn_obj": build_yn_obj,
    "yn_verb": build_yn_verb,
    "mc_obj": build_mc_obj,
    "mc_verb": build_mc_verb,
    "obj_exist": build_obj_exist,
    "yn_ko": build_yn_ko,
}




def rare_hois(train_labels: np.ndarray, vocab: Vocabulary, threshold: float) -> frozenset[int]:
    """HOIs with fewer than ``threshold`` of their object's training positives (paper, Fig. 3)."""
    positives = (train_labels == 1).sum(axis=0)
    rare = set()
    for hois in vocab.hois_of_object.values():
        total = positives[list(hois)].sum()
        rare |= {h for h in hois if total > 0 and positives[h] / total < threshold}
    return frozenset(rare)


def image_labels(anno: HicoAnnotations, split: str, vocab: Vocabulary,
                 rows: Iterable[int] | None = None) -> list[ImageLabels]:
    """Label sets of every image of a split (or of its images at positions ``rows``)."""
    names, labels = anno.images[split], anno.labels[split]
    return [
        ImageLabels.from_row(names[i].rsplit(".", 1)[0], anno.image_relpath(split, names[i]), labels[i], vocab)
        for i in (range(len(names)) if rows is None else rows)
    ]


def build_question_set(
    anno: HicoAnnotations, qset: str, settings: QuestionSettings, dataset: str = "hico",
    images: Collection[str] | None = None, workers: int = 1,
) -> pd.DataFrame:
    """All questions of one set, one row per question (per rotation for MC).

    The images are those of ``settings.split``; ``images`` (file names of that split) keeps only those,
    e.g. the training images of a calibration set (``verbmirage.variants.decisions``), built by the same protocol.
    ``workers``: see :func:`build_question_sets`.
    """
    return build_question_sets(anno, [qset], settings, dataset, images, workers)[qset]


def build_question_sets(
    anno: HicoAnnotations, qsets: Iterable[str], settings: QuestionSettings, dataset: str = "hico",
    images: Collection[str] | None = None, workers: int = 1,
) -> dict[str, pd.DataFrame]:
    """Several sets at once (the same tables as :func:`build_question_set` one by one): the vocabulary,
    the rare HOIs and every image's label sets are computed once for all of them.

    ``workers`` > 1 splits the images into that many contiguous shares, built at the same time in forked
    processes (this one builds the first). Every image has its own random stream, so the tables are the same
    for any number of workers; where ``fork`` is unavailable, or the split has fewer than
    ``MIN_IMAGES_PER_WORKER`` images per share, the sets are built here alone.
    """
    qsets = list(qsets)
    for qset in qsets:
        if qset not in BUILDERS:
            raise KeyError(f"unknown question set '{qset}'; known: {sorted(BUILDERS)}")
    vocab = Vocabulary.from_hois(anno.hois)
    rare = rare_hois(anno.labels["train"], vocab, settings.rare_threshold)
    chosen = None if images is None else {anno.image_relpath(settings.split, name) for name in images}
    rows = [i for i, name in enumerate(anno.images[settings.split])
            if chosen is None or anno.image_relpath(settings.split, name) in chosen]
    shares = image_shares(rows, workers)
    job = _QuestionJob(anno, vocab, rare, tuple(qsets), settings, dataset)
    if len(shares) == 1:
        parts = [job.frames(shares[0])]
    else:
        global _FORKED_JOB
        _FORKED_JOB = job  # the forked workers inherit it: nothing large is pickled on the way out
        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(len(shares) - 1, mp_context=context) as pool:
                others = [pool.submit(_forked_share_frames, share) for share in shares[1:]]
                parts = [job.frames(shares[0])] + [future.result() for future in others]
        finally:
            _FORKED_JOB = None
    return {qset: _joined_shares([part[qset] for part in parts], qset, settings) for qset in qsets}


#: The fewest images a worker of ``build_question_sets`` gets: below this, forking costs more than it saves.
MIN_IMAGES_PER_WORKER = 1000
_FORKED_JOB = None


def image_shares(rows: list[int], workers: int) -> list[list[int]]:
    """``rows`` cut into at most ``workers`` contiguous shares of at least MIN_IMAGES_PER_WORKER images."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    count = max(1, min(workers, len(rows) // MIN_IMAGES_PER_WORKER))
    bounds = np.linspace(0, len(rows), count + 1).round().astype(int)
    return [rows[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def _forked_share_frames(rows: list[int]) -> dict[str, pd.DataFrame]:
    return _FORKED_JOB.frames(rows)


QUESTION_COLUMNS = ("question_id", "dataset", "qset", "image_id", "image", "verb", "object", "hoi_id", "prompt",
                    "options", "answer", "group_id", "rotation", "rare", "common")


@dataclass(frozen=True)
class _QuestionJob:
    """What every share of ``build_question_sets`` needs; ``frames`` drafts one share's rows of each set."""

    anno: HicoAnnotations
    vocab: Vocabulary
    rare: frozenset[int]
    qsets: tuple[str, ...]
    settings: QuestionSettings
    dataset: str

    def frames(self, rows: list[int]) -> dict[str, pd.DataFrame]:
        labels = image_labels(self.anno, self.settings.split, self.vocab, rows)
        return {qset: _question_frame(labels, self.vocab, self.rare, qset, self.settings, self.dataset)
                for qset in self.qsets}


def _question_frame(images: list[ImageLabels], vocab: Vocabulary, rare: frozenset[int], qset: str,
                    settings: QuestionSettings, dataset: str) -> pd.DataFrame:
    """One set's rows on some images, image by image in split order, collected column by column (one dict per
    row costs more than the drafting itself at HICO's 100K+ rows)."""
    builder = BUILDERS[qset]
    common = set(settings.common_verbs)
    columns: dict[str, list] = {name: [] for name in QUESTION_COLUMNS}
    question_ids, group_ids, image_ids, image_names = (columns[name] for name in
                                                       ("question_id", "group_id", "image_id", "image"))
    verbs, objects, hoi_ids, prompts = (columns[name] for name in ("verb", "object", "hoi_id", "prompt"))
    options, answers, rotations = columns["options"], columns["answer"], columns["rotation"]
    for labels in images:
        drafts = builder(labels, vocab, settings, named_rng(settings.seed, qset, labels.image_id))
        groups: dict[tuple, str] = {}  # an MC group's id, hashed once for its rotations
        for draft in drafts:
            question_id = content_hash(dataset, qset, labels.image, draft.prompt, draft.options, draft.answer)
            question_ids.append(question_id)
            if draft.options:
                group_id = groups.get(draft.group_key)
                if group_id is None:
                    group_id = groups[draft.group_key] = content_hash(dataset, qset, labels.image, *draft.group_key)
                group_ids.append(group_id)
            else:
                group_ids.append(question_id)
            verbs.append(draft.verb)
            objects.append(draft.object)
            hoi_ids.append(draft.hoi_id)
            prompts.append(draft.prompt)
            options.append(draft.options)
            answers.append(draft.answer)
            rotations.append(draft.rotation)
        image_ids += [labels.image_id] * len(drafts)
        image_names += [labels.image] * len(drafts)
    columns["dataset"] = [dataset] * len(question_ids)
    columns["qset"] = [qset] * len(question_ids)
    columns["rare"] = [hoi is not None and hoi in rare for hoi in hoi_ids]
    columns["common"] = [verb in common for verb in verbs]
    frame = pd.DataFrame(columns)
    frame["hoi_id"] = frame["hoi_id"].astype("Int64")
    return frame


def _joined_shares(parts: list[pd.DataFrame], qset: str, settings: QuestionSettings) -> pd.DataFrame:
    """One set's table from its shares' rows, in share order; an empty or duplicated set is an error."""
    parts = [part for part in parts if len(part)]  # an empty share's columns have no dtypes to agree on
    if not parts:
        raise ValueError(f"question set '{qset}' is empty: no {settings.split} image has a usable positive label")
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    duplicated = frame.question_id.duplicated()
    if duplicated.any():
        raise AssertionError(f"duplicate question ids in {qset}: {frame.question_id[duplicated].head().tolist()}")
    return frame


# ---- a fixed sample of a set's questions (an API model asked N questions per set: paper Fig. 1) ----------


