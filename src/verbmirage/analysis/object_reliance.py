"""Object reliance (paper Fig. 15, Tables 6 and 7): how naming the object changes a model's verb answers.

Each verb question is attributed to the objects it is about (``ref_objects``):
``yn_obj``/``mc_obj`` name one object; a ``yn_verb`` question asked "yes" is
about the objects the verb is done with in the image, one asked "no" about the
present objects that made the verb a plausible negative (a HICO HOI with it);
an ``mc_verb`` group about the objects of its correct verb. A question counts
once for each object it is attributed to (ours: the paper only says it
"split YN question sets according to object classes").

- Fig. 15: per object, Δ_YN = acc(yn_obj) − acc(yn_verb).
- Table 6: S1 = {o : Δ_YN(o) > τ_obj}, S2 = {o : Δ_MC(o) > τ_obj} (circular
  accuracy), overlap index = |S1 ∩ S2| / min(|S1|, |S2|).
- Table 7: per verb, Δ(v) = yes-ratio(yn_obj) − yes-ratio(yn_verb); the
  influenced set W = {v : |Δ(v)| ≥ τ_verb}; IoU between every two models.

Only objects (verbs) with at least ``min_questions`` questions in both sets
enter a set; a set that is empty gives NaN (0/0), never 0 or 1. Values are
fractions; the tables print percent, as the paper does (its numbers are x100).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.analysis.figure_layout import FONT, PAGE_WIDTH, n_label, page_figure, page_style, save_figure
from verbmirage.analysis.object_reliance_settings import RELIANCE_QSETS, RelianceError, RelianceSettings
from verbmirage.benchmark.questions import Vocabulary, image_labels
from verbmirage.core.io import MISSING_VALUE
from verbmirage.data.hico import HicoAnnotations
from verbmirage.evaluation.metrics import join_predictions, mc_group_correctness
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT, load_paper_numbers, packaged_paper_numbers

OVERLAP_METRIC = "influential_object_overlap_index"  # the keys paper_tables.csv uses (Table 6)
IOU_METRIC = "influenced_verb_set_iou"  # (Table 7)
OVERLAP_QSET = "yn+mc"
IOU_QSET = "yn"
PAIR_SEPARATOR = "~"  # metric rows of Table 7 name the model pair "a~b"

# The paper's numbers (x100; its default decoding was beam search), from the packaged paper_tables.csv.
_PAPER = load_paper_numbers(packaged_paper_numbers())
PAPER_TABLE6 = {row.model: row.value for row in _PAPER[_PAPER.table.eq("6")].itertuples()}
PAPER_TABLE7 = {tuple(row.model.split(PAIR_SEPARATOR)): row.value for row in _PAPER[_PAPER.table.eq("7")].itertuples()}
# Fig. 15 is mPLUG-Owl2's; the text gives its overall YN accuracy with / without the object (Table 1).
_FIG15 = _PAPER[_PAPER.table.eq("1") & _PAPER.model.eq("mPLUG-Owl2") & _PAPER.metric.eq("accuracy")]
PAPER_FIG15 = {"model": "mPLUG-Owl2", **{f"{row.qset}_accuracy": row.value for row in _FIG15.itertuples()
                                         if row.qset in ("yn_obj", "yn_verb")}}

#: Fig. 15's objects per panel: their names at 8 pt, turned upright, side by side across the page (36).
OBJECTS_PER_PANEL = int((PAGE_WIDTH - 0.9) / (FONT * 1.5 / 72))

# Sets compare floats with a tolerance, so that e.g. .9 − .8 counts as ≥ .1 (the values are ratios of counts).
_TOLERANCE = 1e-9


# ---- attribution -----------------------------------------------------------------------------------------
def attribute_objects(questions: pd.DataFrame, anno: HicoAnnotations, split: str = "test",
                      where: str = "questions") -> pd.DataFrame:
    """``questions`` with a ``ref_objects`` column: the objects each question is about (module docstring).

    The labels are the split's HICO labels the questions were built from; a question that no label
    explains (an image the labels lack, a verb not done there) is an error naming it.
    """
    vocab = Vocabulary.from_hois(anno.hois)
    labels = {item.image_id: item for item in image_labels(anno, split, vocab)}
    refs = []
    for row, (question_id, qset, image_id, verb, obj, answer) in enumerate(zip(
            questions.question_id, questions.qset, questions.image_id, questions.verb, questions.object,
            questions.answer)):
        if qset in ("yn_obj", "mc_obj"):
            objects = [obj] if isinstance(obj, str) else []
        elif qset in ("yn_verb", "mc_verb"):
            if image_id not in labels:
                raise RelianceError(f"{where}, row {row} (question {question_id}): image '{image_id}' is not in "
                                    f"the HICO {split} labels")
            image = labels[image_id]
            if qset == "yn_verb" and answer == "no":
                objects = sorted(image.present_objects & vocab.objects_of_verb.get(verb, frozenset()))
            else:  # yn_verb yes, or mc_verb's correct verb
                objects = sorted({vocab.object_of[i] for i in image.positives if vocab.verb_of[i] == verb})
        else:
            raise RelianceError(f"{where}, row {row}: question set '{qset}' is not one of {RELIANCE_QSETS}")
        if not objects:
            raise RelianceError(f"{where}, row {row} (question {question_id}, {qset}, image '{image_id}', verb "
                                f"'{verb}', answer {answer!r}): no object explains it in the HICO labels; were the "
                                "questions built from this anno.mat?")
        refs.append(objects)
    return questions.assign(ref_objects=refs)


# ---- per-object accuracy (Fig. 15, Table 6) ----------------------------------------------------------------
def yes_no_units(questions: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per YN question: ``ref_objects``, ``verb``, ``answer``, ``correct``, ``said_yes``.

    A missing or failed prediction is "unknown": wrong, and not a yes (as in the metrics table).
    """
    joined = join_predictions(questions, predictions)
    return joined.assign(correct=joined.prediction.eq(joined.answer), said_yes=joined.prediction.eq("yes"))


def mc_units(questions: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per MC group (all its rotations): ``ref_objects`` and circular ``correct``."""
    joined = join_predictions(questions, predictions)
    groups = mc_group_correctness(joined)
    refs = joined.drop_duplicates("group_id").set_index("group_id")["ref_objects"]
    return pd.DataFrame({"group_id": groups.group_id, "ref_objects": groups.group_id.map(refs).to_numpy(),
                         "correct": groups.circular_correct.to_numpy()})


def per_object(units: pd.DataFrame) -> pd.DataFrame:
    """``object``, ``n``, ``accuracy``: a unit counts once for each object it is attributed to."""
    exploded = units[["ref_objects", "correct"]].explode("ref_objects").rename(columns={"ref_objects": "object"})
    exploded["correct"] = exploded.correct.astype(float)
    stats = exploded.groupby("object", sort=True)["correct"].agg(n="size", accuracy="mean")
    return stats.reset_index()


def object_deltas(with_object: pd.DataFrame, without_object: pd.DataFrame, settings: RelianceSettings
                  ) -> pd.DataFrame:
    """Per object: counts and scores with and without the object named, Δ and membership of S (Δ > τ_obj).

    Δ is NaN (and the object outside S) unless both sides have ``min_questions`` units.
    """
    both = with_object.merge(without_object, on="object", how="outer", suffixes=("_obj", "_verb"))
    both[["n_obj", "n_verb"]] = both[["n_obj", "n_verb"]].fillna(0).astype(int)
    enough = (both.n_obj >= settings.min_questions) & (both.n_verb >= settings.min_questions)
    both["delta"] = np.where(enough, both.accuracy_obj - both.accuracy_verb, np.nan)
    both["in_set"] = both.delta.gt(settings.tau_obj + _TOLERANCE)
    return both.rename(columns={"accuracy_obj": "acc_obj", "accuracy_verb": "acc_verb"})[
        ["object", "n_obj", "n_verb", "acc_obj", "acc_verb", "delta", "in_set"]
    ].sort_values("object", ignore_index=True)


def overlap_index(s1: set, s2: set) -> float:
    """|S1 ∩ S2| / min(|S1|, |S2|); NaN when a set is empty (the index is undefined)."""
    smaller = min(len(s1), len(s2))
    return len(set(s1) & set(s2)) / smaller if smaller else float("nan")


# ---- per-verb yes-ratios (Table 7) ----------------------------------------------------------------------
def verb_influence(yn_obj: pd.DataFrame, yn_verb: pd.DataFrame, settings: RelianceSettings) -> pd.DataFrame:
    """Per verb: yes-ratios with and without the object, Δ and membership of W (YN units of each set).

    ``settings.answers`` keeps the questions with that ground truth; ``direction`` and ``tau_verb``
    decide W; Δ is NaN (verb outside W) unless both sets have ``min_questions`` questions of the verb.
    """
    def ratios(units: pd.DataFrame) -> pd.DataFrame:
        if settings.answers != "all":
            units = units[units.answer == settings.answers]
        return units.assign(said_yes=units.said_yes.astype(float)).groupby("verb", sort=True)["said_yes"].agg(
            n="size", yes="mean").reset_index()

    both = ratios(yn_obj).merge(ratios(yn_verb), on="verb", how="outer", suffixes=("_obj", "_verb"))
    both[["n_obj", "n_verb"]] = both[["n_obj", "n_verb"]].fillna(0).astype(int)
    enough = (both.n_obj >= settings.min_questions) & (both.n_verb >= settings.min_questions)
    both["delta"] = np.where(enough, both.yes_obj - both.yes_verb, np.nan)
    signed = {"abs": both.delta.abs(), "pos": both.delta, "neg": -both.delta}[settings.direction]
    both["influenced"] = signed.ge(settings.tau_verb - _TOLERANCE)
    return both[["verb", "n_obj", "n_verb", "yes_obj", "yes_verb", "delta", "influenced"]].sort_values(
        "verb", ignore_index=True)


def set_iou(a: set, b: set) -> float:
    """|A ∩ B| / |A ∪ B|; NaN when both are empty (e.g. two constant-answer models)."""
    union = set(a) | set(b)
    return len(set(a) & set(b)) / len(union) if union else float("nan")


# ---- one run ---------------------------------------------------------------------------------------------
def model_reliance(attributed: Mapping[str, pd.DataFrame], predictions: Mapping[str, pd.DataFrame],
                   settings: RelianceSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One model's ``object_reliance`` rows (yn and mc) and ``verb_influence`` rows (without ``model``).

    ``attributed[qset]``: that set's questions with ``ref_objects``; ``predictions[qset]``: its answers.
    """
    yn = {q: yes_no_units(attributed[q], predictions[q]) for q in ("yn_obj", "yn_verb")}
    scored = {q: units[units.answer == "yes"] if settings.metric == "recall" else units for q, units in yn.items()}
    mc = {q: mc_units(attributed[q], predictions[q]) for q in ("mc_obj", "mc_verb")}
    objects = pd.concat([
        object_deltas(per_object(scored["yn_obj"]), per_object(scored["yn_verb"]), settings).assign(qset_pair="yn"),
        object_deltas(per_object(mc["mc_obj"]), per_object(mc["mc_verb"]), settings).assign(qset_pair="mc"),
    ], ignore_index=True)
    return objects, verb_influence(yn["yn_obj"], yn["yn_verb"], settings)


def metric_rows(objects: pd.DataFrame, verbs: pd.DataFrame, models: Sequence[str], keys: Mapping) -> pd.DataFrame:
    """Rows of the long metrics table: the overlap index per model, the IoU per model pair ``a~b``.

    ``keys``: dataset, condition, variant. ``n`` is the index's denominator (min(|S1|, |S2|), |W_a ∪ W_b|);
    no interval (``ci_*`` NaN): the sets come from one run.
    """
    rows = []

    def row(qset, model, metric, value, n):
        rows.append({**keys, "qset": qset, "model": model, "subset": "all", "metric": metric, "value": value,
                     "ci_low": np.nan, "ci_high": np.nan, "n": n})

    for model in models:
        s1, s2 = (set(objects.object[(objects.model == model) & (objects.qset_pair == pair) & objects.in_set])
                  for pair in ("yn", "mc"))
        row(OVERLAP_QSET, model, OVERLAP_METRIC, overlap_index(s1, s2), min(len(s1), len(s2)))
    influenced = {m: set(verbs.verb[(verbs.model == m) & verbs.influenced]) for m in models}
    for a, b in itertools.combinations(models, 2):
        row(IOU_QSET, f"{a}{PAIR_SEPARATOR}{b}", IOU_METRIC, set_iou(influenced[a], influenced[b]),
            len(influenced[a] | influenced[b]))
    columns = ["dataset", "qset", "condition", "model", "variant", "subset", "metric", "value", "ci_low",
               "ci_high", "n"]
    return pd.DataFrame(rows, columns=columns)


def object_reliance(questions: Mapping[str, pd.DataFrame], predictions: Mapping[tuple[str, str], pd.DataFrame],
                    anno: HicoAnnotations, models: Sequence[str], settings: RelianceSettings, keys: Mapping,
                    split: str = "test") -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The whole analysis: (``object_reliance``, ``verb_influence``, metric rows) for ``models``.

    ``questions[qset]`` for the four sets; ``predictions[(model, qset)]``; ``keys``: dataset, condition, variant.
    """
    attributed = {q: attribute_objects(questions[q], anno, split, where=f"question set {q}") for q in RELIANCE_QSETS}
    objects, verbs = [], []
    for model in models:
        obj, verb = model_reliance(attributed, {q: predictions[(model, q)] for q in RELIANCE_QSETS}, settings)
        objects.append(obj.assign(model=model))
        verbs.append(verb.assign(model=model))
    objects = pd.concat(objects, ignore_index=True)[["model", "object", "qset_pair", "n_obj", "n_verb", "acc_obj",
                                                     "acc_verb", "delta", "in_set"]]
    verbs = pd.concat(verbs, ignore_index=True)[["model", "verb", "n_obj", "n_verb", "yes_obj", "yes_verb", "delta",
                                                 "influenced"]]
    return objects, verbs, metric_rows(objects, verbs, models, keys)


# ---- Tables 6 and 7: ours beside the paper's ---------------------------------------------------------------
def _our_metric(metrics: pd.DataFrame, metric: str, keys: Mapping) -> pd.DataFrame:
    chosen = metrics[(metrics.metric == metric) & (metrics.subset == "all")]
    for key, value in keys.items():
        chosen = chosen[chosen[key] == value]
    return chosen.drop_duplicates("model")


def table6(metrics: pd.DataFrame, objects: pd.DataFrame, models: Sequence[str], keys: Mapping) -> pd.DataFrame:
    """Table 6: overlap index (x100) per model, ours (with |S1|, |S2|, |S1 ∩ S2|) then the paper's rows."""
    ours = _our_metric(metrics, OVERLAP_METRIC, {**keys, "qset": OVERLAP_QSET}).set_index("model")["value"]
    rows = []
    for model in models:
        s1, s2 = (set(objects.object[(objects.model == model) & (objects.qset_pair == pair) & objects.in_set])
                  for pair in ("yn", "mc"))
        rows.append({"source": "measured", "model": model, "variant": keys.get("variant", ""),
                     "overlap_index": 100 * ours.get(model, np.nan), "s1": len(s1), "s2": len(s2),
                     "s1_and_s2": len(s1 & s2)})
    for model, value in PAPER_TABLE6.items():
        rows.append({"source": "paper", "model": model, "variant": PAPER_VARIANT, "overlap_index": value,
                     "s1": pd.NA, "s2": pd.NA, "s1_and_s2": pd.NA})
    frame = pd.DataFrame(rows)
    return frame.astype({"overlap_index": float, "s1": "Int64", "s2": "Int64", "s1_and_s2": "Int64"})


def table7(metrics: pd.DataFrame, verbs: pd.DataFrame, models: Sequence[str], keys: Mapping) -> pd.DataFrame:
    """Table 7: influenced-verb-set IoU (x100) per model pair, ours (with the set sizes) then the paper's."""
    ours = _our_metric(metrics, IOU_METRIC, {**keys, "qset": IOU_QSET}).set_index("model")["value"]
    influenced = {m: set(verbs.verb[(verbs.model == m) & verbs.influenced]) for m in models}
    rows = []
    for a, b in itertools.combinations(models, 2):
        rows.append({"source": "measured", "model_a": a, "model_b": b, "variant": keys.get("variant", ""),
                     "iou": 100 * ours.get(f"{a}{PAIR_SEPARATOR}{b}", np.nan), "w_a": len(influenced[a]),
                     "w_b": len(influenced[b]), "w_a_and_w_b": len(influenced[a] & influenced[b]),
                     "w_a_or_w_b": len(influenced[a] | influenced[b])})
    for (a, b), value in PAPER_TABLE7.items():
        rows.append({"source": "paper", "model_a": a, "model_b": b, "variant": PAPER_VARIANT, "iou": value,
                     "w_a": pd.NA, "w_b": pd.NA, "w_a_and_w_b": pd.NA, "w_a_or_w_b": pd.NA})
    frame = pd.DataFrame(rows, columns=["source", "model_a", "model_b", "variant", "iou", "w_a", "w_b",
                                        "w_a_and_w_b", "w_a_or_w_b"])
    return frame.astype({"iou": float, **{c: "Int64" for c in ("w_a", "w_b", "w_a_and_w_b", "w_a_or_w_b")}})


def iou_matrix(table: pd.DataFrame, source: str) -> pd.DataFrame:
    """The paper's layout of Table 7 for one source: a symmetric model x model matrix, "–" on the diagonal.

    An undefined IoU (both sets empty) prints "–" as well: the tables' mark for no value.
    """
    pairs = table[table.source == source]
    models = list(dict.fromkeys([*pairs.model_a, *pairs.model_b]))
    matrix = pd.DataFrame(MISSING_VALUE, index=models, columns=models, dtype=object)
    for a, b, value in zip(pairs.model_a, pairs.model_b, pairs.iou):
        matrix.loc[a, b] = matrix.loc[b, a] = MISSING_VALUE if pd.isna(value) else f"{value:.2f}"
    return matrix.rename_axis("IoU").reset_index()


def table_pages(sections: Sequence[tuple[str, pd.DataFrame]], title: str) -> tuple[str, str]:
    """Markdown and standalone HTML of several titled frames (Table 7: the pair list, then each matrix)."""
    markdown = [f"## {title}\n"]
    html = []
    for heading, frame in sections:
        cells = frame.astype(object).where(frame.notna(), None)  # NaN and <NA> print as the tables' "–"
        table = cells.to_markdown(index=False, floatfmt=".2f", missingval=MISSING_VALUE)
        markdown.append(f"### {heading}\n\n{table}\n")
        html.append(f"<h3>{heading}</h3>\n" + frame.to_html(index=False, float_format=lambda v: f"{v:.2f}",
                                                             na_rep=MISSING_VALUE, border=0))
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head><body>\n"
            f"<h2>{title}</h2>\n" + "\n".join(html) + "\n</body></html>\n")
    return "\n".join(markdown), page


# ---- Fig. 15 -----------------------------------------------------------------------------------------------
def overall_accuracy(metrics: pd.DataFrame, model: str, keys: Mapping) -> dict[str, float]:
    """Our plain YN accuracy of ``model`` on yn_obj and yn_verb (percent), from the metrics table."""
    values = {}
    for qset in ("yn_obj", "yn_verb"):
        chosen = _our_metric(metrics, "accuracy", {**keys, "qset": qset, "model": model})
        values[qset] = 100 * float(chosen.value.iloc[0]) if len(chosen) else float("nan")
    return values


@page_style()  # the whole drawing in the page's fonts
def draw_fig15(objects: pd.DataFrame, model: str, path: str | Path, overall: Mapping[str, float] | None = None,
               note: str = "", min_questions: int | None = None, variant: str | None = None):
    """Fig. 15: Δ_YN per object for ``model``, bars sorted from largest to smallest; returns the Figure.

    ``overall``: our yn_obj / yn_verb accuracy (percent; ``variant``: the variant it is of), printed beside the
    paper's (mPLUG-Owl2, Table 1: beam search). The bars run
    on over as many page-wide panels as the object names need (:data:`OBJECTS_PER_PANEL` each, one y scale);
    an object with fewer than 30 questions in a set says how many (``n=yn_obj/yn_verb``). Saved as PNG, PDF
    and SVG (:mod:`verbmirage.analysis.figure_layout`).
    """
    rows = objects[(objects.model == model) & (objects.qset_pair == "yn") & objects.delta.notna()]
    rows = rows.sort_values(["delta", "object"], ascending=[False, True])
    deltas = 100 * rows.delta.to_numpy(dtype=float)
    overall = overall or {}
    lines = [f"Fig. 15: {model}'s difference of YN accuracy with and without the object, per object "
             f"({len(rows)} objects, {int((deltas > 0).sum())} with Δ > 0)",
             f"overall accuracy yn_obj / yn_verb: ours{f' ({variant})' if variant else ''} "
             f"{overall.get('yn_obj', float('nan')):.2f} / {overall.get('yn_verb', float('nan')):.2f}; "
             f"paper ({PAPER_FIG15['model']}, Table 1: {PAPER_VARIANT}) "
             f"{PAPER_FIG15['yn_obj_accuracy']:.2f} / {PAPER_FIG15['yn_verb_accuracy']:.2f}"]
    lines += [part for part in note.split("; ") if part]
    chunks = [slice(start, start + OBJECTS_PER_PANEL) for start in range(0, len(rows), OBJECTS_PER_PANEL)]
    figure, axes = page_figure(max(1, len(chunks)), columns=1, panel_height=2.6, heading="\n".join(lines),
                               sharey=True)
    for axis, chunk in zip(axes, chunks or [slice(0, 0)]):
        part, values = rows.iloc[chunk], deltas[chunk]
        names = [name.replace("_", " ") + (f" (n={a}/{b})" if n_label(min(a, b)) else "")
                 for name, a, b in zip(part.object, part.n_obj, part.n_verb)]
        axis.bar(np.arange(len(part)), values, color=np.where(values > 0, "tab:blue", "tab:red"))
        axis.set_xticks(np.arange(len(part)), names, rotation=90)
        axis.set_xlim(-0.6, OBJECTS_PER_PANEL - 0.4 if len(chunks) > 1 else max(len(part), 1) - 0.4)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_ylabel("Δ_YN = acc(yn_obj) −\nacc(yn_verb) (points)")
    if rows.empty:
        axes[0].text(0.5, 0.5, f"no object with ≥ {min_questions or '?'} questions in both sets", ha="center",
                     va="center", transform=axes[0].transAxes)
    save_figure(figure, path)
    return figure
