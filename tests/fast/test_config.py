"""Config validation: schema (types, defaults) and the checks a schema cannot express."""

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from verbmirage.workflow.config import check_config, check_schema
from verbmirage.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_shipped_config_is_valid_and_defaults_fill(config, tmp_path):
    del config["metrics"]
    validate(config, SCHEMA)
    assert config["metrics"]["bootstrap_resamples"] == 1000
    check_config(config, REPO)
    check_config(config, tmp_path)  # a fresh checkout: the tiny and derived models' folders are not built yet


def test_wrong_type_names_the_key(config):
    config["models"]["random"]["batch_size"] = "large"
    with pytest.raises(WorkflowError, match="batch_size"):
        validate(config, SCHEMA)


def test_schema_problems_are_listed_one_per_line_key_first(config):
    check_schema(config, SCHEMA)
    config["models"]["random"]["batch_size"] = "large"
    config["conditions"]["clean"]["qsets"] = "yn_obj"
    config["modles"] = {}
    with pytest.raises(ConfigError) as raised:
        check_schema(config, SCHEMA)
    assert str(raised.value).splitlines()[1:] == [
        "  (top level): Additional properties are not allowed ('modles' was unexpected)",
        "  conditions.clean.qsets: 'yn_obj' is not of type 'array'",
        "  models.random.batch_size: 'large' is not an integer >= 1 or 'auto'",
    ]


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
        (lambda c: c["models"]["prior"].update(qsets=["mc_objects"]),
         r"models.prior.qsets: \['mc_objects'\] are not question sets"),
        (lambda c: c["conditions"]["saltpepper"].update(qsets=["yn_obj", "yn_objj"]),
         r"conditions.saltpepper.qsets: \['yn_objj'\] are not question sets"),
        # settings a transform or a backend does not take stop the plan (not the image or inference job)
        (lambda c: c["conditions"]["saltpepper"].update(probabilty=0.5),
         r"conditions.saltpepper: unknown key\(s\) \['probabilty'\] for type 'saltpepper' "
         r"\(known: type, qsets, probability\)"),
        (lambda c: c["conditions"]["clean"].update(probability=0.5),
         r"conditions.clean: unknown key\(s\) \['probability'\] for type 'clean' \(known: type, qsets\)"),
        (lambda c: c["models"]["tiny_llava"].update(dtpye="bfloat16"),
         r"models.tiny_llava: backend 'llava' takes no setting\(s\) \['dtpye'\] \(did you mean 'dtpye' -> 'dtype'\?\)"),
        (lambda c: c["models"]["tiny_clip"].update(treshold=0.3, conversation="llava_v1"),
         r"models.tiny_clip: backend 'clip' takes no setting\(s\) \['conversation', 'treshold'\] "
         r"\(did you mean 'treshold' -> 'threshold'\?\); it takes \['device', "),
        (lambda c: c["models"]["random"].update(temperature=0.0), r"models.random: backend 'random' takes no setting"),
        # a setting's value, not only its name, is checked when the run is planned (not in a GPU job)
        (lambda c: c["models"]["tiny_llava"].update(dtype="fp32"),
         r"models.tiny_llava.dtype: 'fp32' is not one of \['float32', 'bfloat16', 'float16'\]"),
        (lambda c: c["models"]["tiny_llava"].update(device="gpu"),
         r"models.tiny_llava.device: 'gpu' is not one of cpu, cuda, cuda:N or mps"),
        (lambda c: c["models"]["tiny_llava"].update(local_files_only="yes"),
         r"models.tiny_llava.local_files_only: 'yes' is a str, not a YAML boolean \(true or false, unquoted\)"),
        (lambda c: c["models"]["tiny_clip"].update(threshold="high"),
         r"models.tiny_clip.threshold: 'high' is a str, not float"),
        (lambda c: c["models"]["random"].update(seed=1.5), r"models.random.seed: 1.5 is a float, not int"),
        (lambda c: c["models"]["oracle"].update(accuracy=True), r"models.oracle.accuracy: True is a bool, not float"),
        (lambda c: c["conditions"]["saltpepper"].update(probability=7.5),
         r"conditions.saltpepper.probability: 7.5 is not in \[0.0, 1.0\]"),
        (lambda c: c["conditions"]["crop"].update(margin="wide"), r"conditions.crop.margin: 'wide' is not a number"),
        (lambda c: c["models"]["tiny_llava"].update(path="/nowhere/llava-1.5-7b-hf"),
         r"models.tiny_llava.path: no folder '/nowhere/llava-1.5-7b-hf' \(a local checkpoint must exist"),
        # a relative path transformers would not take as a hub id fails here, not in the model's job
        (lambda c: c["models"]["tiny_llava"].update(path="resources/models/no_such_model"),
         r"models.tiny_llava.path: no folder 'resources/models/no_such_model' \(a local checkpoint must exist where "
         r"the run is planned: here, .*\), and it is not a hub id \('org/name'\)"),
        (lambda c: c["models"]["tiny_llava"].update(path="./llava"), r"models.tiny_llava.path: no folder './llava'"),
        # a hub id with local_files_only: true must be in the Hugging Face cache (else the job fails offline)
        (lambda c: c["models"]["tiny_llava"].update(path="resources/no_such"),
         r"models.tiny_llava.path: no folder 'resources/no_such' here .*, nor a checkpoint of that hub id in the "
         r"Hugging Face cache, and local_files_only: true forbids downloading it"),
        (lambda c: c["models"].update(tuned={**c["models"]["tiny_llava"], "adapter": "../adapters/a"}),
         r"models.tuned.adapter: no folder '../adapters/a'"),
        (lambda c: c["models"]["tiny_clip"].update(template="a photo of a person"),
         r"models.tiny_clip.template: 'a photo of a person' is not a text with \{caption\} where the caption goes"),
        (lambda c: (c["conditions"]["saltpepper"].update(qsets=["yn_obj"]),
                    c["conditions"]["crop"].update(qsets=["mc_obj"]),
                    c["metrics"].update(error_consistency=[["saltpepper", "crop"]])),
         r"metrics.error_consistency\[0\]: saltpepper and crop share no HICO question set"),
    ],
)
def test_semantic_errors_name_the_key(config, edit, message):
    config = copy.deepcopy(config)
    edit(config)
    validate(config, SCHEMA)
    with pytest.raises(ConfigError, match=message):
        check_config(config, REPO)


def test_charadesego_video_folder_is_checked(config, tmp_path):
    (tmp_path / "ego" / "CharadesEgo").mkdir(parents=True)
    (tmp_path / "ego" / "CharadesEgo" / "Charades_v1_classes.txt").write_text("c000 Holding some clothes\n")
    config["datasets"]["charadesego"] = {"root": str(tmp_path / "ego")}
    with pytest.raises(ConfigError, match=r"datasets.charadesego.root: no video folder '.*ego/CharadesEgo_v1_480'"):
        check_config(config, REPO)
    config["datasets"]["charadesego"]["videos"] = str(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"datasets.charadesego.videos: no video folder '.*elsewhere'"):
        check_config(config, REPO)
    (tmp_path / "elsewhere").mkdir()
    check_config(config, REPO)
    validate(config, SCHEMA)


def test_paper_config_is_valid():
    paper = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    validate(paper, SCHEMA)
    demo = yaml.safe_load((REPO / "config.yaml").read_text())
    paper["datasets"] = demo["datasets"]  # the real data is not here; everything else must pass
    check_config(paper, REPO)
    for slug, entry in paper["models"].items():  # remote code is pinned to a full commit
        if entry.get("trust_remote_code"):
            assert len(entry["revision"]) == 40 and int(entry["revision"], 16) >= 0, slug
    entry = paper["models"]["qwen_vl_chat"]
    entry["revision"] = "REPLACE-WITH-HF-COMMIT"
    with pytest.raises(ConfigError, match=r"models\.qwen_vl_chat\.revision: 'REPLACE-WITH-HF-COMMIT' is a placeholder"):
        check_config(paper, REPO)
    assert {"llava15_7b", "instructblip_7b", "qwen2_vl_7b", "qwen_vl_chat", "minicpm_llama3_v25",
            "mplug_owl2", "molmo_7b_d", "gpt4_turbo"} <= set(paper["models"])
    for slug, entry in paper["models"].items():
        remote = entry.get("backend") in {"qwen_vl_chat", "minicpm_v", "mplug_owl2", "molmo"}
        assert entry.get("trust_remote_code", False) == remote, slug


# ---- typed and safe config -----------------------------------------
@pytest.mark.parametrize("value", ["false", "no", "0", 0, 1])
def test_trust_remote_code_must_be_a_yaml_boolean(config, value):
    config["models"]["tiny_llava"]["trust_remote_code"] = value
    with pytest.raises(WorkflowError, match="trust_remote_code"):
        validate(config, SCHEMA)
    with pytest.raises(ConfigError, match="models.tiny_llava.trust_remote_code: .*not a YAML boolean"):
        check_config(config, REPO)


def test_trust_remote_code_needs_a_pinned_revision_for_a_hub_id(config):
    config["models"]["hub"] = {"backend": "hf", "path": "org/model", "trust_remote_code": True}
    with pytest.raises(ConfigError, match="models.hub.revision: .*pin it"):
        check_config(config, REPO)
    config["models"]["hub"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    check_config(config, REPO)


def test_the_string_false_never_runs_checkpoint_code(tmp_path):
    """Probe 5: a checkpoint whose auto_map code would write a marker file."""
    from verbmirage.models.hf import TransformersVLM

    (tmp_path / "config.json").write_text('{"model_type": "x", "auto_map": {"AutoConfig": "evil.Config"}}')
    (tmp_path / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    with pytest.raises(ValueError, match="trust_remote_code: must be a YAML boolean"):
        TransformersVLM("m", str(tmp_path), trust_remote_code="false", local_files_only=True)
    assert not (tmp_path / "ran").exists()


def test_duplicate_yaml_keys_are_refused_with_file_and_line(tmp_path):
    from verbmirage.workflow.config import check_yaml_file

    path = tmp_path / "c.yaml"
    path.write_text("models:\n  prior: {backend: prior}\n  prior: {backend: always_yes}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: key 'prior' appears twice .*first on line 2"):
        check_yaml_file(path)
    path.write_text("metrics:\n  bootstrap_resamples: 1000\n  seed: 0\n")
    assert check_yaml_file(path) == {"metrics": {"bootstrap_resamples": 1000, "seed": 0}}
    assert check_yaml_file(REPO / "config.yaml") == yaml.safe_load((REPO / "config.yaml").read_text())


def test_custom_backends_are_allow_listed_and_never_imported(config, tmp_path, monkeypatch):
    package = tmp_path / "mybackends"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    (package / "model.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config["models"]["mine"] = {"backend": "mybackends.model:Mine"}
    with pytest.raises(ConfigError, match=r"not listed under custom_backends.*custom_backends: \[mybackends.model\]"):
        check_config(config, REPO)
    config["custom_backends"] = ["mybackends.model"]
    validate(config, SCHEMA)
    check_config(config, REPO)
    config["models"]["gone"] = {"backend": "mybackends.missing:Mine"}
    config["custom_backends"].append("mybackends.missing")
    with pytest.raises(ConfigError, match="module 'mybackends.missing' cannot be found"):
        check_config(config, REPO)
    assert not (tmp_path / "ran").exists()  # locating the module ran none of its package's code


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["downloads"].update(hico={"source": "x.tar", "archive": ".."}), "archive"),
        (lambda c: c["downloads"].update(hico={"source": "x.tar", "archive": "."}), "archive"),
        (lambda c: c["models"].update(api={"backend": "openai", "model": "m", "api_key_env": "SOME_CLOUD_TOKEN"}),
         "api_key_env"),
    ],
)
def test_schema_refuses_unsafe_values(config, edit, key):
    edit(config)
    with pytest.raises(WorkflowError, match=key):
        validate(config, SCHEMA)


def test_semantic_refusals_of_unsafe_values(config):
    bad = copy.deepcopy(config)
    bad["conditions"]["clean_vs_noise"] = {"type": "clean"}
    with pytest.raises(ConfigError, match="conditions.clean_vs_noise: a condition name cannot contain '_vs_'"):
        check_config(bad, REPO)
    bad = copy.deepcopy(config)
    bad["models"]["api"] = {"backend": "openai", "model": "m", "base_url": "http://example.org/v1"}
    with pytest.raises(ConfigError, match="models.api"):
        check_config(bad, REPO)
    config["models"]["api"] = {"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:8000/v1",
                               "api_key_env": "LOCAL_API_KEY"}
    check_config(config, REPO)


def test_custom_remote_drivers_are_allow_listed(config):
    config["models"]["remote"] = {"backend": "molmo", "path": "org/m", "trust_remote_code": True,
                                  "revision": "0123456789abcdef0123456789abcdef01234567", "driver": "molmo"}
    check_config(config, REPO)
    config["models"]["remote"]["driver"] = "/tmp/x/mine.py:MyDriver"
    with pytest.raises(ConfigError, match=r"models.remote.driver: .*custom_backends: \[/tmp/x/mine.py\]"):
        check_config(config, REPO)
    config["custom_backends"] = ["/tmp/x/mine.py"]
    validate(config, SCHEMA)
    check_config(config, REPO)


def test_condition_question_sets_default_to_all_and_crop_asks_hico_only(config):
    from verbmirage.workflow.config import condition_question_sets

    hico, charades = ["yn_obj", "mc_obj"], ["yn_ego", "mc_ego"]
    config = copy.deepcopy(config)
    config["conditions"] = {"clean": {"type": "clean"}, "noise": {"type": "saltpepper", "qsets": ["mc_obj", "mc_ego"]},
                            "crop": {"type": "crop", "margin": 0.1}}
    assert condition_question_sets(config, "clean", "hico", hico) == hico
    assert condition_question_sets(config, "noise", "hico", hico) == ["mc_obj"]
    assert condition_question_sets(config, "noise", "charadesego", charades) == ["mc_ego"]
    assert condition_question_sets(config, "crop", "hico", hico) == hico
    assert condition_question_sets(config, "crop", "charadesego", charades) == []


def test_qsets_never_reach_the_image_transform():
    from verbmirage.benchmark.condition_types import image_settings

    assert image_settings({"type": "crop", "margin": 0.2, "qsets": ["mc_obj"]}) == {"type": "crop", "margin": 0.2}


def test_a_sampled_model_is_refused_where_models_are_compared_question_by_question(config):
    config["models"]["random"]["sample_questions"] = 20
    config["ensembles"] = {}
    check_config(config, REPO)  # alone it is fine
    config["ensembles"] = {"vote": ["always_yes", "random"]}
    with pytest.raises(ConfigError, match=r"ensembles\.vote: \['random'\] asked a sample of each set"):
        check_config(config, REPO)
    config["ensembles"] = {}
    config["models"]["prior"]["sample_seed"] = 3
    with pytest.raises(ConfigError, match=r"models\.prior\.sample_seed: set with sample_questions only"):
        check_config(config, REPO)


def test_a_failed_check_reads_file_first_then_key(tmp_path, monkeypatch):
    from verbmirage.workflow.config import stop_message

    monkeypatch.chdir(tmp_path)
    error = ConfigError("models.m.dtype: 'fp32' is not one of ['float32']")
    assert stop_message(error, [str(tmp_path / "my.yaml")]) == "my.yaml: models.m.dtype: 'fp32' is not one of ['float32']"
    assert stop_message(error, []) == "config.yaml: models.m.dtype: 'fp32' is not one of ['float32']"
    assert stop_message(error, ["/elsewhere/a.yaml", "b.yaml"]).startswith("/elsewhere/a.yaml, b.yaml: models.m")
    own = ConfigError(f"{tmp_path}/my.yaml: line 3: key 'a' appears twice")
    assert stop_message(own, [str(tmp_path / "my.yaml")]) == str(own)  # names its file already


def test_an_offline_hub_id_in_the_hugging_face_cache_plans(config, tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--some-org--some-vlm" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--some-org--some-vlm" / "refs").mkdir()
    (tmp_path / "hub" / "models--some-org--some-vlm" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config["models"]["tiny_llava"]["path"] = "some-org/some-vlm"
    validate(config, SCHEMA)
    check_config(config, REPO)  # cached: it loads offline
    config["models"]["tiny_llava"]["path"] = "some-org/other-vlm"
    with pytest.raises(ConfigError, match="nor a checkpoint of that hub id in the Hugging Face cache"):
        check_config(config, REPO)
