"""The calibration job of the ``threshold`` decision rule: answer the calibration set with the plain variant,
fit one cut per YN question set (:func:`verbmirage.variants.decisions.fit_threshold`), write the cuts file
(docs/variants.md, "Calibrated decisions").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.io import read_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.inference.runs import RunSpec, run_suite, suite_table
from verbmirage.models.base import YesNoResult
from verbmirage.models.calibrated import margin_of
from verbmirage.variants.decisions import ThresholdFit, fit_threshold, sigmoid, write_cuts
from verbmirage.variants.settings import DecisionSettings, Variant

log = logging.getLogger(__name__)


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


def calibrate(questions_paths: Mapping[str, str | Path], answers_dir: str | Path, cuts_path: str | Path,
              spec: RunSpec, about: dict | None = None) -> dict[str, ThresholdFit]:
    """Ask the model the calibration sets (:func:`~verbmirage.inference.runs.run_suite`, resumable, one job) with the
    variant's decoding but no decision, fit one cut per set and write the cuts file.

    Only the scores of the answers are used, so nothing is decoded past the first answer token
    (``continue_tokens`` 0: the answers' ``prediction`` is "unknown" where that token is neither yes nor no).
    """

    model_slug, variant_settings = spec.model_slug, spec.variant_settings
    variant = Variant.from_config(variant_settings, where=f"variants (calibration of {model_slug})")
    settings: DecisionSettings | None = variant.decision
    if settings is None or settings.method != "threshold":
        raise ValueError(f"calibration of {model_slug}: the variant has no threshold decision ({variant_settings})")
    questions = {qset: read_table(path, QUESTIONS) for qset, path in questions_paths.items()}
    plain = replace(spec, variant_settings=plain_variant_settings(variant_settings), shard=0, n_shards=1,
                    continue_tokens=0, decision_input=None)
    run_suite(dict(questions_paths), answers_dir, plain)
    answers = {qset: read_table(suite_table(answers_dir, qset), PREDICTIONS) for qset in questions}
    fits = fit_cuts(questions, answers, settings.metric)
    for qset, fit in fits.items():
        log.info("%s: cut %.4g (P(yes) >= %.3f): %s %.4f, at 0: %.4f (n=%d, %d yes, %d undefined)", qset, fit.cut,
                 sigmoid(fit.cut), fit.metric, fit.metric_at_cut, fit.metric_at_zero, fit.n, fit.n_yes, fit.undefined)
    write_cuts(cuts_path, fits, {"model": model_slug, "method": "threshold", "metric": settings.metric,
                                 "calibration_images": settings.calibration_images, **(about or {})})
    return fits
