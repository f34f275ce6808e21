"""The paper's tables, derived from the long metrics table (values in percent).

A table is declared as a list of :class:`Column` (question set, condition,
metric); :func:`build_table` picks those values out of the long table for the
rows (models) asked for. Nothing here computes a metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Column:
    label: str
    qset: str
    condition: str
    metric: str


def consistency_condition(reference: str, other: str) -> str:
    """The ``condition`` value under which error consistency between two conditions is stored."""
    return f"{reference}_vs_{other}"


def table1_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 1: YN and MC, with and without object reference."""
    columns = []
    for qset, tag in (("yn_obj", "yn_obj"), ("yn_verb", "yn_verb")):
        for metric, short in (("accuracy", "acc"), ("precision", "prec"), ("recall", "recall")):
            columns.append(Column(f"{tag}_{short}", qset, condition, metric))
    columns += [
        Column("mc_obj_acc", "mc_obj", condition, "circular_accuracy"),
        Column("mc_verb_acc", "mc_verb", condition, "circular_accuracy"),
    ]
    return columns


def table2_columns(reference: str = "clean", distorted: str = "saltpepper") -> list[Column]:
    """Paper Table 2: verb-only questions with and without noise, and error consistency."""
    pair = consistency_condition(reference, distorted)
    return [
        Column(f"yn_acc_{reference}", "yn_verb", reference, "accuracy"),
        Column(f"yn_f1_{reference}", "yn_verb", reference, "f1"),
        Column(f"yn_acc_{distorted}", "yn_verb", distorted, "accuracy"),
        Column(f"yn_f1_{distorted}", "yn_verb", distorted, "f1"),
        Column("yn_err_cons", "yn_verb", pair, "error_consistency"),
        Column(f"mc_acc_{reference}", "mc_verb", reference, "circular_accuracy"),
        Column(f"mc_acc_{distorted}", "mc_verb", distorted, "circular_accuracy"),
        Column("mc_err_cons", "mc_verb", pair, "error_consistency"),
    ]


def table3_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 3: ensemble vs members on YN with and without objects."""
    return table1_columns(condition)[:6]


def table4_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 4: YN on CharadesEgo, egocentric vs exocentric view of the same actions."""
    return [
        Column(f"{view}_{short}", f"yn_{view}", condition, metric)
        for view in ("ego", "exo")
        for metric, short in (("accuracy", "acc"), ("precision", "prec"), ("recall", "recall"))
    ] + [Column(f"mc_{view}_acc", f"mc_{view}", condition, "circular_accuracy") for view in ("ego", "exo")]


def build_table(
    metrics: pd.DataFrame,
    columns: Sequence[Column],
    models: Sequence[str],
    variant: str = "default",
    dataset: str = "hico",
    subset: str = "all",
) -> pd.DataFrame:
    """One row per model, one column per :class:`Column`, values x100; missing values stay NaN.

    A key found twice (two metric parts for one cell) is an error: which value is right cannot be guessed.
    """
    chosen = metrics[(metrics.dataset == dataset) & (metrics.variant == variant) & (metrics.subset == subset)]
    lookup = chosen.set_index(["model", "qset", "condition", "metric"])["value"]
    duplicated = lookup.index[lookup.index.duplicated()].unique()
    if len(duplicated):
        first = dict(zip(("model", "qset", "condition", "metric"), duplicated[0]))
        raise ValueError(
            f"metrics table: {len(duplicated)} key(s) appear more than once for dataset={dataset}, "
            f"variant={variant}, subset={subset}, e.g. {first}"
        )
    rows = []
    for model in models:
        row = {"model": model}
        for column in columns:
            key = (model, column.qset, column.condition, column.metric)
            row[column.label] = 100 * lookup[key] if key in lookup.index else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=["model"] + [c.label for c in columns])


def table3(metrics: pd.DataFrame, ensembles: dict[str, list[str]], condition: str = "clean", **kw) -> pd.DataFrame:
    """Members then the ensemble, for every configured ensemble."""
    parts = []
    for name, members in ensembles.items():
        part = build_table(metrics, table3_columns(condition), [*members, name], **kw)
        part.insert(0, "ensemble", name)
        parts.append(part)
    columns = ["ensemble", "model"] + [c.label for c in table3_columns(condition)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
