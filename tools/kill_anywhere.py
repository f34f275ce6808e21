#!/usr/bin/env python3
"""Kill the workflow anywhere and check that nothing is lost or changed.

Runs the workflow once without interruption (the reference), then again in another folder where Snakemake and
every job it started are killed with SIGKILL at seeded random moments. After each kill it does what
docs/faults.md tells a user to do (``snakemake --unlock``, then the same command again) and, once a run
finishes, checks that:

- every file under ``results/`` and ``resources/`` is byte-identical to the reference's (a link: the same
  target), and no file is missing or extra;
- no temporary file is left (``*.tmp``);
- no process is left that runs in the folder.

Usage (the full demo, about 3 minutes per uninterrupted run on 2 cores)::

    .venv/bin/python tools/kill_anywhere.py --kills 5 --seed 0

It prints one line per kill and, at the end, how many kills the run survived. Exit status 0 when every check
holds. ``--reference DIR`` reuses a finished uninterrupted run; ``--configfile`` names another config (the
demo's ``config.yaml`` by default); ``--keep`` leaves the folders for inspection.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What a run leaves that is compared (logs and benchmarks hold times; .snakemake holds Snakemake's own state).
COMPARED = ("results", "resources")
#: Files under them that are not compared: an inference shard's resume fingerprint identifies weight files by
#: size and modification time (cheap, and it sees rebuilt weights), which differ between any two runs that
#: build their weights; the report's page of the run's facts names the run's own folders and the pipeline's
#: commit.
NOT_COMPARED = ("fingerprint.json", "run_facts.html")
#: Folders under them that are not compared: the content cache of the data's files is keyed by where the data
#: lies (src/verbmirage/data/identity.py), so two runs in two folders keep it under other names.
NOT_COMPARED_FOLDERS = ("resources/cache",)


def snakemake_command(workdir: Path, configfile: Path, cores: int, *extra: str) -> list[str]:
    """The command a user runs (as tools/demo.sh), pointed at ``workdir``."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(configfile), "--cores", str(cores), "--scheduler", "greedy", *extra]


def processes_in(folder: Path) -> list[int]:
    """Processes (other than this one) whose working directory is ``folder`` or inside it."""
    found, folder = [], folder.resolve()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone, or not ours to read
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(int(entry.name))
    return found


def kill_everything(process: subprocess.Popen, folder: Path, wait: float = 30.0) -> None:
    """SIGKILL Snakemake's process group and every process still running in ``folder``; wait until none is."""
    with _suppress_lookup():
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=wait)
    deadline = time.monotonic() + wait
    while True:
        left = processes_in(folder)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes still running in {folder} after SIGKILL: {left}")
        for pid in left:
            with _suppress_lookup():
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


def run_to_end(command: list[str], log: Path, timeout: float) -> float:
    """Run ``command`` to completion (its output appended to ``log``); its seconds. Raises on failure."""
    started = time.monotonic()
    with log.open("a") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                start_new_session=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with status {result.returncode}; see {log}")
    return time.monotonic() - started


@dataclass
class Report:
    kills: list[float] = field(default_factory=list)  # seconds into each killed attempt
    missed: int = 0  # attempts that finished before their kill moment
    differences: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.differences or self.leftovers or self.orphans)


#: Snakemake's progress line ("12 of 80 steps (15%) done").
PROGRESS = re.compile(rb"(\d+) of (\d+) steps")


def steps_done(log: Path) -> tuple[int, int | None]:
    """(jobs finished, jobs planned) of the run writing ``log`` so far (planned: None before the first)."""
    found = PROGRESS.findall(log.read_bytes()) if log.exists() else []
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, None)


def interrupted_run(workdir: Path, configfile: Path, kills: int, seed: int, cores: int, logs: Path,
                    timeout: float = 3600.0, say=print) -> Report:
    """Kill the run ``kills`` times, each time unlocking and starting it again as a user would; then let it finish.

    The kill moments are drawn (seeded) as shares of the whole run's jobs, sorted, each with a delay: once that
    share of the first plan's jobs is done (Snakemake's progress lines; jobs done by earlier attempts count),
    the run is killed the delay later, in the middle of whatever runs then (a share of 0: while it plans or
    starts). Moments chosen by progress, not by clock, spread the kills over the whole run on any machine.
    """
    rng, report = random.Random(seed), Report()
    shares = sorted(rng.random() for _ in range(kills))
    delays = [rng.uniform(0.2, 3.0) for _ in range(kills)]
    command = snakemake_command(workdir, configfile, cores)
    total = None  # jobs in the first plan
    for attempt, (share, delay) in enumerate(zip(shares, delays), start=1):
        log = logs / f"attempt-{attempt}.log"
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started, reached = time.monotonic(), None
        while process.poll() is None and time.monotonic() - started < timeout:
            done, planned = steps_done(log)
            if planned is not None and total is None:
                total = planned
            finished = done + (total - planned if planned is not None and total is not None else 0)
            if reached is None and (share == 0 or (total is not None and finished >= int(share * total))):
                reached = time.monotonic()
            if reached is not None and time.monotonic() - reached >= delay:
                break
            time.sleep(0.2)  # (each look reads the whole log so far)
        if process.poll() is not None:
            if process.returncode != 0:
                raise RuntimeError(f"the run failed (status {process.returncode}); see {log}")
            report.missed += 1
            say(f"attempt {attempt}: the run finished before its kill; nothing left to kill")
            break
        done, planned = steps_done(log)
        kill_everything(process, workdir)
        report.kills.append(time.monotonic() - started)
        say(f"kill {len(report.kills)}: SIGKILL {report.kills[-1]:.1f} s after the start, {done} of "
            f"{planned or '?'} planned jobs done (the first plan had {total or '?'})")
        run_to_end(snakemake_command(workdir, configfile, cores, "--unlock"), logs / "unlock.log", timeout)
    run_to_end(command, logs / "final.log", timeout)
    report.orphans = processes_in(workdir)
    return report


def tree(workdir: Path) -> dict[str, str]:
    """Relative path -> sha256 of the file (or ``link:<target>``) for every entry under the compared folders."""
    entries = {}
    for top in COMPARED:
        for path in sorted((workdir / top).rglob("*")):
            name = str(path.relative_to(workdir))
            if path.name in NOT_COMPARED or any(name.startswith(f"{folder}/") for folder in NOT_COMPARED_FOLDERS):
                continue
            if path.is_symlink():
                entries[name] = f"link:{os.readlink(path)}"
            elif path.is_file():
                entries[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return entries


def temporary_files(workdir: Path) -> list[str]:
    """Files a cut-off write leaves behind (the project writes through ``.<name>.<random>.tmp``)."""
    return sorted(str(path.relative_to(workdir)) for top in COMPARED for path in (workdir / top).rglob("*.tmp"))


def compare(reference: dict[str, str], other: dict[str, str]) -> list[str]:
    """One line per path that differs, is missing or is extra."""
    lines = [f"missing: {name}" for name in sorted(set(reference) - set(other))]
    lines += [f"extra: {name}" for name in sorted(set(other) - set(reference))]
    lines += [f"differs: {name}" for name in sorted(set(reference) & set(other)) if reference[name] != other[name]]
    return lines


def check(reference_dir: Path, workdir: Path, report: Report) -> Report:
    report.differences = compare(tree(reference_dir), tree(workdir))
    report.leftovers = temporary_files(workdir)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--kills", type=int, default=5, help="how many times to kill the run (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    parser.add_argument("--configfile", type=Path, default=REPO / "config.yaml",
                        help="the config to run (default: the demo's config.yaml)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--reference", type=Path, help="a finished uninterrupted run of the same config to compare "
                        "with (default: made first)")
    parser.add_argument("--workdir", type=Path, help="where to run (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folders afterwards")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kill_anywhere."))
    reference = args.reference or base / "reference"
    workdir = args.workdir or base / "killed"
    workdir.mkdir(parents=True, exist_ok=True)
    configfile = args.configfile.resolve()
    if args.reference is None:
        reference.mkdir(parents=True)
        print(f"reference run in {reference} ...")
        seconds = run_to_end(snakemake_command(reference, configfile, args.cores), base / "reference.log", 3600)
        print(f"reference run: {seconds:.0f} s")
    logs = base / "logs"
    logs.mkdir(exist_ok=True)
    print(f"killed runs in {workdir} (logs in {logs})")
    report = check(reference, workdir, interrupted_run(workdir, configfile, args.kills, args.seed, args.cores, logs))
    for line in report.differences[:50] + [f"temporary file left: {name}" for name in report.leftovers]:
        print(line)
    if report.orphans:
        print(f"processes left running in {workdir}: {report.orphans}")
    print(f"survived {len(report.kills)} kills: "
          f"{'the same tree as the uninterrupted run' if report.ok else 'CHECKS FAILED'}")
    if not args.keep and report.ok:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
