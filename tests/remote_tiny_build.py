"""Build a tiny random-weight checkpoint from a remote-code model's own classes (run in that model's env).

    <env python> tests/remote_tiny_build.py <model> <checkpoint code folder> <output folder>

The code, tokenizer and processor files are copied from the checkpoint folder
(``../shared/remote_code/<model>``, never from this repository); the config is
shrunk (small sizes that keep every code path), the model is
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
    # The model repo ships tokenizer.json; the shared copy does not: write it from vocab.json + merges.txt.
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target), trust_remote_code=True)
    tokenizer.backend_tokenizer.save(str(target / "tokenizer.json"))


def byte_level_alphabet() -> list[str]:
    """The printable stand-ins of the 256 bytes used by byte-level BPE (GPT-2, Llama 3): printable bytes map to
    themselves, the others to code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


LLAMA3_SIZE = 128000  # ids below the special tokens, which sit at 128000-128255 in tokenizer_config.json
WORDS = ["Yes", "yes", "No", "no", "riding", "horse", "someone", "Is", "Answer", "or", "the", "user", "assistant"]


def write_stand_in_llama3_tokenizer(target: Path) -> None:
    """A byte-level BPE ``tokenizer.json`` with Llama 3's special tokens at their real ids (the checkpoint ships
    none). Bytes, a few words with and without a leading space, and " A".." Z"; filler ids up to 128000."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = byte_level_alphabet()
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = []

    def add_word(word: str) -> None:
        current = word[0]
        for char in word[1:]:
            merged = current + char
            if merged not in vocab:
                merges.append((current, char))
                vocab[merged] = len(vocab)
            current = merged

    space = alphabet[ord(" ")]
    for word in WORDS:
        add_word(word)
        add_word(space + word)
    for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        add_word(space + letter)
    for i in range(len(vocab), LLAMA3_SIZE):
        vocab[f"<filler_{i}>"] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    config = json.loads((target / "tokenizer_config.json").read_text())
    specials = sorted(config["added_tokens_decoder"].items(), key=lambda item: int(item[0]))
    for token_id, token in specials:
        tokenizer.add_special_tokens([AddedToken(token["content"], special=True, normalized=False)])
        if tokenizer.token_to_id(token["content"]) != int(token_id):
            raise RuntimeError(f"special token {token['content']} got id {tokenizer.token_to_id(token['content'])}")
    tokenizer.save(str(target / "tokenizer.json"))


def build_minicpm_v(source: Path, target: Path) -> None:
    copy_checkpoint_files(source, target)
    write_stand_in_llama3_tokenizer(target)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "verbmirage" / "models"))
    from remote_drivers_llama import supply_list_to_torch_functional  # stdlib-only; the driver applies it too

    supply_list_to_torch_functional()
    shrink_config(target, {
        "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "torch_dtype": "float32",
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 2},
    })
    _save_model(target, "AutoModel")


def _save_model(target: Path, auto_class: str, dtype: str = "float32") -> None:
    """Build from the shrunk config in ``dtype``, save, then put back the checkpoint's own generation config."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(str(target), trust_remote_code=True)
    model = getattr(transformers, auto_class).from_config(config, trust_remote_code=True,
                                                          torch_dtype=getattr(torch, dtype))
    with torch.no_grad():  # random weights of a realistic scale; the tiny models test code paths, not answers
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.05)
    generation_config = (target / "generation_config.json").read_bytes()
    model.save_pretrained(str(target), safe_serialization=True)
    (target / "generation_config.json").write_bytes(generation_config)  # save_pretrained writes a default one
    print(f"built {type(model).__name__} with {sum(p.numel() for p in model.parameters()):,} parameters in {target}")


BUILDERS = {"qwen_vl_chat": build_qwen_vl_chat, "molmo": build_molmo, "minicpm_v": build_minicpm_v}

if __name__ == "__main__":
    name, source, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    BUILDERS[name](source, target)
