"""Config validation: schema (types, defaults) and the checks a schema cannot express."""

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from verbmirage.config import ConfigError, check_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_shipped_config_is_valid_and_defaults_fill(config):
    del config["metrics"]
    validate(config, SCHEMA)
    assert config["metrics"]["bootstrap_resamples"] == 1000
    check_config(config, REPO)


def test_wrong_type_names_the_key(config):
    config["models"]["random"]["batch_size"] = "large"
    with pytest.raises(WorkflowError, match="batch_size"):
        validate(config, SCHEMA)


def test_unknown_top_level_key_is_refused(config):
    config["modles"] = {}
    with pytest.raises(WorkflowError, match="modles"):
        validate(config, SCHEMA)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["models"]["random"].update(backend="gpt5"), "models.random.backend: unknown backend 'gpt5'"),
        (lambda c: c["datasets"]["hico"].update(root="/nowhere/hico_20150920"), "datasets.hico.root: '/nowhere/hico_20150920' has no anno.mat"),
        (lambda c: c["ensembles"].update(vote=["prior", "llava"]), r"ensembles.vote: unknown model\(s\) \['llava'\]"),
        (lambda c: c["ensembles"].update(prior=["prior", "random"]), "ensembles.prior: the name is already a model slug"),
        (lambda c: c["conditions"].update(fog={"type": "fog"}), "conditions.fog.type: unknown image condition"),
        (lambda c: c["metrics"].update(error_consistency=[["clean", "blur"]]), r"metrics.error_consistency\[0\]"),
    ],
)
def test_semantic_errors_name_the_key(config, edit, message):
    config = copy.deepcopy(config)
    edit(config)
    validate(config, SCHEMA)
    with pytest.raises(ConfigError, match=message):
        check_config(config, REPO)


def test_paper_config_is_valid():
    paper = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    validate(paper, SCHEMA)
    demo = yaml.safe_load((REPO / "config.yaml").read_text())
    paper["datasets"] = demo["datasets"]  # the real data is not here; everything else must pass
    check_config(paper, REPO)
    assert {"llava15_7b", "instructblip_7b", "qwen2_vl_7b", "qwen_vl_chat", "minicpm_llama3_v25",
            "mplug_owl2", "molmo_7b_d", "gpt4_turbo"} <= set(paper["models"])
    for slug, entry in paper["models"].items():
        remote = entry["backend"] in {"qwen_vl_chat", "minicpm_v", "mplug_owl2", "molmo"}
        assert entry.get("trust_remote_code", False) == remote, slug
