"""Shared fixtures: the demo data (written once per session) and the real files when present."""

from __future__ import annotations

from pathlib import Path

import pytest

from verbmirage.data.demo import DemoSizes, write_demo_hico
from verbmirage.data.hico import load_hico

REPO = Path(__file__).resolve().parents[1]
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
    """Every tiny random-weight model (real transformers classes), built once per session."""
    from verbmirage.models.tiny import BUILDERS

    base = tmp_path_factory.mktemp("models")
    return {family: build(base / f"tiny_{family}") for family, build in BUILDERS.items()}


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
    workdir = tmp_path_factory.mktemp("workflow")
    write_config(workdir)
    run_api(workdir)
    return workdir


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist turns the marks into node-id suffixes
def pytest_collection_modifyitems(config, items):
    """Group the tests for pytest-xdist's ``--dist loadgroup`` (tools/test.sh runs two workers).

    Each file is one group, so its module fixtures (tiny models, worker envs) are built once; every test that
    reads the shared demo run is in one group, so the demo runs once. That group goes first, then the other
    slow ones: a long group started last would leave the other worker idle at the end.
    """
    def order(item) -> int:
        return 0 if "demo_run" in item.fixturenames else 1 if item.get_closest_marker("slow") else 2

    for item in items:
        item.add_marker(pytest.mark.xdist_group("demo_run" if order(item) == 0 else item.path.name))
    items.sort(key=order)


def pytest_sessionstart(session):
    import time

    session.config.stash[_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """Name the folder of the files the tests kept for CI (the report's screenshots), when this session wrote any."""
    from workflow_run import ARTIFACTS

    started = config.stash.get(_STARTED, None)
    if started is None or not ARTIFACTS.is_dir():
        return
    written = [path for path in ARTIFACTS.rglob("*") if path.is_file() and path.stat().st_mtime >= started]
    if written:
        terminalreporter.write_line(f"test artifacts: {len(written)} files in {ARTIFACTS}")
