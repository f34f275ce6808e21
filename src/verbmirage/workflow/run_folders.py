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

A tree belongs to the config whose run first wrote into it (:func:`claim`, recorded in ``<results>/.owner.json``):
another config file whose results would land there (``a/x.yaml`` and ``b/x.yaml`` both name ``results/x/``,
or a ``results_dir`` pointing into another config's tree) is refused, naming both files, before any job runs.
So are results folders inside the checkout's own folders (``src/``, ``resources/``, ...) and inside the
demo's artifact folders (``results/predictions/``, ...).

Each config's HTML report goes with its tree (:attr:`RunFolders.report`): ``report.html`` in the working
directory for the demo's tree (``results/``), ``report.html`` in the results folder for any other.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from verbmirage.core.paths import atomic_path

#: The demo's config file, and the folders its runs write to.
DEMO_CONFIG = "config.yaml"
RESULTS, LOGS, BENCHMARKS = "results", "logs", "benchmarks"
REPORT = "report.html"
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
#: Where a tree names the config files it belongs to.
OWNER = ".owner.json"
#: The first folders of a results tree (the demo's ``results/predictions/`` ...): no other config's tree may be
#: one of them (tests/fast/test_run_folders.py checks every artifact path of the plan starts with one).
ARTIFACT_FOLDERS = frozenset({"analysis", "benchmark", "calibration", "figures", "frames", "images", "metrics",
                              "models", "predictions", "report", "shards", "tables", "training"})
#: The checkout's own folders (and the logs'): a results folder there would mix results with the pipeline's
#: files or with another tree's logs.
CHECKOUT_FOLDERS = frozenset({".git", ".snakemake", ".venv", "bench", BENCHMARKS, "configs", "docs", "envs", LOGS,
                              "profiles", "report", "resources", "rules", "schemas", "scripts", "src", "tests",
                              "tools"})


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


class TreeOwnedError(RunFolderError):
    """The results folder belongs to another config (the message names both files and what to do)."""


def _config_names(configfiles, workdir: Path) -> list[str]:
    """The config files of a run as its owner record spells them: relative to the working directory when
    inside it (a checkout moved with its configs keeps its trees), else absolute; the demo's ``config.yaml``
    when none is named (the Snakefile's ``configfile:``, which Snakemake reads from the working directory)."""
    files = [workdir / Path(f) for f in configfiles] or [workdir / DEMO_CONFIG]
    names = []
    for file in files:
        real = Path(os.path.realpath(file))
        try:
            names.append(real.relative_to(Path(os.path.realpath(workdir))).as_posix())
        except ValueError:
            names.append(str(real))
    return names


@dataclass(frozen=True)
class TreeClaim:
    """A run's claim on its results tree, checked by :func:`claim`; :meth:`record` makes it the owner."""

    tree: Path
    configfiles: tuple[str, ...]

    def record(self) -> None:
        """Name this run's config files in the tree's owner record, unless one is there (a run that starts
        jobs does this; a dry run or a check leaves the tree as it was)."""
        if _read_owner(self.tree / OWNER) is None:
            self.tree.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.tree / OWNER) as tmp:  # no date: a resumed run's tree is the same bytes
                tmp.write_text(json.dumps({"configfiles": list(self.configfiles)}) + "\n")


def claim(folders: RunFolders, configfiles, workdir: str | Path, workflow_dir: str | Path) -> TreeClaim:
    """The run's claim on ``folders.results``, or :class:`TreeOwnedError` when that folder is another config's
    (:data:`OWNER`), lies inside another config's tree, inside the checkout's own folders, or in one of the
    demo's artifact folders."""
    workdir, workflow_dir = Path(workdir), Path(workflow_dir)
    tree = workdir / folders.results
    mine = _config_names(configfiles, workdir)
    real_tree = Path(os.path.realpath(tree))
    for base in {os.path.realpath(workdir), os.path.realpath(workflow_dir)}:
        try:
            inside = real_tree.relative_to(base).parts
        except ValueError:
            continue
        if inside and inside[0] in CHECKOUT_FOLDERS:
            raise TreeOwnedError(
                f"results_dir: '{folders.results}' lies in the checkout's own {inside[0]}/ folder, where results "
                "would mix with the pipeline's files; choose a folder under results/ or outside the checkout")
        if len(inside) > 1 and inside[0] == RESULTS and inside[1] in ARTIFACT_FOLDERS:
            raise TreeOwnedError(
                f"results_dir: '{folders.results}' is inside the demo's {RESULTS}/{inside[1]}/ folder; choose "
                f"another folder (e.g. results_dir: {RESULTS}/my_{inside[1]}), or rename the config file")
    for above in list(real_tree.parents)[::-1]:
        owners = _read_owner(above / OWNER)
        if owners is not None and not (above == Path(os.path.realpath(workdir / RESULTS))):
            raise TreeOwnedError(
                f"results_dir: '{folders.results}' lies inside {above}/, the results of {', '.join(owners)} "
                f"({above / OWNER}); choose a folder of its own for {', '.join(mine)}")
    owners = _read_owner(tree / OWNER)
    if owners is not None and owners != mine:
        raise TreeOwnedError(
            f"{folders.results}/ holds the results of {', '.join(owners)}, not of {', '.join(mine)} (recorded in "
            f"{tree / OWNER}): two configs in one tree overwrite each other's results. Give "
            f"{', '.join(mine)} a folder of its own (results_dir: {RESULTS}/<another name>) or another file "
            f"name; if it is the same config moved or renamed, delete {tree / OWNER} and plan again")
    return TreeClaim(tree, tuple(mine))


def _read_owner(path: Path) -> list[str] | None:
    """The config files an owner record names, or None when there is none; a damaged one is an error."""
    try:
        text = path.read_text()
    except OSError:  # none there (or a folder we may not read: not ours to judge)
        return None
    try:
        owners = json.loads(text)["configfiles"]
        if isinstance(owners, list) and all(isinstance(owner, str) for owner in owners):
            return owners
    except (ValueError, KeyError, TypeError):
        pass
    raise TreeOwnedError(f"{path}: not a readable owner record of a results tree; if this tree is yours, delete "
                         "the file and plan again")
