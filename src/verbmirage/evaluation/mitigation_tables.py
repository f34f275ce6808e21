"""The paper's Tables 5 (mitigation methods) and 8 (decoding strategies), ours beside the paper's rows.

Both come from the long metrics table like Tables 1-4 (:mod:`verbmirage.evaluation.tables`): our rows are
``source`` measured (value and 95% interval), the paper's ``source`` paper, and where names match the
paper's row and ``Δ (ours − paper)`` follow ours.

Table 8: every (model, variant) run whose variant's ``paper_name`` is one of the paper's decodings
(``sampling``, ``sampling+VCD``, ``beam5``), with Table 1's columns; matched by the model's and the
variant's ``paper_name``.

Table 5 (all the paper's rows are LLaVA-1.5-7B) names a row by its *method*:

- a variant's ``paper_name`` ``beam5`` is the row ``none``: the paper's Table 5 baseline is its default
  decoding, beam search (its Table 5 "LLaVA V1.5" row equals Table 1's and Table 8's beam column);
  ``VCD`` (VCD + beam search) and ``OPERA`` are rows of their own;
- a model entry with ``paper_method`` (a derived or fine-tuned LLaVA: Nullu, REVERIE, HaloQuest, Octopus,
  the paper's Pangea LoRA) is that row, under its ``beam5`` variant (the paper's decoding), and is compared
  with the paper's LLaVA-1.5-7B row of that method only when it is built on the paper's LLaVA-1.5-7B (its
  base's ``paper_name``); a Pangea fine-tune that departs from the paper's training mix, or a Nullu that
  departs from the official one (its HalluSpace from other data than LURE's, the official Nullu's), is named a
  variant of its method and never paired (:mod:`verbmirage.evaluation.paper_methods`, read when a run is
  planned);
- Appendix F's prompt suffix (variant ``paper_name`` ``prompt:pay-attention-to-verb``; the paper prints
  only the two YN F1) is a second row group, ``Appendix F (prompt suffix)``, read against ``none``; Appendix
  F's other numbers, Qwen2.5-VL-7B's YN F1 without a mitigation, are a third, ``Appendix F (Qwen2.5-VL-7B)``:
  the runs of a model whose ``paper_name`` is Qwen2.5-VL-7B under the paper's decoding (beam5).

Rows of models with a ``paper_method`` appear only as that method. The other models appear when they are
the paper's LLaVA-1.5-7B (``paper_name``) or ran a mitigation (a VCD, OPERA or prompt-suffix variant),
with every Table-5 variant they ran, so a mitigation always sits next to its own baseline.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from verbmirage.evaluation.paper_methods import TABLE5_MODEL, TABLE5_MODEL_METHODS, TABLE5_VARIANT_METHODS
from verbmirage.evaluation.paper_numbers import PAPER_VARIANT
from verbmirage.evaluation.tables import (
    Column,
    PaperTable,
    measured_rows,
    paper_rows,
    table1_columns,
    table_columns,
    with_paper,
)

#: Appendix F's ad-hoc prompt (the ``text`` rows of paper_tables.csv)
PROMPT_SUFFIX_METHOD = "prompt:pay-attention-to-verb"
TABLE5_GROUP, PROMPT_GROUP = "Table 5", "Appendix F (prompt suffix)"
#: Appendix F also prints Qwen2.5-VL-7B's YN F1 without any mitigation (its decoding: the paper's default)
APPENDIX_F_MODEL, APPENDIX_F_MODEL_GROUP = "Qwen2.5-VL-7B", "Appendix F (Qwen2.5-VL-7B)"
#: the row groups in the order they are shown
GROUP_ORDER = {TABLE5_GROUP: 0, PROMPT_GROUP: 1, APPENDIX_F_MODEL_GROUP: 2}
#: the paper's row order within Table 5
TABLE5_ORDER = ("none", "OPERA", "VCD", *TABLE5_MODEL_METHODS, PROMPT_SUFFIX_METHOD)
#: Table 8's decodings (variant paper_name), in the paper's row order
TABLE8_DECODINGS = ("sampling", "sampling+VCD", PAPER_VARIANT)


def table5_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 5: YN accuracy and F1 with and without the object, MC circular accuracy."""
    return [
        Column("yn_obj_acc", "yn_obj", condition, "accuracy"),
        Column("yn_obj_f1", "yn_obj", condition, "f1"),
        Column("yn_verb_acc", "yn_verb", condition, "accuracy"),
        Column("yn_verb_f1", "yn_verb", condition, "f1"),
        Column("mc_obj_acc", "mc_obj", condition, "circular_accuracy"),
        Column("mc_verb_acc", "mc_verb", condition, "circular_accuracy"),
    ]


def table8_columns(condition: str = "clean") -> list[Column]:
    """Paper Table 8: Table 1's columns (YN accuracy, precision, recall; MC circular accuracy; ours: unknown share)."""
    return table1_columns(condition)


def _runs(metrics: pd.DataFrame, dataset: str = "hico", subset: str = "all") -> set[tuple[str, str]]:
    """(model, variant) pairs with at least one value in the metrics table."""
    chosen = metrics[(metrics.dataset == dataset) & (metrics.subset == subset)]
    return set(zip(chosen.model, chosen.variant))


def table5_runs(
    runs: set[tuple[str, str]],
    models: Sequence[str],
    variant_paper_names: Mapping[str, str],
    paper_names: Mapping[str, str],
    paper_methods: Mapping[str, str],
    method_pairs: Mapping[str, str] | None = None,
) -> list[dict]:
    """Our Table 5 rows: group, method, model, variant and the paper model compared with (``method_pairs`` for
    the ``paper_method`` models: :func:`~verbmirage.evaluation.paper_methods.paper_method_pairs`), in the
    paper's order."""
    beam_variants = [v for v, name in variant_paper_names.items() if name == PAPER_VARIANT]
    mitigations = {v for v, name in variant_paper_names.items()
                   if name in ("VCD", "OPERA", PROMPT_SUFFIX_METHOD)}
    rows = []
    for model in models:
        if model in paper_methods:
            rows += [{"group": TABLE5_GROUP, "method": paper_methods[model], "model": model, "variant": v,
                      "paper_name": (method_pairs or {}).get(model, "")} for v in beam_variants if (model, v) in runs]
            continue
        if paper_names.get(model) == APPENDIX_F_MODEL:  # Appendix F's plain F1 of Qwen2.5-VL-7B
            rows += [{"group": APPENDIX_F_MODEL_GROUP, "method": "none", "model": model, "variant": v,
                      "paper_name": APPENDIX_F_MODEL} for v in beam_variants if (model, v) in runs]
        in_scope = paper_names.get(model) == TABLE5_MODEL or any((model, v) in runs for v in mitigations)
        if not in_scope:
            continue
        for variant, name in variant_paper_names.items():
            if (model, variant) not in runs:
                continue
            if name in TABLE5_VARIANT_METHODS:
                group, method = TABLE5_GROUP, TABLE5_VARIANT_METHODS[name]
            elif name == PROMPT_SUFFIX_METHOD:
                group, method = PROMPT_GROUP, PROMPT_SUFFIX_METHOD
            else:
                continue
            rows.append({"group": group, "method": method, "model": model, "variant": variant,
                         "paper_name": paper_names.get(model, "")})
    order = {method: i for i, method in enumerate(TABLE5_ORDER)}
    order |= {method.split(" (")[0]: i for method, i in order.items()}  # a variant of a method sits with it
    place = lambda method: order.get(method, order[method.split(" (")[0]])  # noqa: E731
    return sorted(rows, key=lambda row: (GROUP_ORDER[row["group"]], place(row["method"])))


def _with_keys(frame: pd.DataFrame, keys: dict) -> pd.DataFrame:
    """``frame`` with identifying columns (scalars or one value per row) right after ``source``."""
    for position, (name, value) in enumerate(keys.items()):
        frame.insert(1 + position, name, value)
    return frame


@dataclass(frozen=True)
class GroupedPaperTable(PaperTable):
    """Table 5 read group by group (its methods, then Appendix F's): each group's rows, then its paper-only rows."""

    def display(self, variant_paper_names: Mapping[str, str] | None = None) -> pd.DataFrame:
        groups = sorted(set(self.frame.group), key=GROUP_ORDER.get)
        parts = [replace(self, frame=self.frame[self.frame.group == group]) for group in groups]
        shown = [PaperTable.display(part, variant_paper_names) for part in parts]
        if not shown:
            return PaperTable.display(self, variant_paper_names)
        joined = pd.concat(shown, ignore_index=True)
        return joined.fillna({"note": ""}) if "note" in joined else joined  # a group without notes has none


def table5(
    metrics: pd.DataFrame,
    paper: pd.DataFrame,
    models: Sequence[str],
    variant_paper_names: Mapping[str, str],
    paper_names: Mapping[str, str] | None = None,
    paper_methods: Mapping[str, str] | None = None,
    condition: str = "clean",
    method_pairs: Mapping[str, str] | None = None,
    planned: Collection[Sequence[str]] = (),
    stand_ins: Mapping[str, str] | None = None,
) -> PaperTable:
    """Paper Table 5 and Appendix F's prompt suffix, ours (:func:`table5_runs`) then the paper's rows; a planned
    run (``planned``, as in :func:`~verbmirage.evaluation.tables.measured_rows`) without metrics keeps its row, "not run"."""
    columns = table5_columns(condition)
    blocks = []
    runs = _runs(metrics) | {(m, v) for d, c, m, v, _ in planned if (d, c) == ("hico", condition)}
    for run in table5_runs(runs, models, variant_paper_names, paper_names or {}, paper_methods or {},
                           method_pairs):
        row = measured_rows(metrics, columns, [run["model"]], [run["variant"]],
                            paper_names={run["model"]: run["paper_name"]}, planned=planned, stand_ins=stand_ins)
        if len(row):
            blocks.append(_with_keys(row, {"group": run["group"], "method": run["method"]}))
    published = paper_rows(paper, 5, columns)
    blocks.append(_with_keys(published, {"group": TABLE5_GROUP, "method": published.variant.tolist()}))
    text = paper_rows(paper, "text", columns)
    appendix = text[text.variant == PROMPT_SUFFIX_METHOD].reset_index(drop=True)
    blocks.append(_with_keys(appendix, {"group": PROMPT_GROUP, "method": appendix.variant.tolist()}))
    qwen = text[(text.model == APPENDIX_F_MODEL) & (text.variant == PAPER_VARIANT)].reset_index(drop=True)
    qwen = qwen.assign(variant="none")  # its plain decoding: the row "none", as in Table 5
    blocks.append(_with_keys(qwen, {"group": APPENDIX_F_MODEL_GROUP, "method": ["none"] * len(qwen)}))
    frame = pd.concat([b for b in blocks if len(b)], ignore_index=True) if any(len(b) for b in blocks) else (
        pd.DataFrame(columns=["source", "group", "method", *table_columns(columns)[1:]]))
    return GroupedPaperTable(5, frame, columns, keys=("group", "method"), match_keys=("group",),
                             paper_variant_key="method")


def table8(
    metrics: pd.DataFrame,
    paper: pd.DataFrame,
    models: Sequence[str],
    variant_paper_names: Mapping[str, str],
    paper_names: Mapping[str, str] | None = None,
    condition: str = "clean",
    planned: Collection[Sequence[str]] = (),
    stand_ins: Mapping[str, str] | None = None,
) -> PaperTable:
    """Paper Table 8: every run of a variant named like one of the paper's decodings, then the paper's rows
    (``planned``: as in :func:`~verbmirage.evaluation.tables.measured_rows`)."""
    columns = table8_columns(condition)
    order = {name: i for i, name in enumerate(TABLE8_DECODINGS)}
    variants = sorted((v for v, name in variant_paper_names.items() if name in order),
                      key=lambda v: order[variant_paper_names[v]])
    measured = measured_rows(metrics, columns, models, variants, paper_names=paper_names, planned=planned,
                             stand_ins=stand_ins)
    measured = _with_keys(measured, {"decoding": [variant_paper_names[v] for v in measured.variant]})
    published = paper_rows(paper, 8, columns)
    published = _with_keys(published, {"decoding": published.variant.tolist()})
    return PaperTable(8, with_paper(measured, published), columns, keys=("decoding",))
