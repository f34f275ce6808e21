"""Derived model entries (models.<slug>.derive): the effective entry, the config checks, the schema, planning."""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

import verbmirage.models.derived as derived
from verbmirage.workflow.config import check_config
from verbmirage.core.errors import ConfigError
from verbmirage.models.derived import (
    DERIVED_FOLDER,
    DerivedBusyError,
    DerivedModelError,
    build_derived,
    derived_entries,
    effective_entry,
    effective_models,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")
NULLU = {"derive": {"method": "nullu", "base": "tiny_llava", "pairs": 40}, "paper_method": "Nullu",
         "variants": ["default", "beam5"]}


@pytest.fixture
def config():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["models"] = {slug: entry for slug, entry in config["models"].items()
                        if "derive" not in entry}  # each test adds the derived entries it needs
    config["models"]["tiny_llava"].update(paper_name="LLaVA-1.5-7B", qsets=["yn_obj"], conversation="llava_v1",
                                          resources={"gpu": 1, "mem_mb": 1000, "runtime": 5})
    return config


def test_nullu_entry_loads_its_base_with_its_own_weights(config):
    config["models"]["edited"] = copy.deepcopy(NULLU)
    entry = effective_entry(config, "edited")
    base = config["models"]["tiny_llava"]
    assert entry["backend"] == "llava" and entry["path"] == DERIVED_FOLDER.format(model="edited")
    # the base's settings, not its labels or planning
    for key in ("conversation", "dtype", "device", "local_files_only", "batch_size", "resources"):
        assert entry[key] == base[key]
    assert "paper_name" not in entry and "qsets" not in entry and "derive" not in entry
    assert entry["paper_method"] == "Nullu" and entry["variants"] == ["default", "beam5"]
    # the base entry itself is untouched
    assert base["path"] == "resources/models/tiny_llava" and "derive" not in base


def test_own_keys_win_and_the_base_adapter_is_built_into_nullu_weights(config):
    config["models"]["tiny_llava"].update(adapter="resources/adapters/a", merge_adapter=False)
    config["models"]["edited"] = {**copy.deepcopy(NULLU), "resources": {"gpu": 2}, "dtype": "bfloat16"}
    entry = effective_entry(config, "edited")
    assert entry["resources"] == {"gpu": 2} and entry["dtype"] == "bfloat16"
    assert "adapter" not in entry and "merge_adapter" not in entry


def test_fine_tune_entry_is_an_adapter_on_the_base_path(config):
    config["models"]["tuned"] = {"derive": {"method": "lora_finetune", "base": "tiny_llava"}}
    entry = effective_entry(config, "tuned")
    assert entry["path"] == "resources/models/tiny_llava"
    assert entry["adapter"] == DERIVED_FOLDER.format(model="tuned")


def test_plain_entries_are_unchanged(config):
    config["models"]["edited"] = copy.deepcopy(NULLU)
    models = effective_models(config)
    assert {slug: models[slug] for slug in config["models"] if slug != "edited"} == {
        slug: entry for slug, entry in config["models"].items() if slug != "edited"}
    assert derived_entries(config) == {"edited": NULLU["derive"]}


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"derive": {"method": "nullu", "base": "llava7b"}}, r"models.edited.derive.base: 'llava7b' is not a models: entry"),
        ({"derive": {"method": "nullu", "base": "prior"}},
         r"models.edited.derive.base: 'prior' has backend 'prior'; nullu derives from a transformers backend"),
        ({"derive": {"method": "nullu", "base": "tiny_clip"}}, r"'tiny_clip' has backend 'clip'"),
        ({"derive": {"method": "nullu", "base": "edited"}}, r"'edited' is itself a derived model"),
        ({"derive": {"method": "rome", "base": "tiny_llava"}}, r"models.edited.derive.method: unknown method 'rome'"),
        ({"derive": {"method": "nullu", "base": "tiny_llava"}, "backend": "llava"},
         r"models.edited: a derived entry takes its backend from its base .* remove \['backend'\]"),
        ({"derive": {"method": "nullu", "base": "tiny_llava"}, "path": "x"}, r"remove \['path'\]"),
        ({"derive": {"method": "nullu", "base": "tiny_llava", "top_k": -1}}, r"models.edited.derive.top_k: -1"),
        ({"derive": {"method": "nullu", "base": "tiny_llava", "topk": 3}}, r"unknown Nullu setting\(s\) \['topk'\]"),
        ({"derive": {"method": "nullu", "base": "tiny_llava", "layers": [1, -2]}}, r"models.edited.derive.layers"),
        ({"derive": {"method": "nullu", "base": "tiny_llava", "pairs_file": "lure.jsonl"}},
         r"models.edited.derive.image_root: pairs_file is set"),
    ],
)
def test_bad_derived_entries_name_the_key(config, entry, message):
    config["models"]["edited"] = entry
    with pytest.raises(DerivedModelError, match=message):
        effective_models(config)
    with pytest.raises(ConfigError, match=message):
        check_config(config, REPO)


def test_a_chain_is_refused_from_either_end(config):
    config["models"]["edited"] = copy.deepcopy(NULLU)
    config["models"]["edited_twice"] = {"derive": {"method": "nullu", "base": "edited"}}
    with pytest.raises(DerivedModelError, match="models.edited_twice.derive.base: 'edited' is itself a derived"):
        derived_entries(config)


def test_a_method_whose_module_is_missing_says_so(config, monkeypatch):
    monkeypatch.setitem(derived.DERIVE_METHODS, "lora_finetune", "verbmirage.models.derived.no_such_module:build")
    config["models"]["tuned"] = {"derive": {"method": "lora_finetune", "base": "tiny_llava"}}
    message = r"models.tuned.derive.method: 'lora_finetune' is not available in this installation"
    with pytest.raises(ConfigError, match=message):
        check_config(config, REPO)
    with pytest.raises(DerivedModelError, match=message):
        build_derived("tuned", config["models"]["tuned"]["derive"], config["models"]["tiny_llava"], "out", {})


def test_every_method_has_its_light_settings_module():
    """The config check reads a method's settings from their own module, never from the build's (test_plan.py
    checks that planning imports no heavy library)."""
    assert set(derived.DERIVE_SETTINGS) == set(derived.DERIVE_METHODS)
    for module in derived.DERIVE_SETTINGS.values():
        assert callable(importlib.import_module(module).check_settings)


def test_build_dispatches_to_the_method_with_its_settings(monkeypatch, tmp_path):
    calls = []
    module = type("Module", (), {"build": staticmethod(lambda *args: calls.append(args))})
    monkeypatch.setattr(derived, "_method_module", lambda method, where: module)
    build_derived("edited", {"method": "nullu", "base": "b", "top_k": 2}, {"backend": "llava"}, tmp_path / "o",
                  {"hico_root": "r"})
    assert calls == [("edited", {"top_k": 2}, {"backend": "llava"}, tmp_path / "o", {"hico_root": "r"})]


def test_a_second_build_of_one_derived_model_fails_at_once_naming_the_first(monkeypatch, tmp_path):
    calls = []
    module = type("Module", (), {"build": staticmethod(lambda *args: calls.append(args))})
    monkeypatch.setattr(derived, "_method_module", lambda method, where: module)
    output = tmp_path / "results" / "models" / "edited"
    holder = subprocess.Popen(  # another job building the same model (its lock, as build_derived takes it)
        [sys.executable, "-c", "import sys, time\nfrom verbmirage.models.derived import build_lock\n"
         f"lock = build_lock({str(output)!r})\nprint('held', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for method in ("nullu", "lora_finetune"):
            with pytest.raises(DerivedBusyError, match=rf"derived model {output}: another job is writing it right "
                                                       rf"now \(pid {holder.pid} on host .*; it holds .*\.edited\.lock"):
                build_derived("edited", {"method": method, "base": "b"}, {"backend": "llava"}, output, {})
        assert calls == []  # stopped before the method read or removed anything
    finally:
        holder.kill()
        holder.wait()
    build_derived("edited", {"method": "nullu", "base": "b"}, {"backend": "llava"}, output, {})
    assert len(calls) == 1
    assert (output.parent / ".edited.lock").read_text() == ""  # released: no holder named any more


def test_schema_types_the_derive_block_and_fills_nullu_defaults(config):
    config["models"]["edited"] = copy.deepcopy(NULLU)
    validate(config, SCHEMA)
    assert config["models"]["edited"]["derive"] == {
        "method": "nullu", "base": "tiny_llava", "pairs": 40, "pairs_file": "", "image_root": "",
        "pair_style": "caption", "prompt": "Please describe this image in detail.", "seed": 0, "top_k": 4,
        "layers": "upper_half", "embedding": "mean", "batch_size": 8}
    check_config(config, REPO)
    for bad in ({"top_k": "four"}, {"embedding": "max"}, {"layers": "lower_half"}, {"topk": 4}):
        wrong = copy.deepcopy(config)
        wrong["models"]["edited"]["derive"].update(bad)
        with pytest.raises(WorkflowError, match=next(iter(bad))):
            validate(wrong, SCHEMA)


def test_schema_wants_a_backend_or_a_derive_block(config):
    config["models"]["nothing"] = {"dtype": "float32"}
    with pytest.raises(WorkflowError, match="not valid under any of the given schemas"):
        validate(config, SCHEMA)
    config["models"]["nothing"] = {"derive": {"base": "tiny_llava"}}
    with pytest.raises(WorkflowError, match="method"):
        validate(config, SCHEMA)


def test_a_stand_in_is_named_for_itself_its_derived_models_and_its_ensembles():
    from verbmirage.models.entries import stand_ins

    config = {"models": {"tiny": {"backend": "llava", "path": "x", "stand_in": "random weights"},
                         "tiny_nullu": {"derive": {"method": "nullu", "base": "tiny"}},
                         "real": {"backend": "llava", "path": "y"}},
              "ensembles": {"vote": ["tiny", "real"], "real_only": ["real"]}}
    assert stand_ins(config) == {"tiny": "random weights", "tiny_nullu": "random weights",
                                 "vote": "members ['tiny'] are stand-ins"}
