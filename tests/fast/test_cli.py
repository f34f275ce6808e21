"""The ``verbmirage`` command and the tools' --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from verbmirage import __version__
from verbmirage.workflow.cli import SNAKEFILE, main, snakemake_command

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"verbmirage {__version__}"


def test_the_console_command_is_installed():
    result = subprocess.run([str(BIN / "verbmirage"), "--help"], capture_output=True, text=True, check=True)
    assert all(command in result.stdout for command in ("check", "run", "report", "predict", "predict-suite"))


def test_run_puts_targets_before_the_config_file_and_passes_the_rest():
    command = snakemake_command("my.yaml", ["results/tables/table1.md"], cores=4, extra=["--keep-going"])
    assert command.index("results/tables/table1.md") < command.index("--configfile")
    assert command[-2:] == ["--configfile", "my.yaml"] and "--keep-going" in command
    assert command[command.index("--snakefile") + 1] == str(SNAKEFILE) and SNAKEFILE.is_file()
    profiled = snakemake_command("my.yaml", profile="profiles/slurm")
    assert "--cores" not in profiled and profiled[profiled.index("--profile") + 1] == "profiles/slurm"


@pytest.mark.parametrize("tool", sorted(str(p.relative_to(REPO)) for p in (REPO / "tools").rglob("*")
                                        if p.suffix in (".py", ".sh")))
def test_every_tool_takes_help(tool, tmp_path):
    """--help prints what the tool does and does nothing else (no folder named --help, no install, no run)."""
    runner = [sys.executable] if tool.endswith(".py") else ["bash"]
    result = subprocess.run([*runner, str(REPO / tool), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 20
    assert not list(tmp_path.iterdir())


def test_compare_runs_names_each_differing_file(tmp_path):
    """tools/compare_runs.py: identical trees pass; a changed, a missing and an extra file are each named."""
    first, second = tmp_path / "a", tmp_path / "b"
    for root in (first, second):
        (root / "results" / "tables").mkdir(parents=True)
        (root / "results" / "tables" / "table1.md").write_text("| a |\n")
        (root / "resources" / "x.parquet").parent.mkdir(parents=True)
        (root / "resources" / "x.parquet").write_bytes(b"PAR1")
        (root / "results" / "fingerprint.json").write_text(str(root))  # never compared
    tool = [sys.executable, str(REPO / "tools" / "compare_runs.py"), str(first), str(second)]
    same = subprocess.run(tool, capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and "identical" in same.stdout, same.stdout + same.stderr
    (second / "results" / "tables" / "table1.md").write_text("| b |\n")
    (second / "resources" / "x.parquet").unlink()
    (second / "results" / "extra.txt").write_text("")
    different = subprocess.run(tool, capture_output=True, text=True, timeout=60)
    assert different.returncode == 1
    assert {"differs: results/tables/table1.md", "missing: resources/x.parquet", "extra: results/extra.txt"} <= set(
        different.stdout.splitlines())


def test_list_names_what_there_is_to_choose_from_without_loading_a_backend(tmp_path):
    """`verbmirage list`: the registries' backends, question sets, decodings and conditions, and a config's own
    models, variants, conditions and ensembles; read from the code, so torch is never imported."""
    listed = subprocess.run([str(BIN / "verbmirage"), "list"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout
    for heading, names in (("backends (models.<slug>.backend):", ["llava", "qwen_vl_chat", "oracle", "openai"]),
                           ("question sets (questions.sets):", ["yn_obj", "mc_verb", "yn_ego"]),
                           ("decodings (variants.<slug>.decoding):", ["greedy", "beam", "sample", "opera"]),
                           ("image condition types (conditions.<slug>.type):", ["clean", "saltpepper", "crop"]),
                           ("config.yaml: models:", ["tiny_llava", "oracle"]),
                           ("config.yaml: variants:", ["beam5", "sample_vcd"])):
        block = text.split(heading, 1)[1].split("\n\n", 1)[0]
        assert all(f"\n  {name} " in block for name in names), (heading, block)
    assert "stand-in: random weights" in text and "beam + vcd (paper: VCD)" in text
    (tmp_path / "mine.yaml").write_text("models:\n  gpt: {backend: openai, model: gpt-4o, paper_name: GPT-4}\n")
    mine = subprocess.run([str(BIN / "verbmirage"), "list", "config", "--configfile", "mine.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert mine.stdout.startswith("mine.yaml: models:\n  gpt  openai (paper: GPT-4)\n"), mine.stdout
    light = subprocess.run([sys.executable, "-c", "import sys; from verbmirage.workflow.catalog import listing; "
                            "listing(); print(sorted({'torch', 'transformers'} & set(sys.modules)))"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert light.stdout.strip() == "[]", light.stdout + light.stderr


def test_every_command_and_option_has_plain_help():
    """Help texts (verbmirage --help, each command's --help): a description each, a help text for every option,
    no reST markup, the description printed once."""
    from verbmirage.workflow.cli import _parser

    parser = _parser()
    top = parser.format_help()
    assert "``" not in top and top.count(parser.description.strip()) == 1
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        assert command.description, name
        text = command.format_help()
        assert "``" not in text and "`" not in text, (name, text)
        for action in command._actions:
            assert action.help, (name, action.dest)
