"""Field of view (paper Fig. 10): full image vs crops around the interaction, on the same questions.

The paper asks MC questions about HICO images with one small HOI instance, once on the full image and
once on crops of several sizes, and finds that accuracy and token uncertainty barely change. Here:

- Questions: the ``fov.qsets`` rows whose image is ``single_instance`` (HICO-DET tags) and that every
  ``fov.conditions`` prediction table answers; an MC group counts only with all its rotations. So every
  condition is scored on exactly the same question ids.
- Accuracy per condition: plain (rotation 0) and circular (every rotation) for MC; plain only for YN.
  Error rows count as wrong, as in the metrics.
- Confidence u: the ``confidence`` column of the models that have a token probability
  (:func:`~verbmirage.analysis.uncertainty_settings.token_probability_models`), rows with an error dropped.
  ``delta_conf_mean`` = mean over rows usable in both of u(condition) - u(reference), the reference
  being the first FOV condition (the full image); its interval is a percentile bootstrap over images
  (``metrics.score_with_interval``).
- ``crop_area_frac``: the crop's area over the image's, from the same union box and
  :func:`~verbmirage.benchmark.condition_types.crop_box` the crop condition cuts with (1 for a full-image condition);
  ``crop_area_frac_mean`` averages it over the shared images.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

import pandas as pd

from verbmirage.analysis.uncertainty import confidence_rows, mean_from_sums
from verbmirage.benchmark.condition_types import CONDITIONS, crop_box, image_settings
from verbmirage.benchmark.question_sets import question_kind
from verbmirage.evaluation.metrics import BootstrapSettings, mc_group_correctness, score_with_interval

log = logging.getLogger(__name__)

FOV_COLUMNS = ["model", "variant", "qset", "condition", "margin", "crop_area_frac_mean", "n", "n_groups",
               "acc_plain", "acc_circular", "conf_mean", "conf_mean_correct", "conf_mean_hallucinated",
               "delta_conf_mean", "delta_ci_low", "delta_ci_high"]
ROW_COLUMNS = ["model", "variant", "qset", "condition", "question_id", "image_id", "group_id", "correct",
               "confidence"]
PAPER_NOTE = "The paper gives Fig. 10 only (no numbers), so there is no published value to set beside these."


def crop_area_fractions(tags: pd.DataFrame, settings: dict) -> pd.Series:
    """image_id -> area of the image a condition shows / the full image's area, for the single-instance images.

    A box condition (``crop``) cuts the union box plus ``margin`` with :func:`crop_box`, exactly as the
    condition does; any other condition shows the whole image (1.0).
    """
    single = tags[tags.single_instance.astype(bool)]
    spec = CONDITIONS[settings["type"]]
    if not spec.needs_boxes:
        return pd.Series(1.0, index=pd.Index(single.image_id, name="image_id"))
    params = {k: v for k, v in image_settings(settings).items() if k != "type"}
    fractions = {}
    for row in single.itertuples(index=False):
        left, upper, right, lower = crop_box((row.union_x1, row.union_y1, row.union_x2, row.union_y2),
                                             int(row.width), int(row.height), **params)
        fractions[row.image_id] = (right - left) * (lower - upper) / (row.width * row.height)
    return pd.Series(fractions, dtype=float).rename_axis("image_id")


def shared_questions(questions: pd.DataFrame, tags: pd.DataFrame,
                     predictions: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The questions every FOV condition is scored on: single-instance images, answered under every
    condition, and (MC) only groups with all their rotations left."""
    single = set(tags.image_id[tags.single_instance.astype(bool)])
    keep = questions.image_id.isin(single)
    for frame in predictions.values():
        keep &= questions.question_id.isin(set(frame.question_id))
    chosen = questions[keep]
    if len(chosen) and question_kind(chosen.qset.iloc[0]) == "mc":
        complete = questions[questions.image_id.isin(single)].groupby("group_id").size()
        kept = chosen.groupby("group_id").size()
        whole = kept.index[kept.eq(complete.reindex(kept.index))]
        chosen = chosen[chosen.group_id.isin(whole)]
    return chosen.reset_index(drop=True)


def _accuracies(rows: pd.DataFrame, kind: str) -> tuple[float, float, int]:
    """(plain, circular, groups): MC from its groups; YN has no circular accuracy."""
    if rows.empty:
        return math.nan, math.nan, 0
    if kind == "yn":
        return float(rows.correct.mean()), math.nan, 0
    groups = mc_group_correctness(rows.assign(prediction=rows.prediction.where(rows.error.isna(), "unknown")))
    return float(groups.plain_correct.mean()), float(groups.circular_correct.mean()), len(groups)


def _paired_delta(reference: pd.DataFrame, other: pd.DataFrame,
                  bootstrap: BootstrapSettings) -> tuple[float, float, float]:
    """Mean of u(other) - u(reference) over rows usable in both, with an image-bootstrap interval."""
    both = reference[["question_id", "image_id", "confidence"]].merge(
        other[["question_id", "confidence"]], on="question_id", suffixes=("_ref", "_other")
    ).dropna(subset=["confidence_ref", "confidence_other"])
    if both.empty:
        return math.nan, math.nan, math.nan
    both["delta"] = both.confidence_other - both.confidence_ref
    per_image = both.groupby("image_id", sort=True).delta.agg(["sum", "count"]).to_numpy(float)
    value, low, high = score_with_interval(per_image, mean_from_sums, bootstrap)
    return float(value[0]), float(low[0]), float(high[0])


def fov_tables(
    runs: Iterable[tuple[dict, pd.DataFrame, Mapping[str, pd.DataFrame]]],
    tags: pd.DataFrame,
    conditions: Mapping[str, dict],
    bootstrap: BootstrapSettings,
    token_models: Iterable[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``fov.parquet`` rows and the question rows behind them.

    ``runs``: ``(keys, questions, {condition: predictions})`` with ``keys`` = ``model, variant, qset``;
    ``conditions``: slug -> config entry, in FOV order (the first is the reference); ``token_models``:
    the models whose ``confidence`` is a token probability (the others get accuracies only).
    """
    token_models = set(token_models)
    order = list(conditions)
    areas = {c: crop_area_fractions(tags, settings) for c, settings in conditions.items()}
    summary, question_rows = [], []
    for keys, questions, predictions in runs:
        shared = shared_questions(questions, tags, predictions)
        kind = question_kind(keys["qset"])
        images = shared.image_id.unique()
        rows = {}
        for condition in order:
            answered = predictions[condition]
            frame = confidence_rows(shared, answered[answered.question_id.isin(set(shared.question_id))],
                                    f"predictions of {keys} under {condition}")
            if keys["model"] not in token_models:  # a baseline's own prior is no token probability
                frame["confidence"] = math.nan
            rows[condition] = frame
            question_rows.append(frame.assign(**keys, condition=condition)[ROW_COLUMNS])
        for condition in order:
            frame = rows[condition]
            plain, circular, groups = _accuracies(frame, kind)
            confidence = frame.confidence.dropna()
            correct = frame.confidence[frame.correct].dropna()
            wrong = frame.confidence[~frame.correct].dropna()
            delta = (math.nan,) * 3 if condition == order[0] else _paired_delta(rows[order[0]], frame, bootstrap)
            area = areas[condition].reindex(images)
            summary.append({
                **keys, "condition": condition,
                "margin": float(conditions[condition].get("margin", 0.1)) if CONDITIONS[
                    conditions[condition]["type"]].needs_boxes else math.nan,
                "crop_area_frac_mean": float(area.mean()) if len(area) else math.nan,
                "n": len(frame), "n_groups": groups, "acc_plain": plain, "acc_circular": circular,
                "conf_mean": float(confidence.mean()) if len(confidence) else math.nan,
                "conf_mean_correct": float(correct.mean()) if len(correct) else math.nan,
                "conf_mean_hallucinated": float(wrong.mean()) if len(wrong) else math.nan,
                "delta_conf_mean": delta[0], "delta_ci_low": delta[1], "delta_ci_high": delta[2],
            })
        log.info("fov: %s: %d shared question rows on %d images", keys, len(shared), len(images))
    rows_table = pd.concat(question_rows, ignore_index=True) if question_rows else pd.DataFrame(columns=ROW_COLUMNS)
    return pd.DataFrame(summary, columns=FOV_COLUMNS), rows_table


def fov_report_table(fov: pd.DataFrame) -> pd.DataFrame:
    """The FOV table: per model, variant, question set and crop, the full image beside the crop (percent).

    Accuracy (plain, circular) and mean confidence on the full image and the crop, and their change
    (crop - full; the confidence change is the paired mean with its image-bootstrap interval).
    """
    columns = ["model", "variant", "qset", "crop", "margin", "crop_area_pct", "n", "plain_full", "plain_crop",
               "plain_change", "circular_full", "circular_crop", "circular_change", "conf_full", "conf_crop",
               "conf_change", "conf_change_ci_low", "conf_change_ci_high"]
    out = []
    for (model, variant, qset), part in fov.groupby(["model", "variant", "qset"], sort=False):
        full, crops = part.iloc[0], part.iloc[1:]
        for crop in crops.itertuples(index=False):
            out.append({
                "model": model, "variant": variant, "qset": qset, "crop": crop.condition, "margin": crop.margin,
                "crop_area_pct": 100 * crop.crop_area_frac_mean, "n": crop.n,
                "plain_full": 100 * full.acc_plain, "plain_crop": 100 * crop.acc_plain,
                "plain_change": 100 * (crop.acc_plain - full.acc_plain),
                "circular_full": 100 * full.acc_circular, "circular_crop": 100 * crop.acc_circular,
                "circular_change": 100 * (crop.acc_circular - full.acc_circular),
                "conf_full": 100 * full.conf_mean, "conf_crop": 100 * crop.conf_mean,
                "conf_change": 100 * crop.delta_conf_mean,
                "conf_change_ci_low": 100 * crop.delta_ci_low, "conf_change_ci_high": 100 * crop.delta_ci_high,
            })
    return pd.DataFrame(out, columns=columns)
