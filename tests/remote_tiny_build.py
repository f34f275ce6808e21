"""Build a tiny random-weight checkpoint from a remote-code model's own classes (run in that model's env).

    <env python> tests/remote_tiny_build.py <model> <checkpoint code folder> <output folder>

The code, tokenizer and processor files are copied from the checkpoint folder
(``../shared/remote_code/<model>``, never from this repository); the config is
shrunk (sizes from ``../shared/notes/remote-adapters-review.md``), the model is
built with ``from_config`` under a fixed seed and saved with ``save_pretrained``.
Imports only the standard library, torch and transformers: it runs on the
model's old stack, not the project's.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

CODE_SUFFIXES = (".py", ".json", ".tiktoken", ".txt")


def copy_checkpoint_files(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix in CODE_SUFFIXES and file.name != "requirements.txt":
            shutil.copyfile(file, target / file.name)  # not the read-only mode of the shared copy


def shrink_config(target: Path, changes: dict, drop: tuple[str, ...] = ("quantization_config",)) -> None:
    path = target / "config.json"
    config = json.loads(path.read_text())
    for key in drop:
        config.pop(key, None)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))


def build_qwen_vl_chat(source: Path, target: Path) -> None:
    copy_checkpoint_files(source, target)
    shrink_config(target, {
        "hidden_size": 128, "kv_channels": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 256, "seq_length": 2048, "use_flash_attn": False, "fp32": True, "fp16": False,
        "bf16": False, "torch_dtype": "float32",
        "visual": {"width": 32, "layers": 1, "heads": 2, "mlp_ratio": 2.0, "output_dim": 128},
    })
    _save_model(target, "AutoModelForCausalLM")


# Molmo's vision tower sizes are written in MolmoForCausalLM.__init__, not in the config: shrink them in the
# copy of the code that the tiny checkpoint carries (the review's "patch VisionBackboneConfig in the test").
MOLMO_VISION_SIZES = {"image_emb_dim": 32, "image_num_heads": 2, "image_num_key_value_heads": 2,
                      "image_num_layers": 9, "image_head_dim": 16, "image_mlp_dim": 64}


def use_torchvision_resize(preprocessing: Path) -> None:
    """The shared copy resizes with TensorFlow ("FIXME remove"); later revisions use the torchvision branch that
    this copy carries commented out. Switch to it, as the revision we pin does, so no TensorFlow is needed."""
    lines = preprocessing.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "import tensorflow as tf")
    other = next(i for i in range(start, len(lines)) if lines[i].strip() == "# else:")
    end = other + 1
    while end < len(lines) and lines[end].lstrip().startswith("#     "):
        end += 1
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    torchvision_branch = [indent + line.strip()[2:].lstrip() for line in lines[other + 1 : end]]
    if not any("torchvision.transforms.Resize" in line for line in torchvision_branch):
        raise RuntimeError(f"{preprocessing}: no commented torchvision resize after the TensorFlow one")
    # Re-indent the continuation lines of the Resize(...) call relative to the branch.
    fixed = []
    for original, line in zip(lines[other + 1 : end], torchvision_branch):
        extra = len(original.split("#", 1)[1]) - len(original.split("#", 1)[1].lstrip()) - 5
        fixed.append(indent + " " * max(extra, 0) + line.strip())
    preprocessing.write_text("\n".join(lines[: start - 2] + fixed + lines[end:]) + "\n")


def build_molmo(source: Path, target: Path) -> None:
    copy_checkpoint_files(source, target)
    if "import tensorflow" in (target / "image_preprocessing_molmo.py").read_text():
        use_torchvision_resize(target / "image_preprocessing_molmo.py")
    modeling = target / "modeling_molmo.py"
    code = modeling.read_text()
    for name, value in MOLMO_VISION_SIZES.items():
        code, count = re.subn(rf"\b{name}=\d+,", f"{name}={value},", code)
        if count != 1:
            raise RuntimeError(f"{modeling}: expected one '{name}=' in MolmoForCausalLM.__init__, found {count}")
    modeling.write_text(code)
    shrink_config(target, {
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "torch_dtype": "float32",
    })
    _save_model(target, "AutoModelForCausalLM")


def _save_model(target: Path, auto_class: str) -> None:
    """Build from the shrunk config, save, then put back the checkpoint's own generation config."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(str(target), trust_remote_code=True)
    model = getattr(transformers, auto_class).from_config(config, trust_remote_code=True, torch_dtype=torch.float32)
    with torch.no_grad():  # random weights of a realistic scale; the tiny models test code paths, not answers
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.05)
    generation_config = (target / "generation_config.json").read_bytes()
    model.save_pretrained(str(target), safe_serialization=True)
    (target / "generation_config.json").write_bytes(generation_config)  # save_pretrained writes a default one
    print(f"built {type(model).__name__} with {sum(p.numel() for p in model.parameters()):,} parameters in {target}")


BUILDERS = {"qwen_vl_chat": build_qwen_vl_chat, "molmo": build_molmo}

if __name__ == "__main__":
    name, source, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    BUILDERS[name](source, target)
