"""LoRA adapters on a transformers model entry (``models.<slug>.adapter``; docs/models.md).

A fine-tuned checkpoint often ships as a peft LoRA folder (``PeftModel.save_pretrained``:
``adapter_config.json`` + ``adapter_model.safetensors``) on top of a base model. peft matches the
saved weights to the model's modules by name and only *warns* when they do not match: a saved
weight whose module is not found is dropped, and a LoRA module injected from the config keeps its
initialisation (B = 0), so the run silently measures the untrained base (transformers#38927:
adapters saved before the llava/gemma3 module renames). peft 0.21 maps that particular rename
itself; any other mismatch :func:`attach_adapter` refuses, naming the config key and a few keys.

peft is imported only when an entry sets ``adapter``.
"""

from __future__ import annotations

from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
#: The weight files ``save_pretrained`` writes, newest format first.
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
#: Offending keys quoted in an error (the rest are counted).
QUOTED_KEYS = 4


def adapter_weights_file(folder: str | Path, where: str = "adapter") -> Path:
    """The adapter's weight file; a clear error when ``folder`` is not a saved peft adapter."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{where}: '{folder}' is not a folder (a peft adapter saved by save_pretrained)")
    if not (folder / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"{where}: '{folder}' has no {ADAPTER_CONFIG}; is it a peft adapter folder?")
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{where}: '{folder}' holds none of {list(WEIGHT_FILES)}")


def saved_adapter_keys(folder: str | Path, where: str = "adapter") -> list[str]:
    """The names of the tensors in the adapter's weight file, as saved (read without loading the values)."""
    file = adapter_weights_file(folder, where)
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as weights:
            return list(weights.keys())
    import torch

    return list(torch.load(file, map_location="cpu", weights_only=True))


def _quoted(keys: list[str]) -> str:
    shown = ", ".join(keys[:QUOTED_KEYS])
    return shown + (f" (+{len(keys) - QUOTED_KEYS} more)" if len(keys) > QUOTED_KEYS else "")


def _adapter_weight(key: str) -> bool:
    """A LoRA tensor (A, B, magnitude, embedding factors), as opposed to a fully saved module."""
    return "lora_" in key


def attach_adapter(model, folder: str | Path, merge: bool = True, where: str = "adapter"):
    """``model`` with the peft adapter of ``folder`` loaded (merged into its weights when ``merge``).

    Refuses (ValueError naming ``where``) when any saved adapter weight was not loaded into the model or
    any injected LoRA module was left at its initialisation. Returns a model of the same class as
    ``model``: merged weights (``merge_and_unload``), or the model with its LoRA layers in place.
    """
    from peft import PeftConfig, PeftModel
    from peft.utils import get_peft_model_state_dict

    saved = saved_adapter_keys(folder, where)
    config = PeftConfig.from_pretrained(str(folder))
    config.inference_mode = True
    try:
        wrapped = PeftModel(model, config)  # injects the LoRA modules the config targets, at their init
    except ValueError as error:  # e.g. "Target modules {...} not found in the base model"
        raise ValueError(f"{where}: adapter '{folder}' does not fit this model: {error}") from error
    # As PeftModel.from_pretrained does, but keeping the load result it only warns about.
    result = wrapped.load_adapter(str(folder), adapter_name="default", torch_device="cpu",
                                  key_mapping=getattr(model, "_checkpoint_conversion_mapping", None) or None)
    unexpected = sorted(key for key in result.unexpected_keys if _adapter_weight(key))
    missing = sorted(key for key in result.missing_keys if _adapter_weight(key))
    # Independent of how peft reports it: as many LoRA tensors in the model as in the file.
    injected = [key for key in get_peft_model_state_dict(wrapped) if _adapter_weight(key)]
    saved_lora = [key for key in saved if _adapter_weight(key)]
    if unexpected or missing or len(injected) != len(saved_lora):
        problems = []
        if unexpected:
            problems.append(f"{len(unexpected)} saved weight(s) match no module of the model: {_quoted(unexpected)}")
        if missing:
            problems.append(f"{len(missing)} LoRA weight(s) of the model are not in the file (left at their "
                            f"initialisation): {_quoted(missing)}")
        if not problems:
            problems.append(f"the file holds {len(saved_lora)} LoRA tensors, the model received {len(injected)}")
        raise ValueError(
            f"{where}: adapter '{folder}' does not match the model's modules ({'; '.join(problems)}). peft would "
            "load it with a warning only and run the untrained base (transformers#38927: modules renamed "
            "since the adapter was saved). Re-save the adapter for this transformers version, or pass peft a "
            "key_mapping."
        )
    return wrapped.merge_and_unload() if merge else wrapped.get_base_model()
