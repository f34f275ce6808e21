"""What a user's commands plan and print around Snakemake: ``verbmirage check`` plans a config without running
it and names a bad key in the user's file; the end-of-run hook's summary names the jobs that failed, read from
Snakemake's own log (docs/faults.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from workflow_run import REPO

from verbmirage.workflow.run_summary import failed_jobs, failure_summary

BIN = Path(sys.executable).parent


def test_check_plans_a_config_and_names_a_bad_key(tmp_path):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(config))
    config["models"]["tiny_llava"]["batch_sise"] = 8
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    good = subprocess.run([str(BIN / "verbmirage"), "check", "--configfile", "good.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    assert "good.yaml plans;" in good.stdout and "jobs to run" in good.stdout
    bad = subprocess.run([str(BIN / "verbmirage"), "check", "--configfile", "bad.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert "models.tiny_llava" in bad.stderr and "batch_sise" in bad.stderr
    # one message that opens with the user's file, then the key; no traceback into the workflow's code
    assert any(line.startswith("bad.yaml: models.tiny_llava") for line in bad.stderr.splitlines()), bad.stderr
    assert "Traceback" not in bad.stderr and "common.smk" not in bad.stderr and 'File "' not in bad.stderr
    assert not (tmp_path / "results").exists()  # planned, nothing run


SNAKEFILE = r"""
from verbmirage.workflow import run_summary

rule all:
    input: expand("out/{x}.txt", x=["a", "b", "c"])

rule make:
    output: "out/{x}.txt"
    log: "logs/make/{x}.log"
    shell:
        "echo starting {wildcards.x} > {log}; "
        "if [ {wildcards.x} != a ]; then "
        "printf 'Traceback (most recent call last):\n  ...\nValueError: bad row 3 in {wildcards.x}\n"
        "job resources: 0.1 s\n' >> {log}; exit 1; fi; "
        "touch {output}"

onerror:
    run_summary.print_summary("error", snakemake_logs=log)
"""


def test_failure_summary_reads_the_failed_jobs_from_a_real_snakemake_log(tmp_path):
    (tmp_path / "Snakefile").write_text(textwrap.dedent(SNAKEFILE))
    result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--keep-going"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    logs = sorted((tmp_path / ".snakemake" / "log").glob("*.snakemake.log"))
    jobs = failed_jobs(logs[-1].read_text())
    assert sorted((job["rule"], job["wildcards"], tuple(job["logs"])) for job in jobs) == [
        ("make", "x=b", ("logs/make/b.log",)), ("make", "x=c", ("logs/make/c.log",))]
    text = failure_summary([str(logs[-1])], workdir=tmp_path)
    assert "the run stopped; 2 jobs failed:" in text
    assert "  make (x=b)\n    log logs/make/b.log: ValueError: bad row 3 in b\n" in text
    assert f"Snakemake's log of this run: .snakemake/log/{logs[-1].name}" in text
    assert text in result.stderr  # the hook printed the same block
