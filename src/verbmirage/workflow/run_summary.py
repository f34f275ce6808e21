"""What a researcher sees when a run ends: the few lines the Snakefile's ``onsuccess``/``onerror`` hooks print.

On success (:func:`success_summary`): where the tables, figures and metrics are, a few headline numbers from
Table 1 (each model's ``yn_obj`` and ``yn_verb`` accuracy on clean HICO images, with its 95% interval, beside
the paper's where a paper row matches the model's and the variant's ``paper_name``, the rule Table 1 itself
follows), and how to write and open the HTML report. On failure (:func:`failure_summary`): which jobs failed,
read from Snakemake's own log of the run, with their log files and the error line each log ends with.

Neither may fail the run: a missing or unreadable file becomes one line saying so (:func:`print_summary`
catches whatever is left).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from verbmirage.core.paths import write_text
from verbmirage.workflow.jobserver import KILLED

#: Table 1's columns shown as headline numbers (tables.table1_columns), with their short names.
HEADLINE_COLUMNS = (("yn_obj_acc", "yn_obj"), ("yn_verb_acc", "yn_verb"))
#: Set by a caller that writes the report after the run (``verbmirage report``, ``tools/demo.sh``): the run saves
#: its summary instead of printing it, and the caller prints it last (:func:`print_saved_summary`).
SUMMARY_LATER = "VERBMIRAGE_SUMMARY_LATER"
#: at most this many failed jobs are listed one by one.
FAILED_JOBS = 10
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
TABLE_SUFFIXES = (".html",)  # every table of ours is also written as HTML (and .md, .parquet beside it)


# ---- success -------------------------------------------------------------------------------------------------
def _shown(path: str | Path, workdir: Path) -> str:
    """``path`` relative to the working directory where it lies inside it (what a user types there)."""
    path = Path(path)
    if path.is_absolute():
        try:
            return str(path.relative_to(workdir))
        except ValueError:
            return str(path)
    return str(path)


def _folders(paths: Sequence[str], workdir: Path, noun: str) -> str:
    """``folder/ (N nouns)`` (or ``made of N``) for each folder the paths lie in, in first-seen order."""
    folders: dict[str, list[str]] = {}
    for path in paths:
        folders.setdefault(str(Path(path).parent), []).append(path)
    parts = []
    for folder, members in folders.items():
        made = sum((workdir / member).is_file() for member in members)
        plural = noun if len(members) != 1 else noun.removesuffix("s")
        count = f"{made} {plural}" if made == len(members) else f"{made} of {len(members)} {plural} made"
        parts.append(f"{_shown(folder, workdir)}/ ({count})")
    return ", ".join(parts)


def _interval(row: Mapping, column: str) -> str:
    low, high = row.get(f"{column}_ci_low"), row.get(f"{column}_ci_high")
    if low is None or high is None or low != low or high != high:  # NaN: no interval
        return ""
    return f" [{low:.2f}, {high:.2f}]"


def _value(value) -> str:
    return "–" if value is None or value != value else f"{value:.2f}"


def headline_lines(table1, variant_paper_names: Mapping[str, str] | None = None,
                   limit: int | None = None) -> list[str]:
    """One line per model of Table 1 (``table1.parquet``, percent): its ``yn_obj`` and ``yn_verb`` accuracy
    with the 95% interval, and the paper's values of the same model and decoding where Table 1 has them.

    A model with several variants shows one: the first whose decoding matches a paper row, else the first
    with a value, else its first row (and its ``note``: why it has none). Models with a paper counterpart
    come first; after ``limit`` models (default: every model), one line counts the rest.
    """
    missing = [column for column, _ in HEADLINE_COLUMNS if column not in table1.columns]
    if missing or "source" not in table1.columns:
        return [f"table1.parquet has no {', '.join(missing) or 'source'} column: no headline numbers"]
    from verbmirage.evaluation.tables import headline_rows  # deferred: imports pandas (a failed run's hook needs none)

    rows = headline_rows(table1, variant_paper_names, [column for column, _ in HEADLINE_COLUMNS])
    if not rows:
        return ["table1.parquet has no measured rows: no headline numbers"]
    chosen = {row["model"]: (row, reference) for row, reference in rows}

    def has_values(row) -> bool:
        return any(row[column] == row[column] for column, _ in HEADLINE_COLUMNS)  # not all NaN

    order = list(chosen)  # paper counterparts first (headline_rows)
    limit = len(order) if limit is None else limit
    width = max(len(f"{model} ({chosen[model][0]['variant']})") for model in order[:limit])
    lines = []
    for model in order[:limit]:
        row, reference = chosen[model]
        ours = "  ".join(f"{short} {_value(row[column])}{_interval(row, column)}" for column, short in HEADLINE_COLUMNS)
        note = row.get("note")
        if not has_values(row) and isinstance(note, str) and note:  # a planned run without values says why
            ours = f"no values: {note}"
        line = f"{model + ' (' + row['variant'] + ')':<{width}}  {ours}"
        if reference is not None:
            theirs = ", ".join(_value(reference[column]) for column, _ in HEADLINE_COLUMNS)
            line += f"  | paper {reference['model']} ({reference['variant']}): {theirs}"
        lines.append(line)
    if len(order) > limit:
        lines.append(f"... and {len(order) - limit} more models in table1.md")
    if chosen[order[0]][1] is None and (table1.source == "paper").any():
        lines.append("(no row has the paper's beside it: that takes the model's and the variant's paper_name)")
    return lines


def _metrics_line(path: Path) -> str:
    import pandas as pd  # deferred: the hook of a failed run never needs it

    datasets = pd.read_parquet(path, columns=["dataset"]).dataset
    return f"{len(datasets):,} values (datasets: {', '.join(sorted(datasets.unique()))})"


def _report_command(configfiles: Sequence[str], workdir: Path, output: str | None = None) -> str:
    script = Path(sys.executable).parent / "verbmirage"  # the venv's command (pyproject [project.scripts])
    command = _shown(script, workdir) if script.is_file() else f"{_shown(sys.executable, workdir)} -m verbmirage"
    command += " report"
    for configfile in configfiles or ():
        command += f" --configfile {_shown(configfile, workdir)}"
    return command + (f" --output {_shown(output, workdir)}" if output else "")


def report_line(report: str | Path, shown: Iterable[str], command: str, workdir: Path) -> str:
    """The summary's line on the HTML report: up to date when it is at least as new as every file it shows
    (``shown``: tables, figures, its own pages; those missing are not counted), else why not and the
    ``command`` that writes it."""
    report_path = workdir / report
    made = [(path.stat().st_mtime, name) for name in shown if (path := workdir / name).is_file()]
    newer = sorted(((time, name) for time, name in made
                    if not report_path.is_file() or time > report_path.stat().st_mtime), reverse=True)
    if report_path.is_file() and not newer:
        return f"  report   {report_path} (open it in a browser; `{command}` rewrites it)"
    if report_path.is_file():
        more = f" and {len(newer) - 1} more of the files it shows" if len(newer) > 1 else ""
        state = f"older than {_shown(newer[0][1], workdir)}{more}"
    else:
        state = "not written yet"
    return f"  report   {state}: `{command}` writes {report_path}, then open it in a browser"


def success_summary(outputs: Iterable[str], metrics: str, table1: str | None = None,
                    variants: Mapping[str, Mapping] | None = None, configfiles: Sequence[str] | None = (),
                    report: str = "report.html", workdir: str | Path = ".",
                    shown: Iterable[str] | None = None, output: str | None = None) -> str:
    """The end-of-run block of a successful run.

    ``outputs``: the workflow's final files (``rule all``'s inputs); its tables (HTML, with .md and .parquet
    beside them) and figures are located by suffix. ``metrics``/``table1``: the long metrics table and Table 1's
    Parquet (default: the ``table1.parquet`` among ``outputs``). ``variants``: the config's ``variants`` (their
    ``paper_name``: the decoding a paper row must match). ``configfiles``: the config files the run was given
    (``--configfile``), repeated in the report command. ``report``: the config's HTML report
    (``RunFolders.report``); ``shown``: every file it shows (``Plan.report_files``; default: the tables and
    figures among ``outputs``), which it must be at least as new as to be up to date; ``output``: the report
    written somewhere else than the config's own (``verbmirage report --output``), named instead and in the
    command. Paths are shown relative to ``workdir``.
    """
    workdir = Path(workdir).resolve()
    outputs = [str(path) for path in outputs]
    lines = ["", "Verb Mirage: the run finished."]
    tables = [path for path in outputs if path.endswith(TABLE_SUFFIXES)]
    figures = [path for path in outputs if path.endswith(FIGURE_SUFFIXES)]
    lines.append(f"  tables   {_folders(tables, workdir, 'tables') if tables else 'none configured'}"
                 + ("; .html, with .md and .parquet beside" if tables else ""))
    lines.append(f"  figures  {_folders(figures, workdir, 'figures') if figures else 'none configured'}")
    metrics_path = workdir / metrics
    try:
        detail = _metrics_line(metrics_path) if metrics_path.is_file() else "missing (this run did not make it)"
    except Exception as error:  # an unreadable table is said, not raised: the run has succeeded
        detail = f"unreadable ({type(error).__name__}: {error})"
    lines.append(f"  metrics  {_shown(metrics, workdir)}: {detail}")
    if table1 is None:
        table1 = next((path for path in outputs if Path(path).name == "table1.parquet"), None)
    if table1 is None:
        lines.append("  Table 1  not among this workflow's outputs: no headline numbers")
    elif not (workdir / table1).is_file():
        lines.append(f"  Table 1  {_shown(table1, workdir)} is missing: no headline numbers")
    else:
        try:
            import pandas as pd

            names = {name: (settings or {}).get("paper_name", "") for name, settings in (variants or {}).items()}
            headline = headline_lines(pd.read_parquet(workdir / table1), names)
        except Exception as error:
            headline = [f"{_shown(table1, workdir)} unreadable ({type(error).__name__}: {error})"]
        lines.append(f"  Table 1 ({_shown(table1, workdir)}, clean images): accuracy in %, ours [95% interval]"
                     " | the paper's")
        lines += [f"    {line}" for line in headline]
    lines.append(report_line(output or report, tables + figures if shown is None else shown,
                             _report_command(configfiles, workdir, output), workdir))
    return "\n".join(lines) + "\n"


# ---- failure -------------------------------------------------------------------------------------------------
#: a job's header in Snakemake's log (``rule x:`` or ``localrule x:``) and the error block of a failed job
_JOB = re.compile(r"^(?:local)?(?:rule|checkpoint) (?P<rule>\w+):$")
_ERROR = re.compile(r"^Error in (?:rule|checkpoint) (?P<rule>\w+):$")
_FIELD = re.compile(r"^ {4}(?P<key>\w+): (?P<value>.*)$")
#: the line of a traceback that names the exception (``ValueError: ...``, ``verbmirage.core.io.SchemaError: ...``)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b.*")


def _blocks(text: str) -> Iterable[tuple[str, str, dict[str, str]]]:
    """(kind, rule, fields) of every job header and error block in a Snakemake log."""
    current = None
    for line in text.splitlines():
        header, error = _JOB.match(line), _ERROR.match(line)
        if header or error:
            if current:
                yield current
            current = ("error" if error else "job", (error or header).group("rule"), {})
            continue
        field = _FIELD.match(line)
        if current and field:
            current[2].setdefault(field.group("key"), field.group("value"))
        elif current and not line.startswith(" "):
            yield current
            current = None
    if current:
        yield current


def failed_jobs(snakemake_log: str) -> list[dict[str, object]]:
    """The failed jobs of one Snakemake log, in the order they failed: rule, jobid, wildcards (from the job's
    header), message (where Snakemake gives one) and log files."""
    wildcards: dict[str, str] = {}
    failed = []
    for kind, rule, fields in _blocks(snakemake_log):
        jobid = fields.get("jobid", "")
        if kind == "job":
            wildcards[jobid] = fields.get("wildcards", "")
            continue
        logs = fields.get("log", "").split(" (check log file(s)", 1)[0]
        message = fields.get("message", "")
        failed.append({"rule": rule, "jobid": jobid, "wildcards": wildcards.get(jobid, ""),
                       "message": "" if message == "None" else message,
                       "logs": [path.strip() for path in logs.split(",") if path.strip()]})
    return failed


def error_line(log: Path, limit: int = 300) -> str:
    """The line a job log names its error with: the job server's word that a signal killed the job (its last
    line, :data:`verbmirage.workflow.jobserver.KILLED`), else the exception line of its last Python traceback
    (the first line after ``Traceback (most recent call last):`` that is not indented), else the last line that
    names an error, else its last line. A line longer than ``limit`` keeps its start and its end (where our
    messages say what to do: the command that repairs a damaged shard)."""
    lines = [line.rstrip() for line in re.split(r"[\r\n]+", log.read_text(errors="replace")) if line.strip()]
    if not lines:
        return "(empty)"
    if lines[-1].startswith(KILLED.split("{")[0]):
        return lines[-1]
    starts = [number for number, line in enumerate(lines) if line.strip() == "Traceback (most recent call last):"]
    found = None
    if starts:
        found = next((line for line in lines[starts[-1] + 1 :] if not line[0].isspace()), None)
    if found is None:
        found = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line.strip())), lines[-1])
    found = found.strip()
    half = (limit - 5) // 2
    return found if len(found) <= limit else f"{found[:half]} ... {found[-half:]}"


def failure_summary(snakemake_logs: Sequence[str], workdir: str | Path = ".", limit: int = FAILED_JOBS) -> str:
    """The end-of-run block of a failed run: each failed job (rule, wildcards), its log files and the error
    line each ends with, read from ``snakemake_logs`` (the hook's ``log``: Snakemake's own log of this run)."""
    workdir = Path(workdir).resolve()
    lines = [""]
    failed, read = [], []
    for path in snakemake_logs:
        try:
            failed += failed_jobs(Path(path).read_text(errors="replace"))
            read.append(path)
        except OSError as error:
            lines.append(f"  (Snakemake's log {path} unreadable: {error})")
    if failed:
        lines.insert(1, f"Verb Mirage: the run stopped; {len(failed)} job{'s' * (len(failed) > 1)} failed:")
    else:
        lines.insert(1, "Verb Mirage: the run stopped; Snakemake's log names no failed job (see its messages "
                        "above).")
    for job in failed[:limit]:
        wildcards = f" ({job['wildcards']})" if job["wildcards"] else ""
        lines.append(f"  {job['rule']}{wildcards}")
        if job["message"]:
            lines.append(f"    message: {job['message']}")
        if not job["logs"]:
            lines.append("    (the rule has no log file)")
        for log in job["logs"]:
            path = workdir / log
            try:
                said = error_line(path) if path.is_file() else "missing (the job wrote none)"
            except OSError as error:
                said = f"unreadable ({error})"
            lines.append(f"    log {_shown(log, workdir)}: {said}")
    if len(failed) > limit:
        lines.append(f"  ... and {len(failed) - limit} more")
    for path in read:
        lines.append(f"  Snakemake's log of this run: {_shown(path, workdir)}")
    if failed:
        lines.append("  Fix the cause and run the same command again: finished jobs are not redone.")
    return "\n".join(lines) + "\n"


# ---- the hooks -----------------------------------------------------------------------------------------------
def print_summary(outcome: str, stream=None, **arguments) -> None:
    """Print the end-of-run block (``outcome``: ``success`` or ``error``; ``arguments``: those of
    :func:`success_summary` / :func:`failure_summary`). With :data:`SUMMARY_LATER` set in the environment a
    success's block is not printed: the caller prints it once it has written the report
    (:func:`print_saved_summary`). Never raises: this runs in the Snakefile's hooks, and the run's outcome must
    not depend on its summary."""
    stream = stream or sys.stderr
    if outcome == "success" and os.environ.get(SUMMARY_LATER):
        return
    try:
        text = success_summary(**arguments) if outcome == "success" else failure_summary(**arguments)
    except Exception as error:
        text = f"Verb Mirage: no end-of-run summary ({type(error).__name__}: {error})\n"
    _write(stream, text)


def save_summary(path: str | Path, arguments: Mapping) -> None:
    """Keep the arguments of :func:`success_summary` (the run's outputs, metrics, report ...) at ``path`` (JSON,
    when they changed), where :func:`print_saved_summary` reads them: written when the run is planned, so they
    are there also after a run that had nothing to do (Snakemake calls no hook then)."""
    def plain(value):  # Snakemake's lists, paths
        return str(value) if isinstance(value, Path) else list(value)

    text = json.dumps(dict(arguments), default=plain, indent=1) + "\n"
    try:
        if Path(path).read_text() == text:
            return
    except OSError:
        pass
    write_text(path, text)


def print_saved_summary(saved: str | Path, stream=None, report: str | Path | None = None,
                        workdir: str | Path = ".") -> bool:
    """Print the summary of the last successful run that saved one at ``saved`` (its report line as of now, for
    ``report`` when given: the file just written; the run's paths are relative to ``workdir``); False when there
    is none to print."""
    stream = stream or sys.stderr
    try:
        arguments = json.loads(Path(saved).read_text())
    except (OSError, ValueError):
        return False
    if report is not None and Path(report).resolve() != (Path(workdir) / arguments.get("report", "")).resolve():
        arguments["output"] = str(report)  # not the config's own report: named, and so is the --output it needs
    arguments["workdir"] = str(workdir)
    try:
        text = success_summary(**arguments)
    except Exception as error:
        text = f"Verb Mirage: no end-of-run summary ({type(error).__name__}: {error})\n"
    _write(stream, text)
    return True


def _write(stream, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed or broken stream: nothing left to tell
        pass


__all__ = ["success_summary", "report_line", "failure_summary", "failed_jobs", "headline_lines", "error_line",
           "print_summary", "save_summary", "print_saved_summary", "SUMMARY_LATER"]
