"""Question tables are checked against the declared types and values.

Each broken table is a real Parquet file written the way a hand edit or
another tool would write it (pandas or pyarrow, without our schema), and the
error must name the file, the column and the first bad row.
"""

import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbmirage.benchmark.conditions import MANIFEST, ImageResolver, condition_questions
from verbmirage.core.io import DamagedTableError, SchemaError, read_provenance, read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS


def _questions() -> pd.DataFrame:
    """Two yes/no rows and one MC question in its four rotations, as the builders make them."""
    rows = []
    for n, answer in enumerate(["yes", "no"]):
        rows.append({"question_id": f"yn{n}", "dataset": "hico", "qset": "yn_obj", "image_id": "HICO_test2015_1",
                     "image": "images/test2015/HICO_test2015_1.jpg", "verb": "ride", "object": "horse",
                     "hoi_id": 3, "prompt": "Is someone riding a horse?", "options": [], "answer": answer,
                     "group_id": f"yn{n}", "rotation": 0, "rare": n == 1, "common": True})
    for rotation in range(4):
        rows.append({"question_id": f"mc{rotation}", "dataset": "hico", "qset": "mc_obj",
                     "image_id": "HICO_test2015_2", "image": "images/test2015/HICO_test2015_2.jpg", "verb": "ride",
                     "object": "horse", "hoi_id": 3, "prompt": "Which?", "options": ["a", "b", "c", "d"],
                     "answer": "ABCD"[rotation], "group_id": "g", "rotation": rotation, "rare": False,
                     "common": True})
    return pd.DataFrame(rows)


def _raises(path, column: str, row: int, detail: str = ""):
    return pytest.raises(SchemaError, match=re.escape(str(path)) + rf".*'{column}'.*row {row}\b.*{detail}")


def test_a_table_written_by_the_builders_reads_back(tmp_path):
    write_table(_questions(), tmp_path / "q.parquet", QUESTIONS)
    assert len(read_table(tmp_path / "q.parquet", QUESTIONS)) == 6


def test_harmless_equivalents_are_accepted(tmp_path):
    """large_string instead of string, int32 for int64, and an all-empty (null-typed) column."""
    frame = _questions().assign(verb=None)
    fields = [pa.field(f.name, pa.large_string()) if f.type == pa.string() else f for f in QUESTIONS]
    schema = pa.schema([pa.field("verb", pa.null()) if f.name == "verb" else
                        pa.field("rotation", pa.int32()) if f.name == "rotation" else f for f in fields])
    pq.write_table(pa.Table.from_pandas(frame[QUESTIONS.names], schema=schema, preserve_index=False),
                   tmp_path / "q.parquet")
    assert read_table(tmp_path / "q.parquet", QUESTIONS).answer.tolist()[:2] == ["yes", "no"]


@pytest.mark.parametrize(
    "column, broken, row",
    [
        ("rare", lambda f: f.assign(rare=f.rare.map(str)), 0),  # "True"/"False" strings: every row counted rare
        ("rotation", lambda f: f.assign(rotation=f.rotation.map(str)), 0),  # plain accuracy read 0.0
        ("question_id", lambda f: f.assign(question_id=range(len(f))), 0),  # int ids crashed run_shard
        ("options", lambda f: f.assign(options=f.options.map(";".join)), 0),  # string options: IndexError
        ("hoi_id", lambda f: f.assign(hoi_id=f.hoi_id.map(str)), 0),
    ],
)
def test_wrong_types_are_refused(tmp_path, column, broken, row):
    path = tmp_path / "q.parquet"
    broken(_questions()).to_parquet(path, index=False)
    with _raises(path, column, row, "declared"):
        read_table(path, QUESTIONS)


@pytest.mark.parametrize(
    "column, row, edit",
    [
        ("answer", 0, lambda f: f.assign(answer=f.answer.str.capitalize())),  # "Yes" is never correct
        ("answer", 4, lambda f: f.assign(answer=["yes", "no", "A", "B", "yes", "D"])),  # yes/no on an MC set
        ("answer", 5, lambda f: f.assign(answer=["yes", "no", "A", "B", "C", "E"])),  # no option E
        ("question_id", 3, lambda f: f.assign(question_id=["yn0", "yn1", "mc0", "mc0", "mc2", "mc3"])),
        ("qset", 0, lambda f: f.assign(qset="yn_unknown")),
        ("image", 1, lambda f: f.assign(image=["images/test2015/a.jpg", "../../victim.jpg"] + list(f.image[2:]))),
    ],
)
def test_wrong_values_are_refused(tmp_path, column, row, edit):
    path = tmp_path / "q.parquet"
    table = pa.Table.from_pandas(edit(_questions())[QUESTIONS.names], schema=QUESTIONS, preserve_index=False)
    pq.write_table(table, path)  # the right types: only the values lie
    with _raises(path, column, row):
        read_table(path, QUESTIONS)


def test_missing_rotation_is_refused(tmp_path):
    path = tmp_path / "q.parquet"
    frame = _questions().astype({"rotation": "Int64"})
    frame.loc[2, "rotation"] = pd.NA
    pq.write_table(pa.Table.from_pandas(frame[QUESTIONS.names], schema=QUESTIONS, preserve_index=False), path)
    with _raises(path, "rotation", 2, "missing"):
        read_table(path, QUESTIONS)


def test_prediction_tables_are_type_checked_too(tmp_path):
    path = tmp_path / "p.parquet"
    frame = pd.DataFrame({"question_id": ["a"], "raw_answer": ["yes"], "prediction": ["yes"], "parse_rule": ["x"],
                          "p_yes": ["0.9"], "option_probs": [None], "confidence": [0.9], "error": [None]})
    frame.to_parquet(path, index=False)
    with _raises(path, "p_yes", 0, "declared double"):
        read_table(path, PREDICTIONS)


@pytest.fixture(params=["empty", "cut"])
def damaged(request, tmp_path):
    """A table the workflow wrote, then damaged from outside (a full disk elsewhere, a bad copy)."""
    path = tmp_path / "q.parquet"
    write_table(_questions(), path, QUESTIONS, provenance={"model": "m"})
    path.write_bytes(b"" if request.param == "empty" else path.read_bytes()[:-30])
    return path


def test_a_damaged_table_is_named_with_how_to_rebuild_it(damaged):
    for read in (lambda path: read_table(path, QUESTIONS), read_provenance):
        with pytest.raises(DamagedTableError, match=re.escape(f"{damaged}: not a readable Parquet table") +
                           ".*delete it and rerun"):
            read(damaged)


def test_a_damaged_image_manifest_is_named(damaged):
    folder = damaged.parent / "clean"
    folder.mkdir()
    damaged.rename(folder / MANIFEST)
    with pytest.raises(DamagedTableError, match=re.escape(f"{folder / MANIFEST}: not a readable Parquet table")):
        condition_questions(_questions(), folder)
    with pytest.raises(DamagedTableError, match=re.escape(f"{folder / MANIFEST}: not a readable Parquet table")):
        ImageResolver(folder)
