"""The HTML report as a file: where a config's report goes, how it is written, and what keeps it safe to open.

``verbmirage report`` and ``tools/demo.sh`` both write the report through :func:`write_report`:

- **One report per config** (:func:`report_path`): the demo's ``config.yaml`` writes ``report.html`` in the
  working directory; any other config writes ``report.html`` in its own results folder
  (``results/<name>/report.html``, or ``<results_dir>/report.html``), beside the tables and figures it shows.
  A report of one config never replaces another's.
- **Nothing from a config runs as script** (:func:`seal_script_data`). Snakemake's report embeds its data
  (each result's job parameters, captions and wildcards, the rules, the landing text) as JSON inside
  ``<script>`` blocks, verbatim. A config's free text (a model's ``paper_name`` or ``stand_in``, a data
  folder's name) that holds ``</script>`` would end its block, and the rest would run as the page's own
  HTML. Every ``<`` of those blocks is written ``\\u003c`` instead: inside a JSON string it is the same
  character to JavaScript, and no text can leave its block. (``<`` appears only inside strings in JSON.)
- **Every result opens from its top** (:data:`STYLESHEET`, ``report/report.css``): Snakemake's viewer centres a
  result in a box of the screen's height, which cuts off the top of a figure taller than the screen; the
  stylesheet keeps it centred while it fits and starts it at the top when it does not.
- **Never half written**: Snakemake writes to a temporary file beside the output; it is sealed and then
  moved into place, so the output is either the previous report or the whole new one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

from verbmirage.core.paths import open_plain
from verbmirage.workflow.run_folders import DEMO_CONFIG, RunFolderError, RunFolders, run_folders

#: The report's stylesheet (given to Snakemake with ``--report-stylesheet``).
STYLESHEET = Path(__file__).resolve().parents[3] / "report" / "report.css"
#: The data blocks of Snakemake's report template: ``<script id="...">`` then one line ``var NAME = JSON;``.
DATA_BLOCKS = ("workflow-desc", "results", "categories", "rulegraph", "runtimes", "timeline", "rules",
               "packages", "metadata", "logo")
_DATA_BLOCK = re.compile(r'(<script id="(?P<id>[\w-]+)">\n[ \t]*var (?P<name>\w+) = )(?P<data>[^\n]*);(?=\n)')


class ReportError(RuntimeError):
    """The report cannot be written or made safe; the message names the file and why."""


def report_path(configfile: str | None, workdir: str | Path, workflow_dir: str | Path) -> Path:
    """Where ``verbmirage report`` writes a config's report by default (relative to ``workdir`` unless the
    config's ``results_dir`` is absolute): ``report.html`` for the demo's config (``configfile`` None or the
    demo's ``config.yaml``), else ``report.html`` in the config's results folder (:func:`config_folders`)."""
    return Path(config_folders(configfile, workdir, workflow_dir).report)


def config_folders(configfile: str | None, workdir: str | Path, workflow_dir: str | Path) -> RunFolders:
    """The folders a config's run writes to (:func:`~verbmirage.workflow.run_folders.run_folders`, from the
    config's ``results_dir``), as the workflow chooses them; :class:`ReportError` when they cannot be chosen."""
    workdir = Path(workdir)
    source = workdir / (configfile or DEMO_CONFIG)
    try:
        config = yaml.safe_load(source.read_text()) if source.is_file() or configfile else {}
    except (OSError, yaml.YAMLError) as error:
        raise ReportError(f"--configfile {configfile}: cannot be read ({type(error).__name__}: {error})") from None
    results_dir = config.get("results_dir") or "" if isinstance(config, dict) else ""
    try:
        return run_folders(str(results_dir), [configfile] if configfile else [], workdir, workflow_dir)
    except RunFolderError as error:
        raise ReportError(str(error)) from None


def seal_script_data(page: str) -> str:
    """``page`` (Snakemake's report) with every ``<`` of its embedded data written ``\\u003c``: no text of a
    config can end its ``<script>`` block. Raises :class:`ReportError` when a data block of Snakemake's
    template is missing or is not one line of JSON (a template this does not know: better no report than an
    unsafe one)."""
    found: dict[str, str] = {}

    def seal(match: re.Match) -> str:
        data = match.group("data")
        try:
            value = json.loads(data)
        except json.JSONDecodeError as error:
            raise ReportError(f"the report's <script id=\"{match.group('id')}\"> block is not one line of JSON "
                              f"({error}); the Snakemake report template changed") from None
        sealed = data.replace("<", "\\u003c")
        if json.loads(sealed) != value:  # cannot differ (JSON has '<' only inside strings); checked all the same
            raise ReportError(f"sealing the report's <script id=\"{match.group('id')}\"> block changed its data")
        found[match.group("id")] = match.group("name")
        return f"{match.group(1)}{sealed};"

    sealed = _DATA_BLOCK.sub(seal, page)
    missing = [block for block in DATA_BLOCKS if block not in found]
    if missing:
        raise ReportError(f"the report has no <script id=\"{missing[0]}\"> data block where Snakemake's template "
                          "puts it; the Snakemake report template changed")
    return sealed


def report_command(snakemake: Sequence[str], output: Path) -> list[str]:
    """``snakemake`` (the command that runs the workflow) asked for the report at ``output`` instead (the
    options go before ``--configfile``, which takes every word after it up to the next option)."""
    command = list(snakemake)
    at = command.index("--configfile") if "--configfile" in command else len(command)
    return [*command[:at], "--report", str(output), "--report-stylesheet", str(STYLESHEET), *command[at:]]


def write_report(snakemake: Sequence[str], output: str | Path, log: str | Path | None = None) -> Path:
    """Write the report of the workflow that ``snakemake`` (a command line, without ``--report``) runs to
    ``output`` (an ``.html`` file): Snakemake writes it to a temporary file beside ``output``, which is sealed
    (:func:`seal_script_data`) and moved into place. Returns the absolute path; raises :class:`ReportError`
    (naming Snakemake's exit status or the problem) with ``output`` left as it was. With ``log``, Snakemake's
    output goes there (a failure's message names it), not to the terminal."""
    output = Path(output).resolve()
    if output.suffix != ".html":
        raise ReportError(f"--output {output}: the report is one self-contained page; name it *.html")
    output.parent.mkdir(parents=True, exist_ok=True)
    draft = output.with_name(f".{output.stem}.{os.getpid()}.draft.html")
    try:
        if log is None:
            status = subprocess.run(report_command(snakemake, draft)).returncode
        else:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(open_plain(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as written:
                status = subprocess.run(report_command(snakemake, draft), stdout=written,
                                        stderr=subprocess.STDOUT).returncode
        if status != 0:
            where = "above" if log is None else f"in {log}"
            raise ReportError(f"snakemake --report failed (exit status {status}); its message is {where}")
        draft.write_text(seal_script_data(draft.read_text(encoding="utf-8")), encoding="utf-8")
        os.replace(draft, output)
    finally:
        draft.unlink(missing_ok=True)
    return output


__all__ = ["STYLESHEET", "ReportError", "report_path", "config_folders", "seal_script_data", "report_command",
           "write_report"]
