"""Shared fixtures: the demo data (written once per session) and the real files when present."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiers import (TESTS, TIERS, build_once, claim_once, folder_tier, group_of, run_root, runs_snakemake, start_order,
                   tier_of)

from verbmirage.data.demo import DemoSizes, write_demo_hico
from verbmirage.data.hico import load_hico

REPO = Path(__file__).resolve().parents[1]
# Test files import fixtures and data from each other by module name, across the tier folders (test_yes_margin.py
# takes test_api_backend.py's fake API server); the helpers in tests/ itself are on the path as this file's folder.
sys.path[:0] = [str(TESTS / tier) for tier in TIERS]
_NAMES: dict[str, list[str]] = {}
for _file in sorted(TESTS.glob("*/*.py")):
    _NAMES.setdefault(_file.name, []).append(str(_file.relative_to(TESTS)))
_TWICE = {name: files for name, files in _NAMES.items() if len(files) > 1 and name != "__init__.py"}
if _TWICE:  # one module name, two files: whichever imports first shadows the other in every tier
    raise RuntimeError(f"test modules share a name across tier folders: {_TWICE}; give each its own name")
SHARED_DATA = REPO.parent / "shared" / "data"
REAL_HICO = SHARED_DATA / "hico_20150920"
REAL_HICO_DET_JSON = SHARED_DATA / "hicodet" / "instances_test2015.json"


_STARTED = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def demo_roots(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("demo")
    root, det_root = base / "hico_20150920", base / "hico_20160224_det"
    write_demo_hico(root, det_root, DemoSizes())
    return root, det_root


@pytest.fixture(scope="session")
def demo_anno(demo_roots):
    return load_hico(demo_roots[0])


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Every tiny random-weight model (real transformers classes), built once per test run: the first
    pytest-xdist worker that needs them builds them, the others wait and read the same folders (the builders
    are seeded, so any worker would build the same weights)."""
    from verbmirage.models.registry import TINY_FAMILIES, tiny_builder

    base = run_root(tmp_path_factory) / "models"
    return {family: build_once(base / f"tiny_{family}", tiny_builder(family)) for family in TINY_FAMILIES}


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> list[Path]:
    """Three small random RGB images of different sizes."""
    import numpy as np
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    paths = []
    for i, size in enumerate([(50, 40), (64, 64), (30, 70)]):
        path = folder / f"img{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def real_anno():
    if not (REAL_HICO / "anno.mat").is_file():
        pytest.skip(f"real HICO anno.mat not present at {REAL_HICO}")
    return load_hico(REAL_HICO)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """The demo workflow run once per session (a smaller config); every slow test file reads its results.

    ``VERBMIRAGE_DEMO_RUN=<folder>`` reuses a finished run there (for iterating on the slow tests only).
    """
    import os

    from workflow_run import run_api, write_config

    if os.environ.get("VERBMIRAGE_DEMO_RUN"):
        return Path(os.environ["VERBMIRAGE_DEMO_RUN"])
    first = claim_once(run_root(tmp_path_factory), "demo_run")
    if first is not None:  # a test read it outside the demo group: its fixture belongs in tiers.DEMO_FIXTURES
        pytest.fail(f"the demo run was started a second time in this test run (first on worker {first}): a test "
                    "that reads it is not in its pytest-xdist group (tests/tiers.py, DEMO_FIXTURES)")
    workdir = tmp_path_factory.mktemp("workflow")
    write_config(workdir)
    run_api(workdir)
    return workdir


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist turns the marks into node-id suffixes, and before -m selects
def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier (tests/tiers.py) and its group for pytest-xdist's ``--dist loadgroup``.

    Each file is one group, so its module fixtures (tiny models, worker envs) are built once; every test that
    reads the shared demo run is in one group, so the demo runs once. That group goes first, then the longest
    files, the other slow ones, and the rest by tier (tiers.start_order): a long group started last would leave
    the other worker idle at the end.
    """
    def order(item) -> tuple[int, int, int, int]:
        tier = next(mark.name for mark in item.iter_markers() if mark.name in TIERS)
        return start_order(item.get_closest_marker("xdist_group").args[0], tier,
                           item.get_closest_marker("slow") is not None)

    for item in items:
        path = item.path.relative_to(TESTS)
        try:
            tier = tier_of(path, item.originalname, item.fixturenames)
        except ValueError as error:  # a test its folder's tier may not lift: it fails there, saying why
            tier = folder_tier(path)  # (a file outside the tier folders raises here: no tier would collect it)
            item.stash[_MISPLACED] = str(error)
        item.add_marker(getattr(pytest.mark, tier))
        item.add_marker(pytest.mark.xdist_group(group_of(item.path.name, item.fixturenames)))
    items.sort(key=order)


#: the message of a test whose tier its folder's may not lift (tests/tiers.py)
_MISPLACED = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)  # before its fixtures are built
def pytest_runtest_setup(item):
    if _MISPLACED in item.stash:
        pytest.fail(item.stash[_MISPLACED], pytrace=False)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_snakemake(request, monkeypatch):
    """A test of the fast tier that starts Snakemake fails at once, naming tests/workflow/, where it belongs."""
    if request.node.get_closest_marker("fast") is None:
        return
    start = subprocess.Popen.__init__

    def refuse_snakemake(self, args, *more, **options):
        if runs_snakemake(args):
            raise RuntimeError(f"{request.node.nodeid} is in the fast tier but starts Snakemake ({args!r}): move it "
                               "to tests/workflow/ (tests/tiers.py)")
        start(self, args, *more, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_snakemake)


_TIER_SPANS: dict[str, list] = {}  # tier -> [first start, last end, tests run] (times from time.time())


def pytest_runtest_logreport(report):
    """Note when each tier's tests start and end (for the summary; under xdist, the workers' reports)."""
    tier = next((name for name in TIERS if name in report.keywords), None)
    if tier is not None:
        span = _TIER_SPANS.setdefault(tier, [report.start, report.stop, 0])
        span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)
        span[2] += report.when == "call"


def pytest_sessionstart(session):
    import time

    session.config.stash[_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """When each tier ran; the folder of the files the tests kept for CI (the report's screenshots), when this
    session wrote any."""
    from workflow_run import ARTIFACTS

    started = config.stash.get(_STARTED, None)
    for tier, (first, last, tests) in sorted(_TIER_SPANS.items(), key=lambda kv: TIERS.index(kv[0])):
        if started is not None:
            terminalreporter.write_line(f"tier {tier}: {tests} tests, from {first - started:.0f} s to "
                                        f"{last - started:.0f} s after the session started")
    if started is None or not ARTIFACTS.is_dir():
        return
    written = [path for path in ARTIFACTS.rglob("*") if path.is_file() and path.stat().st_mtime >= started]
    if written:
        terminalreporter.write_line(f"test artifacts: {len(written)} files in {ARTIFACTS}")
