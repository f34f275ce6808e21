"""Run the workflow in a scratch folder: a smaller demo config, the Snakemake API, dry-run job lists.

The demo run itself is one session fixture (`demo_run` in conftest.py) shared by every slow test file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
#: what the slow tests keep for CI (screenshots of the demo's report; git-ignored); the session's summary names it
ARTIFACTS = Path(os.environ.get("VERBMIRAGE_TEST_ARTIFACTS", REPO / "test-artifacts"))


def write_config(workdir: Path, edit=None) -> Path:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["demo"].update(train_images=150, test_images=60, charades_pairs=6)
    config["metrics"]["bootstrap_resamples"] = 50
    if edit:
        edit(config)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_api(workdir: Path) -> None:
    from snakemake.api import SnakemakeApi
    from snakemake.scheduling.greedy import SchedulerSettings as GreedySchedulerSettings
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
        SchedulingSettings,
    )

    with SnakemakeApi(OutputSettings()) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=[workdir / "config.yaml"]),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )
        workflow.dag(dag_settings=DAGSettings()).execute_workflow(  # the greedy scheduler, as tools/demo.sh
            executor="local", scheduling_settings=SchedulingSettings(scheduler="greedy"),
            scheduler_settings=GreedySchedulerSettings())


def planned_jobs(workdir: Path, configfile: Path | None = None, *extra: str, targets=()) -> list[tuple[str, dict]]:
    """(rule, wildcards) of every job a dry run would execute (config: ``workdir``/config.yaml by default;
    ``targets``: files to plan instead of rule all)."""
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *targets, "--dry-run", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir), "--configfile", str(configfile or workdir / "config.yaml"), *extra],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = []
    for block in re.split(r"\n(?=(?:localrule|rule) \w+:)", result.stdout):
        match = re.match(r"(?:localrule|rule) (\w+):", block)
        if match:
            found = re.search(r"^\s+wildcards: (.*)$", block, re.M)
            wildcards = dict(kv.split("=", 1) for kv in found.group(1).split(", ")) if found else {}
            jobs.append((match.group(1), wildcards))
    return jobs


def derived_model_runs(workdir: Path, slug: str, qsets, method: str) -> list[dict]:
    """A derived model's demo runs (default and beam5 on HICO clean): each set's predictions exist without
    errors, and Table 5 has its beam5 row as ``method``. Returns the model entry each job loaded."""
    from verbmirage.core.io import read_provenance, read_table
    from verbmirage.core.schemas import MITIGATION_TABLE5, PREDICTIONS

    loaded = []
    for qset in qsets:
        for variant in ("default", "beam5"):
            frame = read_table(workdir / f"results/predictions/hico/{qset}/clean/{slug}/{variant}.parquet",
                               PREDICTIONS)
            assert len(frame) and frame.error.isna().all(), (qset, variant)
            provenance = read_provenance(workdir / f"results/shards/hico/clean/{slug}/{variant}/0/{qset}.parquet")
            assert provenance["model_slug"] == slug
            loaded.append(provenance["model"])
    table5 = read_table(workdir / "results/tables/table5.parquet", MITIGATION_TABLE5)
    row = table5[(table5.source == "measured") & (table5.model == slug)]
    assert row.method.tolist() == [method] and row.variant.tolist() == ["beam5"]
    assert row.yn_obj_acc.between(0, 100).all() and row.mc_verb_acc.between(0, 100).all()
    assert method in (workdir / "results/tables/table5.md").read_text()
    return loaded
