"""Every number, template and path a job takes is checked before any work, from every entry point.

The workflow's plan checks the config against ``schemas/config.schema.yaml``; a job started by hand (the
``verbmirage predict`` commands, :class:`RunSpec`) meets the same bounds, which the package declares and the
schema repeats, and the config file itself cannot make a check run out of memory.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import verbmirage
from verbmirage.core.errors import ConfigError
from verbmirage.inference.runs import RunSpec, predict, predict_suite
from verbmirage.inference.settings import INFERENCE_DEFAULTS, INFERENCE_SETTINGS
from verbmirage.inference.store import _stream_table
from verbmirage.workflow.cli import main
from verbmirage.workflow.config import MAX_CONFIG_VALUES, check_schema, check_yaml_file
from test_config import SCHEMA
from test_shard_integrity import prepared  # noqa: F401  (a fixture: the questions and images of a real job)


@pytest.fixture(scope="module")
def job_inputs(prepared):  # noqa: F811  (a fixture, imported above)
    """A question set and its image folder: enough for a real ``predict-suite`` job."""
    return prepared[0]


def _suite(base, output, *options):
    return ["predict-suite", "--questions", str(base / "yn_obj.parquet"), "--images", str(base / "clean"),
            "--model-name", "coin", "--model", json.dumps({"backend": "random"}), "--output", str(output), *options]


def test_a_part_size_of_0_is_refused_before_the_job_starts(job_inputs, tmp_path):
    """It used to write an empty row group forever, until the machine ran out of memory."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "verbmirage", *_suite(job_inputs, tmp_path / "out", "--part-size",
                                                                         "0")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "argument --part-size: inference.part_size: 0 is less than the minimum of 1" in result.stderr
    assert time.monotonic() - started < 60 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, value, message", [
    ("--batch-size", "0", "inference.batch_size: 0 is less than the minimum of 1"),
    ("--batch-size", "-5", "inference.batch_size: -5 is less than the minimum of 1"),
    ("--batch-size", "8.5", "'8.5' is not a whole number or auto (inference.batch_size)"),
    ("--batch-size", "big", "'big' is not a whole number or auto (inference.batch_size)"),
    ("--continue-tokens", "-1", "inference.continue_tokens: -1 is less than the minimum of 0"),
    ("--max-error-share", "1.5", "inference.max_error_share: 1.5 is greater than the maximum of 1"),
    ("--max-error-share", "nan", "inference.max_error_share: .nan is not a finite number"),
    ("--shards", "0", "inference.shards: 0 is less than the minimum of 1"),
])
def test_the_commands_refuse_a_setting_out_of_its_bounds_naming_it(job_inputs, tmp_path, capsys, option, value,
                                                                  message):
    with pytest.raises(SystemExit) as stop:
        main(_suite(job_inputs, tmp_path / "out", option, value))
    assert stop.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("settings, message", [
    ({"part_size": 0}, r"^inference.part_size: 0 is less than the minimum of 1$"),
    ({"batch_size": -5}, r"^inference.batch_size: -5 is less than the minimum of 1$"),
    ({"batch_size": True}, r"^inference.batch_size: True is neither a whole number >= 1 nor 'auto'$"),
    ({"batch_size": "big"}, r"^inference.batch_size: 'big' is neither a whole number >= 1 nor 'auto'$"),
    ({"n_shards": 0}, r"^inference.shards: 0 is less than the minimum of 1$"),
    ({"model_settings": {"backend": "clip", "path": "m", "template": "a photo"}},
     r"^models.m.template: 'a photo' is not a text with \{caption\} where the caption goes$"),
    ({"model_settings": {"backend": "llava", "path": "m", "dtype": "fp32"}},
     r"^models.m.dtype: 'fp32' is not one of \['float32', 'bfloat16', 'float16'\]$"),
])
def test_a_run_spec_checks_what_the_plan_checks(settings, message):
    with pytest.raises(ValueError, match=message):
        RunSpec(**{"model_slug": "m", "model_settings": {"backend": "random"}, "images_dir": ".", **settings})


def test_the_package_declares_the_inference_settings_the_schema_documents():
    """The schema's ``inference`` block (defaults filled into every config) is the package's, key for key."""
    schema = yaml.safe_load(Path(SCHEMA).read_text())
    assert schema["properties"]["inference"]["properties"] == INFERENCE_SETTINGS
    spec = RunSpec("m", {"backend": "random"}, ".")
    assert (spec.batch_size, spec.part_size, spec.max_error_share, spec.continue_tokens) == ("auto", 512, 0.05, 8)


def test_a_run_spec_takes_its_defaults_without_a_checkout(tmp_path):
    """Installed without the repository around it (a wheel), the package still knows how a job runs: it used to
    read the defaults from ``schemas/`` beside ``src/`` and fail there."""
    shutil.copytree(Path(verbmirage.__file__).parent, tmp_path / "site" / "verbmirage",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("import verbmirage; from verbmirage.inference.runs import RunSpec; "
             "spec = RunSpec('m', {'backend': 'random'}, '.'); "
             "print(verbmirage.__file__, spec.batch_size, spec.part_size, spec.max_error_share, spec.continue_tokens)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(tmp_path / "site" / "verbmirage" / "__init__.py"), "auto", "512", "0.05", "8"]


def test_only_a_direct_call_has_default_run_settings():
    """A suite job's batch, part size and error budget come from its spec, never from a default of its own."""
    suite = inspect.signature(predict_suite).parameters
    for name in ("batch_size", "part_size", "max_error_share"):
        assert suite[name].default is inspect.Parameter.empty and suite[name].kind is inspect.Parameter.KEYWORD_ONLY
    direct = inspect.signature(predict).parameters
    assert (direct["batch_size"].default, direct["part_size"].default) == (INFERENCE_DEFAULTS["batch_size"],
                                                                         INFERENCE_DEFAULTS["part_size"])


def test_a_table_is_never_streamed_in_empty_row_groups(tmp_path):
    with pytest.raises(ValueError, match=r"rows_per_group 0 is not a whole number >= 1 \(inference.part_size\)"):
        _stream_table([], {}, tmp_path / "t.parquet", {}, 0)
    assert not (tmp_path / "t.parquet").exists()


def _bomb(levels: int = 9) -> list[str]:
    """YAML lines of a list whose last item stands for 10**levels values through aliases ("billion laughs")."""
    lines = ["      - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"      - &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return lines


def test_an_alias_bomb_in_a_value_is_refused_at_once_naming_the_key(tmp_path):
    """It used to run minutes, then fail with a MemoryError in the schema check, naming no key."""
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(["models:", "  random:", "    backend: random", "    paper_name:", *_bomb()]) + "\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^{path}: line 9: models.random.paper_name\[4\]: its aliases \(\*name\) "
                                          rf"expand to more than {MAX_CONFIG_VALUES:,} values"):
        check_yaml_file(path)
    assert time.monotonic() - started < 5
    (tmp_path / "loop.yaml").write_text("models:\n  random: &self {backend: random, again: *self}\n")
    with pytest.raises(ConfigError, match=r"loop.yaml: line 2: models.random: its aliases .* or into themselves"):
        check_yaml_file(tmp_path / "loop.yaml")
    # aliases that stay small (configs/paper.yaml shares its qsets lists) load as before
    (tmp_path / "shared.yaml").write_text("sets: &sets [yn_obj, mc_obj]\nmodels:\n  a: {qsets: *sets}\n"
                                          + "\n".join(["small:", *_bomb(3)]) + "\n")
    loaded = check_yaml_file(tmp_path / "shared.yaml")
    assert loaded["models"]["a"]["qsets"] == ["yn_obj", "mc_obj"] and len(loaded["small"]) == 4


def test_a_schema_message_quotes_a_long_value_shortened():
    config = {"models": {"random": {"backend": "random", "paper_name": list(range(20000))}}}
    with pytest.raises(ConfigError) as raised:
        check_schema(config, SCHEMA)
    line = next(line for line in str(raised.value).splitlines() if "paper_name" in line)
    assert line.startswith("  models.random.paper_name: [0, 1, 2") and line.endswith("…") and len(line) < 400


def test_a_missing_config_file_is_one_line_before_snakemake_starts(tmp_path, capsys):
    assert main(["check", "--configfile", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == f"verbmirage check: --configfile {tmp_path / 'nope.yaml'} does not exist\n"
    assert main(["run", "--configfile", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"verbmirage run: --configfile {tmp_path} is a folder, not a config file\n"
