"""Live progress lines in the terminal, read from the bars the long jobs write to their logs
(src/verbmirage/workflow/progress.py)."""

from __future__ import annotations

import io
import os
import threading
import time

from tqdm import tqdm

from verbmirage.workflow.progress import ProgressLines, latest_bar


def _bar_text(done: int, total: int, initial: int = 0) -> str:
    """What a job's tqdm bar leaves in its log after ``done`` questions (``initial`` answered before)."""
    text = io.StringIO()
    bar = tqdm(total=total, initial=initial, desc="tiny_llava 4 sets", unit="q", file=text, mininterval=0)
    for _ in range(done - initial):
        bar.update(1)
    return text.getvalue() + "\n2026-12-04 10:00:00 INFO verbmirage.inference.runs: a log line after it\n"


def test_the_latest_bar_of_a_log_gives_count_rate_and_time_left():
    bar = latest_bar("junk\n" + _bar_text(150, 405))
    assert (bar.description, bar.done, bar.total) == ("tiny_llava 4 sets", 150, 405)
    line = bar.line("predict/hico/clean/tiny_llava/default/0")
    assert line.startswith("running predict/hico/clean/tiny_llava/default/0: tiny_llava 4 sets 150/405 (37%), ")
    assert "q/s" in line and "left" in line
    assert latest_bar(_bar_text(60, 405, initial=50)).done == 60  # a resumed job's bar starts at its kept rows
    assert latest_bar("no bar here\n") is None


def test_a_line_per_running_job_whose_bar_moved_and_none_for_finished_or_old_logs(tmp_path):
    logs = tmp_path / "logs"
    old = logs / "predict/hico/clean/m/default/1.log"
    old.parent.mkdir(parents=True)
    old.write_text(_bar_text(10, 400))
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # a log of an earlier run
    stream = io.StringIO()
    watcher = ProgressLines(logs, interval=0, stream=stream)
    running = logs / "predict/hico/clean/m/default/0.log"
    running.write_text(_bar_text(120, 400))
    done = logs / "derive_model/nullu.log"
    done.parent.mkdir(parents=True)
    done.write_text(_bar_text(30, 30))
    other = logs / "metrics.log"
    other.write_text(_bar_text(5, 50))  # not a watched rule
    lines = watcher.poll()
    assert len(lines) == 1 and lines[0].startswith("running predict/hico/clean/m/default/0: tiny_llava 4 sets 120/400")
    assert stream.getvalue() == lines[0] + "\n"
    assert watcher.poll() == []  # nothing moved
    running.write_text(_bar_text(121, 400))
    os.utime(running, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert [line.split(": ", 1)[1].split(" (")[0] for line in watcher.poll()] == ["tiny_llava 4 sets 121/400"]


def test_the_watcher_thread_writes_until_stopped(tmp_path):
    logs = tmp_path / "logs"
    log = logs / "predict/hico/clean/m/default/0.log"
    log.parent.mkdir(parents=True)

    class Lines(io.StringIO):
        def __init__(self):
            super().__init__()
            self.written = threading.Event()

        def flush(self):
            self.written.set()

    stream = Lines()
    watcher = ProgressLines(logs, interval=0.01, stream=stream).start()
    log.write_text(_bar_text(7, 40))
    assert stream.written.wait(timeout=30)
    watcher.stop()
    assert "running predict/hico/clean/m/default/0: tiny_llava 4 sets 7/40" in stream.getvalue()
    assert not watcher._thread.is_alive()
