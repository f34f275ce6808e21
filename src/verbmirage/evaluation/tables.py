"""The paper's tables, derived from the long metrics table (values in percent), beside the paper's rows.

A table is declared as a list of :class:`Column` (question set, condition,
metric); :func:`measured_rows` picks those values and their bootstrap
intervals out of the long table for the models and variants asked for,
:func:`paper_rows` takes the paper's published rows of that table
(``paper_numbers``), and :func:`side_by_side` lays both out for reading:
each of our rows, then the paper's row of the same model and decoding and the
difference, where the model's and the variant's ``paper_name`` match.
Nothing here computes a metric.

A configured (model, variant) never vanishes from a table: a row without any
value is kept, its cells "–", and its ``note`` says why (:data:`NO_VALUES`,
:data:`NOT_RUN`), so a model whose metrics are all undefined is told apart
from one that is not in the config.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from verbmirage.core.io import MISSING_VALUE
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT

#: our metric name -> the name ``paper_tables.csv`` gives the same quantity (kappa printed x100)
PAPER_METRICS = {"error_consistency": "error_consistency_kappa_x100"}
MEASURED, PAPER = "measured", "paper"
#: ``note`` of a kept row without values: its cells are in the metrics table, every one undefined (NaN) ...
NO_VALUES = "no valid answers: every metric undefined"
#: ... or the config plans its run but the metrics table has none of its cells.
NOT_RUN = "not run: no metrics for this run"
#: ``note`` of a row from a stand-in (``models.<slug>.stand_in``: random weights, an oracle), and of its Δ row
STAND_IN = "stand-in, not a model's result"


def stand_in_note(reason: str) -> str:
    return f"{STAND_IN} ({reason})"


@dataclass(frozen=True)
class Column:
    label: str
    qset: str
    condition: str
    metric: str
    #: where the paper's CSV names this column differently (Table 4: qset ``charadesego_yn``, condition ``ego``)
    paper_qset: str | None = None
    paper_condition: str | None = None
    #: the metrics subset this column reads, where not the table's (Table 2 beside a crop: ``single_instance``)
    subset: str | None = None

    def paper_key(self) -> tuple[str, str, str]:
        """(qset, condition, metric) of this column in ``paper_tables.csv``."""
        condition = self.paper_condition or self.condition.replace("_vs_", "~")
        return self.paper_qset or self.qset, condition, PAPER_METRICS.get(self.metric, self.metric)


def consistency_condition(reference: str, other: str) -> str:
    """The ``condition`` value under which error consistency between two conditions is stored."""
    return f"{reference}_vs_{other}"


#: Table 1's question sets, in its column order
TABLE1_SETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb")


def table1_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 1: YN and MC, with and without object reference, and (ours) each set's unknown share."""
    columns = []
    for qset, tag in (("yn_obj", "yn_obj"), ("yn_verb", "yn_verb")):
        for metric, short in (("accuracy", "acc"), ("precision", "prec"), ("recall", "recall")):
            columns.append(Column(f"{tag}_{short}", qset, condition, metric))
    columns += [
        Column("mc_obj_acc", "mc_obj", condition, "circular_accuracy"),
        Column("mc_verb_acc", "mc_verb", condition, "circular_accuracy"),
    ]
    # ours, not the paper's: the share of answers that are neither yes/no nor a letter, which every accuracy
    # above counts as wrong (a 0.65 % accuracy under sampling is mostly this)
    columns += [Column(f"{qset}_unknown", qset, condition, "unknown_ratio") for qset in TABLE1_SETS]
    return columns


def table2_columns(reference: str = "clean", distorted: str = "saltpepper", reference_subset: str | None = None,
                   other_subset: str | None = None) -> list[Column]:
    """Paper Table 2: verb-only questions under a reference and another condition, and error consistency.

    Labels say ``ref``/``other`` (one table holds every configured pair; its rows name the pair). Beside a
    condition that covers only single-instance images (``crop``), the other condition is read on its
    ``single_instance`` subset, so both columns count the same questions (error consistency already does).
    """
    pair = consistency_condition(reference, distorted)
    return [
        Column("yn_acc_ref", "yn_verb", reference, "accuracy", subset=reference_subset),
        Column("yn_f1_ref", "yn_verb", reference, "f1", subset=reference_subset),
        Column("yn_acc_other", "yn_verb", distorted, "accuracy", subset=other_subset),
        Column("yn_f1_other", "yn_verb", distorted, "f1", subset=other_subset),
        Column("yn_err_cons", "yn_verb", pair, "error_consistency"),
        Column("mc_acc_ref", "mc_verb", reference, "circular_accuracy", subset=reference_subset),
        Column("mc_acc_other", "mc_verb", distorted, "circular_accuracy", subset=other_subset),
        Column("mc_err_cons", "mc_verb", pair, "error_consistency"),
    ]


def table3_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 3: ensemble vs members on YN with and without objects."""
    return table1_columns(condition)[:6]


def table4_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 4: YN on CharadesEgo, egocentric vs exocentric view of the same actions."""
    return [
        Column(f"{view}_{short}", f"yn_{view}", condition, metric, paper_qset="charadesego_yn", paper_condition=view)
        for view in ("ego", "exo")
        for metric, short in (("accuracy", "acc"), ("precision", "prec"), ("recall", "recall"))
    ] + [Column(f"mc_{view}_acc", f"mc_{view}", condition, "circular_accuracy", paper_qset="charadesego_mc",
                paper_condition=view) for view in ("ego", "exo")]


# ---- ours beside the paper's --------------------------------------------------------------------------------
def _lookup(metrics: pd.DataFrame, dataset: str, subset: str) -> pd.DataFrame:
    chosen = metrics[(metrics.dataset == dataset) & (metrics.subset == subset)]
    table = chosen.set_index(["model", "variant", "qset", "condition", "metric"])[["value", "ci_low", "ci_high"]]
    duplicated = table.index[table.index.duplicated()].unique()
    if len(duplicated):  # two metric parts for one cell: which value is right cannot be guessed
        first = dict(zip(table.index.names, duplicated[0]))
        raise ValueError(f"metrics table: {len(duplicated)} key(s) appear more than once for dataset={dataset}, "
                         f"subset={subset}, e.g. {first}")
    return table


def measured_rows(
    metrics: pd.DataFrame,
    columns: Sequence[Column],
    models: Sequence[str],
    variants: Sequence[str] = ("default",),
    paper_names: Mapping[str, str] | None = None,
    dataset: str = "hico",
    subset: str = "all",
    planned: Collection[Sequence[str]] = (),
    stand_ins: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Our rows: one per (model, variant), values x100 and their interval (``<label>_ci_low``/``_ci_high``).

    ``stand_ins``: model -> why its rows are not a model's result (``models.entries.stand_ins``); their
    ``note`` says so (:func:`stand_in_note`), and so does the note of their difference to the paper.

    A missing cell stays NaN. A (model, variant) with no value in any column keeps its row, ``note`` saying
    why, when the metrics table holds its cells, all NaN (:data:`NO_VALUES`), or when ``planned`` holds one
    of its cells (:data:`NOT_RUN`); ``planned``: (dataset, condition, model, variant, qset) of every run the
    config plans (:attr:`verbmirage.workflow.plan.Plan.planned_cells`). Any other pair without values (one the config
    does not run, e.g. a baseline under beam search) is left out.
    """
    planned = {tuple(cell) for cell in planned}
    lookups: dict[str, pd.DataFrame] = {}
    rows = []
    for model in models:
        for variant in variants:
            row = {"source": MEASURED, "model": model, "variant": variant,
                   "paper_name": (paper_names or {}).get(model, ""), "note": math.nan}
            stored = False
            for column in columns:
                column_subset = column.subset or subset
                if column_subset not in lookups:
                    lookups[column_subset] = _lookup(metrics, dataset, column_subset)
                lookup = lookups[column_subset]
                key = (model, variant, column.qset, column.condition, column.metric)
                stored = stored or key in lookup.index
                value, low, high = lookup.loc[key] if key in lookup.index else (float("nan"),) * 3
                row[column.label] = 100 * value
                row[f"{column.label}_ci_low"], row[f"{column.label}_ci_high"] = 100 * low, 100 * high
            if not any(pd.notna(row[column.label]) for column in columns):
                if stored:
                    row["note"] = NO_VALUES
                elif any((dataset, c.condition, model, variant, c.qset) in planned for c in columns):
                    row["note"] = NOT_RUN
                else:
                    continue
            if model in (stand_ins or {}):
                caveat = stand_in_note(stand_ins[model])
                row["note"] = caveat if pd.isna(row["note"]) else f"{row['note']}; {caveat}"
            rows.append(row)
    return pd.DataFrame(rows, columns=table_columns(columns))


def table_columns(columns: Sequence[Column]) -> list[str]:
    labels = [column.label for column in columns]
    intervals = [f"{label}_{end}" for label in labels for end in ("ci_low", "ci_high")]
    return ["source", "model", "variant", "paper_name", *labels, *intervals, "note"]


def paper_rows(paper: pd.DataFrame, table: int | str, columns: Sequence[Column]) -> pd.DataFrame:
    """Every row the paper published in ``table`` (``paper_numbers.load_paper_numbers``), in the paper's order."""
    published = paper[paper.table.astype(str) == str(table)]
    keys = {column.paper_key(): column.label for column in columns}
    rows: dict[tuple[str, str], dict] = {}
    for entry in published.itertuples(index=False):
        label = keys.get((entry.qset, entry.condition, entry.metric))
        if label is None:
            continue
        row = rows.setdefault((entry.model, entry.variant), {"source": PAPER, "model": entry.model,
                                                             "variant": entry.variant, "paper_name": entry.model})
        row[label] = float(entry.value)
    return pd.DataFrame(list(rows.values()), columns=table_columns(columns))


def with_paper(measured: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The Parquet table: our rows, then the paper's (``source`` tells them apart)."""
    parts = [frame for frame in (measured, paper) if len(frame)]
    return pd.concat(parts, ignore_index=True) if parts else measured


def _cell(value, low=None, high=None, signed: bool = False) -> str:
    if value is None or pd.isna(value):
        return MISSING_VALUE
    text = f"{value:+.2f}" if signed else f"{value:.2f}"
    if low is not None and pd.notna(low) and pd.notna(high):
        text += f" [{low:.2f}, {high:.2f}]"
    return text


def side_by_side(table: pd.DataFrame, columns: Sequence[Column], variant_paper_names: Mapping[str, str] | None = None,
                 keys: Sequence[str] = (), match_keys: Sequence[str] = (),
                 paper_variant_key: str | None = None) -> pd.DataFrame:
    """The table as read: each of our rows (value [95% interval]); where its model's ``paper_name`` and its
    variant's ``paper_name`` match a paper row (and the ``match_keys`` columns agree), that row and
    ``Δ (ours − paper)`` follow; the paper's other rows come last. ``keys``: extra identifying columns kept
    in front (Table 2's condition pair, Table 3's ensemble). ``paper_variant_key``: the column of our row
    that names the paper's variant instead of the variant's ``paper_name`` (Table 5: the method).
    A last column ``note`` says why a row of ours has no value, where one has none."""
    labels = [column.label for column in columns]
    measured, paper = table[table.source == MEASURED], table[table.source == PAPER]
    used, lines = set(), []
    notes = "note" in measured and bool(measured.note.notna().any())

    def line(row, source, values, signed=False, intervals=True):
        out = {"source": source, **{k: row[k] for k in keys}, "model": row["model"], "variant": row["variant"]}
        for label in labels:
            bounds = (row.get(f"{label}_ci_low"), row.get(f"{label}_ci_high")) if intervals else (None, None)
            out[label] = _cell(values[label], *bounds, signed=signed)
        if notes:
            own = row.get("note") if source != PAPER and pd.notna(row.get("note")) else ""
            out["note"] = own if source == MEASURED or STAND_IN in own else ""
        return out

    for _, row in measured.iterrows():
        lines.append(line(row, MEASURED, row))
        variant_name = (row[paper_variant_key] if paper_variant_key
                        else (variant_paper_names or {}).get(row["variant"], ""))
        same_keys = pd.Series([all(p[k] == row[k] for k in match_keys) for _, p in paper.iterrows()],
                              index=paper.index, dtype=bool)
        match = paper[(paper.model == row["paper_name"]) & (paper.variant == variant_name) & same_keys
                      ] if row["paper_name"] and variant_name else paper.iloc[:0]
        for index, reference in match.iterrows():
            used.add(index)
            lines.append(line(reference, PAPER, reference, intervals=False))
            difference = {label: row[label] - reference[label] for label in labels}
            lines.append(line(row, "Δ (ours − paper)", difference, signed=True, intervals=False))
    for index, reference in paper.iterrows():
        if index not in used:
            lines.append(line(reference, PAPER, reference, intervals=False))
    return pd.DataFrame(lines, columns=["source", *keys, "model", "variant", *labels, *(["note"] if notes else [])])


@dataclass(frozen=True)
class PaperTable:
    """One of the paper's tables as we publish it: the Parquet rows and how to lay them out."""

    number: int
    frame: pd.DataFrame  # source, [keys], model, variant, paper_name, values, intervals
    columns: list[Column]
    keys: tuple[str, ...] = ()
    match_keys: tuple[str, ...] = ()
    paper_variant_key: str | None = None  # see side_by_side

    def display(self, variant_paper_names: Mapping[str, str] | None = None) -> pd.DataFrame:
        return side_by_side(self.frame, self.columns, variant_paper_names, self.keys, self.match_keys,
                            self.paper_variant_key)


def _keyed(frame: pd.DataFrame, **keys) -> pd.DataFrame:
    for position, (name, value) in enumerate(keys.items()):
        frame.insert(1 + position, name, value)
    return frame


def paper_tables(metrics: pd.DataFrame, paper: pd.DataFrame, models: Sequence[str], ensembles: Mapping[str, list],
                 pairs: Sequence[tuple[str, str]], variants: Sequence[str] = ("default",),
                 paper_names: Mapping[str, str] | None = None, condition: str = "clean",
                 partial_conditions: Collection[str] = (),
                 planned: Collection[Sequence[str]] = (),
                 stand_ins: Mapping[str, str] | None = None) -> dict[int, PaperTable]:
    """Tables 1-4 (4 only with CharadesEgo rows), each with every row the paper published for it.

    ``partial_conditions``: those asked on single-instance images only (``crop``); Table 2 reads the other
    condition of such a pair on its ``single_instance`` subset. ``planned``: the cells of the runs the
    config plans; their rows stay, "not run", when the metrics table lacks them (:func:`measured_rows`)."""
    rows = list(models) + list(ensembles)
    common = dict(variants=variants, paper_names=paper_names, planned=planned, stand_ins=stand_ins)
    tables = {}
    columns = table1_columns(condition)
    tables[1] = PaperTable(1, with_paper(measured_rows(metrics, columns, rows, **common),
                                         paper_rows(paper, 1, columns)), columns)
    # Table 2: one block per configured condition pair; the paper's pair is clean ~ saltpepper
    generic = table2_columns()

    def pair_columns(a: str, b: str) -> list[Column]:
        def narrowed(beside: str, own: str) -> str | None:  # the single-instance questions a crop asks
            return "single_instance" if beside in partial_conditions and own not in partial_conditions else None

        return table2_columns(a, b, reference_subset=narrowed(b, a), other_subset=narrowed(a, b))

    blocks = [_keyed(measured_rows(metrics, pair_columns(a, b), rows, **common), reference=a, other=b)
              for a, b in pairs]
    blocks.append(_keyed(paper_rows(paper, 2, generic), reference="clean", other="saltpepper"))
    frame = pd.concat([b for b in blocks if len(b)], ignore_index=True) if any(len(b) for b in blocks) else blocks[-1]
    tables[2] = PaperTable(2, frame, generic, ("reference", "other"), ("reference", "other"))
    # Table 3: members then the ensemble, per configured ensemble; the paper's ensemble as one block
    columns = table3_columns(condition)
    blocks = [_keyed(measured_rows(metrics, columns, [*members, name], **common), ensemble=name)
              for name, members in ensembles.items()]
    published = paper_rows(paper, 3, columns)
    ensemble_names = [m for m in published.model if m.startswith("Ensemble(")]
    blocks.append(_keyed(published, ensemble=ensemble_names[0] if ensemble_names else "paper"))
    frame = pd.concat([b for b in blocks if len(b)], ignore_index=True) if any(len(b) for b in blocks) else blocks[-1]
    tables[3] = PaperTable(3, frame, columns, ("ensemble",))
    if "charadesego" in set(metrics.dataset) or any(cell[0] == "charadesego" for cell in planned):
        columns = table4_columns(condition)
        tables[4] = PaperTable(4, with_paper(measured_rows(metrics, columns, rows, dataset="charadesego", **common),
                                             paper_rows(paper, 4, columns)), columns)
    return tables


#: Table 1's accuracy columns, the headline of a run (the end-of-run summary, the report's landing page)
HEADLINE_COLUMNS = ("yn_obj_acc", "yn_verb_acc", "mc_obj_acc", "mc_verb_acc")


def headline_rows(table1: pd.DataFrame, variant_paper_names: Mapping[str, str] | None = None,
                  columns: Sequence[str] = HEADLINE_COLUMNS) -> list[tuple[dict, dict | None]]:
    """One of our rows per model of Table 1 (its Parquet: ``source``, ``model``, ``variant``, ``paper_name``,
    values), with the paper's row of the same model and decoding where Table 1 has one (the rule of
    :func:`side_by_side`: the model's and the variant's ``paper_name``), else None.

    A model with several variants shows one: the first whose decoding matches a paper row, else the first in the
    paper's decoding (a variant whose ``paper_name`` is :data:`PAPER_VARIANT`, beam search: the figures' rule),
    else the first with a value in ``columns``, else its first row. Models with a paper counterpart come first,
    then the others in the table's order."""
    names = dict(variant_paper_names or {})
    measured = table1[table1.source == MEASURED]
    paper = table1[table1.source == PAPER]

    def paper_row(row) -> dict | None:
        decoding = names.get(row["variant"], "")
        if not row.get("paper_name") or not decoding:
            return None
        match = paper[(paper.model == row["paper_name"]) & (paper.variant == decoding)]
        return match.iloc[0].to_dict() if len(match) else None

    def has_values(row) -> bool:
        return any(pd.notna(row.get(column)) for column in columns)

    def rank(row, reference) -> tuple[bool, bool, bool]:
        return reference is not None, has_values(row) and names.get(row["variant"]) == PAPER_VARIANT, has_values(row)

    chosen: dict[str, tuple[dict, dict | None]] = {}
    for _, frame_row in measured.iterrows():
        row = frame_row.to_dict()
        reference = paper_row(row)
        if row["model"] not in chosen or rank(row, reference) > rank(*chosen[row["model"]]):
            chosen[row["model"]] = (row, reference)
    return sorted(chosen.values(), key=lambda pair: pair[1] is None)  # stable: paper counterparts first
