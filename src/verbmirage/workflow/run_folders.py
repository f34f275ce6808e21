"""Where a config's results, logs and benchmarks go: each config file its own tree (README, "Several configs
in one checkout").

The demo's ``config.yaml`` (the Snakefile's own, or ``config.yaml`` in the working directory) writes to
``results/``, ``logs/`` and ``benchmarks/``. Any other file named with ``--configfile`` writes to
``results/<name>/``, ``logs/<name>/`` and ``benchmarks/<name>/``, ``<name>`` being the file's name without
its extension (``configs/paper.yaml``: ``results/paper/``; several files: their names joined by ``+``), so
that two configs in one checkout never overwrite each other's tables nor make each other's jobs rerun.

The top-level key ``results_dir`` names the results folder instead (relative to the working directory, or
absolute). Inside ``results/`` its logs and benchmarks follow the same rule (``results_dir: results/v2``:
``logs/v2/``); elsewhere they go into it (``<results_dir>/logs/``, ``<results_dir>/benchmarks/``).

Each config's HTML report goes with its tree (:attr:`RunFolders.report`): ``report.html`` in the working
directory for the demo's tree (``results/``), ``report.html`` in the results folder for any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: The demo's config file, and the folders its runs write to.
DEMO_CONFIG = "config.yaml"
RESULTS, LOGS, BENCHMARKS = "results", "logs", "benchmarks"
REPORT = "report.html"
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


class RunFolderError(ValueError):
    """A config's results folder cannot be chosen; the message names the file or key."""


@dataclass(frozen=True)
class RunFolders:
    """The folders one config's run writes to (paths relative to the working directory, or absolute)."""

    results: str
    logs: str
    benchmarks: str

    @property
    def report(self) -> str:
        """The config's HTML report: ``report.html`` for the demo's tree, else in its results folder."""
        return REPORT if self.results == RESULTS else str(PurePosixPath(self.results, REPORT))


def _is_demo_config(path: Path, workdir: Path, workflow_dir: Path) -> bool:
    return path.name == DEMO_CONFIG and path.resolve().parent in (workdir.resolve(), workflow_dir.resolve())


def config_name(configfiles, workdir: str | Path, workflow_dir: str | Path) -> str:
    """The name of a run's tree below ``results/``: "" for the demo's config.yaml, else the stems of the
    other config files named on the command line, joined by ``+``."""
    workdir, workflow_dir = Path(workdir), Path(workflow_dir)
    stems = []
    for configfile in configfiles:
        path = workdir / Path(configfile)  # an absolute path stays as it is
        if _is_demo_config(path, workdir, workflow_dir):
            continue
        if not _NAME.fullmatch(path.stem) or path.stem.startswith("."):
            raise RunFolderError(
                f"--configfile {configfile}: '{path.stem}' cannot name a results folder (letters, digits, "
                "'_', '.', '+', '-'); rename the file or set results_dir in it")
        stems.append(path.stem)
    return "+".join(stems)


def run_folders(results_dir: str, configfiles, workdir: str | Path, workflow_dir: str | Path) -> RunFolders:
    """The results, logs and benchmarks folders of a run (``results_dir``: the config key, "" for the default
    by config file name; ``configfiles``: those named on the command line, none for the demo's)."""
    if not results_dir:
        name = config_name(configfiles, workdir, workflow_dir)
        return RunFolders(*(str(PurePosixPath(top, name)) for top in (RESULTS, LOGS, BENCHMARKS)))
    path = PurePosixPath(results_dir)
    if ".." in path.parts or str(path) == ".":
        raise RunFolderError(f"results_dir: '{results_dir}' must name a folder below the working directory or "
                             "an absolute path (no '..', not '.')")
    if path.parts[0] == RESULTS:
        name = PurePosixPath(*path.parts[1:]) if len(path.parts) > 1 else PurePosixPath()
        return RunFolders(str(path), str(LOGS / name), str(BENCHMARKS / name))
    return RunFolders(str(path), str(path / LOGS), str(path / BENCHMARKS))
