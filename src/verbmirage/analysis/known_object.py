"""Known-Object mAP (paper: "mAP vs Acc", Fig. 11; HICO's official Known Object protocol).

Does a model that hallucinates verbs still *rank* them well? Each HOI h is a
ranking task over the test images that contain h's object (question set
``yn_ko``: label +1 is "yes", -1 is "no", ambiguous labels are dropped), scored
by the model's ``yes_margin`` (logsumexp(z[yes]) - logsumexp(z[no])).

- **Score**: ``yes_margin``; where it is null, logit(``p_yes``) (the same scale,
  ±inf where P(yes) is exactly 1 or 0); a question without an answer (no row,
  an error row) ranks last. Equal scores keep the question-table order
  (images in ``list_test`` order), as MATLAB's stable ``sort`` in HICO's
  evaluation does.
- **AP** per HOI, on that one ranking: ``ap`` non-interpolated,
  sum over positives of the precision at their rank / n_pos (= scikit-learn's
  ``average_precision_score`` when scores are distinct; with ties sklearn pools
  a tie block, we keep the stable order); ``ap_voc11`` the VOC2007 11-point AP of
  ``eval_pr_score_label.m``: mean over t in {0, 0.1, ..., 1} of the highest
  precision at a recall >= t, compared exactly (10·tp >= k·n_pos) so that
  floating-point 0.3 cannot drop a recall of 3/10.
- **mAP** = mean over the asked HOIs (every HOI with a positive); ``rare`` /
  ``non_rare`` means over HICO-DET's rare HOIs (< 10 training instances: the
  instances JSON's ``rare`` list, or counted from ``anno_bbox.mat``), or, without
  HICO-DET boxes, the question table's ``rare`` flag (our own rule; the
  provenance and the log name the definition used).
- **Interval**: resample test images with replacement, recompute every AP
  (a drawn image's questions appear as many times as it was drawn, copies
  adjacent), drop HOIs without a positive in that replicate, take the
  percentile interval of the replicate mAPs.

The numbers are written as fractions; the figure and the tables show percent.
The paper: LLaVA-1.5 68.41, HICO-finetuned CLIP 60.45 (``PAPER_MAP``, by the paper's model name).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.analysis.figure_layout import fit_title, page_figure, page_style, save_figure
from verbmirage.analysis.known_object_settings import KnownObjectError
from verbmirage.benchmark.conditions import condition_questions
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import KNOWN_OBJECT_AP, METRICS, PREDICTIONS
from verbmirage.data.hico import hoi_vocabulary, load_hico_det_mat
from verbmirage.data.hico_files import HICO_DET_MAT
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

log = logging.getLogger(__name__)

#: The paper's Known-Object mAP (percent; the packaged paper_tables.csv rows ``hoi_known_object``), by the
#: paper's model name: a model's ``paper_name`` finds its row, by the tables' one pairing rule
#: (``paper_numbers.paper_names_from_config``: a ``paper_method`` model, e.g. a Nullu LLaVA, is not the paper's).
_PAPER = load_paper_numbers(packaged_paper_numbers())
PAPER_MAP = {model: float(value) for model, value in
             _PAPER[_PAPER.qset.eq("hoi_known_object")][["model", "value"]].itertuples(index=False)}
PAPER_LLAVA, PAPER_CLIP = "LLaVA-1.5-7B", "CLIP (HICO-finetuned)"  # Fig. 11's pair
#: HICO-DET: an HOI is rare with fewer than this many training instances (Chao et al. 2018).
RARE_INSTANCES = 10
SUBSETS = ("all", "rare", "non_rare")
METRIC_OF = {"ap": "map", "ap_voc11": "map_voc11"}
RECALL_POINTS = 11


# ---- scores and the per-HOI rankings ----------------------------------------------------------------
def ranking_scores(questions: pd.DataFrame, predictions: pd.DataFrame, score: str = "margin"
                   ) -> tuple[np.ndarray, dict]:
    """The score of each question (in ``questions`` order) and counts of where it came from.

    ``margin``: ``yes_margin``, else logit(``p_yes``), else -inf (no answer: ranked last). ``yes_mass``: the
    stored P(Yes) over the whole vocabulary, -inf where a row has none; a model that stores it on no row (CLIP,
    blind baselines, parsed text) is ranked by its margin instead (counted as ``yes_mass_absent``).
    """
    extra = set(predictions.question_id) - set(questions.question_id)
    if extra:
        raise KnownObjectError(f"{len(extra)} predictions answer no known question, e.g. {sorted(extra)[:3]}")
    table = predictions.set_index("question_id")
    if score == "yes_mass" and "yes_mass" in table and table["yes_mass"].notna().any():
        mass = questions.question_id.map(table["yes_mass"]).to_numpy(dtype=float)
        return np.where(np.isnan(mass), -np.inf, mass), {"yes_mass": int(np.isfinite(mass).sum()),
                                                        "no_score": int(np.isnan(mass).sum())}
    margin_scores, counts = _margin_scores(questions, table)
    return margin_scores, {**counts, "yes_mass_absent": 1} if score == "yes_mass" else counts


def _margin_scores(questions: pd.DataFrame, table: pd.DataFrame) -> tuple[np.ndarray, dict]:
    margin = questions.question_id.map(table["yes_margin"]).to_numpy(dtype=float)
    p_yes = questions.question_id.map(table["p_yes"]).to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logit = np.log(p_yes) - np.log1p(-p_yes)
    score = np.where(np.isnan(margin), logit, margin)
    counts = {
        "yes_margin": int(np.isfinite(margin).sum()),
        "p_yes_fallback": int((np.isnan(margin) & ~np.isnan(p_yes)).sum()),
        "no_score": int(np.isnan(score).sum()),
    }
    return np.where(np.isnan(score), -np.inf, score), counts


@dataclass(frozen=True)
class _Rankings:
    """Every HOI's ranking, concatenated: rows sorted by (HOI, score descending, question-table position)."""

    group: np.ndarray  # HOI index (0..n_groups-1) of each sorted row
    positive: np.ndarray  # bool
    score: np.ndarray
    image: np.ndarray  # image index of each sorted row
    n_groups: int

    @classmethod
    def build(cls, group: np.ndarray, positive: np.ndarray, score: np.ndarray, image: np.ndarray, n_groups: int):
        position = np.arange(len(group))
        order = np.lexsort((position, -np.asarray(score, float), group))  # last key sorts first
        return cls(np.asarray(group)[order], np.asarray(positive, bool)[order], np.asarray(score, float)[order],
                   np.asarray(image)[order], n_groups)

    def resampled(self, image_counts: np.ndarray) -> "_Rankings":
        """The rankings with image i present ``image_counts[i]`` times (copies adjacent: order kept)."""
        take = np.repeat(np.arange(len(self.group)), image_counts[self.image])
        return _Rankings(self.group[take], self.positive[take], self.score[take], self.image[take], self.n_groups)

    def average_precisions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per HOI: (n, n_pos, ap, ap_voc11); AP is NaN for an HOI without a positive."""
        return grouped_average_precision(self.group, self.positive, self.n_groups)

    def tied_rows(self) -> np.ndarray:
        """Per HOI: rows whose score equals another row's score in the same HOI."""
        same = (self.score[1:] == self.score[:-1]) & (self.group[1:] == self.group[:-1])
        tied = np.zeros(len(self.group), bool)
        tied[1:] |= same
        tied[:-1] |= same
        return np.bincount(self.group, weights=tied, minlength=self.n_groups).astype(int)


def grouped_average_precision(group: np.ndarray, positive: np.ndarray, n_groups: int):
    """(n, n_pos, ap, ap_voc11) per group of rows already sorted by (group, rank).

    Vectorised over all groups at once (the bootstrap recomputes every AP
    hundreds of times); :func:`average_precision` is the one-ranking reference.
    """
    group = np.asarray(group, np.int64)
    y = np.asarray(positive, bool).astype(np.int64)
    n = np.bincount(group, minlength=n_groups)
    n_pos = np.bincount(group, weights=y, minlength=n_groups).astype(np.int64)
    ap, ap11 = np.full(n_groups, np.nan), np.full(n_groups, np.nan)
    if len(group) == 0:
        return n, n_pos, ap, ap11
    starts = np.searchsorted(group, np.arange(n_groups))
    tp_all, fp_all = np.cumsum(y), np.cumsum(1 - y)
    tp_before = np.concatenate([[0], tp_all])[starts]
    fp_before = np.concatenate([[0], fp_all])[starts]
    tp, fp = tp_all - tp_before[group], fp_all - fp_before[group]
    precision = tp / (tp + fp)
    has_pos = n_pos > 0
    summed = np.bincount(group, weights=precision * y, minlength=n_groups)
    ap[has_pos] = summed[has_pos] / n_pos[has_pos]
    # precision envelope: the highest precision at this rank or later, within the group
    offset = 2.0 * (n_groups - 1 - group)  # grows along the reversed rows, so the running max restarts per group
    envelope = np.maximum.accumulate((precision + offset)[::-1])[::-1] - offset
    positives_at = np.flatnonzero(y)
    first_positive = np.concatenate([[0], np.cumsum(n_pos)])[:-1]  # index into positives_at per group
    chosen = np.flatnonzero(has_pos)
    total = np.zeros(len(chosen))
    for k in range(RECALL_POINTS):
        needed = (k * n_pos[chosen] + RECALL_POINTS - 2) // (RECALL_POINTS - 1)  # ceil(k·n_pos/10): recall >= k/10
        rows = np.where(needed == 0, starts[chosen],
                        positives_at[np.minimum(first_positive[chosen] + np.maximum(needed, 1) - 1,
                                                len(positives_at) - 1)])
        total += envelope[rows]
    ap11[chosen] = total / RECALL_POINTS
    return n, n_pos, ap, ap11


def average_precision(scores, labels) -> tuple[float, float]:
    """(ap, ap_voc11) of one HOI under the Known-Object rule: only labels +1 and -1 count.

    ``labels`` as in HICO's ``anno_test``: 1 positive, -1 negative, 0 ambiguous
    and NaN (object absent) dropped. Ties keep the given order.
    """
    scores, labels = np.asarray(scores, float), np.asarray(labels, float)
    keep = (labels == 1) | (labels == -1)
    ranking = _Rankings.build(np.zeros(keep.sum(), np.int64), labels[keep] == 1, scores[keep],
                              np.zeros(keep.sum(), np.int64), 1)
    _, _, ap, ap11 = ranking.average_precisions()
    return float(ap[0]), float(ap11[0])


# ---- rare HOIs --------------------------------------------------------------------------------------
def hico_det_rare(det_root: str | Path) -> tuple[frozenset[int], str]:
    """HICO-DET's rare HOIs (0-based) and how they were found.

    The instances JSON (fredzzhang/hicodet) lists them (``rare``); from
    ``anno_bbox.mat`` they are counted: fewer than 10 visible training pairs.
    """

    det_root = Path(det_root)
    if (det_root / HICO_DET_MAT).is_file():
        boxes = load_hico_det_mat(det_root)
        pairs = boxes.pairs[boxes.pairs.split.eq("train") & boxes.pairs.human_box.notna()]
        counts = pairs.groupby("hoi_id").size()
        rare = {h for h in range(len(hoi_vocabulary())) if counts.get(h, 0) < RARE_INSTANCES}
        return frozenset(rare), f"HICO-DET: < {RARE_INSTANCES} training pairs in {HICO_DET_MAT}"
    for name in ("instances_test2015.json", "instances_train2015.json"):
        path = det_root / name
        if path.is_file():
            try:
                listed = json.loads(path.read_text()).get("rare")
                rare = frozenset(int(h) for h in listed)
            except (OSError, ValueError, TypeError, AttributeError) as error:
                raise KnownObjectError(f"{path}: no readable 'rare' list of HOI indices ({error})") from None
            return rare, f"HICO-DET rare list ({path.name})"
    raise KnownObjectError(f"datasets.hico.det_root: {det_root} holds neither {HICO_DET_MAT} nor an instances JSON")


QUESTION_TABLE_RARE = "question table 'rare' (share of the object's training positives < questions.rare_threshold; ours)"


# ---- the analysis -----------------------------------------------------------------------------------
@dataclass
class _Prepared:
    questions: pd.DataFrame
    hois: pd.DataFrame  # hoi_id, verb, object, rare (one row per asked HOI, group order)
    group: np.ndarray
    positive: np.ndarray
    image: np.ndarray
    n_images: int


def _prepare(questions: pd.DataFrame, rare: frozenset[int] | None) -> _Prepared:
    if questions.empty:
        raise KnownObjectError("no questions to rank")
    if questions.hoi_id.isna().any():
        row = int(questions.hoi_id.isna().to_numpy().argmax())
        raise KnownObjectError(f"question {questions.question_id.iloc[row]}: no hoi_id, so no HOI to rank it in")
    questions = questions.reset_index(drop=True)
    hoi_ids = questions.hoi_id.astype(int).to_numpy()
    ids, group = np.unique(hoi_ids, return_inverse=True)
    first = questions.drop_duplicates("hoi_id").set_index("hoi_id")
    flags = [h in rare for h in ids] if rare is not None else [bool(first.at[h, "rare"]) for h in ids]
    hois = pd.DataFrame({"hoi_id": ids, "verb": [first.at[h, "verb"] for h in ids],
                         "object": [first.at[h, "object"] for h in ids], "rare": flags})
    images, image = np.unique(questions.image_id.to_numpy(), return_inverse=True)
    return _Prepared(questions, hois, group, questions.answer.eq("yes").to_numpy(), image, len(images))


def _subset_masks(hois: pd.DataFrame) -> dict[str, np.ndarray]:
    rare = hois.rare.to_numpy(bool)
    return {"all": np.ones(len(hois), bool), "rare": rare, "non_rare": ~rare}


def evaluate_run(
    questions: pd.DataFrame,
    predictions: pd.DataFrame,
    keys: dict,
    rare: frozenset[int] | None = None,
    resamples: int = 200,
    seed: int = 0,
    level: float = 0.95,
    score: str = "margin",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """AP per HOI (``io.KNOWN_OBJECT_AP`` rows) and mAP rows (``io.METRICS``) of one prediction table, its
    answers ranked by ``score`` (:func:`ranking_scores`).

    ``keys``: dataset, qset, condition, model, variant. ``rare``: HICO-DET's rare
    HOIs, or None to use the question table's ``rare`` flag.
    """
    prepared = _prepare(questions, rare)
    ranked_by = score
    score, counts = ranking_scores(prepared.questions, predictions, ranked_by)
    log.info("%s: ranked by %s (%s)", "/".join(str(v) for v in keys.values()), ranked_by,
             ", ".join(f"{name} {count}" for name, count in counts.items()))
    rankings = _Rankings.build(prepared.group, prepared.positive, score, prepared.image, len(prepared.hois))
    n, n_pos, ap, ap11 = rankings.average_precisions()
    table = prepared.hois.assign(n_pos=n_pos, n=n, ap=ap, ap_voc11=ap11, n_tied_scores=rankings.tied_rows())
    for position, column in enumerate(("dataset", "condition", "model", "variant")):
        table.insert(position, column, keys[column])
    masks = _subset_masks(prepared.hois)
    replicates = _bootstrap(rankings, prepared.n_images, masks, resamples, seed)
    rows = []
    for subset, mask in masks.items():
        chosen = mask & (n_pos > 0)
        if not chosen.any():
            continue
        for column, metric in METRIC_OF.items():
            value = float(np.mean((ap if column == "ap" else ap11)[chosen]))
            low, high = _interval(replicates.get((subset, column)), level)
            rows.append({**keys, "subset": subset, "metric": metric, "value": value, "ci_low": low,
                         "ci_high": high, "n": int(chosen.sum())})
    return table, pd.DataFrame(rows, columns=[*keys, "subset", "metric", "value", "ci_low", "ci_high", "n"])


def _bootstrap(rankings: _Rankings, n_images: int, masks: dict, resamples: int, seed: int) -> dict:
    """(subset, ap column) -> replicate mAPs over resampled images (HOIs without a positive dropped)."""
    if resamples <= 0 or n_images < 2:
        return {}
    rng = np.random.default_rng(seed)
    values = {(subset, column): [] for subset in masks for column in METRIC_OF}
    for _ in range(resamples):
        image_counts = np.bincount(rng.integers(0, n_images, n_images), minlength=n_images)
        _, n_pos, ap, ap11 = rankings.resampled(image_counts).average_precisions()
        for subset, mask in masks.items():
            chosen = mask & (n_pos > 0)
            for column, per_hoi in (("ap", ap), ("ap_voc11", ap11)):
                values[(subset, column)].append(float(np.mean(per_hoi[chosen])) if chosen.any() else np.nan)
    return {key: np.asarray(v) for key, v in values.items()}


def _interval(replicates: np.ndarray | None, level: float) -> tuple[float, float]:
    if replicates is None:
        return math.nan, math.nan
    finite = replicates[np.isfinite(replicates)]
    if len(finite) < 2:
        return math.nan, math.nan
    tail = (1 - level) / 2
    return float(np.quantile(finite, tail)), float(np.quantile(finite, 1 - tail))


def known_object_job(
    questions_path, prediction_paths: dict, output_ap, output_metrics, settings: dict, dataset: str = "hico",
    images_dirs: dict | None = None, det_root: str | Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The workflow's job: every configured (condition, model, variant) -> the AP table and the mAP rows.

    ``prediction_paths``: "condition/model/variant" -> prediction table; ``images_dirs``: condition ->
    its image folder where the condition covers only some images (crop), so only their questions count.
    """

    questions = read_table(questions_path, QUESTIONS)
    if det_root:
        rare, definition = hico_det_rare(det_root)
    else:
        rare, definition = None, QUESTION_TABLE_RARE
    log.info("rare HOIs: %s", definition)
    tables, metrics = [], []
    for key, path in prediction_paths.items():
        condition, model, variant = key.split("/")
        asked = questions
        if images_dirs and images_dirs.get(condition):
            asked = condition_questions(questions, images_dirs[condition])
        keys = {"dataset": dataset, "qset": settings["qset"], "condition": condition, "model": model,
                "variant": variant}
        table, rows = evaluate_run(asked, read_table(path, PREDICTIONS), keys, rare,
                                   settings["bootstrap_resamples"], settings["seed"], settings["confidence_level"],
                                   settings.get("score", "margin"))
        tables.append(table)
        metrics.append(rows)
        summary = rows[rows.subset.eq("all")].set_index("metric").value
        log.info("%s: mAP %.2f, mAP (VOC 11-point) %.2f over %d HOIs", key, 100 * summary.get("map", math.nan),
                 100 * summary.get("map_voc11", math.nan), int(rows.n.iloc[0]) if len(rows) else 0)
    provenance = {"known_object": settings, "rare_definition": definition}
    write_table(pd.concat(tables, ignore_index=True), output_ap, KNOWN_OBJECT_AP, provenance=provenance)
    write_table(pd.concat(metrics, ignore_index=True), output_metrics, METRICS, provenance=provenance)
    return pd.concat(tables, ignore_index=True), pd.concat(metrics, ignore_index=True)


# ---- Fig. 11 ----------------------------------------------------------------------------------------
def ap_differences(ap_table: pd.DataFrame, model: str, reference: str, condition: str, variant: str,
                   column: str = "ap_voc11") -> pd.DataFrame:
    """Per HOI asked of both: ``delta`` = AP(model) - AP(reference), sorted descending (ties by HOI id)."""
    rows = ap_table[ap_table.condition.eq(condition) & ap_table.variant.eq(variant) & ap_table.n_pos.gt(0)]
    ours = rows[rows.model.eq(model)].set_index("hoi_id")[column]
    theirs = rows[rows.model.eq(reference)].set_index("hoi_id")[column]
    both = pd.DataFrame({"model": ours, "reference": theirs}).dropna()
    both["delta"] = both.model - both.reference
    return both.reset_index().sort_values(["delta", "hoi_id"], ascending=[False, True], kind="stable")


def map_label(model: str, value: float, paper_name: str = "") -> str:
    """``model`` and its mAP in percent, and the paper's mAP beside it only where ``paper_name`` (the
    model's ``paper_name``, the rule of the tables) is a model the paper measured."""
    text = f"{model} {100 * value:.2f}"
    return text + (f" (paper {paper_name}: {PAPER_MAP[paper_name]:.2f})" if paper_name in PAPER_MAP else "")


@page_style()  # the whole drawing in the page's fonts
def draw_known_object_figure(ap_table: pd.DataFrame, metrics: pd.DataFrame, reference: str, path: str | Path,
                             metric: str = "map_voc11", paper_names: dict[str, str] | None = None,
                             notes: dict[str, str] | None = None) -> None:
    """Fig. 11: ΔAP per HOI (each model minus ``reference``), sorted bars, one panel per model/condition/variant.

    The title of a panel gives both mAPs, the share of HOIs with Δ > 0 and, where the paper has
    one for the model (its ``paper_name``, as in the tables), the paper's mAP; the dashed line is our mean Δ
    (= the mAP difference on the shared HOIs), the dotted one the paper's 68.41 - 60.45. The panels stand one
    under the other on a page (:mod:`verbmirage.analysis.figure_layout`), saved as PNG, PDF and SVG.
    """
    paper_names, notes = paper_names or {}, notes or {}
    column = {v: k for k, v in METRIC_OF.items()}[metric]
    runs = ap_table[["condition", "variant", "model"]].drop_duplicates()
    panels = [(c, v, m) for c, v, m in runs.itertuples(index=False) if m != reference]
    mean_map = metrics[metrics.subset.eq("all") & metrics.metric.eq(metric)].set_index(
        ["condition", "variant", "model"]).value
    paper_delta = PAPER_MAP[PAPER_LLAVA] - PAPER_MAP[PAPER_CLIP]

    def label(model: str, condition: str, variant: str) -> str:
        return map_label(model, mean_map.get((condition, variant, model), math.nan), paper_names.get(model, ""))

    heading = (f"Fig. 11: Known-Object AP per HOI class, model minus {reference}"
               + (f" - {notes[reference]}" if notes.get(reference) else ""))
    figure, axes = page_figure(len(panels), columns=1, panel_height=3.0, heading=heading)
    for axis, (condition, variant, model) in zip(axes, panels):
        delta = ap_differences(ap_table, model, reference, condition, variant, column)
        values = 100 * delta.delta.to_numpy()
        colours = np.where(values > 0, "tab:blue", "tab:red")
        axis.bar(np.arange(len(values)), values, width=1.0, color=colours)
        axis.axhline(0, color="black", linewidth=0.6)
        if len(values):
            axis.axhline(values.mean(), color="black", linestyle="--", linewidth=0.8,
                         label=f"ours: mean ΔAP {values.mean():+.2f}")
        axis.axhline(paper_delta, color="grey", linestyle=":", linewidth=1.0,
                     label=f"paper: {PAPER_MAP[PAPER_LLAVA]:.2f} - {PAPER_MAP[PAPER_CLIP]:.2f} = {paper_delta:+.2f}")
        share = float((values > 0).mean()) if len(values) else math.nan
        fit_title(axis, f"{label(model, condition, variant)} vs {label(reference, condition, variant)} "
                        f"[{metric}, {condition}, {variant}]; ΔAP > 0 on {share:.0%} of {len(values)} HOIs"
                        + (f"\n{notes[model]}" if notes.get(model) else ""))
        axis.set_xlim(-0.5, max(len(values), 1) - 0.5)
        axis.set_xlabel("HOI classes, sorted by ΔAP")
        axis.set_ylabel(f"ΔAP = AP({model}) - AP({reference})")
        axis.legend(loc="upper right")
    if not panels:
        axes[0].text(0.5, 0.5, f"only the reference model {reference} is configured", ha="center",
                     transform=axes[0].transAxes)
    save_figure(figure, path)
