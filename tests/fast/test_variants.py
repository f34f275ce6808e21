"""Typed variants, what each backend runs, the planning of (model, variant) pairs, the prompt suffix."""

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from verbmirage.workflow.config import check_config
from verbmirage.core.errors import ConfigError
from verbmirage.models import create_model
from verbmirage.models.prompts import PromptTemplate
from verbmirage.models.registry import BACKENDS, variant_features
from verbmirage.variants.settings import (
    FEATURES,
    PAPER_PROMPT_SUFFIX,
    Variant,
    model_variants,
    question_seed,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_defaults_follow_the_methods():
    assert Variant.from_config({}) == Variant()
    assert Variant().is_plain and Variant().label == "greedy"
    beam = Variant.from_config({"decoding": "beam"})
    assert beam.num_beams == 5 and beam.label == "beam5" and beam.features() == {"decoding:beam"}
    opera = Variant.from_config({"decoding": "opera", "opera": {"threshold": 25}})
    assert opera.num_beams == 5 and opera.opera.threshold == 25 and opera.opera.scale_factor == 50
    vcd = Variant.from_config({"decoding": "sample", "vcd": {}})
    assert (vcd.vcd.alpha, vcd.vcd.beta, vcd.vcd.noise_step) == (1.0, 0.1, 500)
    assert vcd.features() == {"decoding:sample", "vcd"} and vcd.label == "sample+vcd"
    calibrated = Variant.from_config({"decision": {"method": "content_free"}, "prompt_suffix": "x"})
    assert calibrated.features() == {"decoding:greedy", "decision:content_free", "prompt_suffix"}
    assert not calibrated.is_plain
    # paper_name labels the variant and conditions / datasets / qsets plan its runs: none is a setting the
    # answers depend on
    planned = Variant.from_config({"paper_name": "beam5", "conditions": ["clean"], "datasets": ["hico"],
                                   "qsets": ["yn_verb"]})
    assert planned.settings() == Variant().settings()
    assert planned.runs_under("clean", "hico") and not planned.runs_under("clean", "charadesego")
    assert not planned.runs_under("saltpepper") and planned.asks("yn_verb") and not planned.asks("yn_obj")
    assert Variant().asks("yn_ko") and Variant().runs_under("crop", "hico")


@pytest.mark.parametrize("entry, message", [
    ({"decoding": "nucleus"}, r"variants.v.decoding: 'nucleus'"),
    ({"decoding": "greedy", "num_beams": 3}, r"variants.v.num_beams: greedy decoding keeps one sequence"),
    ({"decoding": "beam", "opera": {}}, r"variants.v.opera: settings for opera need decoding: opera"),
    ({"decoding": "opera", "vcd": {}}, r"variants.v.vcd: VCD combines with greedy, beam or sample"),
    ({"vcd": {"gamma": 1}}, r"variants.v.vcd: unknown key\(s\) \['gamma'\]"),
    ({"decision": {"method": "platt"}}, r"variants.v.decision.method: 'platt'"),
    ({"temperature": 0}, r"variants.v.temperature: must be positive"),
    ({"beams": 5}, r"variants.v: unknown key\(s\) \['beams'\]"),
])
def test_bad_entries_name_the_key(entry, message):
    with pytest.raises(ValueError, match=message):
        Variant.from_config(entry, "variants.v")


def test_every_backend_declares_what_it_runs():
    for backend in BACKENDS:
        assert "decoding:greedy" in variant_features(backend) and variant_features(backend) <= FEATURES, backend
    assert variant_features("always_yes") == {"decoding:greedy"}
    assert variant_features("llava") == FEATURES
    assert {"decoding:sample", "prompt_suffix", "decision:threshold"} <= variant_features("openai")
    assert "decoding:beam" not in variant_features("openai")


def test_models_get_the_variants_their_backend_runs(config):
    config["variants"] = {"default": {}, "beam5": {"decoding": "beam"}, "suffix": {"prompt_suffix": "x"}}
    assert model_variants(config, "tiny_llava", variant_features("llava")) == ["default", "beam5", "suffix"]
    assert model_variants(config, "random", variant_features("random")) == ["default"]
    assert model_variants(config, "tiny_llava", None) == ["default"]  # a custom backend: plain variants only
    config["models"]["tiny_llava"]["variants"] = ["beam5"]
    assert model_variants(config, "tiny_llava", variant_features("llava")) == ["beam5"]


@pytest.mark.parametrize("variants, message", [
    (["beam5"], r"models.random.variants: backend 'random' cannot run variant 'beam5' \(it needs \['decoding:beam'\]\)"),
    (["beam"], r"models.random.variants: 'beam' is not a configured variant"),
])
def test_an_explicit_unsupported_pair_stops_the_run(config, variants, message):
    config = copy.deepcopy(config)
    config["variants"]["beam5"] = {"decoding": "beam"}
    config["models"]["random"]["variants"] = variants
    validate(config, SCHEMA)
    with pytest.raises(ConfigError, match=message):
        check_config(config, REPO)


def test_schema_and_semantic_checks_of_variant_entries(config):
    bad = copy.deepcopy(config)
    bad["variants"]["v"] = {"vcd": {"alpha": -1}}
    with pytest.raises(Exception, match="alpha"):
        validate(bad, SCHEMA)
    bad["variants"]["v"] = {"decoding": "greedy", "num_beams": 2}
    validate(bad, SCHEMA)
    with pytest.raises(ConfigError, match="variants.v.num_beams"):
        check_config(bad, REPO)


def test_non_finite_numbers_stop_the_plan_naming_the_key(config):
    """`.nan` / `.inf` passed the schema's bounds and the plan; `alpha:
    .inf` then answered every question "unknown" without an error row."""
    loaded = copy.deepcopy(config)
    loaded["variants"]["vcd_beam"]["vcd"]["alpha"] = yaml.safe_load(".inf")
    loaded["variants"].update(yaml.safe_load("""
        nan_sample: {decoding: sample, temperature: .nan, conditions: [clean]}
        nan_beam: {decoding: beam, length_penalty: .nan}
    """))
    validate(loaded, SCHEMA)  # the schema lets all three through: only the walk below stops them
    with pytest.raises(ConfigError) as raised:
        check_config(loaded, REPO)
    assert str(raised.value) == ("variants.vcd_beam.vcd.alpha: .inf is not a finite number; "
                                 "variants.nan_sample.temperature: .nan is not a finite number; "
                                 "variants.nan_beam.length_penalty: .nan is not a finite number")
    # any key, at any depth, lists included: not only the variants
    for edit, message in [
        (lambda c: c["inference"].update(max_error_share=float("nan")), "inference.max_error_share: .nan"),
        (lambda c: c["conditions"]["saltpepper"].update(probability=float("nan")),
         "conditions.saltpepper.probability: .nan"),
        (lambda c: c["models"]["tiny_clip"].update(threshold=-float("inf")), "models.tiny_clip.threshold: -.inf"),
        (lambda c: c["variants"]["opera"]["opera"].update(scale_factor=float("inf")),
         "variants.opera.opera.scale_factor: .inf"),
        (lambda c: c["models"]["tiny_llava"].update(resources={"gpu": 0, "mem_mb": float("inf")}),
         "models.tiny_llava.resources.mem_mb: .inf"),
    ]:
        bad = copy.deepcopy(config)
        edit(bad)
        with pytest.raises(ConfigError, match=rf"^{message} is not a finite number$"):
            check_config(bad, REPO)
    check_config(config, REPO)


@pytest.mark.parametrize("entry, message", [
    ('{"vcd": {"alpha": Infinity}}', r"^run\.vcd\.alpha: \.inf is not a finite number$"),
    ('{"decoding": "sample", "temperature": NaN}', r"^run\.temperature: \.nan is not a finite number$"),
    ('{"decoding": "beam", "length_penalty": -Infinity}', r"^run\.length_penalty: -\.inf is not a finite number$"),
])
def test_a_job_refuses_non_finite_variant_numbers_it_gets_without_a_plan(entry, message):
    """The command line (`python -m verbmirage predict-suite --variant JSON`) bypasses planning, and JSON reads
    NaN and Infinity: the job refuses them before loading a model."""
    import json

    with pytest.raises(ValueError, match=message):
        Variant.from_config(json.loads(entry), "run")


def test_backends_refuse_variants_they_cannot_run():
    blind = create_model("y", {"backend": "always_yes"})
    with pytest.raises(ValueError, match=r"where: backend 'always_yes' \(y\) cannot run .* lacks \['decoding:beam'\]"):
        blind.use_variant(Variant.from_config({"decoding": "beam"}), where="where")
    blind.use_variant(Variant())
    assert blind.variant.is_plain


def test_prompt_suffix_follows_the_question_and_keeps_the_shared_prefix():
    template = PromptTemplate(suffix=PAPER_PROMPT_SUFFIX)
    yes_no = template.render("Is the person riding the horse?", multiple_choice=False)
    assert yes_no == "Is the person riding the horse? Pay attention to the verb in question.\nAnswer yes or no."
    choice = template.render("What is the person doing?\nA. riding\nB. feeding", multiple_choice=True)
    assert choice.splitlines()[-2:] == ["Pay attention to the verb in question.",
                                       "Answer with the option's letter from the given choices directly."]
    assert PromptTemplate().render("Q?", False) == "Q?\nAnswer yes or no."


def test_question_seeds_do_not_depend_on_order_or_batch():
    seeds = [question_seed(q, 0) for q in ("a", "b", "c")]
    assert seeds == [question_seed(q, 0) for q in ("a", "b", "c")]
    assert len(set(seeds)) == 3 and question_seed("a", 1) != seeds[0]


def test_a_model_sets_its_own_vcd_alpha_for_one_variant():
    """The official VCD scripts ran alpha 1 for LLaVA and 0.5 for InstructBLIP: configs/paper.yaml sets it per
    model, on top of the shared variant, for that variant only."""
    import yaml
    from pathlib import Path

    from verbmirage.variants.settings import check_model_variant_settings, model_variant_entry

    paper = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/paper.yaml").read_text())
    alpha = lambda model, variant: Variant.from_config(model_variant_entry(paper, model, variant)).vcd.alpha  # noqa
    assert alpha("instructblip_7b", "sample_vcd") == 0.5 and alpha("llava15_7b", "sample_vcd") == 1.0
    assert set(model_variant_entry(paper, "instructblip_7b", "sample_vcd")["vcd"]) == {"alpha"}
    assert model_variant_entry(paper, "instructblip_7b", "beam5") == paper["variants"]["beam5"]
    config = {"variants": {"v": {"vcd": {"beta": 0.2}, "qsets": ["yn_obj"]}},
              "models": {"m": {"variant_settings": {"v": {"vcd": {"alpha": 0.5}}}}}}
    assert model_variant_entry(config, "m", "v") == {"vcd": {"beta": 0.2, "alpha": 0.5}, "qsets": ["yn_obj"]}
    check_model_variant_settings(config, "m", ["v"])
    for own, message in (({"w": {}}, r"models\.m\.variant_settings\.w: 'w' is not a variant this model runs"),
                         ({"v": {"qsets": ["yn_verb"]}}, r"\['qsets'\] plan or label"),
                         ({"v": {"vcd": {"alfa": 1}}}, r"models\.m\.variant_settings\.v\.vcd: unknown key")):
        config["models"]["m"]["variant_settings"] = own
        with pytest.raises(ValueError, match=message):
            check_model_variant_settings(config, "m", ["v"])


def test_a_derived_model_does_not_inherit_its_bases_variant_settings(config):
    """A derived entry runs its own variant list, so its base's variant_settings (for variants it may not run)
    are not inherited: the demo's Nullu runs default and beam5 only, its base sets sample_vcd's alpha."""
    from verbmirage.models.derived import effective_models

    config["models"]["tiny_llava"]["variant_settings"] = {"sample_vcd": {"vcd": {"alpha": 0.5}}}
    validate(config, SCHEMA)
    check_config(config, REPO)  # the derived tiny_llava_nullu is checked as the entry its jobs load
    assert "variant_settings" not in effective_models(config)["tiny_llava_nullu"]
    config["models"]["tiny_llava_nullu"]["variant_settings"] = {"beam5": {"num_beams": 3}}
    check_config(config, REPO)
    assert effective_models(config)["tiny_llava_nullu"]["variant_settings"] == {"beam5": {"num_beams": 3}}
