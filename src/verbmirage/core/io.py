"""Table schemas, declared once, and the one way tables are written.

Every Parquet artifact of the workflow goes through :func:`write_table`: it
checks the columns against the declared schema, stamps provenance (package
version and the settings that produced the table) into the file metadata,
and writes atomically (temporary file, fsync, rename), so a killed job or a
crashed node never leaves a half-written table that a later job could read.
Files get the user's umask (not ``mkstemp``'s 0600), so a shared cluster
project can read them.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verbmirage import __version__
from verbmirage.core.paths import user_file_mode

QUESTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("image_id", pa.string()),
        ("image", pa.string()),
        ("verb", pa.string()),
        ("object", pa.string()),
        ("hoi_id", pa.int64()),
        ("prompt", pa.string()),
        ("options", pa.list_(pa.string())),
        ("answer", pa.string()),
        ("group_id", pa.string()),
        ("rotation", pa.int64()),
        ("rare", pa.bool_()),
        ("common", pa.bool_()),
    ]
)

PREDICTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("raw_answer", pa.string()),
        ("prediction", pa.string()),
        ("parse_rule", pa.string()),
        ("p_yes", pa.float64()),
        # logsumexp(z[yes]) - logsumexp(z[no]) at the first answer position (float64): sigmoid of it is p_yes,
        # finite where p_yes saturates at 1.0; null without yes/no logits (baselines, parsed text, MC rows)
        ("yes_margin", pa.float64()),
        # P(Yes) not renormalised: the probability mass of the yes tokens over the whole vocabulary at the first
        # answer position (the paper's Known-Object ranking score, read literally); null where the backend has
        # no logits; an API's is the mass of the yes tokens among the top logprobs it returns
        ("yes_mass", pa.float64()),
        ("option_probs", pa.list_(pa.float64())),
        ("confidence", pa.float64()),
        ("error", pa.string()),
        # VCD variants (docs/variants.md), first answer position: KL(q || p~) of the contrasted
        # distribution q against the plain one restricted to the plausibility set and renormalised, and the size
        # of that set (tokens with p >= beta * p_max); null without VCD
        ("vcd_kl", pa.float64()),
        ("vcd_plausible", pa.int64()),
        # the other direction, KL(p~ || q): the paper's "KL divergence between the original p_theta and the
        # contrasted p_vcd" names no direction (its wording reads as this one), so both are kept
        # (docs/analysis.md, "VCD divergence")
        ("vcd_kl_reverse", pa.float64()),
    ]
)

METRICS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("subset", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
    ]
)

QUESTION_COUNTS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("rows", pa.int64()),
        ("unique_questions", pa.int64()),
        ("images", pa.int64()),
        ("yes", pa.int64()),
        ("no", pa.int64()),
        ("yes_share", pa.float64()),  # yes / (yes + no): 1/3 is the paper's 1:2
        ("paper_unique_questions", pa.int64()),
        ("paper_used_questions", pa.int64()),  # of those, how many the paper's experiments asked (CharadesEgo)
        ("paper_yes_to_no", pa.string()),
        ("paper_yes_share", pa.float64()),
    ]
)

# One row per (question, decoder layer) of the attention analysis (analysis/attention.py).
ATTENTION = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("question_id", pa.string()),
        ("layer", pa.int64()),
        ("visual_share", pa.float64()),
        ("verb_share", pa.float64()),
        ("object_share", pa.float64()),
        ("key_area_share", pa.float64()),
        ("key_area_raw", pa.float64()),
        ("key_area_lift", pa.float64()),
        ("image_id", pa.string()),
        ("answer", pa.string()),
        ("correct", pa.bool_()),
    ]
)

# Nullu's truthful/hallucinated pairs (derived/nullu.py), saved beside the edited weights: images relative to the
# data root (HICO: images/train2015/...); HOI ids 0-based, -1 for LURE-format pairs.
NULLU_PAIRS = pa.schema(
    [
        ("image", pa.string()),
        ("truthful_prompt", pa.string()),
        ("hallucinated_prompt", pa.string()),
        ("truthful", pa.string()),
        ("hallucinated", pa.string()),
        ("hoi_id", pa.int64()),
        ("negative_hoi_id", pa.int64()),
    ]
)

# Attention summary (analysis/attention_summary.py): per (qset, condition, model, layer, measure, group),
# the correct and hallucinated rows compared (means, medians, difference with an image-bootstrap CI, AUROC).
ATTENTION_SUMMARY = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("layer", pa.int64()),
        ("measure", pa.string()),
        ("group", pa.string()),
        ("statistic", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
    ]
)

# Object reliance (analysis/object_reliance.py): one row per (model, object, yn|mc), Fig. 15 and Table 6 ...
OBJECT_RELIANCE = pa.schema(
    [
        ("model", pa.string()),
        ("object", pa.string()),
        ("qset_pair", pa.string()),
        ("n_obj", pa.int64()),
        ("n_verb", pa.int64()),
        ("acc_obj", pa.float64()),
        ("acc_verb", pa.float64()),
        ("delta", pa.float64()),
        ("in_set", pa.bool_()),
    ]
)

# ... and one row per (model, verb), Table 7.
VERB_INFLUENCE = pa.schema(
    [
        ("model", pa.string()),
        ("verb", pa.string()),
        ("n_obj", pa.int64()),
        ("n_verb", pa.int64()),
        ("yes_obj", pa.float64()),
        ("yes_verb", pa.float64()),
        ("delta", pa.float64()),
        ("influenced", pa.bool_()),
    ]
)

# Paper Tables 6 and 7 (percent): our rows ("measured", with the set sizes) and the paper's ("paper").
RELIANCE_TABLE6 = pa.schema(
    [
        ("source", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("overlap_index", pa.float64()),
        ("s1", pa.int64()),
        ("s2", pa.int64()),
        ("s1_and_s2", pa.int64()),
    ]
)

RELIANCE_TABLE7 = pa.schema(
    [
        ("source", pa.string()),
        ("model_a", pa.string()),
        ("model_b", pa.string()),
        ("variant", pa.string()),
        ("iou", pa.float64()),
        ("w_a", pa.int64()),
        ("w_b", pa.int64()),
        ("w_a_and_w_b", pa.int64()),
        ("w_a_or_w_b", pa.int64()),
    ]
)


def _paper_table(keys: tuple[str, ...], labels: tuple[str, ...]) -> pa.Schema:
    """A paper table beside ours (tables.py): identifying columns, one value per label and its 95% interval, and
    ``note``: why a row of ours has no value (``tables.NO_VALUES``, ``tables.NOT_RUN``; else null)."""
    return pa.schema(
        [("source", pa.string()), *[(key, pa.string()) for key in keys], ("model", pa.string()),
         ("variant", pa.string()), ("paper_name", pa.string()), *[(label, pa.float64()) for label in labels],
         *[(f"{label}_{end}", pa.float64()) for label in labels for end in ("ci_low", "ci_high")],
         ("note", pa.string())]
    )


# Paper Table 5 (mitigation_tables.py; percent): per group (Table 5's methods, Appendix F's prompt suffix) and
# method (the paper's row name), our rows ("measured") and the paper's ("paper"); paper_name = the paper model
# a row is compared with.
MITIGATION_TABLE5 = _paper_table(
    ("group", "method"), ("yn_obj_acc", "yn_obj_f1", "yn_verb_acc", "yn_verb_f1", "mc_obj_acc", "mc_verb_acc")
)
# Paper Table 8 (mitigation_tables.py; percent): per decoding (the variant's paper_name), as Table 1's columns.
DECODING_TABLE8 = _paper_table(
    ("decoding",), ("yn_obj_acc", "yn_obj_prec", "yn_obj_recall", "yn_verb_acc", "yn_verb_prec", "yn_verb_recall",
                    "mc_obj_acc", "mc_verb_acc")
)

# Token uncertainty (analysis/uncertainty.py, Figs. 9 and 12): one row per histogram bin of one
# (model, variant, condition, qset, group, correct) series; group is pred_yes, pred_no or mc.
UNCERTAINTY_HIST = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("group", pa.string()),
        ("correct", pa.bool_()),
        ("bin_left", pa.float64()),
        ("bin_right", pa.float64()),
        ("count", pa.int64()),
        ("density", pa.float64()),
    ]
)

# Field of view (analysis/fov.py, Fig. 10): one row per (model, variant, qset, condition) on the questions
# every FOV condition shares; delta_* is the paired change against the first (reference) condition.
FOV = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("margin", pa.float64()),
        ("crop_area_frac_mean", pa.float64()),
        ("n", pa.int64()),
        ("n_groups", pa.int64()),
        ("acc_plain", pa.float64()),
        ("acc_circular", pa.float64()),
        ("conf_mean", pa.float64()),
        ("conf_mean_correct", pa.float64()),
        ("conf_mean_hallucinated", pa.float64()),
        ("delta_conf_mean", pa.float64()),
        ("delta_ci_low", pa.float64()),
        ("delta_ci_high", pa.float64()),
    ]
)

# The question rows behind FOV (what Fig. 10's boxes are drawn from); confidence is null where it is not
# a token probability (baselines) or the row has an error.
FOV_ROWS = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("question_id", pa.string()),
        ("image_id", pa.string()),
        ("group_id", pa.string()),
        ("correct", pa.bool_()),
        ("confidence", pa.float64()),
    ]
)


# One row per (condition, model, variant, asked HOI) of the Known-Object AP (analysis/known_object.py).
KNOWN_OBJECT_AP = pa.schema(
    [
        ("dataset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("hoi_id", pa.int64()),
        ("verb", pa.string()),
        ("object", pa.string()),
        ("rare", pa.bool_()),
        ("n_pos", pa.int64()),
        ("n", pa.int64()),
        ("ap", pa.float64()),
        ("ap_voc11", pa.float64()),
        ("n_tied_scores", pa.int64()),
    ]
)

# VCD divergence (analysis/vcd_divergence.py): one row per (model, VCD variant, condition, qset), plus the
# sets pooled ("a+b"); KL columns over the rows with a stored vcd_kl, flip columns against the plain
# counterpart (null, with plain_note saying why, when there is none); paper_* on the pooled row only.
VCD_DIVERGENCE = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("plain_variant", pa.string()),
        ("plain_note", pa.string()),
        ("n", pa.int64()),
        ("n_dropped", pa.int64()),
        ("n_kl_zero", pa.int64()),
        ("share_kl_zero", pa.float64()),
        ("n_plausible_one", pa.int64()),
        ("share_plausible_one", pa.float64()),
        ("n_kl_zero_plausible_many", pa.int64()),
        ("plausible_mean", pa.float64()),
        ("kl_mean", pa.float64()),
        ("kl_median", pa.float64()),
        ("kl_q90", pa.float64()),
        ("kl_q99", pa.float64()),
        ("kl_max", pa.float64()),
        ("kl_median_positive", pa.float64()),
        # the same of the other direction, KL(p~ || q) (vcd_kl_reverse); null for tables written without it
        ("kl_reverse_mean", pa.float64()),
        ("kl_reverse_median", pa.float64()),
        ("kl_reverse_q90", pa.float64()),
        ("kl_reverse_q99", pa.float64()),
        ("kl_reverse_max", pa.float64()),
        ("n_paired", pa.int64()),
        ("n_flips", pa.int64()),
        ("flip_share", pa.float64()),
        ("yes_to_no", pa.int64()),
        ("no_to_yes", pa.int64()),
        ("n_fixed", pa.int64()),
        ("n_broken", pa.int64()),
        ("n_flips_plausible_one", pa.int64()),
        ("paper_model", pa.string()),
        ("paper_model_match", pa.bool_()),
        ("paper_n", pa.int64()),
        ("paper_share_kl_zero", pa.float64()),
    ]
)

# Its KL histogram: per series an exact-zero bin (bin_left == bin_right == 0), then log-spaced bins shared by
# every series; share = count / the series' KL rows (all shares of a series add up to 1).
VCD_KL_HIST = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("bin_left", pa.float64()),
        ("bin_right", pa.float64()),
        ("count", pa.int64()),
        ("share", pa.float64()),
    ]
)


# A LoRA fine-tune's log (derived/finetune.py): one row per optimizer step (1-based); loss = mean cross-entropy
# over the step's answer tokens, lr = the learning rate the step used, tokens = its answer (loss) tokens.
TRAIN_LOG = pa.schema(
    [
        ("step", pa.int64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("tokens", pa.int64()),
    ]
)

# Pangea training questions per source (derived/pangea.py): the pattern that left it out (empty: kept), its
# samples, labels and unsafe image names, the images and questions drawn, the selected (290) nodes they reach.
PANGEA_SOURCES = pa.schema(
    [
        ("source", pa.string()),
        ("excluded_by", pa.string()),
        ("samples", pa.int64()),
        ("unsafe_names", pa.int64()),
        ("labels", pa.int64()),
        ("images", pa.int64()),
        ("mc_questions", pa.int64()),
        ("yn_yes", pa.int64()),
        ("yn_no", pa.int64()),
        ("nodes_covered", pa.int64()),
    ]
)


class SchemaError(ValueError):
    """A table does not have the columns its schema declares."""


class DamagedTableError(ValueError):
    """A file that should be a Parquet table cannot be read (empty, cut short, not Parquet); names the file."""


#: What a damaged table's error adds: how to get it back.
REBUILD_ADVICE = ("if the workflow wrote it, delete it and rerun: Snakemake builds it again (and what was made "
                  "from it); otherwise replace it")


def read_schema(path: str | Path) -> pa.Schema:
    """A Parquet file's schema (and metadata); :class:`DamagedTableError` naming the file when it is damaged."""
    try:
        return pq.read_schema(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as error:
        raise DamagedTableError(f"{path}: not a readable Parquet table ({error}); {REBUILD_ADVICE}") from None


def to_arrow(frame: pd.DataFrame, schema: pa.Schema, where: str = "table") -> pa.Table:
    """Cast a DataFrame to ``schema`` (column order and types), naming what is wrong.

    A column added to the schema later (``_ADDED_COLUMNS``) that ``frame`` lacks is written null.
    """
    frame = _with_added_columns(frame, schema)
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise SchemaError(f"{where}: {error}") from error


def write_table(
    frame: pd.DataFrame,
    path: str | Path,
    schema: pa.Schema,
    provenance: dict | None = None,
    exclusive: bool = False,
) -> None:
    """Write ``frame`` as Parquet under ``schema``, atomically, with provenance metadata.

    The bytes depend only on the data and the provenance (no timestamps), so
    the same inputs give a byte-identical file. With ``exclusive`` an existing
    file is never replaced (``FileExistsError``).
    """
    path = Path(path)
    table = to_arrow(frame, schema, where=str(path))
    metadata = {
        b"verbmirage.version": __version__.encode(),
        b"verbmirage.provenance": json.dumps(provenance or {}, sort_keys=True, default=str).encode(),
    }
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with atomic_path(path, replace=not exclusive) as tmp:
        pq.write_table(table, tmp)


def fsync_directory(directory: str | Path) -> None:
    """Make a rename or link inside ``directory`` durable (a node crash cannot undo it)."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def atomic_path(path: str | Path, replace: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it becomes ``path``.

    The data is fsynced before the rename and the directory after it. With
    ``replace=False`` an existing ``path`` is never overwritten (the file is
    published with a hard link, which fails if the name exists:
    ``FileExistsError``). Leftover temporary files of earlier, killed writers
    of the same ``path`` are removed first; a failed write leaves none.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb+") as written:
            os.fsync(written.fileno())
        os.chmod(tmp, user_file_mode())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
        fsync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def read_table(path: str | Path, schema: pa.Schema | None = None) -> pd.DataFrame:
    """Read a Parquet table; with ``schema``, check its columns, their types and (for questions) values.

    A table written by hand or by another tool can have the right column
    names and still lie: ``rare`` as the strings "True"/"False" makes every
    row rare, a capitalised answer is never correct. Each error names the
    file, the column and the first bad row.
    """
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as error:  # pyarrow names no file for some damage (a cut footer)
        raise DamagedTableError(f"{path}: not a readable Parquet table ({error}); {REBUILD_ADVICE}") from None
    if schema is not None:
        added = _added_columns(schema)
        frame = _with_added_columns(frame, schema)  # a table written before such a column existed: null
        missing = [name for name in schema.names if name not in frame.columns]
        if missing:
            raise SchemaError(f"{path}: missing columns {missing}")
        stored = read_schema(path)
        check_types(stored, frame, pa.schema([f for f in schema if f.name in stored.names or f.name not in added]),
                    str(path))
        for declared, check in _VALUE_CHECKS:
            if schema.equals(declared):
                check(frame, str(path))
    return frame


def _same_kind(actual: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a stored type reads back as the declared one (widths and string flavours aside)."""
    if pa.types.is_null(actual):  # a column with no values at all
        return True
    if pa.types.is_dictionary(actual):  # a pandas categorical
        return _same_kind(actual.value_type, declared)
    for family in (pa.types.is_integer, pa.types.is_floating):
        if family(declared):
            return family(actual)
    if pa.types.is_string(declared) or pa.types.is_large_string(declared):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_list(declared) or pa.types.is_large_list(declared):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _same_kind(
            actual.value_type, declared.value_type
        )
    return actual.equals(declared)


def _first_value(frame: pd.DataFrame, column: str) -> str:
    """``row N (value)`` of the first non-empty cell, for an error message."""
    filled = frame[column].notna().to_numpy()
    if not filled.any():
        return "no values"
    row = int(filled.argmax())
    return f"row {row} ({frame[column].iloc[row]!r})"


def check_types(stored: pa.Schema, frame: pd.DataFrame, schema: pa.Schema, where: str) -> None:
    """Each declared column must be stored with the declared type (or a harmless equivalent)."""
    for field in schema:
        actual = stored.field(field.name).type
        if not _same_kind(actual, field.type):
            raise SchemaError(
                f"{where}: column '{field.name}', {_first_value(frame, field.name)}: "
                f"stored as {actual}, declared {field.type}"
            )


def check_questions(frame: pd.DataFrame, where: str) -> None:
    """The values a question table must hold: metrics trust these without looking again.

    ``question_id`` unique and set; ``qset`` a registered set; ``answer``
    "yes"/"no" for a yes/no set and the letter of one of the options for a
    multiple-choice set; ``image`` a safe relative path; ``rotation``, ``rare``
    and ``common`` set.
    """
    from verbmirage.core.paths import UnsafePathError, safe_relative_name
    from verbmirage.benchmark.questions import question_kind

    def bad(column: str, row: int, problem: str) -> SchemaError:
        return SchemaError(f"{where}: column '{column}', row {row}: {problem}")

    first_seen: dict = {}
    for row, question_id in enumerate(frame["question_id"].tolist()):  # tolist: Arrow columns convert in bulk
        if not isinstance(question_id, str):
            raise bad("question_id", row, f"missing id ({question_id!r})")
        if question_id in first_seen:
            raise bad("question_id", row, f"duplicate id {question_id!r} (first at row {first_seen[question_id]})")
        first_seen[question_id] = row
    kinds = {}
    for qset in frame["qset"].unique():
        try:
            kinds[qset] = question_kind(qset)
        except KeyError as error:
            row = int((frame["qset"] == qset).to_numpy().argmax())
            raise bad("qset", row, str(error.args[0])) from None
    for column in ("rotation", "rare", "common"):
        missing = frame[column].isna().to_numpy()
        if missing.any():
            raise bad(column, int(missing.argmax()), "missing value")
    safe_images: set = set()  # an image has many questions: its path is checked once
    for row, (qset, answer, options, image) in enumerate(
        zip(*(frame[column].tolist() for column in ("qset", "answer", "options", "image")))
    ):
        if kinds[qset] == "yn":
            if answer not in ("yes", "no"):
                raise bad("answer", row, f"{answer!r} is not 'yes' or 'no' (qset {qset})")
        else:
            count = 0 if options is None else len(options)
            letters = [chr(ord("A") + k) for k in range(min(count, 26))]
            if answer not in letters:
                raise bad("answer", row, f"{answer!r} is not the letter of one of its {count} options (qset {qset})")
        if image in safe_images:
            continue
        try:
            safe_relative_name(image, "image")
        except UnsafePathError as error:
            raise bad("image", row, str(error)) from None
        safe_images.add(image)


_VALUE_CHECKS = [(QUESTIONS, check_questions)]  # (schema, check of its values) for read_table
# (schema, nullable columns added after tables were written with it): an older table reads with them null,
# and a writer that does not know them yet writes them null.
_ADDED_COLUMNS = [(PREDICTIONS, ("yes_margin", "yes_mass", "vcd_kl", "vcd_plausible", "vcd_kl_reverse")),
                  (MITIGATION_TABLE5, ("note",)), (DECODING_TABLE8, ("note",))]


def _added_columns(schema: pa.Schema) -> tuple[str, ...]:
    return next((names for declared, names in _ADDED_COLUMNS if schema.equals(declared)), ())


def _with_added_columns(frame: pd.DataFrame, schema: pa.Schema) -> pd.DataFrame:
    """``frame`` with each later-added column of ``schema`` it lacks, as nulls."""
    absent = [name for name in _added_columns(schema) if name not in frame.columns]
    if not absent:
        return frame
    frame = frame.copy()
    for name in absent:
        frame[name] = pd.Series(None, index=frame.index, dtype=schema.field(name).type.to_pandas_dtype())
    return frame


def read_provenance(path: str | Path) -> dict:
    """The settings stamped into a table by :func:`write_table`."""
    metadata = read_schema(path).metadata or {}
    return json.loads(metadata.get(b"verbmirage.provenance", b"{}"))


def write_text(path: str | Path, text: str) -> None:
    """Write a small text file atomically (fsynced, user's umask)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


#: How tables print a missing or undefined value (no run, or a metric whose denominator is 0).
MISSING_VALUE = "–"


def write_markdown(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as Markdown (via tabulate), atomically; NaN prints as ``MISSING_VALUE``."""
    cells = frame.astype(object).where(frame.notna(), None)  # tabulate's missingval applies to None only
    table = cells.to_markdown(index=False, floatfmt=".2f", missingval=MISSING_VALUE)
    write_text(path, (f"## {title}\n\n" if title else "") + table + "\n")


def write_html(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Write a table as a small standalone HTML page (for the Snakemake report), atomically."""
    body = frame.to_html(index=False, float_format=lambda v: f"{v:.2f}", na_rep=MISSING_VALUE, border=0)
    heading = f"<h2>{title}</h2>\n" if title else ""
    write_text(path, f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>"
                      f"<body>\n{heading}{body}\n</body></html>\n")
