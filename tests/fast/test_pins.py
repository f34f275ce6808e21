"""The workflow's conda environment (envs/verbmirage.yaml, `--use-conda`) installs what pyproject.toml pins."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _pins(requirements) -> dict[str, str]:
    """name (lower case, extras dropped) -> the whole requirement line, for every ``name==version``."""
    pins = {}
    for line in requirements:
        name = line.split("==", 1)[0].split("[", 1)[0].strip().lower()
        pins[name] = line.replace(" ", "")
    return pins


def test_the_rules_conda_env_pins_what_pyproject_pins():
    project = _pins(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    conda = yaml.safe_load((REPO / "envs" / "verbmirage.yaml").read_text())
    pip = next(item["pip"] for item in conda["dependencies"] if isinstance(item, dict))
    env = _pins(pip)
    assert all("==" in line for line in project.values()), project  # every dependency pinned exactly
    # Snakemake and its SLURM plugin run the workflow; the jobs in the env do not import them
    runner = {name for name in project if name.startswith("snakemake")}
    assert {name: project[name] for name in project.keys() - runner} == env


def test_test_extra_is_pinned_exactly():
    """tools/setup.sh installs `.[test]`: the test tools (pytest, xdist, playwright for the report test) pinned."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test = _pins(extras["test"])
    assert all("==" in line for line in test.values()), test
    assert {"pytest", "pytest-xdist", "playwright"} <= set(test)
