"""The demo through a real single-node SLURM (`snakemake --profile profiles/slurm`).

Opt-in: set ``VERBMIRAGE_TEST_SLURM=1`` (CI does); without it the test is skipped. It needs root and Debian's
``slurmctld slurmd slurm-client munge`` packages (installed beforehand: nothing is installed here), and with
the variable set, a cluster that does not start is a failure.

The module's fixture starts a SLURM of its own (tools/slurm/local_cluster.py: munge, slurmctld and slurmd with
two fake GPUs) in a temporary folder that holds all its files, on free ports, and stops it when the tests end,
passed or failed: a SLURM the machine runs itself is neither addressed nor changed. Snakemake and scontrol
reach the test cluster through ``SLURM_CONF`` (and, inside a job, the folder's srun: ``local_cluster.environment``).

Inference shards must reach SLURM as jobs, with a GPU request exactly for the model that asks for one; light
rules must run on the submitting node; the metrics must equal a local run's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "slurm"))

import local_cluster  # noqa: E402  (tools/ is not a package)

pytestmark = pytest.mark.slow
#: the variable that enables this tier (README, "Tests")
OPT_IN = "VERBMIRAGE_TEST_SLURM"
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: .*/rule_(\w+)/(\S+)/\d+\.log\)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _cluster(folder: Path):
    """A SLURM in ``folder`` while the block runs (skipped unless opted in); yields the environment that reaches
    it. It is stopped when the block ends, however it ends."""
    if os.environ.get(OPT_IN) != "1":
        pytest.skip(f"the cluster tier starts a SLURM of its own (root; Debian's {local_cluster.PACKAGES}): "
                    f"set {OPT_IN}=1 to run it")
    try:
        local_cluster.start(folder)
    except local_cluster.ClusterError as error:
        pytest.fail(f"{OPT_IN}=1, but the test SLURM did not start: {error}")
    # a SIGTERM (tools/test.sh sends one on Ctrl-C) ends the tests through the stop below, as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield {**os.environ, **local_cluster.environment(folder)}
    finally:
        signal.signal(signal.SIGTERM, previous)
        local_cluster.stop(folder)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> dict[str, str]:
    """The environment (``SLURM_CONF``, ``PATH``) of a SLURM started for these tests and stopped after them."""
    with _cluster(tmp_path_factory.mktemp("slurm")) as environment:
        yield environment


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


def _snakemake(workdir: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    command = ["timeout", "-s", "INT", "1200", sys.executable, "-m", "snakemake", "--snakefile",
               str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(workdir / "config.yaml"),
               *extra]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout + result.stderr


def _tres(job_id: str, env: dict[str, str]) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True,
                           env=env).stdout
    found = re.search(r"TresPerJob=(\S+)", shown)
    return found.group(1) if found else ""


def test_demo_through_slurm(slurm_cluster, tmp_path):
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    _config(on_slurm)
    _config(local)
    log = _snakemake(on_slurm, "--profile", str(REPO / "profiles" / "slurm"), env=slurm_cluster)
    submissions = SUBMITTED.findall(log)
    # every inference job, and nothing else, became a SLURM job: one per model shard (both sets in it),
    # 1 condition x 4 shards (always_yes, random x2, tiny_llava)
    assert {rule for _, rule, _ in submissions} == {"predict_suite"}
    assert len(submissions) == 4
    for job_id, _, wildcards in submissions:
        wants_gpu = "_tiny_llava_" in wildcards
        assert ("gres:gpu:1" in _tres(job_id, slurm_cluster)) == wants_gpu, (wildcards, _tres(job_id, slurm_cluster))
    assert sum("_tiny_llava_" in w for _, _, w in submissions) == 1

    _snakemake(local, "--cores", "2", "results/metrics/metrics.parquet")  # what is compared: no tables, no report
    keys = ["dataset", "qset", "condition", "model", "variant", "subset", "metric"]
    from_slurm = pd.read_parquet(on_slurm / "results/metrics/metrics.parquet").sort_values(keys, ignore_index=True)
    from_local = pd.read_parquet(local / "results/metrics/metrics.parquet").sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(from_slurm, from_local)
    assert set(from_slurm.model) >= {"tiny_llava", "random", "blind_vote"}


def _daemons(folder: Path) -> list[int | None]:
    files = local_cluster.Files(folder)
    return [local_cluster.our_pid(getattr(files, key), folder) for _, key in local_cluster.DAEMONS]


def test_the_test_cluster_leaves_a_slurm_already_running_and_its_jobs_alone(tmp_path):
    """Another SLURM on the machine (here a second cluster in its own folder, on its own ports, standing for a
    site's) keeps its daemons and its running job while the test cluster starts and stops."""
    site, ours = tmp_path / "site", tmp_path / "ours"
    with _cluster(site) as site_environment:
        job = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 300"], cwd=tmp_path, env=site_environment,
                             capture_output=True, text=True, check=True).stdout.strip()

        def job_state() -> str:
            return subprocess.run(["squeue", "--noheader", "--format=%T", f"--jobs={job}"], env=site_environment,
                                  capture_output=True, text=True, check=True).stdout.strip()

        deadline = time.monotonic() + 60
        while job_state() != "RUNNING":
            assert time.monotonic() < deadline, f"the site's job {job} did not start: {job_state()}"
            time.sleep(0.5)
        site_daemons = _daemons(site)
        assert None not in site_daemons
        with _cluster(ours):
            assert None not in _daemons(ours)
        assert _daemons(ours) == [None, None, None]
        assert _daemons(site) == site_daemons and job_state() == "RUNNING"
