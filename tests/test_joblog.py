"""Job logs: logging and stderr go to the job's file, a failure's traceback is kept, and the last line states
the job's own time and peak memory (the benchmark files measure the waiting script under the job server)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from verbmirage.joblog import job_log


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
