"""The test tiers (README, "Tests"): a test's tier is the folder its file lies in, below ``tests/``, unless this
module names it or its fixtures lift it; conftest.py marks the tests.

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

A test's tier is the highest of: its folder's (``tests/<tier>/test_*.py``), its own (``TEST_TIERS``: a
Snakemake run in a file of the models tier), and what its fixtures need (``FIXTURE_TIERS``). Only a test of
``tests/models/`` may be lifted so, and only to the workflow tier: tools/test.sh without arguments collects
each tier from its folders alone (fast from ``tests/fast/``, models and workflow from theirs, cluster from
``tests/cluster/``), so a test lifted out of them would run in none; it fails in its folder's tier instead,
naming the folder it belongs in (conftest.py). The helpers the test files share (this module, the fixtures' builders, the drivers of worker
processes) lie in ``tests/`` itself. A fast test that starts Snakemake anyway fails naming ``tests/workflow/``
(conftest.py's guard).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

TIERS = ("fast", "models", "workflow", "cluster")
#: The folder of the tier folders.
TESTS = Path(__file__).resolve().parent

#: Tests that start Snakemake (a dry run) in files of the models tier.
TEST_TIERS = dict.fromkeys([
    "test_adapters.py::test_the_adapter_folder_is_an_input_of_the_model_jobs",
    "test_attention.py::test_attention_is_added_to_a_run_without_inference",
], "workflow")

#: Fixtures that put a test in a tier whatever its file. ``vcd_demo`` (test_workflow_vcd.py) asks for the demo
#: run inside its body (``request.getfixturevalue``), which pytest cannot see when it collects.
FIXTURE_TIERS = {"tiny_dirs": "models", "demo_run": "workflow", "vcd_demo": "workflow"}
#: The fixtures that read the one shared demo run: their tests form one pytest-xdist group.
DEMO_FIXTURES = ("demo_run", "vcd_demo")
#: The files whose tests take longest together (their ``--durations`` summed on 2 workers, 2026-12-05, here and
#: in CI; only the order matters), longest first: after the demo run's group they start before any other group,
#: whatever their tier, so that the groups that start last are short ones. A long file started last (the models
#: tier's remote-code and compiler tests come last in file order) would leave the other worker idle. One
#: exception: test_bench.py comes after the data-identity runs, so that bench/h200_check.sh, whose steps each
#: run under a time limit, does not start while the demo run's Snakemake fills both cores (the worker beside
#: it starts with the demo run, this one with the kill-anywhere runs, which end sooner).
LONG_FILES = (
    "test_kill_anywhere.py", "test_workflow_data_identity.py", "test_bench.py", "test_on_device.py",
    "test_figure_layout.py", "test_remote_adapters.py", "test_finetune.py", "test_remote_tiny_qwen.py",
    "test_workflow_report.py", "test_workflow.py", "test_envs.py", "test_workflow_damaged_shard.py",
    "test_killed_run.py", "test_resume.py",
)


def folder_tier(path: str | PurePath) -> str:
    """The tier of a test file from its path below ``tests/`` (``fast/test_metrics.py``: fast); a file outside
    the tier folders is an error that says where it belongs."""
    parts = PurePath(path).parts
    if len(parts) != 2 or parts[0] not in TIERS:
        raise ValueError(f"tests/{PurePath(path).as_posix()}: a test file lies in the folder of its tier, "
                         f"tests/<tier>/ with <tier> one of {', '.join(TIERS)} (tests/tiers.py)")
    return parts[0]


def tier_of(path: str | PurePath, name: str, fixtures) -> str:
    """The tier of test ``name`` (without its parameters) of the file at ``path`` below ``tests/``
    (``fast/test_metrics.py``) that uses ``fixtures``."""
    folder = folder_tier(path)
    found = [folder, TEST_TIERS.get(f"{PurePath(path).name}::{name}", "fast")]
    found += [FIXTURE_TIERS[fixture] for fixture in fixtures if fixture in FIXTURE_TIERS]
    tier = max(found, key=TIERS.index)
    if tier != folder and (folder, tier) != ("models", "workflow"):
        raise ValueError(f"tests/{PurePath(path).as_posix()}::{name} needs the {tier} tier (its fixtures or "
                         f"tests/tiers.py say so): move it to tests/{tier}/ (tools/test.sh collects the {folder} "
                         f"tier from tests/{folder}/ alone)")
    return tier


def group_of(file: str, fixtures) -> str:
    """The pytest-xdist group of a test of ``file`` that uses ``fixtures``: the demo run's, else its file's."""
    return "demo_run" if any(fixture in DEMO_FIXTURES for fixture in fixtures) else file


def start_order(group: str, tier: str, slow: bool) -> tuple[int, int, int, int]:
    """The sort key that conftest.py orders the tests by, so that pytest-xdist starts their groups in that order:
    the demo run's group, then the :data:`LONG_FILES` longest first, then the other slow files, then the rest by
    tier, highest first (a group's ``group``, its tests' ``tier`` and whether they are marked slow)."""
    long = LONG_FILES.index(group) if group in LONG_FILES else len(LONG_FILES)
    return group != "demo_run", long, 0 if slow else 1, -TIERS.index(tier)


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
