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
                                {"repetition_penalty": {"type": "number"}, "max_new_tokens": {"type": "integer"}})
    monkeypatch.setitem(decodings.DECODINGS, "greedy_rp", row)
    variant = Variant.from_config({"decoding": "greedy_rp", "repetition_penalty": 1.3, "max_new_tokens": 4})
    assert variant.decoding_settings == PenaltySettings(1.3, 4) and variant.max_new_tokens == 4
    assert variant.settings()["repetition_penalty"] == 1.3
    assert Variant.from_config({"decoding": "beam"}).settings() == before
    with pytest.raises(ValueError, match=r"v.repetition_penalty: settings for greedy_rp need decoding: greedy_rp"):
        Variant.from_config({"decoding": "beam", "repetition_penalty": 1.3}, "v")
