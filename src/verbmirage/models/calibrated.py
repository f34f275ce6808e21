"""A loaded model whose yes/no (or letter) decision passes through a calibrated-decision rule
(docs/variants.md, "Calibrated decisions"; the fitting numerics are in :mod:`verbmirage.variants.decisions`).

Inference applies a rule through :func:`decision_model`, a wrapper around the loaded model, so every backend
that returns scores (transformers, remote-code adapters, the API) calibrates the same way. The calibrated rows
keep ``raw_answer`` and ``confidence``; ``p_yes``/``yes_margin``/``option_probs`` become the calibrated scores and
``parse_rule`` is ``calibrated:threshold`` or ``calibrated:content_free``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from verbmirage.benchmark.calibration import content_free_paths
from verbmirage.benchmark.question_sets import calibration_qsets
from verbmirage.benchmark.sampling import content_hash
from verbmirage.core.paths import file_digest
from verbmirage.models.base import (
    NO,
    UNKNOWN,
    YES,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
    score_questions,
)
from verbmirage.variants.decisions import (
    CONTENT_FREE_RULE,
    THRESHOLD_RULE,
    logit,
    mean_probability_margin,
    read_cuts,
    sigmoid,
)
from verbmirage.variants.settings import Variant


def margin_of(result: YesNoResult) -> float:
    """The YN score the decisions cut: ``yes_margin``, else ``logit(p_yes)`` (backends without logits); NaN if none."""
    if result.yes_margin is not None and not math.isnan(result.yes_margin):
        return float(result.yes_margin)
    p_yes = result.p_yes
    return math.nan if p_yes is None else logit(float(p_yes))


def apply_threshold(result: YesNoResult, cut: float) -> YesNoResult:
    """``result`` decided by ``margin >= cut``; its scores shifted by the cut (``yes_margin - cut``)."""
    if result.error is not None:
        return result
    margin = margin_of(result)
    return _shifted(result, margin, cut, THRESHOLD_RULE, decide_yes=None if math.isnan(margin) else margin >= cut)


def _shifted(result: YesNoResult, margin: float, shift: float, rule: str, decide_yes: bool | None) -> YesNoResult:
    """The YN result with calibrated margin ``margin - shift`` and the given decision (None: "unknown")."""
    with np.errstate(invalid="ignore"):
        calibrated = margin - shift  # NaN when undefined, or when both are the same infinity
    if decide_yes is None:
        return replace(result, prediction=UNKNOWN, parse_rule=rule, p_yes=math.nan, yes_margin=None)
    return replace(
        result,
        prediction=YES if decide_yes else NO,
        parse_rule=rule,
        p_yes=sigmoid(calibrated) if not math.isnan(calibrated) else float(decide_yes),
        yes_margin=calibrated if math.isfinite(calibrated) else None,
    )


def content_free_yes_no(result: YesNoResult, content_free_margins: Sequence[float]) -> YesNoResult:
    """``margin' = margin - margin_cf`` (margin_cf: log-odds of the averaged content-free probabilities);
    yes iff margin' >= 0, "unknown" where margin' is undefined. A uniform p_cf (margin_cf = 0) changes no score."""
    if result.error is not None:
        return result
    margin, shift = margin_of(result), mean_probability_margin(content_free_margins)
    with np.errstate(invalid="ignore"):
        calibrated = margin - shift
    return _shifted(result, margin, shift, CONTENT_FREE_RULE,
                    decide_yes=None if math.isnan(calibrated) else bool(calibrated >= 0))


def content_free_choice(result: MultipleChoiceResult,
                        content_free_probs: Sequence[Sequence[float]]) -> MultipleChoiceResult:
    """Option probabilities divided by the averaged content-free ones, renormalised; the argmax letter
    (the first on ties). Undefined (NaN, or a content-free probability of 0) -> "unknown"."""
    if result.error is not None:
        return result
    probs = np.asarray(result.option_probs, dtype=np.float64)
    p_cf = np.mean(np.asarray(content_free_probs, dtype=np.float64), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        weighted = probs / p_cf
        total = weighted.sum()
        calibrated = weighted / total
    if len(p_cf) != len(probs) or not np.isfinite(calibrated).all() or not total > 0:
        return replace(result, prediction=UNKNOWN, parse_rule=CONTENT_FREE_RULE,
                       option_probs=tuple(math.nan for _ in probs))
    return replace(result, prediction=option_letter(int(np.argmax(calibrated))), parse_rule=CONTENT_FREE_RULE,
                   option_probs=tuple(float(p) for p in calibrated))


class ThresholdRule:
    """Applies each question set's fitted cut to its YN answers (question id -> set from ``question_sets``)."""

    def __init__(self, cuts: Mapping[str, float], question_sets: Mapping[str, str]):
        self.cuts, self.question_sets = dict(cuts), question_sets
        self.fingerprint = {"method": "threshold", "cuts": {q: repr(float(c)) for q, c in sorted(self.cuts.items())}}

    def decide(self, questions: Sequence[Question], multiple_choice: Sequence[bool], results: list) -> list:
        decided = []
        for question, mc, result in zip(questions, multiple_choice, results):
            cut = self.cuts.get(self.question_sets.get(question.question_id))
            decided.append(result if mc or cut is None else apply_threshold(result, cut))
        return decided


class ContentFreeRule:
    """Scores each distinct prompt once on the content-free images (with the loaded model) and calibrates by it."""

    def __init__(self, model: VisionLanguageModel, images: Mapping[str, Path]):
        self.model, self.images = model, dict(images)
        self._cache: dict[tuple, list] = {}  # (kind, prompt, options) -> the content-free results, one per image
        self.fingerprint = {"method": "content_free",
                            "images": {name: file_digest(path) for name, path in sorted(self.images.items())}}

    @staticmethod
    def _key(question: Question, mc: bool) -> tuple:
        return ("mc" if mc else "yn", question.prompt, tuple(question.options))

    def _score_missing(self, questions: Sequence[Question], multiple_choice: Sequence[bool]) -> dict:
        """Score the prompts not yet cached on every content-free image; a failed one is not cached (the next
        batch that needs it asks again) and is returned: key -> its first failed result."""
        missing = {}
        for question, mc in zip(questions, multiple_choice):
            missing.setdefault(self._key(question, mc), (question, mc))
        missing = {key: value for key, value in missing.items() if key not in self._cache}
        asked, flags = [], []
        for (kind, prompt, options), (question, mc) in missing.items():
            for name, path in self.images.items():
                question_id = f"content_free/{name}/{content_hash(kind, prompt, options)}"
                asked.append(replace(question, question_id=question_id, image=path))
                flags.append(mc)
        # only the scores of the content-free answers are used: no decoding past the first answer token
        continue_tokens = self.model.continue_tokens
        if continue_tokens is not None:
            self.model.continue_tokens = 0
        try:
            results = score_questions(self.model, asked, flags) if asked else []
        finally:
            if continue_tokens is not None:
                self.model.continue_tokens = continue_tokens
        failures, per_key = {}, len(self.images)
        for index, key in enumerate(missing):
            chunk = results[index * per_key : (index + 1) * per_key]
            failed = [r for r in chunk if r.error is not None]
            if failed:
                failures[key] = failed[0]
            else:
                self._cache[key] = chunk
        return failures

    def decide(self, questions: Sequence[Question], multiple_choice: Sequence[bool], results: list) -> list:
        failures = self._score_missing(questions, multiple_choice)
        decided = []
        for question, mc, result in zip(questions, multiple_choice, results):
            key = self._key(question, mc)
            if key in failures:  # no reference answer: the question fails too (retried if the failure may pass)
                error, retry = f"content-free image: {failures[key].error}", failures[key].retry
                decided.append(MultipleChoiceResult.failed(len(question.options), error, retry) if mc
                               else YesNoResult.failed(error, retry))
            elif mc:
                decided.append(content_free_choice(result, [r.option_probs for r in self._cache[key]]))
            else:
                decided.append(content_free_yes_no(result, [margin_of(r) for r in self._cache[key]]))
        return decided


class CalibratedModel(VisionLanguageModel):
    """A loaded model whose answers pass through a decision rule; everything else is the model's own."""

    checks_scores = False  # the model's own methods checked them; a rule renames a text-scored answer's rule

    def __init__(self, model: VisionLanguageModel, rule):
        super().__init__(model.name)
        self.model, self.rule = model, rule
        self.backend, self.uses_images, self.variant = model.backend, model.uses_images, model.variant

    @property
    def mixed_kinds(self) -> bool:
        return self.model.mixed_kinds

    @property
    def continue_tokens(self) -> int | None:
        return self.model.continue_tokens

    @continue_tokens.setter
    def continue_tokens(self, value: int) -> None:
        self.model.continue_tokens = value

    def __getattr__(self, name):  # attributes the wrapper does not define (the engine's processor, ...)
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def _score_yes_no(self, questions):
        return self.rule.decide(questions, [False] * len(questions), self.model.score_yes_no(questions))

    def _score_multiple_choice(self, questions):
        return self.rule.decide(questions, [True] * len(questions), self.model.score_multiple_choice(questions))

    def score_mixed(self, questions, multiple_choice):
        return self.rule.decide(questions, list(multiple_choice), self.model.score_mixed(questions, multiple_choice))

    def use_batch_size(self, batch_size: int) -> int:
        return self.model.use_batch_size(batch_size)

    def memory_costs(self):
        return self.model.memory_costs()

    def device_path(self) -> dict | None:
        return self.model.device_path()

    def fingerprint_extra(self) -> dict:
        return {**self.model.fingerprint_extra(), "decision": self.rule.fingerprint}

    def close(self) -> None:
        self.model.close()


def decision_model(model: VisionLanguageModel, variant: Variant, question_sets: Mapping[str, str],
                   dataset: str, decision_input: str | Path | None) -> VisionLanguageModel:
    """``model`` deciding by ``variant.decision`` (itself when the variant has none).

    ``question_sets``: question id -> set of the job's questions. ``decision_input``: the cuts file
    (threshold; required when the job asks a set of :func:`calibration_qsets`) or the content-free images
    folder (content_free).
    """
    settings = variant.decision
    if settings is None:
        return model
    if settings.method == "threshold":
        needed = calibration_qsets(dataset, sorted(set(question_sets.values())))
        cuts = read_cuts(decision_input) if decision_input else {}
        missing = sorted(set(needed) - set(cuts))
        if missing:
            raise ValueError(f"decision threshold: no fitted cut for question set(s) {missing} "
                             f"(cuts file: {decision_input or 'none given'})")
        rule = ThresholdRule({q: cuts[q] for q in needed}, question_sets)
    else:
        if not decision_input:
            raise ValueError("decision content_free: no content-free images folder given")
        rule = ContentFreeRule(model, content_free_paths(decision_input, settings.content_free_images))
    return CalibratedModel(model, rule)
