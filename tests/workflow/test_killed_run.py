"""A Snakemake run killed with SIGKILL: its inference job stops instead of running on as an orphan, and a job that
finds an earlier run of itself still writing does not replace that job's log (docs/faults.md).

Real Snakemake, the real inference script (scripts/predict_suite.py), the real run start of the Snakefile
(``jobserver.start_run``: the run named for its jobs, a job server) and the slow test model
(tests/slow_backend.py), on a one-rule workflow so that each run takes seconds. The job holds after its first
part until the test releases it, so it is still running at each step that needs it, however loaded the
machine; whatever a failed test leaves running in its folder is killed at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verbmirage.benchmark.conditions import apply_condition
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
sys.path.insert(0, str(REPO / "tools"))

import kill_anywhere  # noqa: E402  (tools/ is not a package)
from slow_backend import held_mark  # noqa: E402  (tests/ is not a package)

pytestmark = pytest.mark.slow
#: 30 batches of 4
QUESTIONS_ASKED = 120
#: the job answers this many questions (at least one part of 8 rows stored), then holds (tests/slow_backend.py)
HOLD_AFTER = 16
SHARD = "out/hico/slow/0"
LOG = "logs/predict/hico/slow/0.log"

SNAKEFILE = """\
from verbmirage.workflow import jobserver

_server = []


onstart:
    _server.append(jobserver.start_run(config["local"], config["job_server"], "logs/job_server.log",
                                       preload=("numpy", "pandas", "pyarrow.parquet", "verbmirage.inference.runs")))


onsuccess:
    jobserver.stop(_server.pop())


onerror:
    jobserver.stop(_server.pop())


rule all:
    input:
        "{shard}",


rule predict_suite:
    input:
        questions=["yn_obj.parquet"],
        images="clean",
        train_stats="yn_obj.parquet",
    output:
        directory("out/{{dataset}}/{{model}}/{{shard}}"),
    params:
        qsets=["yn_obj"],
        model={{"backend": "slow_backend:SlowModel", "hold_file": "{hold}", "hold_after": {hold_after}}},
        variant={{}},
        n_shards=1,
        batch_size=4,
        part_size=8,
        max_error_share=0.05,
        continue_tokens=8,
        condition=None,
    log:
        "logs/predict/{{dataset}}/{{model}}/{{shard}}.log",
    script:
        "{script}"
"""


@pytest.fixture(scope="module")
def questions_and_images(demo_anno, demo_roots, tmp_path_factory):
    base = tmp_path_factory.mktemp("killed_run_data")
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(QUESTIONS_ASKED)
    write_table(questions, base / "yn_obj.parquet", QUESTIONS)
    apply_condition(demo_roots[0], sorted(set(questions.image)), base / "clean", "clean", {"type": "clean"})
    return base, questions


@pytest.fixture
def work(questions_and_images, tmp_path):
    """The one-rule workflow's folder; its job holds until :func:`_release`. At the end, every process still
    running in it (the test's own runs and jobs, left by a failure) is killed."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("yn_obj.parquet", "clean"):
        (work / name).symlink_to(questions_and_images[0] / name)
    (work / "Snakefile").write_text(SNAKEFILE.format(shard=SHARD, hold=_hold_file(work), hold_after=HOLD_AFTER,
                                                     script=REPO / "scripts" / "predict_suite.py"))
    yield work
    _release(work)
    for pid in kill_anywhere.processes_in(work):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _hold_file(work: Path) -> Path:
    return work.parent / "release"


def _held(work: Path) -> bool:
    """Whether the job answered its first questions and now holds."""
    return held_mark(_hold_file(work)).exists()


def _release(work: Path) -> None:
    """Let the held job (and any later run of it) answer the rest."""
    _hold_file(work).touch()


def _environment() -> dict:
    path = os.pathsep.join(filter(None, [str(TESTS), str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _snakemake(work: Path, *extra: str, local: bool = True, job_server: bool = True) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(work / "Snakefile"), "--directory", str(work),
            "--cores", "1",
            "--config", f"local={local}", f"job_server={job_server}", *extra]


def _start(work: Path, name: str, **flags) -> subprocess.Popen:
    with (work.parent / f"{name}.out").open("w") as out:
        return subprocess.Popen(_snakemake(work, **flags), stdout=out, stderr=subprocess.STDOUT, env=_environment(),
                                cwd=work, start_new_session=True)


def _wait_until(condition, seconds: float, what: str, process: subprocess.Popen | None = None, out: Path | None = None):
    deadline = time.monotonic() + seconds
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the run ended while waiting for {what}: {out.read_text()[-3000:] if out else ''}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _lock_holder(work: Path) -> int:
    """The pid the shard's lock file names (its holder: the process running the job)."""
    return json.loads((work / f"{SHARD}.parts" / "yn_obj" / ".lock").read_text())["pid"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _run(work: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(_snakemake(work, *extra), capture_output=True, text=True, env=_environment(),
                            cwd=work, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_job_stops_when_its_snakemake_is_killed_and_the_rerun_resumes(questions_and_images, work, tmp_path):
    """A served job (the default local run); tests/fast/test_jobserver.py covers a job in its own process."""
    questions = questions_and_images[1]
    run = _start(work, "killed")
    _wait_until(lambda: _held(work), 300, "the job to hold", run, tmp_path / "killed.out")
    job = _lock_holder(work)
    assert job != run.pid and _alive(job)
    run.send_signal(signal.SIGKILL)  # Snakemake alone: its jobs and the job server are not signalled
    run.wait()
    _wait_until(lambda: not _alive(job), 20, "the orphaned job to stop")
    _wait_until(lambda: not kill_anywhere.processes_in(work), 20, "every process of the run to end")
    log = (work / LOG).read_text()
    assert "stopped (JobTerminated: terminated by SIGTERM); the answered rows are saved" in log

    _run(work, "--unlock")
    _release(work)
    _run(work)
    assert "resuming:" in (work / LOG).read_text()
    table = read_table(work / SHARD / "yn_obj.parquet", PREDICTIONS)
    assert sorted(table.question_id) == sorted(questions.question_id)


def test_a_rerun_that_finds_the_job_still_running_leaves_its_log_alone(work, tmp_path):
    # a run whose jobs are not stopped with it (as a cluster's jobs outlive a killed Snakemake)
    run = _start(work, "killed", local=False, job_server=False)
    # the job holds: it cannot finish before the rerun has found it running
    _wait_until(lambda: _held(work), 300, "the job to hold", run, tmp_path / "killed.out")
    holder = _lock_holder(work)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert _alive(holder)
    _run(work, "--unlock")

    rerun = _run(work, check=False)  # Snakemake removes the job's log, then runs the job again
    assert rerun.returncode != 0
    assert "LogBusyError" in rerun.stderr and f"pid {holder} on host" in rerun.stderr
    assert _alive(holder)
    before = (work / LOG).read_text()
    assert "resuming" not in before and "LogBusyError" not in before  # the holder's log, not the rerun's
    _release(work)
    _wait_until(lambda: not _alive(holder), 300, "the first job to finish")
    log = (work / LOG).read_text()
    assert log.startswith(before) and f"predictions per set: {{'yn_obj': {QUESTIONS_ASKED}}}" in log  # the holder wrote on into it
    assert not list((work / LOG).parent.glob(".*.writer"))
