"""The demo through a real single-node SLURM (`snakemake --profile profiles/slurm`).

tools/slurm/start_cluster.sh starts munge, slurmctld and slurmd (Debian's
packages) with two fake GPUs. Inference shards must reach SLURM as jobs, with
a GPU request exactly for the model that asks for one; light rules must run
on the submitting node; the metrics must equal a local run's.
Skipped only where SLURM cannot be started (not root); never in CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: .*/rule_(\w+)/(\S+)/\d+\.log\)")


@pytest.fixture(scope="module")
def slurm_cluster():
    problem = None
    if os.geteuid() != 0:
        problem = "starting SLURM needs root"
    else:
        started = subprocess.run([str(REPO / "tools" / "slurm" / "start_cluster.sh")], capture_output=True,
                                 text=True, timeout=600)
        if started.returncode != 0:
            problem = f"SLURM did not start: {started.stdout}{started.stderr}"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    yield  # left running: stopping and restarting costs more than it saves (tools/slurm/stop_cluster.sh)


def _config(workdir: Path) -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["demo"].update(train_images=100, test_images=40)
    config["questions"]["sets"] = ["yn_verb", "mc_verb"]
    del config["datasets"]["charadesego"]  # keep the SLURM run short: HICO only, no attention analysis
    config.pop("analysis", None)
    config["conditions"] = {"clean": config["conditions"]["clean"]}  # one condition: scheduling is what is tested
    config["metrics"]["error_consistency"] = []
    config["metrics"]["bootstrap_resamples"] = 50
    config["variants"] = {"default": {}}  # the demo's mitigation variants add jobs, not scheduling cases
    # a CPU model with two shards, one without, the GPU model; an ensemble of two (a light job on the node);
    # no derived model (no build job: it lists beam5)
    config["models"] = {slug: config["models"][slug] for slug in ("always_yes", "random", "tiny_llava")}
    config["ensembles"] = {"blind_vote": ["always_yes", "random"]}
    # the test node has 2 CPUs: a GPU job may ask for one per GPU
    config["models"]["tiny_llava"]["resources"] = {"gpu": 1, "mem_mb": 2000, "runtime": 10, "cpus_per_gpu": 1}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _snakemake(workdir: Path, *extra: str) -> str:
    command = ["timeout", "-s", "INT", "1200", sys.executable, "-m", "snakemake", "--snakefile",
               str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(workdir / "config.yaml"),
               *extra]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def _tres(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    found = re.search(r"TresPerJob=(\S+)", shown)
    return found.group(1) if found else ""


def test_demo_through_slurm(slurm_cluster, tmp_path):
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    _config(on_slurm)
    _config(local)
    log = _snakemake(on_slurm, "--profile", str(REPO / "profiles" / "slurm"))
    submissions = SUBMITTED.findall(log)
    # every inference job, and nothing else, became a SLURM job: one per model shard (both sets in it),
    # 1 condition x 4 shards (always_yes, random x2, tiny_llava)
    assert {rule for _, rule, _ in submissions} == {"predict_suite"}
    assert len(submissions) == 4
    for job_id, _, wildcards in submissions:
        wants_gpu = "_tiny_llava_" in wildcards
        assert ("gres:gpu:1" in _tres(job_id)) == wants_gpu, (wildcards, _tres(job_id))
    assert sum("_tiny_llava_" in w for _, _, w in submissions) == 1

    _snakemake(local, "--cores", "2")
    keys = ["dataset", "qset", "condition", "model", "variant", "subset", "metric"]
    from_slurm = pd.read_parquet(on_slurm / "results/metrics/metrics.parquet").sort_values(keys, ignore_index=True)
    from_local = pd.read_parquet(local / "results/metrics/metrics.parquet").sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(from_slurm, from_local)
    assert set(from_slurm.model) >= {"tiny_llava", "random", "blind_vote"}
