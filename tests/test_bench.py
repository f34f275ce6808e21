"""The benchmark scripts run and print their figures (speed itself is not asserted: see bench/)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_cpu_benchmark_prints_ratio_and_difference():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scoring.py"), "--images", "2"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert re.search(r"ratio engine / generate:\s+[\d.]+x", out)
    difference = float(re.search(r"max \|P\(yes\) difference\|:\s+([\d.e+-]+)", out).group(1))
    assert difference < 1e-4


def test_gpu_benchmark_script_runs_in_smoke_mode():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_scoring.py"), "--smoke", "--images", "2"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    assert re.search(r"engine, float32, prefix reuse: [\d.]+ prompts/s", out)
