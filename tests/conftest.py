"""Shared fixtures: the demo data (written once per session) and the real files when present."""

from __future__ import annotations

from pathlib import Path

import pytest

from verbmirage.demo import DemoSizes, write_demo_hico
from verbmirage.hico import load_hico

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
REAL_HICO = SHARED_DATA / "hico_20150920"
REAL_HICO_DET_JSON = SHARED_DATA / "hicodet" / "instances_test2015.json"


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
def real_anno():
    if not (REAL_HICO / "anno.mat").is_file():
        pytest.skip(f"real HICO anno.mat not present at {REAL_HICO}")
    return load_hico(REAL_HICO)
