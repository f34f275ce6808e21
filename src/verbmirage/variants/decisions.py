"""Calibrated decisions on a model's scores: beyond the paper, training-free (docs/variants.md, "Calibrated decisions").

A variant with ``decision: {method: ...}`` (:class:`~verbmirage.variants.settings.DecisionSettings`) keeps the model's
scores and replaces its yes/no (or letter) decision:

- ``threshold``: predict yes iff ``yes_margin >= cut``, where the cut maximises ``metric`` (accuracy, or F1
  with yes as positive) on a calibration set: the benchmark's YN protocol on ``calibration_images`` seeded
  *training* images (:func:`build_calibration_set`, never a test image). One cut per (model, variant,
  condition, YN question set), fitted by :func:`calibrate` in a job of its own (``results/calibration/``).
  MC rows, and YN sets without a calibration set (CharadesEgo), keep the plain decision.
- ``content_free`` (contextual calibration, Zhao et al. 2021): the same prompt is scored on content-free
  images (a grey ``blank`` and the ``mean`` of training images, :func:`write_content_free_images`); their
  probability vectors are averaged, p_cf, and the answer's probabilities are divided by p_cf and
  renormalised (W = diag(p_cf)^-1). For YN that is exactly ``margin - margin_cf``. Computed once per
  distinct prompt per job.

The calibrated rows keep ``raw_answer`` (the model's text) and ``confidence`` (its answer token's
probability); ``p_yes``/``yes_margin``/``option_probs`` become the calibrated scores and ``parse_rule`` is
``calibrated:threshold`` or ``calibrated:content_free``. ``yes_margin`` is ``logsumexp(yes) - logsumexp(no)``
where the backend has logits, else ``logit(p_yes)`` (:func:`margin_of`).

Inference applies a rule through :func:`decision_model`, a wrapper around the loaded model, so every backend
that returns scores (transformers, remote-code adapters, the API) calibrates the same way.
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from verbmirage.data.hico import NO_INTERACTION, HicoAnnotations
from verbmirage.core.imaging import open_rgb
from verbmirage.core.io import PREDICTIONS, QUESTIONS, atomic_path, read_table
from verbmirage.models.base import (
    NO,
    UNKNOWN,
    YES,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
)
from verbmirage.core.paths import file_digest
from verbmirage.benchmark.questions import QUESTION_SETS, QuestionSettings, build_question_set, content_hash
from verbmirage.variants.settings import DecisionSettings, Variant

log = logging.getLogger(__name__)

THRESHOLD_RULE = "calibrated:threshold"
CONTENT_FREE_RULE = "calibrated:content_free"
METRICS = ("accuracy", "f1")
#: The blank content-free image: uniform mid grey, of the typical size of the calibration training images
#: (their median width and height; real HICO images: 640 x 480, measured on the test split's sizes).
BLANK_GREY = (128, 128, 128)
CONTENT_FREE_FILES = {"blank": "blank.png", "mean": "mean.png"}
CONTENT_FREE_INFO = "content_free.json"


# ---- scores ------------------------------------------------------------------------------------------------
def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)) without overflow; NaN stays NaN."""
    if math.isnan(x):
        return math.nan
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def logit(p: float) -> float:
    """log(p / (1 - p)): +-inf at 1 and 0, NaN outside [0, 1] or for NaN."""
    if p is None or not 0.0 <= p <= 1.0:
        return math.nan
    if p == 0.0:
        return -math.inf
    if p == 1.0:
        return math.inf
    return math.log(p) - math.log1p(-p)


def margin_of(result: YesNoResult) -> float:
    """The YN score the decisions cut: ``yes_margin``, else ``logit(p_yes)`` (backends without logits); NaN if none."""
    if result.yes_margin is not None and not math.isnan(result.yes_margin):
        return float(result.yes_margin)
    p_yes = result.p_yes
    return math.nan if p_yes is None else logit(float(p_yes))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def mean_probability_margin(margins: Sequence[float]) -> float:
    """The yes-vs-no log-odds of the *averaged* probability vectors (p_i = sigmoid(m_i)), computed in log space.

    Averaging probabilities, not margins, is what the reference code of contextual calibration does.
    """
    m = np.asarray(margins, dtype=np.float64)
    log_yes = -_softplus(-m)  # log sigmoid(m)
    log_no = -_softplus(m)  # log (1 - sigmoid(m))
    return float(np.logaddexp.reduce(log_yes) - np.logaddexp.reduce(log_no))


# ---- threshold ---------------------------------------------------------------------------------------------
def candidate_cuts(margins: np.ndarray) -> np.ndarray:
    """Every cut that gives distinct predictions (``yes iff margin >= cut``), ascending: the distinct defined
    margins, then the next float above the largest (all "no" here, yet a finite shift that keeps the
    calibrated scores ranked: a higher margin elsewhere still says yes)."""
    margins = np.asarray(margins, dtype=np.float64)
    defined = margins[~np.isnan(margins)]
    above = np.nextafter(defined.max(), np.inf) if len(defined) else np.inf
    return np.unique(np.append(defined, above))


def metric_at_cuts(margins: np.ndarray, is_yes: np.ndarray, cuts: np.ndarray, metric: str) -> np.ndarray:
    """``metric`` of the predictions ``margin >= cut`` for each cut (rows with NaN margins left out), vectorised.

    Counts by binary search over the sorted margins of each class, so a fit costs O(n log n).
    """
    if metric not in METRICS:
        raise ValueError(f"decision.metric: '{metric}' is not one of {list(METRICS)}")
    margins, is_yes = np.asarray(margins, dtype=np.float64), np.asarray(is_yes, dtype=bool)
    defined = ~np.isnan(margins)
    positives, negatives = np.sort(margins[defined & is_yes]), np.sort(margins[defined & ~is_yes])
    cuts = np.asarray(cuts, dtype=np.float64)
    tp = len(positives) - np.searchsorted(positives, cuts, side="left")
    fp = len(negatives) - np.searchsorted(negatives, cuts, side="left")
    fn, tn = len(positives) - tp, len(negatives) - fp
    if metric == "accuracy":
        total = len(positives) + len(negatives)
        return (tp + tn) / total if total else np.full(len(cuts), np.nan)
    denominator = 2 * tp + fp + fn
    return np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)


@dataclass(frozen=True)
class ThresholdFit:
    """A fitted cut and what it achieves on its calibration set (written to the cuts file)."""

    cut: float
    metric: str
    metric_at_cut: float
    #: The plain score-based decision (P(yes) >= 0.5, i.e. margin >= 0) on the same questions.
    metric_at_zero: float
    n: int
    n_yes: int
    #: Calibration rows without a score (errors, a backend without yes/no mass): left out of the fit.
    undefined: int


def fit_threshold(margins, answers, metric: str = "accuracy") -> ThresholdFit:
    """The cut on ``margins`` maximising ``metric`` against ``answers`` ("yes"/"no"); ties -> the smallest cut."""
    margins = np.asarray(margins, dtype=np.float64)
    answers = np.asarray(answers)
    if not np.isin(answers, [YES, NO]).all():
        raise ValueError(f"calibration answers must be 'yes' or 'no', got {sorted(set(answers) - {YES, NO})}")
    is_yes = answers == YES
    defined = ~np.isnan(margins)
    if not defined.any():
        raise ValueError("no calibration question has a score (every margin is undefined): cannot fit a cut")
    cuts = candidate_cuts(margins)
    scores = metric_at_cuts(margins, is_yes, cuts, metric)
    best = int(np.argmax(scores))  # the first maximum of the ascending cuts: the smallest cut
    return ThresholdFit(
        cut=float(cuts[best]),
        metric=metric,
        metric_at_cut=float(scores[best]),
        metric_at_zero=float(metric_at_cuts(margins, is_yes, np.array([0.0]), metric)[0]),
        n=int(defined.sum()),
        n_yes=int((is_yes & defined).sum()),
        undefined=int((~defined).sum()),
    )


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


# ---- content-free (contextual) calibration ---------------------------------------------------------------------
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


# ---- rules applied to a job's answers ---------------------------------------------------------------------
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
        from verbmirage.inference.runs import score_questions

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
        continue_tokens = getattr(self.model, "continue_tokens", None)
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
        return getattr(self.model, "mixed_kinds", False)

    def __getattr__(self, name):  # attributes the wrapper does not define (e.g. continue_tokens)
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

    def fingerprint_extra(self) -> dict:
        return {**self.model.fingerprint_extra(), "decision": self.rule.fingerprint}

    def close(self) -> None:
        self.model.close()


def calibration_qsets(dataset: str, qsets) -> list[str]:
    """The sets among ``qsets`` that get a threshold: HICO's YN sets (CharadesEgo has no calibration set)."""
    return [q for q in qsets if dataset == "hico" and q in QUESTION_SETS and QUESTION_SETS[q].kind == "yn"]


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


# ---- calibration data: training images only ------------------------------------------------------------------
CALIBRATION_STREAM = "calibration"


def calibration_images(anno: HicoAnnotations, count: int, seed: int) -> list[str]:
    """``count`` training image names (a seeded draw among those with a positive HOI), sorted.

    The same images for every calibration set and for the mean content-free image; never a test image.
    """
    hois = anno.hois
    interaction = np.asarray(hois.verb != NO_INTERACTION)
    labels = anno.labels["train"]
    usable = [name for name, row in zip(anno.images["train"], labels) if (row[interaction] == 1).any()]
    if not usable:
        raise ValueError(f"{anno.root}: no training image has a positive label: no calibration set")
    rng = np.random.default_rng([seed, zlib.crc32(CALIBRATION_STREAM.encode())])
    chosen = rng.choice(len(usable), size=min(count, len(usable)), replace=False)
    return sorted(usable[i] for i in chosen)


def check_training_only(frame: pd.DataFrame, anno: HicoAnnotations, where: str = "calibration set") -> None:
    """Raise if any row asks about a test image (by path or by name)."""
    test_paths = {anno.image_relpath("test", name) for name in anno.images["test"]}
    test_ids = {name.rsplit(".", 1)[0] for name in anno.images["test"]}
    train_paths = {anno.image_relpath("train", name) for name in anno.images["train"]}
    leaked = frame[frame.image.isin(test_paths) | frame.image_id.isin(test_ids) | ~frame.image.isin(train_paths)]
    if len(leaked):
        raise ValueError(f"{where}: {len(leaked)} rows ask about an image that is not a training image, "
                         f"e.g. {leaked.image.iloc[0]!r} (calibration must never see a test image)")


def build_calibration_set(anno: HicoAnnotations, qset: str, settings: QuestionSettings, count: int,
                          dataset: str = "hico") -> pd.DataFrame:
    """The calibration questions of a YN set: the benchmark's protocol on :func:`calibration_images`."""
    if qset not in QUESTION_SETS or QUESTION_SETS[qset].kind != "yn":
        raise ValueError(f"calibration sets are built for HICO's YN sets, not '{qset}'")
    names = calibration_images(anno, count, settings.seed)
    frame = build_question_set(anno, qset, replace(settings, split="train"), dataset, images=names)
    check_training_only(frame, anno, f"calibration set {qset}")
    return frame


# ---- content-free images -------------------------------------------------------------------------------------
def typical_size(paths: Sequence[Path]) -> tuple[int, int]:
    """The median width and height of the images (headers only)."""
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    widths, heights = zip(*sizes)
    return int(np.median(widths)), int(np.median(heights))


def mean_image(paths: Sequence[Path], size: tuple[int, int]) -> Image.Image:
    """The per-pixel mean of the images, each resized (bilinear) to ``size``, rounded to 8 bits."""
    total = np.zeros((size[1], size[0], 3), dtype=np.float64)
    for path in paths:
        total += np.asarray(open_rgb(path).resize(size, Image.BILINEAR), dtype=np.float64)
    return Image.fromarray(np.rint(total / len(paths)).clip(0, 255).astype(np.uint8))


def write_content_free_images(root: str | Path, anno: HicoAnnotations, count: int, seed: int,
                              out_dir: str | Path) -> dict:
    """``blank.png`` (uniform :data:`BLANK_GREY`) and ``mean.png`` (the mean of :func:`calibration_images`),
    both of the calibration images' typical size, plus a JSON note of how they were made. Returns the note."""
    names = calibration_images(anno, count, seed)
    paths = [Path(root) / anno.image_relpath("train", name) for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"content-free mean image: {len(missing)} training images are missing, "
                                f"e.g. {missing[0]}")
    size = typical_size(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = {"blank": Image.new("RGB", size, BLANK_GREY), "mean": mean_image(paths, size)}
    for name, image in images.items():
        with atomic_path(out_dir / CONTENT_FREE_FILES[name]) as tmp:
            image.save(tmp, format="PNG")
    note = {"size": list(size), "blank_grey": list(BLANK_GREY), "mean_of": len(names), "seed": seed,
            "images": [anno.image_relpath("train", name) for name in names]}
    with atomic_path(out_dir / CONTENT_FREE_INFO) as tmp:
        tmp.write_text(json.dumps(note, indent=1))
    return note


def content_free_paths(folder: str | Path, names: Sequence[str]) -> dict[str, Path]:
    """The configured content-free images (``content_free_images``) in their folder; a missing one is an error."""
    paths = {}
    for name in names:
        if name not in CONTENT_FREE_FILES:
            raise ValueError(f"decision.content_free_images: '{name}' is not one of {sorted(CONTENT_FREE_FILES)}")
        path = Path(folder) / CONTENT_FREE_FILES[name]
        if not path.is_file():
            raise FileNotFoundError(f"content-free image '{name}' not found: {path}")
        paths[name] = path
    return paths


# ---- the calibration job ---------------------------------------------------------------------------------------
def _encode(value: float):
    """JSON has no infinity: an infinite cut (only where a margin is infinite) is written as "inf" / "-inf"."""
    return value if math.isfinite(value) else repr(value)


def write_cuts(path: str | Path, fits: Mapping[str, ThresholdFit], about: dict) -> None:
    document = {**about, "cuts": {q: {**asdict(fit), "cut": _encode(fit.cut),
                                      "p_yes_cut": sigmoid(fit.cut) if not math.isnan(fit.cut) else None}
                                  for q, fit in fits.items()}}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True))


def read_cuts(path: str | Path) -> dict[str, float]:
    """Question set -> cut, from a cuts file (:func:`write_cuts`); a malformed file is an error naming it."""
    try:
        document = json.loads(Path(path).read_text())
        return {qset: float(entry["cut"]) for qset, entry in document["cuts"].items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a cuts file of a threshold calibration ({type(error).__name__}: {error})") \
            from None


def fit_cuts(questions: Mapping[str, pd.DataFrame], answers: Mapping[str, pd.DataFrame],
             metric: str) -> dict[str, ThresholdFit]:
    """One :class:`ThresholdFit` per set from its calibration questions and the model's answers to them."""
    fits = {}
    for qset, table in questions.items():
        rows = table[["question_id", "answer"]].merge(answers[qset], on="question_id", how="left", validate="1:1")
        margins = [margin_of(YesNoResult(p_yes=np.nan if pd.isna(r.p_yes) else float(r.p_yes), prediction="",
                                         raw_answer="", confidence=np.nan, parse_rule="",
                                         yes_margin=None if pd.isna(r.yes_margin) else float(r.yes_margin)))
                   if pd.isna(r.error) else math.nan
                   for r in rows.itertuples(index=False)]
        fits[qset] = fit_threshold(margins, rows.answer.to_numpy(), metric)
    return fits


def plain_variant_settings(variant_settings: dict) -> dict:
    """The variant's settings without its decision: how the calibration questions are scored."""
    return {key: value for key, value in variant_settings.items() if key != "decision"}


def calibrate(questions_paths: Mapping[str, str | Path], images_dir: str | Path, model_slug: str,
              model_settings: dict, variant_settings: dict, answers_dir: str | Path, cuts_path: str | Path,
              about: dict | None = None, **suite_options) -> dict[str, ThresholdFit]:
    """Ask the model the calibration sets (:func:`~verbmirage.inference.runs.run_suite`, resumable, one job) with the
    variant's decoding but no decision, fit one cut per set and write the cuts file.

    Only the scores of the answers are used, so nothing is decoded past the first answer token
    (``continue_tokens`` 0: the answers' ``prediction`` is "unknown" where that token is neither yes nor no).
    """
    from verbmirage.inference.runs import run_suite, suite_table

    variant = Variant.from_config(variant_settings, where=f"variants (calibration of {model_slug})")
    settings: DecisionSettings | None = variant.decision
    if settings is None or settings.method != "threshold":
        raise ValueError(f"calibration of {model_slug}: the variant has no threshold decision ({variant_settings})")
    questions = {qset: read_table(path, QUESTIONS) for qset, path in questions_paths.items()}
    run_suite(dict(questions_paths), images_dir, model_slug, model_settings, plain_variant_settings(variant_settings),
              0, 1, answers_dir, **{**suite_options, "continue_tokens": 0})
    answers = {qset: read_table(suite_table(answers_dir, qset), PREDICTIONS) for qset in questions}
    fits = fit_cuts(questions, answers, settings.metric)
    for qset, fit in fits.items():
        log.info("%s: cut %.4g (P(yes) >= %.3f): %s %.4f, at 0: %.4f (n=%d, %d yes, %d undefined)", qset, fit.cut,
                 sigmoid(fit.cut), fit.metric, fit.metric_at_cut, fit.metric_at_zero, fit.n, fit.n_yes, fit.undefined)
    write_cuts(cuts_path, fits, {"model": model_slug, "method": "threshold", "metric": settings.metric,
                                 "calibration_images": settings.calibration_images, **(about or {})})
    return fits


# ---- planning (read by rules/common.smk; nothing heavy) ---------------------------------------------------------
def decision_plan(config: dict) -> dict:
    """Which variants decide how, and the one number of calibration images they share.

    One calibration set per question set (``results/benchmark/hico/calibration/<qset>.parquet``) and one mean
    image serve every decision variant, so they must agree on ``calibration_images``.
    """
    variants = {slug: Variant.from_config(entry, f"variants.{slug}") for slug, entry in config["variants"].items()}
    decisions = {slug: v.decision for slug, v in variants.items() if v.decision is not None}
    counts = {slug: d.calibration_images for slug, d in decisions.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"variants.*.decision.calibration_images: every decision variant must use the same number "
                         f"(one calibration set per question set), got {counts}")
    return {
        "threshold": [slug for slug, d in decisions.items() if d.method == "threshold"],
        "content_free": [slug for slug, d in decisions.items() if d.method == "content_free"],
        "calibration_images": next(iter(counts.values()), DecisionSettings("threshold").calibration_images),
    }
