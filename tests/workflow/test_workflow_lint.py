"""Snakemake's own lint of the demo workflow (`snakemake --lint`); ruff and snakefmt: tests/fast/test_lint.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_snakemake_lint_finds_nothing_in_the_demo_workflow(tmp_path):
    """`snakemake --lint` on the demo's config (copied into a scratch working directory, where the Snakefile's
    ``configfile:`` reads it), as a user would run it in the checkout."""
    shutil.copy(REPO / "config.yaml", tmp_path / "config.yaml")
    linted = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "--cores", "1", "--snakefile",
                             str(REPO / "Snakefile"), "--directory", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert linted.returncode == 0 and "workflow is in a good condition" in linted.stdout + linted.stderr, \
        f"`snakemake --lint` finds these:\n{linted.stdout}{linted.stderr}"
