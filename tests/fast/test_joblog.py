"""Job logs: logging and stderr go to the job's file, a failure's traceback is kept, and the last line states
the job's own time and peak memory (the benchmark files measure the waiting script under the job server)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from verbmirage.core.joblog import job_log


def test_the_log_keeps_messages_progress_and_the_job_resources(tmp_path):
    path = tmp_path / "logs" / "job.log"
    with job_log(path) as log:
        log.info("predictions per set: %s", {"yn_obj": 3})
        print("a progress bar", file=sys.stderr)
        held = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
        held[::4096] = 2
    text = path.read_text()
    assert "predictions per set: {'yn_obj': 3}" in text and "a progress bar" in text
    found = re.search(r"job resources: ([\d.]+) s, CPU ([\d.]+) s, peak RSS (\d+) MiB\n$", text)
    assert found, text
    assert int(found.group(3)) >= 64


def test_a_failure_is_logged_with_its_traceback_and_still_raises(tmp_path):
    path = tmp_path / "job.log"
    with pytest.raises(ValueError, match="bad row 7"), job_log(path):
        raise ValueError("bad row 7")
    text = path.read_text()
    assert "job failed" in text and "Traceback" in text and "ValueError: bad row 7" in text
    assert "job resources:" in text.splitlines()[-1]


HOLDER = """\
import sys, time
from pathlib import Path
from verbmirage.core.joblog import job_log

path, go = Path(sys.argv[1]), Path(sys.argv[2])
with job_log(path) as log:
    log.info("holder: first line")
    print("started", flush=True)
    while not go.exists():
        time.sleep(0.05)
    log.info("holder: last line")
"""


def _holder(tmp_path, path):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    process = subprocess.Popen([sys.executable, str(script), str(path), str(tmp_path / "go")], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "started"
    return process


def test_a_rerun_of_a_job_still_running_puts_its_log_back_and_stops(tmp_path):
    """As after a killed Snakemake whose job runs on: the rerun removes the job's log (Snakemake does so before it
    runs a job), then runs the job again while the first one still writes it."""
    path = tmp_path / "logs" / "0.log"
    holder = _holder(tmp_path, path)
    try:
        path.unlink()  # Snakemake, preparing the rerun
        second = subprocess.run(
            [sys.executable, "-c", "import sys\nfrom verbmirage.core.joblog import job_log\n"
             f"with job_log({str(path)!r}) as log:\n    log.info('second: never written')"],
            capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert "LogBusyError" in second.stderr and f"pid {holder.pid} on host" in second.stderr
        assert "holder: first line" in path.read_text()  # the running job's log is back where it was
    finally:
        (tmp_path / "go").touch()
    assert holder.wait(timeout=60) == 0
    text = path.read_text()
    assert "holder: first line" in text and "holder: last line" in text and "second" not in text
    assert not list(path.parent.glob(".*.writer"))  # its second name gone with it


def test_a_log_left_by_a_killed_job_is_taken_over(tmp_path):
    path = tmp_path / "0.log"
    holder = _holder(tmp_path, path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert list(tmp_path.glob(".0.log.*.writer"))  # left behind, its lock gone with the process
    with job_log(path) as log:
        log.info("the rerun")
    assert "holder: first line" in path.read_text() and "the rerun" in path.read_text()
    assert not list(tmp_path.glob(".0.log.*.writer"))
