"""The end-of-run block (verbmirage.workflow.run_summary): Table 1's headline beside the paper's, the failed jobs of a
Snakemake log, and a summary that never fails the run (the failed jobs of a real Snakemake run:
tests/workflow/test_workflow_commands.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pandas as pd
import pytest

from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers
from verbmirage.workflow.run_summary import failure_summary, headline_lines, print_summary, success_summary
from verbmirage.evaluation.tables import paper_tables

VARIANTS = {"default": {}, "beam5": {"decoding": "beam", "num_beams": 5, "paper_name": "beam5"}}


def _metrics(values: dict[tuple[str, str, str], float]) -> pd.DataFrame:
    """A long metrics table: (model, variant, qset) -> accuracy (circular accuracy for MC), clean HICO."""
    rows = []
    for (model, variant, qset), value in values.items():
        metric = "circular_accuracy" if qset.startswith("mc") else "accuracy"
        rows.append({"dataset": "hico", "qset": qset, "condition": "clean", "model": model, "variant": variant,
                     "subset": "all", "metric": metric, "value": value, "ci_low": value - 0.05,
                     "ci_high": value + 0.05, "n": 300})
    return pd.DataFrame(rows)


def _table1(tmp_path, values, paper_names=None, models=None):
    """table1.parquet as scripts/make_tables.py writes it (our rows, then the paper's)."""
    metrics = _metrics(values)
    models = models or list(dict.fromkeys(model for model, _, _ in values))
    variants = list(dict.fromkeys(variant for _, variant, _ in values))
    tables = paper_tables(metrics, load_paper_numbers(packaged_paper_numbers()), models, {}, [], variants,
                          paper_names or {})
    folder = tmp_path / "results" / "tables"
    folder.mkdir(parents=True)
    tables[1].frame.to_parquet(folder / "table1.parquet", index=False)
    metrics_folder = tmp_path / "results" / "metrics"
    metrics_folder.mkdir(parents=True)
    metrics.to_parquet(metrics_folder / "metrics.parquet", index=False)
    return tables[1].frame


def test_headline_puts_the_paper_beside_the_same_model_and_decoding(tmp_path):
    frame = _table1(tmp_path, {
        ("llava", "default", "yn_obj"): 0.60, ("llava", "default", "yn_verb"): 0.55,
        ("llava", "beam5", "yn_obj"): 0.5216, ("llava", "beam5", "yn_verb"): 0.50,
        ("prior", "default", "yn_obj"): 0.71, ("prior", "default", "yn_verb"): 0.6766,
    }, paper_names={"llava": "LLaVA-1.5-7B"})
    lines = headline_lines(frame, {name: s.get("paper_name", "") for name, s in VARIANTS.items()})
    # llava's beam5 row matches the paper's LLaVA-1.5-7B beam5 row (Table 1: 52.16 and 59.16); it comes first,
    # and its greedy row is not compared with the paper's beam search
    assert lines[0].split() == ["llava", "(beam5)", "yn_obj", "52.16", "[47.16,", "57.16]", "yn_verb",
                                "50.00", "[45.00,", "55.00]", "|", "paper", "LLaVA-1.5-7B", "(beam5):", "52.16,", "59.16"]
    assert lines[1].split()[:4] == ["prior", "(default)", "yn_obj", "71.00"] and "paper" not in lines[1]
    assert len(lines) == 2
    # without the variant's paper_name the same row has nothing beside it
    unmatched = headline_lines(frame, {})
    assert unmatched[0].startswith("llava (default)") and all("| paper" not in line for line in unmatched)
    assert "paper_name" in unmatched[-1]


def test_headline_prefers_a_row_with_values_and_says_why_one_has_none(tmp_path):
    nan = float("nan")
    frame = _table1(tmp_path, {
        ("llava", "default", "yn_obj"): nan, ("llava", "default", "yn_verb"): nan,
        ("llava", "verb_prompt", "yn_obj"): 0.61, ("llava", "verb_prompt", "yn_verb"): 0.58,
        ("broken", "default", "yn_obj"): nan, ("broken", "default", "yn_verb"): nan,
    })
    lines = headline_lines(frame, {})
    assert lines[0].split()[:4] == ["llava", "(verb_prompt)", "yn_obj", "61.00"]
    assert lines[1].split(None, 2) == ["broken", "(default)", "no values: no valid answers: every metric undefined"]


def test_headline_lists_every_model_or_counts_those_a_limit_leaves_out(tmp_path):
    values = {(f"m{i}", "default", qset): 0.5 for i in range(7) for qset in ("yn_obj", "yn_verb")}
    frame = _table1(tmp_path, values)
    assert [line.split()[0] for line in headline_lines(frame, {})[:8]] == [f"m{i}" for i in range(7)] + ["(no"]
    lines = headline_lines(frame, {}, limit=5)
    assert [line.split()[0] for line in lines[:5]] == ["m0", "m1", "m2", "m3", "m4"]
    assert lines[5] == "... and 2 more models in table1.md"


def test_success_summary_names_folders_headline_and_report_command(tmp_path):
    _table1(tmp_path, {("llava", "beam5", "yn_obj"): 0.5216, ("llava", "beam5", "yn_verb"): 0.50},
            paper_names={"llava": "LLaVA-1.5-7B"})
    figures = tmp_path / "results" / "figures"
    figures.mkdir()
    (figures / "fig1_object_vs_verb.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    outputs = ["results/tables/table1.parquet", "results/tables/table1.html", "results/tables/table2.html",
               "results/figures/fig1_object_vs_verb.png", "results/figures/fig3a_rare_common.png"]
    (tmp_path / "results/tables/table1.html").write_text("<table></table>")
    text = success_summary(outputs, "results/metrics/metrics.parquet", variants=VARIANTS,
                           configfiles=["configs/paper.yaml"], workdir=tmp_path)
    assert "tables   results/tables/ (1 of 2 tables made)" in text
    assert "figures  results/figures/ (1 of 2 figures made)" in text
    assert "metrics  results/metrics/metrics.parquet: 2 values (datasets: hico)" in text
    assert "| paper LLaVA-1.5-7B (beam5): 52.16, 59.16" in text
    script = Path(sys.executable).parent / "verbmirage"
    command = str(script) if script.is_file() else f"{sys.executable} -m verbmirage"
    assert (f"report   not written yet: `{command} report --configfile configs/paper.yaml` writes "
            f"{tmp_path / 'report.html'}, then open it in a browser") in text
    (tmp_path / "report.html").write_text("<html></html>")
    assert f"report   {tmp_path / 'report.html'} (open it in a browser" in success_summary(
        outputs, "results/metrics/metrics.parquet", variants=VARIANTS, workdir=tmp_path)


def test_the_report_is_up_to_date_only_when_newer_than_every_file_it_shows(tmp_path):
    """A config's own report (results/<name>/report.html), checked against its tables, figures and pages, not
    only the metrics table: a paper_name change rewrites the figures and leaves the metrics as they were."""
    import os

    shown = ["results/mini/tables/table1.html", "results/mini/figures/fig1_object_vs_verb.png",
             "results/mini/report/landing.html", "results/mini/figures/fig3a_rare_common.png"]  # the last: not made
    for number, name in enumerate(["results/mini/metrics/metrics.parquet", *shown[:3], "results/mini/report.html"]):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (1_000_000 + number, 1_000_000 + number))  # in this order, the report last

    def line():
        text = success_summary(shown, "results/mini/metrics/metrics.parquet", configfiles=["my/mini.yaml"],
                               report="results/mini/report.html", workdir=tmp_path, shown=shown)
        return next(line for line in text.splitlines() if line.startswith("  report "))

    report = tmp_path / "results/mini/report.html"
    assert line().startswith(f"  report   {report} (open it in a browser; `")
    os.utime(tmp_path / shown[1], (1_000_100, 1_000_100))  # Fig. 1 drawn again (a paper_name changed)
    assert line().startswith("  report   older than results/mini/figures/fig1_object_vs_verb.png: `")
    assert line().endswith(f"report --configfile my/mini.yaml` writes {report}, then open it in a browser")
    os.utime(tmp_path / shown[2], (1_000_050, 1_000_050))
    assert "older than results/mini/figures/fig1_object_vs_verb.png and 1 more of the files it shows" in line()
    report.unlink()
    assert line().startswith("  report   not written yet: `")


def test_success_summary_says_what_is_missing_in_one_line_each(tmp_path):
    text = success_summary(["results/tables/table1.parquet", "results/tables/table1.html"],
                           "results/metrics/metrics.parquet", variants=None, workdir=tmp_path)
    assert "metrics  results/metrics/metrics.parquet: missing (this run did not make it)" in text
    assert "Table 1  results/tables/table1.parquet is missing: no headline numbers" in text
    assert "tables   results/tables/ (0 of 1 table made)" in text
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "tables" / "table1.parquet").write_bytes(b"not parquet")
    broken = success_summary(["results/tables/table1.parquet"], "results/metrics/metrics.parquet",
                             workdir=tmp_path)
    assert "results/tables/table1.parquet unreadable (" in broken


def test_print_summary_never_raises(tmp_path):
    stream = io.StringIO()
    print_summary("success", stream=stream, outputs=None, metrics="results/metrics/metrics.parquet",
                  workdir=tmp_path)  # a bad argument: the summary says so instead of failing the run
    assert stream.getvalue().startswith("Verb Mirage: no end-of-run summary (TypeError:")


def test_failure_summary_without_failed_jobs_or_logs(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text("Building DAG of jobs...\nError in rule make:\n    jobid: 4\n    log: logs/x.log (check log "
                   "file(s) for error details)\n    message: SLURM-job '17' failed\n")
    text = failure_summary([str(log), str(tmp_path / "gone.log")], workdir=tmp_path)
    assert "1 job failed:" in text and "  make\n    message: SLURM-job '17' failed\n" in text
    assert "    log logs/x.log: missing (the job wrote none)" in text
    assert "gone.log unreadable" in text
    empty = tmp_path / "empty.snakemake.log"
    empty.write_text("Building DAG of jobs...\n")
    assert "names no failed job" in failure_summary([str(empty)], workdir=tmp_path)


@pytest.mark.parametrize("tail, expected", [
    # job_log's record of a failed job: the traceback, then the resources line (verbmirage.core.joblog)
    ("12:00 ERROR verbmirage.job: job failed\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
     "    read()\npyarrow.lib.ArrowInvalid: Could not open 'm.parquet'\n12:00 INFO verbmirage.job: job resources\n",
     "pyarrow.lib.ArrowInvalid: Could not open 'm.parquet'"),
    # chained exceptions: the last traceback's
    ("Traceback (most recent call last):\n  File \"a\"\nKeyError: 'x'\n\nDuring handling of the above exception, "
     "another exception occurred:\n\nTraceback (most recent call last):\n  File \"b\"\nValueError: models.x: bad\n"
     "job resources: 1 s\n", "ValueError: models.x: bad"),
    ("loading\nRuntimeError: CUDA out of memory\nslurmstepd: cancelled\n", "RuntimeError: CUDA out of memory"),
    ("progress 10%\rprogress 100%\r\nall done\n", "all done"),
])
def test_error_line_of_a_job_log(tmp_path, tail, expected):
    from verbmirage.workflow.run_summary import error_line

    log = tmp_path / "job.log"
    log.write_text(tail)
    assert error_line(log) == expected


def test_a_long_error_line_keeps_the_command_that_repairs_it(tmp_path):
    """A damaged shard's message ends with the rerun that repairs it; a long line keeps its start and its end."""
    from verbmirage.workflow.run_summary import error_line

    message = ("verbmirage.inference.runs.DamagedShardError: results/fp2/shards/hico/clean/tiny_llava/default/0/"
               "yn_obj.parquet: not a readable Parquet table (ArrowInvalid: Parquet magic bytes not found in footer. "
               "Either the file is corrupted or this is not a parquet file.); the shard's folder holds a damaged "
               "table that Snakemake does not see: rebuild the folder with snakemake -R "
               "results/fp2/shards/hico/clean/tiny_llava/default/0")
    log = tmp_path / "job.log"
    log.write_text(f"Traceback (most recent call last):\n  File \"x\"\n{message}\n")
    line = error_line(log)
    assert len(line) <= 300 and line.startswith("verbmirage.inference.runs.DamagedShardError: results/fp2/")
    assert line.endswith("snakemake -R results/fp2/shards/hico/clean/tiny_llava/default/0") and " ... " in line


def test_a_saved_summary_is_printed_after_the_report_with_its_line_current(tmp_path, monkeypatch):
    """A run that ``verbmirage report`` (or tools/demo.sh) started saves its summary instead of printing it; the
    command prints it last, once the report is written, so its report line says the report is there."""
    import io

    from verbmirage.workflow.run_summary import SUMMARY_LATER, print_saved_summary, print_summary, save_summary

    _table1(tmp_path, {("llava", "beam5", "yn_obj"): 0.5, ("llava", "beam5", "yn_verb"): 0.4})
    arguments = dict(outputs=["results/tables/table1.parquet"], metrics="results/metrics/metrics.parquet",
                     report="report.html", workdir=str(tmp_path), shown=[])
    save_summary(tmp_path / "logs/run_summary.json", arguments)  # when the run is planned
    monkeypatch.setenv(SUMMARY_LATER, "1")
    printed = io.StringIO()
    print_summary("success", stream=printed, **arguments)
    assert printed.getvalue() == ""
    (tmp_path / "report.html").write_text("<html></html>")
    later = io.StringIO()
    assert print_saved_summary(tmp_path / "logs/run_summary.json", stream=later, report=tmp_path / "report.html",
                               workdir=tmp_path)
    lines = later.getvalue().rstrip().splitlines()
    assert lines[-1].startswith(f"  report   {tmp_path / 'report.html'} (open it in a browser")
    assert any(line.startswith("    llava (beam5)") for line in lines)
    assert not print_saved_summary(tmp_path / "nothing.json", stream=later)
    elsewhere = io.StringIO()  # a report written with --output: the command that rewrites it names it
    (tmp_path / "mine.html").write_text("<html></html>")
    assert print_saved_summary(tmp_path / "logs/run_summary.json", stream=elsewhere, report=tmp_path / "mine.html",
                               workdir=tmp_path)
    assert elsewhere.getvalue().rstrip().splitlines()[-1].endswith(
        "report --output mine.html` rewrites it)"), elsewhere.getvalue()
    monkeypatch.delenv(SUMMARY_LATER)
    now = io.StringIO()
    print_summary("success", stream=now, **arguments)
    assert "Verb Mirage: the run finished." in now.getvalue()


def test_headline_takes_a_models_beam_search_run_also_without_a_paper_counterpart(tmp_path):
    """A model without ``paper_name`` (the demo's tiny_llava) shows its run in the paper's decoding, beam search,
    where it has one (the figures' rule), not its first variant's greedy answers."""
    frame = _table1(tmp_path, {("tiny", "default", "yn_obj"): 0.40, ("tiny", "default", "yn_verb"): 0.41,
                               ("tiny", "beam5", "yn_obj"): 0.30, ("tiny", "beam5", "yn_verb"): 0.31})
    lines = headline_lines(frame, {"beam5": "beam5"})
    assert lines[0].split()[:4] == ["tiny", "(beam5)", "yn_obj", "30.00"]
    assert headline_lines(frame, {})[0].split()[:2] == ["tiny", "(default)"]  # no variant in the paper's decoding
