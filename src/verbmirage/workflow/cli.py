"""The ``verbmirage`` command (also ``python -m verbmirage``).

    verbmirage --version
    verbmirage check  [--configfile F]             every planning check, no job runs; prints the plan's size
    verbmirage run    [--configfile F] [TARGET...] [--cores N] [--profile P] [-n] [-- SNAKEMAKE-ARGS...]
    verbmirage report [--configfile F] [--output FILE] [--no-run] [-- SNAKEMAKE-ARGS...]
                                                   the tables, figures and the HTML report
    verbmirage list   [--configfile F] [WHAT]       backends, question sets, decodings, conditions; a config's models
    verbmirage predict / predict-suite ...         answer questions by hand, as a workflow job does

``check``, ``run`` and ``report`` call Snakemake on this checkout's Snakefile in the current folder (the
workflow's working directory); a ``--configfile`` replaces the demo's ``config.yaml`` (README, "Using the real
data"). ``run`` puts the targets before the config file (after it, Snakemake would read them as more config
files) and passes everything after ``--`` to Snakemake unchanged. ``report`` writes one report per config
(``report.html`` for the demo's, ``results/<name>/report.html`` for another: ``workflow/report_file.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from verbmirage import __version__
from verbmirage.inference.runs import RunSpec, run_shard, run_suite
from verbmirage.inference.settings import INFERENCE_DEFAULTS, inference_problem
from verbmirage.workflow.catalog import SECTIONS, listing
from verbmirage.workflow.paths import LOGS
from verbmirage.workflow.run_summary import SUMMARY_LATER, print_saved_summary

#: The workflow this package belongs to (an editable install from the repository).
SNAKEFILE = Path(__file__).resolve().parents[3] / "Snakefile"


def snakemake_command(configfile: str | None = None, targets: list[str] | None = None, cores: int | None = None,
                      profile: str | None = None, dry_run: bool = False, extra: list[str] | None = None) -> list[str]:
    """The Snakemake command line of a ``run``: the targets first, then the options, the config file last."""
    if not SNAKEFILE.is_file():
        raise SystemExit(f"verbmirage: no Snakefile at {SNAKEFILE}; run the workflow from a checkout of the "
                         "repository (pip install -e .)")
    command = [sys.executable, "-m", "snakemake", *(targets or []), "--snakefile", str(SNAKEFILE)]
    if profile:
        command += ["--profile", profile]
    elif cores is not None or not dry_run:
        command += ["--cores", str(cores or 2), "--scheduler", "greedy"]  # tools/demo.sh's choice, see there
    if dry_run:
        command.append("--dry-run")
    command += list(extra or [])
    if configfile:
        command += ["--configfile", str(configfile)]
    return command


#: The summary line of ``snakemake --dry-run --quiet rules`` ("total   179").
_TOTAL = re.compile(r"^total\s+(\d+)\s*$", re.M)


def check(configfile: str | None) -> int:
    """Plan the workflow without running a job: every check made when a run is planned (config keys and
    values, backend and condition settings, data roots, analyses' inputs) reports here, naming the key."""
    command = snakemake_command(configfile, dry_run=True, extra=["--quiet", "rules"])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        print(f"verbmirage check: the plan failed ({configfile or 'config.yaml'}); the message above names "
              "the key or file", file=sys.stderr)
        return result.returncode
    total = _TOTAL.search(result.stdout)
    jobs = f"{total.group(1)} jobs to run" if total else "nothing to do"
    print(f"verbmirage check: {configfile or 'config.yaml'} plans; {jobs}")
    return 0


def report(configfile: str | None, output: str | None = None, cores: int | None = None, no_run: bool = False,
           extra: list[str] | None = None) -> int:
    """Run what is missing (unless ``no_run``), then write the report (:func:`~verbmirage.workflow.report_file.
    write_report`) to ``output``, by default the config's own (:func:`~verbmirage.workflow.report_file.
    report_path`)."""
    from verbmirage.workflow.report_file import ReportError, config_folders, write_report

    workdir = _workdir(extra or [])
    try:
        folders = config_folders(configfile, workdir, SNAKEFILE.parent)
    except ReportError as error:
        print(f"verbmirage report: {error}", file=sys.stderr)
        return 2
    target = Path(output) if output else workdir / folders.report
    if _dry_run(extra or []):  # a plan only: nothing made, no report
        return subprocess.run(snakemake_command(configfile, cores=cores, extra=extra)).returncode
    command = snakemake_command(configfile, cores=cores, extra=extra)
    if not no_run:  # the run saves its summary; it is printed last, once the report is written
        status = subprocess.run(command, env={**os.environ, SUMMARY_LATER: "1"}).returncode
        if status != 0:
            return status
    log = workdir / folders.logs / LOGS["report"]
    try:
        written = write_report(command, target, log=log)
    except ReportError as error:
        print(f"verbmirage report: {error}", file=sys.stderr)
        return 1
    if not print_saved_summary(workdir / folders.logs / LOGS["run_summary"], report=written, workdir=workdir):
        print(f"verbmirage report: open {written} in a browser")
    return 0


def _workdir(arguments: list[str]) -> Path:
    """The working directory Snakemake arguments choose (``--directory``/``-d``), else the current one."""
    for index, argument in enumerate(arguments):
        if argument in ("--directory", "-d") and index + 1 < len(arguments):
            return Path(arguments[index + 1])
        if argument.startswith("--directory="):
            return Path(argument.split("=", 1)[1])
    return Path.cwd()


def _dry_run(arguments: list[str]) -> bool:
    """Whether Snakemake arguments ask for a dry run (``-n``, also among other one-letter flags, ``--dry-run``)."""
    return any(argument in ("--dry-run", "--dryrun") or re.fullmatch(r"-[a-zA-Z]*n[a-zA-Z]*", argument)
               for argument in arguments)


def _add_workflow_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configfile", help="the config (default: the demo's config.yaml); it replaces "
                        "config.yaml, keys it leaves out take the schema's defaults")


def _parser() -> argparse.ArgumentParser:
    first, _, rest = __doc__.replace("``", "").partition("\n\n")
    parser = argparse.ArgumentParser(prog="verbmirage", description=first,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=rest)
    parser.add_argument("--version", action="version", version=f"verbmirage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    checking = commands.add_parser(
        "check", help="plan a config: every planning check, no job runs",
        description="Plan a config as a run would, without running a job: every check made when a run is planned "
        "(config keys and values, backend and condition settings, data roots, analyses' inputs) reports here, "
        "naming the key; prints how many jobs the run would have.")
    _add_workflow_options(checking)

    running = commands.add_parser("run", help="run the workflow (Snakemake) on a config",
                                  description="Run the workflow. Arguments after -- go to Snakemake unchanged.")
    _add_workflow_options(running)
    running.add_argument("targets", nargs="*", help="files or rules to make (default: everything)")
    running.add_argument("--cores", type=int, help="CPU cores for local jobs (default 2)")
    running.add_argument("--profile", help="a Snakemake profile, e.g. profiles/slurm")
    running.add_argument("-n", "--dry-run", action="store_true", help="only show what would run")

    reporting = commands.add_parser(
        "report", help="make the tables and figures (what is missing) and the HTML report",
        description="Run what is missing of the workflow, then write its HTML report, one per config: "
                    "report.html for the demo's config.yaml, report.html in the results folder for any other "
                    "(results/<name>/report.html). Arguments after -- go to Snakemake unchanged.")
    _add_workflow_options(reporting)
    reporting.add_argument("--output", help="the report file, *.html (default: report.html for the demo's config, "
                           "else report.html in the config's results folder)")
    reporting.add_argument("--cores", type=int, help="CPU cores for local jobs (default 2)")
    reporting.add_argument("--no-run", action="store_true", help="only write the report of the results as they "
                           "are, without running the workflow first (tools/demo.sh does, after its run)")

    listing = commands.add_parser(
        "list", help="what there is to choose from: backends, question sets, decodings, image conditions, and a "
        "config's models, variants, conditions and ensembles",
        description="List the backends, question sets, decodings and image condition types the package offers, "
        "and the models, variants, conditions and ensembles a config sets up. Nothing is loaded or run.")
    listing.add_argument("what", nargs="?", default="all", choices=("all", *SECTIONS),
                         help="one section (default: all)")
    listing.add_argument("--configfile", help="the config whose models and variants to list (default: config.yaml)")

    predict = commands.add_parser("predict", help="answer one question set on one image shard",
                                  description="Answer one question set on one image shard, as a workflow job "
                                  "does (resumable from OUTPUT.parts/).")
    predict.add_argument("--questions", required=True, help="question set Parquet")
    predict.add_argument("--output", required=True, help="the answers' Parquet table")
    suite = commands.add_parser("predict-suite", help="answer every question set on one image shard",
                                description="Answer every question set on one image shard with one model load, "
                                "as a workflow job does (resumable from OUTPUT.parts/<qset>/).")
    suite.add_argument("--questions", required=True, nargs="+", help="question set Parquet files (<qset>.parquet)")
    suite.add_argument("--output", required=True, help="a folder: <qset>.parquet per set")
    for command in (predict, suite):
        command.add_argument("--images", required=True, help="image-condition folder (with manifest.parquet)")
        command.add_argument("--model-name", required=True, help="the model's slug")
        command.add_argument("--model", required=True, help="the model's config entry as JSON")
        command.add_argument("--variant", default="{}", help="the variant's settings as JSON")
        command.add_argument("--shard", type=int, default=0, help="which image shard to answer, 0 to SHARDS-1 "
                             "(default 0)")
        command.add_argument("--shards", type=_inference_option("shards", int), default=1,
                             help="how many image shards the questions are split into (default 1)")
        command.add_argument("--train-stats", default=None, help="the training split's label statistics (Parquet), "
                             "for the language-prior baseline")
        command.add_argument("--condition", default="null", help="the image condition's settings as JSON")
        for name in ("batch_size", "part_size", "max_error_share", "continue_tokens"):
            default = INFERENCE_DEFAULTS[name]
            kind = _whole_or_auto if name == "batch_size" else type(default)
            command.add_argument(f"--{name.replace('_', '-')}", type=_inference_option(name, kind),
                                 default=default, help=f"inference.{name} (default {default})")
    return parser


def _whole_or_auto(text: str) -> int | str:
    """``--batch-size``: a whole number, or ``auto`` (sized from a GPU's memory)."""
    return text if text == "auto" else int(text)


def _inference_option(key: str, kind: type):
    """An argparse type: the option's text as ``kind``, refused (one line naming the option and the config key)
    outside the bounds the config gives ``inference.<key>`` (:mod:`verbmirage.inference.settings`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = {int: "a whole number", _whole_or_auto: "a whole number or auto"}.get(kind, "a number")
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (inference.{key})") from None
        problem = inference_problem(key, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = _parser().parse_args(argv)
    if getattr(args, "configfile", None) and not Path(args.configfile).is_file():
        what = "is a folder, not a config file" if Path(args.configfile).is_dir() else "does not exist"
        print(f"verbmirage {args.command}: --configfile {args.configfile} {what}", file=sys.stderr)
        return 2
    if args.command == "check":
        return check(args.configfile)
    if args.command == "list":
        print(listing(args.what, args.configfile), end="")
        return 0
    if args.command == "run":
        command = snakemake_command(args.configfile, args.targets, args.cores, args.profile, args.dry_run, extra)
        return subprocess.run(command).returncode
    if args.command == "report":
        return report(args.configfile, args.output, args.cores, args.no_run, extra)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = RunSpec(model_slug=args.model_name, model_settings=json.loads(args.model), images_dir=args.images,
                   variant_settings=json.loads(args.variant), shard=args.shard, n_shards=args.shards,
                   train_stats=args.train_stats, condition_settings=json.loads(args.condition),
                   batch_size=args.batch_size, part_size=args.part_size, max_error_share=args.max_error_share,
                   continue_tokens=args.continue_tokens)
    if args.command == "predict-suite":
        counts = run_suite({Path(path).stem: path for path in args.questions}, args.output, spec)
        print(f"{sum(counts.values())} predictions of {len(counts)} sets written to {args.output}")
        return 0
    frame = run_shard(args.questions, args.output, spec)
    print(f"{len(frame)} predictions written to {args.output}")
    return 0
