"""The registries are complete: every backend row and every decoding row carries all that the rest of the
package reads from it, and no list outside them names a backend (docs/architecture.md, "Adding things")."""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

import pytest
import yaml

from verbmirage.variants import registry as decodings
from verbmirage.variants.settings import DECODINGS, Variant

REPO = Path(__file__).resolve().parents[2]


def _variant_schema() -> dict:
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    return schema["properties"]["variants"]["additionalProperties"]["properties"]


def test_the_config_schema_names_the_registry_decodings_in_order():
    assert _variant_schema()["decoding"]["enum"] == list(decodings.DECODINGS)
    assert tuple(decodings.DECODINGS) == DECODINGS
    with pytest.raises(ValueError, match="decoding 'nucleus' is not one of"):
        decodings.strategy_class("nucleus")


@pytest.mark.parametrize("name", list(decodings.DECODINGS))
def test_every_decoding_row_is_complete(name):
    """Its strategy imports and runs this decoding; its settings type is a frozen dataclass whose every field has
    a default; its schema entry holds exactly those fields, each as the config schema writes it."""
    from verbmirage.variants.strategies import Decoding

    row = decodings.DECODINGS[name]
    strategy = decodings.strategy_class(name)
    assert issubclass(strategy, Decoding) and strategy.name == name
    assert is_dataclass(row.settings) and row.settings.__dataclass_params__.frozen, name
    missing = [f.name for f in fields(row.settings) if f.default is MISSING and f.default_factory is MISSING]
    assert not missing, f"{name}: settings without a default: {missing}"
    assert set(row.schema) == {f.name for f in fields(row.settings)}, name
    schema = _variant_schema()
    for key, entry in row.schema.items():
        assert schema.get(key) == entry, f"schemas/config.schema.yaml variants.{key} differs from {name}'s row"
    variant = Variant.from_config({"decoding": name})
    assert isinstance(variant.decoding_settings, row.settings) and variant.label.startswith(name.rstrip("0123456789"))


def test_a_decoding_reads_its_defaults_and_refuses_keys_of_others_from_its_row():
    beam, opera, greedy = (Variant.from_config({"decoding": d}) for d in ("beam", "opera", "greedy"))
    assert beam.num_beams == opera.num_beams == decodings.BeamSettings.num_beams == 5 and greedy.num_beams == 1
    assert opera.opera == decodings.OperaSettings() and beam.opera is None
    with pytest.raises(ValueError, match=r"v.opera: settings for opera need decoding: opera \(got 'sample'\)"):
        Variant.from_config({"decoding": "sample", "opera": {"threshold": 3}}, "v")
    with pytest.raises(ValueError, match=r"v.num_beams: sample decoding keeps one sequence; use decoding: beam or op"):
        Variant.from_config({"decoding": "sample", "num_beams": 2}, "v")
    # a search knob another decoding reads is left unused, as transformers' GenerationConfig leaves it
    assert Variant.from_config({"decoding": "beam", "temperature": 0.5}).temperature == 0.5


def test_a_decoding_key_that_is_no_variant_field_lives_in_its_settings_and_only_its_fingerprint(monkeypatch):
    """A decoding with a key of its own needs no field on Variant, and every other variant's settings (and so
    its answers' fingerprint) stay as they were."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class PenaltySettings:
        repetition_penalty: float = 1.0
        max_new_tokens: int = 10

    before = Variant.from_config({"decoding": "beam"}).settings()
    row = decodings.DecodingRow("verbmirage.variants.strategies:Greedy", PenaltySettings,
                                {"repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
                                 "max_new_tokens": {"type": "integer"}})
    monkeypatch.setitem(decodings.DECODINGS, "greedy_rp", row)
    variant = Variant.from_config({"decoding": "greedy_rp", "repetition_penalty": 1.3, "max_new_tokens": 4})
    assert variant.decoding_settings == PenaltySettings(1.3, 4) and variant.max_new_tokens == 4
    assert variant.settings()["repetition_penalty"] == 1.3
    assert Variant.from_config({"decoding": "beam"}).settings() == before
    with pytest.raises(ValueError, match=r"v.repetition_penalty: settings for greedy_rp need decoding: greedy_rp"):
        Variant.from_config({"decoding": "beam", "repetition_penalty": 1.3}, "v")
    with pytest.raises(ValueError, match=r"v.repetition_penalty: 0 is less than or equal to the minimum of 0"):
        Variant.from_config({"decoding": "greedy_rp", "repetition_penalty": 0}, "v")  # a job started by hand


# ---- backends --------------------------------------------------------------------------------------------------

from verbmirage.models import registry as backends  # noqa: E402


@pytest.mark.parametrize("name", list(backends.BACKENDS))
def test_every_backend_row_is_complete(name):
    """Its class imports and declares the features the row plans with; a transformers backend has image modes
    (its default first), a tiny model builder (the generic ``hf`` aside: any checkpoint, no family of its own)
    and the transformers names it loads; a remote-code backend names a worker environment that envs/ holds."""
    import transformers

    from verbmirage.variants.settings import FEATURES

    row = backends.BACKENDS[name]
    assert row.kind in backends.KINDS, name
    cls = backends.backend_class(name)
    assert cls.variant_features == row.features and "decoding:greedy" in row.features <= FEATURES, name
    if row.kind == "transformers":
        assert row.image_modes and len(set(row.image_modes)) == len(row.image_modes), name
        assert (row.tiny is None) == (name == "hf") and (bool(row.preload) or name == "hf"), name
    else:
        assert not row.image_modes, f"{name}: image modes are the transformers engine's"
    if row.tiny is not None:
        assert callable(backends.tiny_builder(name)) and name in backends.TINY_FAMILIES, name
    for attribute in row.preload:
        assert getattr(transformers, attribute) is not None, f"{name}: transformers.{attribute}"
    assert (row.environment is not None) == (row.kind == "remote"), name
    if row.environment is not None:
        from verbmirage.models.remote_drivers import DRIVERS

        assert (REPO / "envs" / f"{row.environment}.txt").is_file(), f"{name}: envs/{row.environment}.txt"
        assert cls.driver in DRIVERS, f"{name}: its driver '{cls.driver}' is not in remote_drivers.DRIVERS"


def test_every_worker_environment_belongs_to_a_backend_row():
    """envs/remote-<name>.txt is the worker environment of a row (remote-transformers5 serves the drivers' tests
    on transformers 5: docs/models.md), so a new remote family's environment is not forgotten in its row."""
    shared = {"remote-transformers5"}
    files = {path.stem for path in (REPO / "envs").glob("remote-*.txt")}
    assert files - shared == {row.environment for row in backends.BACKENDS.values() if row.environment}


def _literal_backend_lists(path: Path) -> list[str]:
    """Each list, tuple, set or dict literal of ``path`` that holds two or more backend names as strings."""
    import ast

    names = set(backends.BACKENDS)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)) or items is None:
            continue
        named = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
        if len(named) >= 2:
            found.append(f"{path.relative_to(REPO)}:{node.lineno} {sorted(named)}")
    return found


def test_no_list_outside_the_registry_names_backends():
    """What is known about a backend is in its row: a hand-kept list of backend names elsewhere in the package,
    the scripts, the tools or the benchmarks would fall out of step when a backend is added."""
    models = REPO / "src" / "verbmirage" / "models"
    # remote_drivers.DRIVERS is the worker's table of drivers: the worker loads that file alone, in the model's
    # own environment, where the registry cannot be imported; each remote row's class names its driver (above).
    exempt = {models / "registry.py", models / "remote_drivers.py"}
    # The remote-code benchmark's figures measured per backend (its proxies' depths and speed-ups, and the
    # projection's rates from them): measurements, not what a backend can do; a new backend is not measured yet.
    exempt |= {REPO / "bench" / "remote_batching.py", REPO / "bench" / "projection.py"}
    files = [path for folder in ("src", "scripts", "tools", "bench") for path in (REPO / folder).rglob("*.py")
             if path not in exempt]
    assert not [hit for path in files for hit in _literal_backend_lists(path)]


def test_the_worked_backend_lists_are_views_of_the_rows():
    """The readers that once kept their own lists read the rows."""
    from verbmirage.analysis.attention_settings import ATTENTION_BACKENDS
    from verbmirage.analysis.object_reliance_settings import BASELINE_BACKENDS
    from verbmirage.analysis.uncertainty_settings import NO_TOKEN_PROBABILITY_BACKENDS
    from verbmirage.models.derived import TRANSFORMERS_BACKENDS
    from verbmirage.workflow import jobserver

    engine = backends.backends_of_kind("transformers")
    assert ATTENTION_BACKENDS == TRANSFORMERS_BACKENDS == engine >= {"hf", "llava", "instructblip", "qwen2_vl"}
    assert BASELINE_BACKENDS == backends.backends_of_kind("baseline") == {"always_yes", "random", "prior"}
    assert NO_TOKEN_PROBABILITY_BACKENDS == {"always_yes", "random", "prior", "clip"}
    assert set(backends.TINY_FAMILIES) == engine - {"hf"} | {"clip"}
    assert not set(backends.preload_names()) & set(jobserver.TRANSFORMERS_NAMES)
    assert {"LlavaForConditionalGeneration", "Qwen2_5_VLProcessor", "CLIPModel"} <= set(backends.preload_names())
