"""LoRA adapters on a transformers model entry (models.<slug>.adapter), on the tiny LLaVA (real classes, real peft).

Oracles (docs/variants.md): a fresh LoRA (B = 0) gives exactly the base logits; a trained
adapter changes them, merged == unmerged within float32 tolerance, and only the targeted modules change;
an adapter whose saved keys match no module (renamed modules, transformers#38927) is refused; the
adapter's files join the resume fingerprint.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from verbmirage.inference.store import model_identity
from verbmirage.models import Question, create_model
from verbmirage.models.adapters import attach_adapter, saved_adapter_keys

peft = pytest.importorskip("peft")
REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "adapter_model.safetensors"
TARGETS = r".*language_model.*\.(q_proj|v_proj)"


def save_adapter(base_dir: Path, folder: Path, scale: float = 0.0, seed: int = 0) -> Path:
    """A LoRA (r 4 on the language model's q/v projections) saved by peft; ``scale`` > 0 draws B (else B = 0)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlavaForConditionalGeneration

    torch.manual_seed(seed)
    model = get_peft_model(LlavaForConditionalGeneration.from_pretrained(base_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    for name, parameter in model.named_parameters():
        if "lora_B" in name and scale:
            torch.nn.init.normal_(parameter, std=scale)
    model.save_pretrained(folder)
    return folder


def renamed_copy(folder: Path, target: Path, old: str, new: str) -> Path:
    """The adapter with ``old`` replaced by ``new`` in every saved key (as if the modules had been renamed)."""
    shutil.copytree(folder, target)
    weights = load_file(folder / WEIGHTS)
    save_file({key.replace(old, new): value for key, value in weights.items()}, target / WEIGHTS)
    return target


@pytest.fixture(scope="module")
def adapters(tiny_dirs, tmp_path_factory):
    base = tiny_dirs["llava"]
    folder = tmp_path_factory.mktemp("adapters")
    fresh = save_adapter(base, folder / "fresh")
    trained = save_adapter(base, folder / "trained", scale=0.5)
    return {
        "base": base,
        "fresh": fresh,
        "trained": trained,
        # the pre-refactor llava layout (language_model.model.layers): peft 0.21 maps it itself
        "old_layout": renamed_copy(trained, folder / "old_layout", "model.model.language_model.",
                                   "model.language_model.model."),
        # modules that do not exist in this model: peft would load nothing and only warn
        "renamed": renamed_copy(trained, folder / "renamed", "self_attn", "attention"),
    }


def _model(adapters, **entry):
    settings = {"backend": "llava", "path": str(adapters["base"]), "local_files_only": True, **entry}
    return create_model("tiny", settings)


def _logits(model, images) -> torch.Tensor:
    prompts = [model.render(Question(f"q{i}", "Is the person riding a horse?", image=image), False)
               for i, image in enumerate(images)]
    encoded = model.encode(prompts, [model.open_image(image) for image in images])
    with torch.inference_mode():
        return model.model(**encoded).logits.float()


@pytest.fixture(scope="module")
def base_logits(adapters, images):
    return _logits(_model(adapters), images)


@pytest.mark.parametrize("merge", [True, False])
def test_fresh_lora_gives_exactly_the_base_logits(adapters, images, base_logits, merge):
    model = _model(adapters, adapter=str(adapters["fresh"]), merge_adapter=merge)
    assert torch.equal(_logits(model, images), base_logits)
    lora_layers = [name for name, _ in model.model.named_modules() if name.endswith("lora_A")]
    assert (len(lora_layers) == 0) == merge  # merged: plain layers again; unmerged: the LoRA layers in place


def test_trained_adapter_changes_logits_and_merged_equals_unmerged(adapters, images, base_logits):
    merged = _model(adapters, adapter=str(adapters["trained"]))
    unmerged = _model(adapters, adapter=str(adapters["trained"]), merge_adapter=False)
    merged_logits, unmerged_logits = _logits(merged, images), _logits(unmerged, images)
    assert (merged_logits - base_logits).abs().max() > 1e-2
    torch.testing.assert_close(merged_logits, unmerged_logits, atol=1e-5, rtol=1e-5)
    # the engine's scores move too, and only the targeted weights changed
    base = _model(adapters)
    question = [Question("q0", "Is the person riding a horse?", image=images[0])]
    assert merged.score_yes_no(question)[0].p_yes != base.score_yes_no(question)[0].p_yes
    before, after = dict(base.model.named_parameters()), dict(merged.model.named_parameters())
    assert before.keys() == after.keys()
    changed = sorted(name for name in before if not torch.equal(before[name], after[name]))
    assert changed and all(re.fullmatch(r".*language_model.*\.(q_proj|v_proj)\.weight", name) for name in changed)


def test_adapter_in_the_old_llava_layout_loads_through_peft_key_mapping(adapters, images):
    assert saved_adapter_keys(adapters["old_layout"])[0].startswith("base_model.model.language_model.model.layers.")
    old = _model(adapters, adapter=str(adapters["old_layout"]))
    new = _model(adapters, adapter=str(adapters["trained"]))
    assert torch.equal(_logits(old, images), _logits(new, images))


def test_adapter_with_renamed_modules_is_refused(adapters):
    with pytest.raises(ValueError, match=r"models\.tiny\.adapter: adapter .* does not match the model's modules "
                                         r"\(8 saved weight\(s\) match no module.*layers\.0\.attention\.q_proj"):
        _model(adapters, adapter=str(adapters["renamed"]))


def test_adapter_refusal_does_not_depend_on_peft_reporting(adapters, monkeypatch):
    """Counting the LoRA tensors in the file and in the model catches it even if peft reports nothing."""
    from peft import PeftModel
    from transformers import LlavaForConditionalGeneration

    original = PeftModel.load_adapter

    def silent(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        result.unexpected_keys.clear()
        result.missing_keys.clear()
        return result

    monkeypatch.setattr(PeftModel, "load_adapter", silent)
    weights = load_file(adapters["renamed"] / WEIGHTS)
    assert len(weights) == 8
    base = LlavaForConditionalGeneration.from_pretrained(adapters["base"])
    partial = adapters["renamed"].parent / "half_renamed"
    shutil.copytree(adapters["trained"], partial)
    trained = load_file(adapters["trained"] / WEIGHTS)
    extra = {key.replace("q_proj", "k_proj"): value.clone() for key, value in trained.items() if "q_proj" in key}
    save_file({**trained, **extra}, partial / WEIGHTS)  # k_proj weights the config never injects
    with pytest.raises(ValueError, match=r"models\.x\.adapter: .*the file holds 12 LoRA tensors, the model "
                                         r"received 8"):
        attach_adapter(base, partial, where="models.x.adapter")


def test_not_an_adapter_folder_names_the_key(adapters, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"models\.tiny\.adapter: '.*missing' is not a folder"):
        _model(adapters, adapter=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"models\.tiny\.adapter: .* has no adapter_config\.json"):
        _model(adapters, adapter=str(tmp_path / "empty"))


def test_the_fingerprint_follows_the_adapter_files(adapters, tmp_path):
    folder = shutil.copytree(adapters["trained"], tmp_path / "adapter")
    entry = {"backend": "llava", "path": str(adapters["base"])}
    plain = model_identity(entry)
    assert "adapter_files" not in plain  # entries without an adapter keep their old identity
    first = model_identity({**entry, "adapter": str(folder)})
    assert first["files"] == plain["files"] and WEIGHTS in first["adapter_files"]
    assert model_identity({**entry, "adapter": str(folder)}) == first
    weights = load_file(folder / WEIGHTS)
    save_file({key: value * 2 for key, value in weights.items()}, folder / WEIGHTS)  # retrained, same size
    stat = (folder / WEIGHTS).stat()
    os.utime(folder / WEIGHTS, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # a clock too coarse cannot hide it
    assert model_identity({**entry, "adapter": str(folder)}) != first
    config = folder / "adapter_config.json"
    second = model_identity({**entry, "adapter": str(folder)})
    config.write_text(config.read_text().replace('"r": 4', '"r": 5'))
    assert model_identity({**entry, "adapter": str(folder)})["adapter_files"]["adapter_config.json"] != \
        second["adapter_files"]["adapter_config.json"]


def test_paper_method_is_a_label_not_a_backend_setting(adapters):
    model = _model(adapters, paper_method="Nullu", paper_name="LLaVA-1.5-7B")
    assert model.name == "tiny"


def test_the_adapter_folder_is_an_input_of_the_model_jobs(adapters, tmp_path):
    """Dry run of the demo with an adapter on tiny_llava: its inference jobs wait for the folder."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    adapter = shutil.copytree(adapters["fresh"], tmp_path / "lora")
    config["models"]["tiny_llava"].update(adapter="lora", merge_adapter=False, paper_method="Nullu")
    # models derived from tiny_llava load their own folder (tests/fast/test_derived.py); a fine-tune refuses a base
    # adapter
    config["models"] = {slug: entry for slug, entry in config["models"].items() if "derive" not in entry}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--dry-run", "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "--until", "predict_suite"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = [block for block in re.split(r"\n(?=(?:localrule|rule) \w+:)", result.stdout)
              if block.startswith("rule predict_suite:")]
    with_adapter = [block for block in blocks if re.search(r"^\s+input:.*\blora\b", block, re.M)]
    assert with_adapter and all("model=tiny_llava" in block for block in with_adapter)
    assert len(with_adapter) == sum("model=tiny_llava" in block for block in blocks)
    assert adapter.is_dir()
