"""Live progress of the long jobs in the terminal: every few seconds, one line per running job whose progress
bar moved, read from the bar its job writes to its log (questions done, rate, time left).

A job's progress bar (tqdm) goes to its log file, where Snakemake's terminal never shows it; the lines here
come from the Snakemake process itself (started by the Snakefile's ``onstart``), so they appear for local jobs
and, on a shared file system, for cluster jobs alike. Only the rules whose jobs run long are watched
(:data:`WATCHED`): inference shards, model builds, calibration answers and attention runs.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from verbmirage.workflow.paths import LOGS

#: The rules whose jobs' bars are shown (their logs: :data:`verbmirage.workflow.paths.LOGS`).
WATCHED = ("predict_suite", "calibrate_decision", "derive_model", "attention")
#: How much of a log's end is read for its latest bar.
_TAIL = 8192
#: One tqdm bar as written to a file: "desc:  37%|###7      | 150/405 [00:01<00:02, 98.53q/s]".
_BAR = re.compile(r"(?P<desc>.*?):\s+(?P<percent>\d+)%\|[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)\s+"
                  r"\[(?P<elapsed>[^<\]]+)<(?P<left>[^,\]]+),\s*(?P<rate>[^\],]+)")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Bar:
    """The latest state of a job's progress bar."""

    description: str
    done: int
    total: int
    left: str
    rate: str

    def line(self, job: str) -> str:
        rate = self.rate.strip()
        speed = "" if rate.startswith("?") else f", {rate}"
        left = "" if self.left.strip().startswith("?") else f", {self.left.strip()} left"
        percent = 100 * self.done // self.total if self.total else 100
        return f"running {job}: {self.description} {self.done}/{self.total} ({percent}%){speed}{left}"


def latest_bar(text: str) -> Bar | None:
    """The last complete progress bar in ``text`` (a log's end), or None."""
    for piece in reversed(re.split(r"[\r\n]", _ESCAPE.sub("", text))):
        found = _BAR.search(piece)
        if found:
            return Bar(found["desc"].strip(), int(found["done"]), int(found["total"]), found["left"], found["rate"])
    return None


def _pattern(template: str) -> str:
    """A log template (``predict/{dataset}/.../{shard}.log``) as a glob."""
    return re.sub(r"\{[^}]*\}", "*", template)


class ProgressLines:
    """Watches the logs of the :data:`WATCHED` rules under ``logs`` and writes a line to ``stream`` for each job
    whose bar moved since the last look and is not finished (:meth:`poll` once; :meth:`start` every
    ``interval`` seconds in a daemon thread until :meth:`stop`). Logs older than the watcher are left alone."""

    def __init__(self, logs: str | Path, interval: float = 10.0, stream: TextIO | None = None):
        self.logs, self.interval = Path(logs), interval
        self.stream = stream
        self.started = time.time() - 5  # file times lag the clock a little: a log written now is never "older"
        self._shown: dict[Path, tuple[int, str]] = {}  # log -> (mtime_ns when read, line shown)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> list[str]:
        """One look at the logs: the lines of the jobs whose bar moved (also written to the stream)."""
        lines = []
        for rule in WATCHED:
            for log in sorted(self.logs.glob(_pattern(LOGS[rule]))):
                line = self._line(log)
                if line is not None:
                    lines.append(line)
        if lines:
            stream = self.stream or sys.stderr
            stream.write("".join(f"{line}\n" for line in lines))
            stream.flush()
        return lines

    def _line(self, log: Path) -> str | None:
        try:
            stat = log.stat()
            if stat.st_mtime < self.started or self._shown.get(log, (None,))[0] == stat.st_mtime_ns:
                return None
            with log.open("rb") as handle:
                handle.seek(max(0, stat.st_size - _TAIL))
                bar = latest_bar(handle.read().decode("utf-8", "replace"))
        except OSError:  # the job removed or replaced it meanwhile: next time
            return None
        line = None if bar is None or bar.done >= bar.total else bar.line(str(log.relative_to(self.logs))[:-4])
        previous = self._shown.get(log, (None, None))[1]
        self._shown[log] = (stat.st_mtime_ns, line or previous)
        return line if line != previous else None

    def start(self) -> ProgressLines:
        if self.interval > 0:
            self._thread = threading.Thread(target=self._run, name="verbmirage-progress", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
