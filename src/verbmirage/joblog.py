"""Send a workflow job's logging and progress bars to its Snakemake log file."""

from __future__ import annotations

import contextlib
import logging
import resource
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def job_log(path: str | Path) -> Iterator[logging.Logger]:
    """Route ``logging`` and stderr (tqdm's progress bars) to ``path`` for the job's duration.

    An exception is logged with its traceback before it propagates, so the log
    says why the job failed. The last line gives the job's wall time, CPU time and peak memory, measured in
    its own process (right also when the local job server ran it, where ``benchmarks/`` measures the script
    that waited).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", buffering=1) as stream, contextlib.redirect_stderr(stream):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        started = time.perf_counter()
        try:
            yield logging.getLogger("verbmirage.job")
        except BaseException:
            logging.getLogger("verbmirage.job").exception("job failed")
            raise
        finally:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            logging.getLogger("verbmirage.job").info(
                "job resources: %.1f s, CPU %.1f s, peak RSS %.0f MiB", time.perf_counter() - started,
                usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            )
            root.removeHandler(handler)
