"""The test tiers (README, "Tests"): each test's tier, decided here in one place; conftest.py marks the tests.

==========  ===============================================================================================
fast        package logic only: no Snakemake, no model weights; seconds. CI runs it first and stops on a failure.
models      tiny random-weight models (real transformers classes; the remote-code checkpoints built in their
            worker envs), model worker processes and their envs, the benchmark scripts, and the few logic
            tests that take a minute.
workflow    Snakemake: dry-run plans, the demo run that the slow files share (``demo_run``), killed and
            resumed runs.
cluster     the demo through a single-node SLURM that the test starts in a folder of its own and stops
            (``tools/slurm/local_cluster.py``); opt-in: ``VERBMIRAGE_TEST_SLURM=1`` (CI sets it).
==========  ===============================================================================================

A test's tier is the highest of: its file's (``FILE_TIERS``; a file not named there is fast), its own
(``TEST_TIERS``: a Snakemake dry run in a file of unit tests), and what its fixtures need (``FIXTURE_TIERS``).
A fast test that starts Snakemake anyway fails with a message naming this file (conftest.py's guard).
"""

from __future__ import annotations

import os
from pathlib import Path

TIERS = ("fast", "models", "workflow", "cluster")

FILE_TIERS = {
    # tiny random-weight models
    **dict.fromkeys([
        "test_adapters.py", "test_attention.py", "test_clip_backend.py", "test_conversation.py",
        "test_decisions_tiny.py", "test_decoding.py", "test_decoding_variants.py", "test_finetune.py",
        "test_hf_backends.py", "test_image_modes.py", "test_job_costs.py", "test_models.py", "test_nullu.py",
        "test_opera.py", "test_rows_travel.py", "test_shared_prefix.py", "test_suite_inference.py",
        "test_yes_margin.py",
        # the remote-code checkpoints, each built by its own code in its worker env (tools/make_envs.sh)
        "test_remote_tiny_minicpm.py", "test_remote_tiny_molmo.py", "test_remote_tiny_mplug.py",
        "test_remote_tiny_qwen.py",
        # model processes: the remote adapters' worker protocol and smoke runs (a test driver in a worker
        # process), the worker envs built by pip, and inference jobs killed and resumed
        "test_remote_adapters.py", "test_remote_smoke.py", "test_envs.py", "test_resume.py",
        # the benchmark scripts (bench/) on their narrow models
        "test_bench.py",
        # fifteen figures, each drawn twice in three formats: about a minute of plotting
        "test_figure_layout.py",
    ], "models"),
    # Snakemake
    **dict.fromkeys([
        "test_workflow.py", "test_workflow_data_identity.py", "test_workflow_decisions.py",
        "test_workflow_derived.py", "test_workflow_finetune.py", "test_workflow_known_object.py",
        "test_workflow_mitigation_tables.py", "test_workflow_questions.py", "test_workflow_reliance.py",
        "test_workflow_report.py", "test_workflow_uncertainty.py", "test_workflow_vcd.py",
        "test_kill_anywhere.py", "test_killed_run.py", "test_workflow_damaged_shard.py",
    ], "workflow"),
    "test_slurm.py": "cluster",
}

#: Tests that start Snakemake (a dry run, its lint) in files whose other tests are package logic.
TEST_TIERS = dict.fromkeys([
    "test_adapters.py::test_the_adapter_folder_is_an_input_of_the_model_jobs",
    "test_attention.py::test_attention_is_added_to_a_run_without_inference",
    "test_cli.py::test_check_plans_a_config_and_names_a_bad_key",
    "test_derived.py::test_adding_a_derived_model_plans_only_its_jobs",
    "test_lint.py::test_snakemake_lint_finds_nothing_in_the_demo_workflow",
    "test_run_summary.py::test_failure_summary_reads_the_failed_jobs_from_a_real_snakemake_log",
], "workflow")

#: Fixtures that put a test in a tier whatever its file. ``vcd_demo`` (test_workflow_vcd.py) asks for the demo
#: run inside its body (``request.getfixturevalue``), which pytest cannot see when it collects.
FIXTURE_TIERS = {"tiny_dirs": "models", "demo_run": "workflow", "vcd_demo": "workflow"}
#: The fixtures that read the one shared demo run: their tests form one pytest-xdist group.
DEMO_FIXTURES = ("demo_run", "vcd_demo")


def tier_of(file: str, name: str, fixtures) -> str:
    """The tier of test ``name`` (without its parameters) of ``file`` (a file name) that uses ``fixtures``."""
    found = [FILE_TIERS.get(file, "fast"), TEST_TIERS.get(f"{file}::{name}", "fast")]
    found += [FIXTURE_TIERS[fixture] for fixture in fixtures if fixture in FIXTURE_TIERS]
    return max(found, key=TIERS.index)


def group_of(file: str, fixtures) -> str:
    """The pytest-xdist group of a test of ``file`` that uses ``fixtures``: the demo run's, else its file's."""
    return "demo_run" if any(fixture in DEMO_FIXTURES for fixture in fixtures) else file


def runs_snakemake(args) -> bool:
    """Whether a command line (a list or a string, as subprocess takes it) starts Snakemake."""
    words = args.split() if isinstance(args, (str, bytes)) else [str(arg) for arg in args]
    words = [word.decode() if isinstance(word, bytes) else word for word in words]
    if not words:
        return False
    program = words[0].rsplit("/", 1)[-1]
    if program == "snakemake":
        return True
    if program == "verbmirage" and len(words) > 1 and words[1] in ("check", "run", "report"):
        return True
    return any(a == "-m" and b == "snakemake" for a, b in zip(words, words[1:]))


def run_root(tmp_path_factory) -> Path:
    """The folder that every pytest-xdist worker of this test run shares (their own ones lie inside it); without
    workers, this process's own temporary folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(folder: Path, build) -> Path:
    """``build(folder)`` once per ``folder``, whichever process asks first; the others wait for it and reuse it.

    A lock file beside the folder keeps the builders apart; a marker written after a build ends says it is
    whole, so a build that failed half-way is done again (from scratch) by the next process that asks.
    """
    import fcntl
    import shutil

    folder.parent.mkdir(parents=True, exist_ok=True)
    done = folder.parent / f"{folder.name}.complete"
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            done.touch()
    return folder


def claim_once(root: Path, name: str) -> str | None:
    """Claim ``name`` for this process in the run's shared folder; None if it is the first claim, else who claimed
    it first (a pytest-xdist worker id)."""
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        with open(root / f"{name}.claimed", "x") as claim:
            claim.write(me)
        return None
    except FileExistsError:
        first = (root / f"{name}.claimed").read_text()
        return None if first == me else first
