"""Merging a suite job's shards: each question set's table from the output folders of its image shards, the
provenance it is stamped with, and a missing or damaged shard table named with the rerun that repairs it
(docs/faults.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from verbmirage.core.io import REBUILD_ADVICE, DamagedTableError, SchemaError, read_provenance, read_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.inference.runs import DamagedShardError, merge_shards, suite_table
from verbmirage.inference.store import parts_directory


def merge_suite_shards(questions: pd.DataFrame, shard_outputs: list[str | Path], qset: str,
                       where: str = "predictions") -> pd.DataFrame:
    """One set's table from the output folders of its suite shards: every question exactly once, in question order.

    A shard's table that is missing or damaged is a :class:`DamagedShardError` naming its folder: the folder is
    the job's output (a Snakemake ``directory()``), and Snakemake does not look inside it, so only a forced
    rerun of that folder rebuilds the table (deleting the table alone plans nothing).
    """
    tables = []
    for output in shard_outputs:
        with _shard_damage(output, qset):
            tables.append(read_table(suite_table(output, qset), PREDICTIONS))
    return merge_shards(questions, tables, where)


def shard_provenance(output: str | Path, qset: str) -> dict:
    """The settings stamped into a suite shard's table of ``qset``, less ``shard``, ``qset`` and ``batching`` (each
    shard's own: :func:`shards_batching`): what the merged table is stamped with. A missing or damaged table is a
    :class:`DamagedShardError` (:func:`merge_suite_shards`)."""
    with _shard_damage(output, qset):
        stamped = read_provenance(suite_table(output, qset))
    return {key: value for key, value in stamped.items() if key not in ("shard", "qset", "batching")}


def shards_batching(shard_outputs: list[str | Path], qset: str) -> dict:
    """``{"batching": [each shard's batch and call sizes]}`` for a merged table's provenance where any shard was
    sized (a GPU: each job sizes its own, on its own device), else nothing."""
    found = []
    for output in shard_outputs:
        with _shard_damage(output, qset):
            found.append(read_provenance(suite_table(output, qset)).get("batching"))
    return {"batching": found} if any(found) else {}


@contextmanager
def _shard_damage(output: str | Path, qset: str) -> Iterator[None]:
    """Turn a missing or unreadable table of a suite shard's folder into a :class:`DamagedShardError` that names
    the folder and the forced rerun that rebuilds it."""
    table = suite_table(output, qset)
    try:
        yield
    except (FileNotFoundError, DamagedTableError, SchemaError) as error:
        problem = ("missing" if isinstance(error, FileNotFoundError)
                   else str(error).removeprefix(f"{table}: ").removesuffix(f"; {REBUILD_ADVICE}"))
        raise DamagedShardError(
            f"{table}: {problem}. It is inside the output folder of an inference job, which Snakemake does not look "
            f"into; rebuild the folder with `snakemake -R {output}` (or `verbmirage run --configfile <config> -- -R "
            f"{output}`): the job reuses the answers kept in {parts_directory(output)} that are still readable "
            "(the table and its set's kept answers are one file: a damaged table's questions are asked again), "
            "and what was made from the folder is made again") from None
