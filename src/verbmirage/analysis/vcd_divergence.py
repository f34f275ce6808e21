"""VCD divergence (paper, "Hallucination Mitigation Methods"; docs/analysis.md, "VCD divergence"): why VCD barely
moves the answers.

The paper: "we compute Qwen-VL's KL divergence between the original token distribution p_theta and the
contrasted token distribution p_vcd of 20K samples, and find that the KL divergence of 18.6K samples is 0"
(:data:`PAPER`). Which KL, and how it can be exactly 0 when VCD cuts tokens, the paper does not say.

Ours (read from a VCD variant's prediction table, never recomputed; ``io.PREDICTIONS``):

- ``vcd_kl``: KL(q || p~) at the first answer position, q = the contrasted distribution after the
  plausibility cut, p~ = the plain distribution restricted to the plausibility set and renormalised
  (the one common support on which a finite, possibly exactly 0, KL exists; docs/analysis.md).
  ``vcd_kl_reverse``: KL(p~ || q), the direction the paper's wording reads ("between the original p_theta
  and the contrasted p_vcd"). Both are 0 exactly when q = p~, so the zero shares are one number; the
  quantiles are reported for each (``kl_*`` and ``kl_reverse_*``). A table written before the engine
  stored the reverse direction gives null ``kl_reverse_*``.
- ``vcd_plausible``: the size of the plausibility set (tokens with p >= beta * p_max). With one token the
  KL is exactly 0 by construction, so "KL = 0" mostly measures confidence: both shares are reported. Each
  run's beta (``beta``: the variant's, or the model's own ``variant_settings``) is in the table and the figure:
  ours 0.1 is VCD's default, while the official VCD script for LLaVA-1.5 on POPE runs 0.2 (the paper gives
  none); a larger beta removes more tokens, so more one-token sets and more exact zeros.
- Flips: the VCD variant's predictions against the same model's *plain counterpart*, the configured
  variant whose settings equal the VCD variant's without ``vcd``
  (:func:`~verbmirage.analysis.vcd_divergence_settings.plain_counterparts`; ``analysis.vcd_divergence.pairs``
  overrides). No counterpart: the flip columns are null and ``plain_note`` says why.

Unit: one question row (an MC rotation is one forward pass). Rows with an ``error`` (or no stored KL)
are left out of the KL statistics and counted (``n_dropped``); a flip needs an answer without error in
both runs. Outputs: one summary row per (model, variant, condition, question set, and the sets pooled)
(``io.VCD_DIVERGENCE``) and the KL histogram (``io.VCD_KL_HIST``: an exact-zero bin, then log-spaced
bins shared by every series).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from verbmirage.analysis.figure_layout import legend_below, page_figure, page_style, save_figure
from verbmirage.benchmark.question_sets import question_kind


@dataclass(frozen=True)
class PaperKL:
    """The paper's only numbers on it (text of "Hallucination Mitigation Methods"; not in paper_tables.csv)."""

    model: str = "Qwen-VL-Chat"
    n: int = 20_000
    n_kl_zero: int = 18_600

    @property
    def share_kl_zero(self) -> float:
        return self.n_kl_zero / self.n


PAPER = PaperKL()
#: Tolerance for "a one-token plausibility set has KL 0": anything further is a broken table.
SINGLETON_TOLERANCE = 1e-9


# ---- per-run statistics ----------------------------------------------------------------------------------


def kl_rows(predictions: pd.DataFrame, where: str = "predictions") -> pd.DataFrame:
    """The rows that enter the KL statistics (no error, a stored KL): ``question_id, kl, kl_reverse,
    plausible`` (``kl_reverse`` NaN in a table written before the engine stored it).

    A negative KL, a plausibility set below one token or a one-token set with KL other than 0 is an error
    naming ``where`` and the question. A table without any KL where rows were answered is one too (a
    variant without VCD, or a table written before the engine stored it).
    """
    answered = predictions[predictions.error.isna()]
    kl = pd.to_numeric(answered.vcd_kl, errors="coerce").astype(float)
    reverse = pd.to_numeric(answered.get("vcd_kl_reverse", pd.Series(np.nan, index=answered.index)),
                            errors="coerce").astype(float)
    plausible = pd.to_numeric(answered.vcd_plausible, errors="coerce")
    if len(answered) and kl.isna().all():
        raise ValueError(f"{where}: no vcd_kl on any answered row: not a VCD run, or written before VCD stored it")
    usable = kl.notna().to_numpy() & np.isfinite(kl.to_numpy(na_value=np.nan)) & plausible.notna().to_numpy()
    rows = pd.DataFrame({"question_id": answered.question_id.to_numpy()[usable], "kl": kl.to_numpy()[usable],
                         "kl_reverse": reverse.to_numpy(na_value=np.nan)[usable],
                         "plausible": plausible.to_numpy()[usable].astype(np.int64)})
    for bad, what in (
        (rows.kl < 0, "a negative vcd_kl"),
        (rows.kl_reverse < 0, "a negative vcd_kl_reverse"),
        (rows.plausible < 1, "vcd_plausible below 1"),
        ((rows.plausible == 1) & (rows.kl > SINGLETON_TOLERANCE), "vcd_kl > 0 with a one-token plausibility set"),
        ((rows.plausible == 1) & (rows.kl_reverse > SINGLETON_TOLERANCE),
         "vcd_kl_reverse > 0 with a one-token plausibility set"),
    ):
        if bad.any():
            row = rows[bad].iloc[0]
            raise ValueError(f"{where}: question {row.question_id!r}: {what} (kl {row.kl!r}, plausible {row.plausible})")
    return rows


def kl_statistics(rows: pd.DataFrame, n_rows: int) -> dict:
    """Shares and quantiles of the KL rows (:func:`kl_rows`) of ``n_rows`` prediction rows."""
    n = len(rows)
    kl = rows.kl.to_numpy(dtype=float)
    positive = kl[kl > 0]
    zero = int((kl == 0).sum())
    one = int((rows.plausible == 1).sum())

    def quantile(values, q):
        return float(np.quantile(values, q)) if len(values) else math.nan

    reverse = rows.kl_reverse.to_numpy(dtype=float) if "kl_reverse" in rows else np.full(n, np.nan)
    reverse = reverse[~np.isnan(reverse)]  # a table written before the engine stored it: none
    return {
        "n": n,
        "n_dropped": n_rows - n,
        "n_kl_zero": zero,
        "share_kl_zero": zero / n if n else math.nan,
        "n_plausible_one": one,
        "share_plausible_one": one / n if n else math.nan,
        "n_kl_zero_plausible_many": int(((kl == 0) & (rows.plausible.to_numpy() > 1)).sum()),
        "plausible_mean": float(rows.plausible.mean()) if n else math.nan,
        "kl_mean": float(kl.mean()) if n else math.nan,
        "kl_median": quantile(kl, 0.5),
        "kl_q90": quantile(kl, 0.9),
        "kl_q99": quantile(kl, 0.99),
        "kl_max": float(kl.max()) if n else math.nan,
        "kl_median_positive": quantile(positive, 0.5),
        "kl_reverse_mean": float(reverse.mean()) if len(reverse) else math.nan,
        "kl_reverse_median": quantile(reverse, 0.5),
        "kl_reverse_q90": quantile(reverse, 0.9),
        "kl_reverse_q99": quantile(reverse, 0.99),
        "kl_reverse_max": float(reverse.max()) if len(reverse) else math.nan,
    }


def flip_statistics(
    vcd: pd.DataFrame, plain: pd.DataFrame, questions: pd.DataFrame, plausible: pd.DataFrame, where: str = "flips"
) -> dict:
    """How many answers VCD changes against the plain run, on the questions both answered without error.

    ``yes_to_no`` / ``no_to_yes`` count YN questions only (null when none are YN); ``fixed`` = plain wrong,
    VCD right; ``broken`` = plain right, VCD wrong; ``n_flips_plausible_one`` = flips among questions
    whose plausibility set holds one token (where the first token cannot change).
    """
    for name, frame in (("VCD", vcd), ("plain", plain)):
        duplicated = frame.question_id[frame.question_id.duplicated()]
        if len(duplicated):
            raise ValueError(f"{where}: {name} run answers question_id {duplicated.iloc[0]!r} twice")
    pairs = (
        vcd.loc[vcd.error.isna(), ["question_id", "prediction"]]
        .merge(plain.loc[plain.error.isna(), ["question_id", "prediction"]], on="question_id",
               suffixes=("_vcd", "_plain"), validate="one_to_one")
        .merge(questions[["question_id", "qset", "answer"]], on="question_id", how="left", validate="one_to_one")
        .merge(plausible[["question_id", "plausible"]], on="question_id", how="left", validate="one_to_one")
    )
    if pairs.answer.isna().any():
        missing = pairs.question_id[pairs.answer.isna()].iloc[0]
        raise ValueError(f"{where}: question {missing!r} answered but not in the question table")
    flipped = pairs.prediction_vcd.ne(pairs.prediction_plain)
    yn = pairs.qset.map(question_kind).eq("yn")
    has_yn = bool(yn.any())
    right_vcd = pairs.prediction_vcd.eq(pairs.answer)
    right_plain = pairs.prediction_plain.eq(pairs.answer)
    n = len(pairs)
    return {
        "n_paired": n,
        "n_flips": int(flipped.sum()),
        "flip_share": float(flipped.mean()) if n else math.nan,
        "yes_to_no": int((yn & pairs.prediction_plain.eq("yes") & pairs.prediction_vcd.eq("no")).sum())
        if has_yn else None,
        "no_to_yes": int((yn & pairs.prediction_plain.eq("no") & pairs.prediction_vcd.eq("yes")).sum())
        if has_yn else None,
        "n_fixed": int((~right_plain & right_vcd).sum()),
        "n_broken": int((right_plain & ~right_vcd).sum()),
        "n_flips_plausible_one": int((flipped & pairs.plausible.eq(1)).sum()),
    }


NO_FLIPS = dict.fromkeys(("n_paired", "n_flips", "flip_share", "yes_to_no", "no_to_yes", "n_fixed", "n_broken",
                          "n_flips_plausible_one"))


def kl_bin_edges(kl_values: Iterable[np.ndarray], bins: int) -> np.ndarray:
    """Log-spaced edges over every positive KL of every series (whole decades), shared by all; empty without
    any positive KL. The exact zeros get their own bin (:func:`histogram_rows`)."""
    positive = np.concatenate([np.asarray(v, dtype=float) for v in kl_values] or [np.zeros(0)])
    positive = positive[positive > 0]
    if not len(positive):
        return np.zeros(0)
    low = math.floor(math.log10(positive.min()))
    high = max(math.ceil(math.log10(positive.max())), low + 1)
    return np.logspace(low, high, bins + 1)


def histogram_rows(kl: np.ndarray, edges: np.ndarray) -> list[dict]:
    """The exact-zero bin (``bin_left == bin_right == 0``), then one row per log bin; ``share`` is of all
    the series' KL rows, so the zero bin's share is ``share_kl_zero`` and all shares add up to 1."""
    kl = np.asarray(kl, dtype=float)
    n = len(kl)
    rows = [{"bin_left": 0.0, "bin_right": 0.0, "count": int((kl == 0).sum())}]
    if len(edges):
        counts, _ = np.histogram(kl[kl > 0], bins=edges)
        rows += [{"bin_left": float(a), "bin_right": float(b), "count": int(c)}
                 for a, b, c in zip(edges[:-1], edges[1:], counts)]
    for row in rows:
        row["share"] = row["count"] / n if n else math.nan
    return rows


# ---- the tables ------------------------------------------------------------------------------------------


def pooled_label(qsets: list[str]) -> str:
    """The ``qset`` of a row over several sets (as the uncertainty tables name pooled sets)."""
    return "+".join(qsets)


def vcd_divergence_tables(
    runs: list[dict],
    bins: int = 30,
    paper_names: dict[str, str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The summary (``io.VCD_DIVERGENCE``) and histogram (``io.VCD_KL_HIST``) tables.

    ``runs``: :func:`~verbmirage.analysis.vcd_divergence_settings.divergence_runs` entries, each with
    ``predictions`` (the VCD run's table), ``plain`` (the counterpart's table or None), ``questions`` (the set's
    question table) and ``where`` (a path for errors). ``bins``: log bins of the positive KLs (``analysis.vcd_divergence.bins``). Per (model, variant, condition): one row per set and, over two sets or more, one pooled row;
    the paper's numbers (pooled over its sets) sit on the pooled row, or on the only set's row.
    ``paper_names``: model slug -> ``models.<slug>.paper_name``, to say whether the model is the paper's.
    """
    paper_names = paper_names or {}
    series = []  # (keys, kl rows, prediction rows, flip stats or None, plain note)
    for run in runs:
        keys = {k: run[k] for k in ("model", "variant", "condition", "qset")}
        rows = kl_rows(run["predictions"], run["where"])
        flips = None
        if run.get("plain") is not None:
            flips = flip_statistics(run["predictions"], run["plain"], run["questions"], rows,
                                    where=f"{run['where']} vs {run['plain_variant']}")
        series.append((keys, run, rows, flips))
    edges = kl_bin_edges([rows.kl.to_numpy() for _, _, rows, _ in series], bins)

    summary, hist = [], []

    def add(keys, run, rows, n_rows, flips, paper):
        summary.append({
            **keys, "plain_variant": run["plain_variant"], "plain_note": run["plain_note"],
            "beta": run.get("beta", math.nan),
            **kl_statistics(rows, n_rows), **(flips if flips is not None else NO_FLIPS),
            "paper_model": PAPER.model if paper else None,
            "paper_model_match": paper_names.get(keys["model"]) == PAPER.model,
            "paper_n": PAPER.n if paper else None,
            "paper_share_kl_zero": PAPER.share_kl_zero if paper else math.nan,
        })
        hist.extend({**keys, **row} for row in histogram_rows(rows.kl.to_numpy(), edges))

    groups: dict[tuple, list] = {}
    for item in series:
        keys = item[0]
        groups.setdefault((keys["model"], keys["variant"], keys["condition"]), []).append(item)
    for (model, variant, condition), items in groups.items():
        single = len(items) == 1
        for keys, run, rows, flips in items:
            add(keys, run, rows, len(run["predictions"]), flips, paper=single)
        if single:
            continue
        keys = {"model": model, "variant": variant, "condition": condition,
                "qset": pooled_label([k["qset"] for k, *_ in items])}
        rows = pd.concat([rows for _, _, rows, _ in items], ignore_index=True)
        n_rows = sum(len(run["predictions"]) for _, run, _, _ in items)
        add(keys, items[0][1], rows, n_rows, _pooled_flips([flips for *_, flips in items]), paper=True)
    return pd.DataFrame(summary), pd.DataFrame(hist)


def _pooled_flips(parts: list[dict | None]) -> dict | None:
    if any(part is None for part in parts):
        return None
    pooled = {key: sum(part[key] for part in parts) for key in ("n_paired", "n_flips", "n_fixed", "n_broken",
                                                                 "n_flips_plausible_one")}
    for key in ("yes_to_no", "no_to_yes"):
        known = [part[key] for part in parts if part[key] is not None]
        pooled[key] = sum(known) if known else None
    pooled["flip_share"] = pooled["n_flips"] / pooled["n_paired"] if pooled["n_paired"] else math.nan
    return pooled


def divergence_report_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as the report prints it: shares in percent beside the paper's, KLs to 3 significant digits."""

    def percent(values):
        return (100 * values.astype(float)).round(1)

    def digits(values):
        return values.astype(float).map(lambda v: "" if pd.isna(v) else f"{v:.3g}")

    def count(values):  # integers with gaps (no flips, MC sets) stay integers
        return pd.to_numeric(values).astype("Int64")

    return pd.DataFrame({
        "model": summary.model, "variant": summary.variant, "condition": summary.condition, "sets": summary.qset,
        "β (cut)": summary.beta, "n": summary.n, "dropped": summary.n_dropped,
        "KL = 0 (%)": percent(summary.share_kl_zero),
        "paper KL = 0 (%)": percent(summary.paper_share_kl_zero),
        "paper model": summary.paper_model,
        "1-token set (%)": percent(summary.share_plausible_one),
        "KL(q‖p~) median": digits(summary.kl_median), "KL(q‖p~) q90": digits(summary.kl_q90),
        "KL(q‖p~) q99": digits(summary.kl_q99), "KL(q‖p~) max": digits(summary.kl_max),
        "KL(p~‖q) median": digits(summary.kl_reverse_median), "KL(p~‖q) q90": digits(summary.kl_reverse_q90),
        "KL(p~‖q) q99": digits(summary.kl_reverse_q99), "KL(p~‖q) max": digits(summary.kl_reverse_max),
        "vs plain": summary.plain_variant, "paired": count(summary.n_paired),
        "flipped (%)": percent(summary.flip_share),
        "yes→no": count(summary.yes_to_no), "no→yes": count(summary.no_to_yes),
        "fixed": count(summary.n_fixed), "broken": count(summary.n_broken), "note": summary.plain_note,
    })


# ---- the figure ------------------------------------------------------------------------------------------


def overall_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (model, variant, condition), the row over all its sets: the pooled row, else the only set's."""
    if summary.empty:
        return summary
    longest = summary.qset.str.count(r"\+")
    keep = longest.eq(longest.groupby([summary.model, summary.variant, summary.condition]).transform("max"))
    return summary[keep]


#: Under the figure's title: the plausibility cut moves the zero share, and the official scripts differ on it.
BETA_NOTE = ("β: VCD's plausibility cut (tokens under β x the top probability removed), named under each run; VCD's "
             "default 0.1, while its official LLaVA-1.5 POPE script runs 0.2 (the paper gives none): a larger β "
             "leaves more one-token sets, so more KL = 0")


@page_style()  # the whole drawing in the page's fonts
def draw_vcd_divergence_figure(
    summary: pd.DataFrame, hist: pd.DataFrame, path, notes: dict[str, str] | None = None
) -> None:
    """Three panels over each (model, VCD variant) of the first condition, its sets pooled:
    (a) the share of questions with KL exactly 0 and with a one-token plausibility set, the paper's share
    marked; (b) the distribution of the positive KLs (log bins; shares of all questions, so with (a)'s
    zero share they add up to 1); (c) the decisions VCD flips against the plain counterpart. The panels stand one
    under the other on a page, legends below them (:mod:`verbmirage.analysis.figure_layout`); saved as PNG, PDF
    and SVG."""
    notes = notes or {}
    rows = overall_rows(summary)
    condition = rows.condition.iloc[0] if len(rows) else "clean"
    rows = rows[rows.condition == condition].reset_index(drop=True)
    labels = [f"{r.model}\n{r.variant}" + ("" if pd.isna(r.beta) else f", β {r.beta:g}") for r in rows.itertuples()]
    sets = rows.qset.iloc[0] if len(rows) else ""
    lines = [f"VCD divergence ({condition}, {sets})", BETA_NOTE]
    lines += [f"{slug}: {note}" for slug, note in notes.items() if slug in set(rows.model)]
    fig, axes = page_figure(3, columns=1, panel_height=2.5, heading="\n".join(lines))
    x = np.arange(len(rows))

    ax = axes[0]
    ax.bar(x - 0.2, rows.share_kl_zero, width=0.4, color="tab:blue", label="KL exactly 0")
    ax.bar(x + 0.2, rows.share_plausible_one, width=0.4, color="tab:gray", label="plausibility set of 1 token")
    for i, r in rows.iterrows():
        ax.text(i - 0.2, r.share_kl_zero, f"{r.share_kl_zero:.1%}\n{r.n_kl_zero}/{r.n}", ha="center", va="bottom")
    ax.axhline(PAPER.share_kl_zero, color="black", linestyle="--", linewidth=1,
               label=f"paper ({PAPER.model}): {PAPER.n_kl_zero / 1000:.1f}K of {PAPER.n / 1000:.0f}K = "
                     f"{PAPER.share_kl_zero:.0%}")
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("share of questions")
    ax.set_title("(a) KL = 0 vs one-token plausibility set")
    legend_below(ax, ax.get_legend_handles_labels()[0])

    ax = axes[1]
    drawn = 0
    styles = ("-", "--", ":", "-.")  # two variants of one model share their first step's contrast, so their
    for r in rows.itertuples():     # curves often coincide: each its own dash and width, so both stay visible
        part = hist[(hist.model == r.model) & (hist.variant == r.variant) & (hist.condition == r.condition)
                    & (hist.qset == r.qset) & (hist.bin_right > 0)]
        if len(part) and part["count"].sum():
            edges = np.append(part.bin_left.to_numpy(), part.bin_right.iloc[-1])
            ax.stairs(part.share.to_numpy(), edges, label=f"{r.model} / {r.variant} (KL = 0: {r.share_kl_zero:.1%})",
                      linestyle=styles[drawn % len(styles)], linewidth=max(0.8, 2.4 - 0.6 * drawn))
            drawn += 1
    if drawn:
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no question with KL > 0", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("KL(q || p~) at the first answer position (KL > 0 only)")
    ax.set_ylabel("share of all questions per bin")
    ax.set_title("(b) distribution of KL > 0")
    if drawn:
        legend_below(ax, ax.get_legend_handles_labels()[0])

    ax = axes[2]
    flips = rows.n_paired.notna() & rows.n_paired.astype(float).gt(0)
    for i, r in rows.iterrows():
        if not flips[i]:
            ax.text(i, 0.002, "no plain counterpart\n(plain_note in the table)", ha="center", va="bottom",
                    rotation=90)
            continue
        n = float(r.n_paired)
        yes_no = float(r.yes_to_no or 0) / n
        no_yes = float(r.no_to_yes or 0) / n
        other = float(r.n_flips) / n - yes_no - no_yes
        ax.bar(i, yes_no, color="tab:red", label="yes → no" if i == flips.idxmax() else None)
        ax.bar(i, no_yes, bottom=yes_no, color="tab:green", label="no → yes" if i == flips.idxmax() else None)
        ax.bar(i, other, bottom=yes_no + no_yes, color="tab:purple",
               label="other change (MC option; YN to or from neither yes nor no)" if i == flips.idxmax() else None)
        ax.text(i, float(r.flip_share), f"{r.flip_share:.1%} of {int(n)}\nvs {r.plain_variant}", ha="center",
                va="bottom")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    top = float(rows.flip_share.astype(float).max()) if flips.any() else 0.0
    ax.set_ylim(0, max(0.05, 1.6 * top))
    ax.set_ylabel("share of questions\nwhose answer VCD changes")
    ax.set_title("(c) decisions flipped against the plain variant")
    if flips.any():
        legend_below(ax, ax.get_legend_handles_labels()[0])
    save_figure(fig, path)
