"""The test suite's own set-up: its tiers (tests/tiers.py) and its parallel runs (tools/test.sh, tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiers import (FIXTURE_TIERS, TEST_TIERS, TESTS, TIERS, build_once, claim_once, group_of, runs_snakemake,
                   tier_of)


def test_each_file_is_one_xdist_group(request):
    """Under ``--dist loadgroup`` the group must reach the scheduler as the node-id suffix; when it does not
    (pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386) the shared demo run is silently built
    once per worker."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("not under pytest-xdist --dist loadgroup (tools/test.sh with workers)")
    assert request.node.nodeid.endswith("@test_suite_grouping.py"), request.node.nodeid


def test_every_test_has_exactly_one_tier(request):
    """tests/tiers.py gives each test collected here one of the tiers that tools/test.sh runs, in its folder's
    tier's call."""
    for item in request.session.items:
        tiers = [mark.name for mark in item.iter_markers() if mark.name in TIERS]
        assert len(tiers) == 1, (item.nodeid, tiers)
        assert tiers[0] == item.path.parent.name or (item.path.parent.name, tiers[0]) == ("models", "workflow")


def test_the_tier_tables_lift_existing_models_tests_to_the_workflow_tier_only():
    """Each test that TEST_TIERS names exists in tests/models/ (a renamed test would silently lose its tier), and
    the tables lift no test beyond the workflow tier (tools/test.sh's middle call collects models and workflow)."""
    for key, tier in TEST_TIERS.items():
        file, name = key.split("::")
        assert tier == "workflow" and f"def {name}(" in (TESTS / "models" / file).read_text(), key
    assert set(FIXTURE_TIERS.values()) <= {"models", "workflow"}


@pytest.mark.parametrize("path, name, fixtures, tier", [
    ("fast/test_metrics.py", "test_x", ["tmp_path"], "fast"),
    ("models/test_opera.py", "test_x", ["tmp_path"], "models"),
    ("models/test_opera.py", "test_x", ["demo_run"], "workflow"),  # a fixture lifts a test out of its folder's tier
    ("models/test_attention.py", "test_attention_is_added_to_a_run_without_inference", [], "workflow"),  # a dry run
    ("models/test_attention.py", "test_other", [], "models"),
    ("workflow/test_workflow_vcd.py", "test_x", ["vcd_demo", "request"], "workflow"),
    ("cluster/test_slurm.py", "test_x", ["slurm_cluster"], "cluster"),
])
def test_a_tests_tier_is_the_highest_its_folder_name_and_fixtures_ask(path, name, fixtures, tier):
    assert tier_of(path, name, fixtures) == tier


def test_a_test_lifted_where_no_tier_collects_it_is_refused_naming_its_folder(monkeypatch):
    """tools/test.sh collects the fast tier from tests/fast/ alone and the others from their folders: a fast test
    lifted out of its tier, or a models test lifted beyond the workflow tier, would run in none."""
    with pytest.raises(ValueError, match=r"tests/fast/test_metrics.py::test_x needs the models tier .* move it to "
                                         r"tests/models/"):
        tier_of("fast/test_metrics.py", "test_x", ["tiny_dirs"])
    monkeypatch.setitem(TEST_TIERS, "test_opera.py::test_x", "cluster")
    with pytest.raises(ValueError, match=r"tests/models/test_opera.py::test_x needs the cluster tier"):
        tier_of("models/test_opera.py", "test_x", [])


@pytest.mark.parametrize("path", ["test_metrics.py", "slow/test_metrics.py", "fast/more/test_metrics.py"])
def test_a_test_file_outside_the_tier_folders_is_refused_naming_them(path):
    with pytest.raises(ValueError, match=rf"tests/{path}: .* tests/<tier>/ .*fast, models, workflow, cluster"):
        tier_of(path, "test_x", [])


def test_every_test_file_lies_in_its_tiers_folder():
    """No test file outside the tier folders (it would fail the collection), and the folders hold test files only:
    the helpers they share lie in tests/ itself."""
    assert not list(TESTS.glob("test_*.py")), "test files belong in tests/<tier>/"
    for tier in TIERS:
        assert all(path.name.startswith("test_") for path in (TESTS / tier).glob("*.py")), tier


def test_the_demo_run_is_read_by_one_group_only(request):
    """``vcd_demo`` asks for the demo run inside its body: its tests join the demo group all the same (else a
    second worker ran the whole demo again)."""
    from tiers import DEMO_FIXTURES

    assert group_of("test_workflow_vcd.py", ["vcd_demo", "request"]) == "demo_run"
    assert group_of("test_workflow.py", ["tmp_path"]) == "test_workflow.py"  # its dry runs: any worker
    for item in request.session.items:
        reads = any(fixture in item.fixturenames for fixture in DEMO_FIXTURES)
        assert (item.get_closest_marker("xdist_group").args[0] == "demo_run") is reads, item.nodeid


def test_the_longest_files_start_right_after_the_demo_run():
    """pytest-xdist starts the groups in the tests' order: the demo run's group, then the long files longest first
    whatever their tier (the models tier's compiler test before any short workflow file), then the other slow
    files, then the rest, highest tier first. Each long file named is a test file."""
    from tiers import LONG_FILES, start_order

    groups = [("test_pins.py", "fast", False), ("test_opera.py", "models", False), ("test_resume.py", "models", False),
              ("test_workflow_lint.py", "workflow", False), ("test_other_slow.py", "workflow", True),
              ("test_on_device.py", "models", False), ("test_kill_anywhere.py", "workflow", True),
              ("demo_run", "workflow", True)]
    assert [group for group, *_ in sorted(groups, key=lambda group: start_order(*group))] == [
        "demo_run", "test_kill_anywhere.py", "test_on_device.py", "test_resume.py", "test_other_slow.py",
        "test_workflow_lint.py", "test_opera.py", "test_pins.py"]
    assert [name for name in LONG_FILES if len(list(TESTS.glob(f"*/{name}"))) != 1] == []


@pytest.mark.parametrize("command, starts", [
    ([sys.executable, "-m", "snakemake", "--dry-run"], True),
    (["/x/.venv/bin/snakemake", "-n"], True),
    ("snakemake --cores 1", True),
    (["/x/.venv/bin/verbmirage", "check", "--configfile", "c.yaml"], True),
    (["/x/.venv/bin/verbmirage", "--help"], False),
    ([sys.executable, "tools/build_tiny_models.py", "snakemake"], False),
    (["bash", "tools/demo.sh", "--help"], False),
])
def test_commands_that_start_snakemake_are_recognised(command, starts):
    assert runs_snakemake(command) is starts


def test_a_fast_test_that_starts_snakemake_fails_naming_the_workflow_folder(request):
    assert request.node.get_closest_marker("fast")
    with pytest.raises(RuntimeError, match=r"fast tier but starts Snakemake.*move it to tests/workflow/"):
        subprocess.run([sys.executable, "-m", "snakemake", "--version"], capture_output=True)
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


def test_a_build_is_done_once_per_folder_and_again_after_a_failure(tmp_path):
    calls = []

    def build(folder):
        calls.append(folder)
        folder.mkdir()
        (folder / "half").touch()
        if len(calls) == 1:
            raise OSError("disk full")
        (folder / "weights").touch()

    with pytest.raises(OSError):
        build_once(tmp_path / "model", build)
    assert build_once(tmp_path / "model", build) == tmp_path / "model"  # the half-built folder is built again
    assert build_once(tmp_path / "model", build) == tmp_path / "model"
    assert len(calls) == 2 and sorted(p.name for p in (tmp_path / "model").iterdir()) == ["half", "weights"]


def test_a_second_claim_names_the_first_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert claim_once(tmp_path, "demo_run") is None
    assert claim_once(tmp_path, "demo_run") is None  # the same worker again: still its own
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert claim_once(tmp_path, "demo_run") == "gw0"
