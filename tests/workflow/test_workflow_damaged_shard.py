"""A shard table damaged inside its job's output folder, in Snakemake: the merge names the folder and the forced
rerun that rebuilds it, and that rerun, as docs/faults.md gives it, ends with the undamaged predictions.

A blind baseline on one question set, one condition and a small demo, building only the predictions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verbmirage.core.io import read_table
from verbmirage.core.schemas import PREDICTIONS
from workflow_run import REPO, planned_jobs, write_config

pytestmark = pytest.mark.slow

PREDICTIONS_FILE = "results/predictions/hico/yn_obj/clean/random/default.parquet"
SHARD = "results/shards/hico/clean/random/default/0"
MERGE_LOG = "logs/merge_predictions/hico/clean/random/default.log"


def _coin_on_clean_hico(config):
    config["demo"].update(train_images=20, test_images=12)
    config["questions"]["sets"] = ["yn_obj"]
    config["models"] = {"random": {"backend": "random", "seed": 0}}
    config.update(ensembles={}, conditions={"clean": {"type": "clean"}}, job_server=False)
    del config["datasets"]["charadesego"]
    config.pop("analysis", None)
    config["metrics"]["error_consistency"] = []


def _snakemake(workdir: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", PREDICTIONS_FILE, *arguments, "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir), "--configfile", str(workdir / "config.yaml"), "--cores", "1"],
        capture_output=True, text=True, timeout=600,
    )


def test_a_damaged_shard_table_is_named_and_the_documented_rerun_repairs_it(tmp_path):
    write_config(tmp_path, _coin_on_clean_hico)
    built = _snakemake(tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    undamaged = read_table(tmp_path / PREDICTIONS_FILE, PREDICTIONS)

    os.truncate(tmp_path / SHARD / "yn_obj.parquet", 300)
    assert planned_jobs(tmp_path, targets=[PREDICTIONS_FILE]) == []  # Snakemake does not look into the folder
    merged = _snakemake(tmp_path, "-R", PREDICTIONS_FILE)  # the merge reads it
    assert merged.returncode != 0
    log = (tmp_path / MERGE_LOG).read_text()
    assert f"DamagedShardError: {SHARD}/yn_obj.parquet: not a readable Parquet table" in log
    assert f"rebuild the folder with `snakemake -R {SHARD}`" in log

    repaired = _snakemake(tmp_path, "-R", SHARD)  # docs/faults.md, "Damaged files"
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    pd.testing.assert_frame_equal(read_table(tmp_path / PREDICTIONS_FILE, PREDICTIONS), undamaged)
