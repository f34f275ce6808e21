"""Backends by name, imported lazily so a CPU user never imports a GPU stack.

A config entry ``models: {slug: {backend: NAME, ...settings}}`` becomes
``create_model(slug, settings, context)``. Adding a backend is one line here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import re

from verbmirage.core.sources import class_constant, class_summary, source_file
from verbmirage.models.base import ModelContext, VisionLanguageModel
from verbmirage.variants.settings import ALL_FEATURES, API, PLAIN_ONLY, REMOTE, REMOTE_NO_BEAM

BACKENDS: dict[str, str] = {
    "always_yes": "verbmirage.models.baselines:AlwaysYes",
    "random": "verbmirage.models.baselines:RandomGuess",
    "prior": "verbmirage.models.baselines:LanguagePrior",
    "oracle": "verbmirage.models.oracle:NoisyOracle",  # a stand-in with a stated accuracy (the demo's signal)
    "openai": "verbmirage.models.api:OpenAIChatModel",
    "hf": "verbmirage.models.hf.engine:TransformersVLM",
    "llava": "verbmirage.models.hf.families:LlavaVLM",
    "instructblip": "verbmirage.models.hf.families:InstructBlipVLM",
    "qwen2_vl": "verbmirage.models.hf.families:QwenVLM",
    "qwen2_5_vl": "verbmirage.models.hf.families:QwenVLM",
    "clip": "verbmirage.models.clip:ClipModel",
    # trust_remote_code checkpoints (docs/models.md)
    "qwen_vl_chat": "verbmirage.models.remote:QwenVLChat",
    "molmo": "verbmirage.models.remote:MolmoVLM",
    "minicpm_v": "verbmirage.models.remote:MiniCPMV",
    "mplug_owl2": "verbmirage.models.remote:MplugOwl2",
}

# What each backend can run (verbmirage.variants.settings): read while planning, so no backend module is imported.
VARIANT_FEATURES: dict[str, frozenset[str]] = {
    "always_yes": PLAIN_ONLY,
    "random": PLAIN_ONLY,
    "prior": PLAIN_ONLY,
    "oracle": PLAIN_ONLY,
    "openai": API,
    "hf": ALL_FEATURES,
    "llava": ALL_FEATURES,
    "instructblip": ALL_FEATURES,
    "qwen2_vl": ALL_FEATURES,
    "qwen2_5_vl": ALL_FEATURES,
    "clip": PLAIN_ONLY,
    "qwen_vl_chat": REMOTE,
    "molmo": REMOTE_NO_BEAM,
    "minicpm_v": REMOTE,
    "mplug_owl2": REMOTE,
}

# How a transformers backend's images reach its processor (``image_mode``; docs/models.md, "Image processing"):
# the first value is the default, the checkpoint's processor as shipped. ``pad`` expands the image to a square
# in the processor's mean colour first (the original LLaVA-1.5's ``image_aspect_ratio: pad``); ``resize`` squashes
# it to the processor's square input size first (OPERA's LLaVA processor), so nothing is cropped.
IMAGE_MODES: dict[str, tuple[str, ...]] = {
    "llava": ("crop", "pad", "resize"),  # llava-hf: short side to 336, then the centre 336 x 336
    "instructblip": ("resize", "pad"),  # its processor squashes to 224 x 224: nothing is cropped
    "qwen2_vl": ("native",),  # dynamic resolution: the whole image at its own aspect ratio
    "qwen2_5_vl": ("native",),
    "hf": ("native", "pad"),  # whatever the checkpoint's processor does
}

# Keys of a model entry that belong to the workflow, not to the backend.
WORKFLOW_KEYS = frozenset({"backend", "batch_size", "shards", "resources", "qsets", "paper_name", "variants",
                           "paper_method", "variant_settings", "sample_questions", "sample_seed", "stand_in"})
# Those of them that plan or label its runs, which its answers do not depend on: kept out of its inference params
# and answer fingerprint, so that raising a timed-out shard's runtime or adding a variant to its list reruns and
# discards nothing already answered. (``batch_size`` is not among them: padding moves scores by ~1e-4.)
# (``variant_settings`` reaches the answers through the variant's settings of each job, so that a change re-asks
# only that variant's questions.)
PLANNING_KEYS = frozenset({"qsets", "paper_name", "paper_method", "resources", "variants", "variant_settings",
                           "stand_in"})


def variant_features(backend: str) -> frozenset[str] | None:
    """The variant features a backend offers; None for a custom ``module:Class`` (unknown until imported)."""
    return VARIANT_FEATURES.get(backend)


def backend_settings(backend: str) -> frozenset[str] | None:
    """The settings a registered backend's constructor takes (``name`` and the injected ``context`` aside), or
    None where it takes any (``**kwargs``) or cannot be read (a custom ``module:Class``).

    Read from the source, not by importing it: the backends import torch and transformers, seconds that
    planning a run should not pay, and a misspelled setting should stop the plan, not a GPU job
    (``inspect.signature`` needs the class imported; ``tests/models/test_models.py`` checks the two agree).
    """
    types = backend_setting_types(backend)
    return None if types is None else frozenset(types)


def backend_setting_types(backend: str) -> dict[str, str | None] | None:
    """Each setting of a registered backend's constructor with its annotation as written (None: none), read from
    the source like :func:`backend_settings`; None where it takes any setting or cannot be read."""
    if backend not in BACKENDS:
        return None
    module, _, name = BACKENDS[backend].partition(":")
    return _constructor_settings(module, name)


def backend_uses_images(backend: str) -> bool:
    """Whether a backend's answers look at the image (its class's ``uses_images``, read from the source; a custom
    ``module:Class`` counts as looking)."""
    return backend not in BACKENDS or bool(class_constant(BACKENDS[backend], "uses_images", True))


def backend_summary(backend: str) -> str:
    """The first paragraph of a registered backend class's docstring, read from its source (nothing imported)."""
    return class_summary(BACKENDS[backend])


#: Values a setting may take where its annotation (``str``) says too little; planning refuses any other.
#: ``tests/models/test_models.py`` keeps ``dtype``'s equal to what the transformers backends accept.
SETTING_CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": ("float32", "bfloat16", "float16"),
    "scoring": ("logits", "text"),
    "attn_implementation": ("eager", "sdpa", "flash_attention_2"),
}
#: ... or the form it must have (a full match), and how to say it
SETTING_PATTERNS: dict[str, tuple[str, str]] = {
    "device": (r"cpu|cuda(:\d+)?|mps", "one of cpu, cuda, cuda:N or mps"),
    "template": (r"(?s).*\{caption\}.*", "a text with {caption} where the caption goes"),  # CLIP's caption
}


def _matches_annotation(value, annotation: ast.expr) -> bool | None:
    """Whether a YAML value fits the annotation (None: an annotation this check does not read)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):  # X | Y
        sides = [_matches_annotation(value, side) for side in (annotation.left, annotation.right)]
        return True if any(sides) else (None if None in sides else False)
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return value is None
    if isinstance(annotation, ast.Subscript):  # list[str], dict[str, int], Literal["a", "b"], Optional[X]
        base = annotation.value.id if isinstance(annotation.value, ast.Name) else None
        if base == "Literal":
            options = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            return value in [option.value for option in options if isinstance(option, ast.Constant)]
        if base == "Optional":
            inner = _matches_annotation(value, annotation.slice)
            return True if value is None else inner
        annotation = annotation.value
    if not isinstance(annotation, ast.Name):
        return None
    kinds = {"str": str, "Path": str, "dict": dict, "list": list, "tuple": (list, tuple), "bool": bool}
    if annotation.id == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation.id == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kinds[annotation.id]) if annotation.id in kinds else None


def setting_problems(backend: str, entry: dict) -> list[str]:
    """One line per setting of ``entry`` whose value the backend cannot take: its type (from the constructor's
    annotation) or, for the settings of :data:`SETTING_CHOICES` / :data:`SETTING_PATTERNS`, its value."""
    types = backend_setting_types(backend) or {}
    problems = []
    for key, value in entry.items():
        if key not in types:
            continue
        annotation = types[key]
        if annotation is not None and _matches_annotation(value, ast.parse(annotation, mode="eval").body) is False:
            expected = "a YAML boolean (true or false, unquoted)" if annotation == "bool" else annotation
            problems.append(f"{key}: {value!r} is a {type(value).__name__}, not {expected}")
        elif isinstance(value, str) and key in SETTING_CHOICES and value not in SETTING_CHOICES[key]:
            problems.append(f"{key}: {value!r} is not one of {list(SETTING_CHOICES[key])}")
        elif isinstance(value, str) and key in SETTING_PATTERNS and not re.fullmatch(SETTING_PATTERNS[key][0], value):
            problems.append(f"{key}: {value!r} is not {SETTING_PATTERNS[key][1]}")
    return problems


@functools.cache
def _constructor_settings(module: str, name: str) -> dict[str, str | None] | None:
    origin = source_file(module)
    if not origin:
        return None
    tree = ast.parse(open(origin, encoding="utf-8").read(), origin)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    imported = {alias.asname or alias.name: node.module for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.level == 0 for alias in node.names}
    if name not in classes:
        return _constructor_settings(imported[name], name) if name in imported else None
    for node in classes[name].body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            if node.args.kwarg is not None:
                return None
            arguments = [*node.args.posonlyargs, *node.args.args][1:] + node.args.kwonlyargs  # [1:]: self
            return {a.arg: ast.unparse(a.annotation) if a.annotation is not None else None
                    for a in arguments if a.arg not in ("name", "context")}
    for base in classes[name].bases:  # no __init__ of its own: the first base's
        if isinstance(base, ast.Name) and (base.id in classes or base.id in imported):
            return _constructor_settings(module if base.id in classes else imported[base.id], base.id)
    return None


def backend_class(backend: str) -> type[VisionLanguageModel]:
    """The class of a registered backend, or of ``package.module:Class`` (your own backend)."""
    if ":" in backend:
        target = backend
    elif backend in BACKENDS:
        target = BACKENDS[backend]
    else:
        raise KeyError(f"unknown backend '{backend}'; known: {sorted(BACKENDS)} or 'module:Class'")
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, VisionLanguageModel)):
        raise TypeError(f"backend '{backend}' is not a VisionLanguageModel subclass")
    return cls


def create_model(slug: str, settings: dict, context: ModelContext | None = None) -> VisionLanguageModel:
    """Build the backend named in ``settings['backend']`` with the rest of the entry as arguments."""
    cls = backend_class(settings["backend"])
    arguments = {k: v for k, v in settings.items() if k not in WORKFLOW_KEYS}
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(arguments) - set(accepted))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        raise TypeError(f"models.{slug}: backend '{settings['backend']}' takes no setting(s) {unknown}")
    if "context" in accepted:
        arguments["context"] = context or ModelContext()
    try:
        return cls(slug, **arguments)
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a damaged file of a local folder
        damaged = _damaged_folder_error(slug, settings, error)
        if damaged is None:
            raise
        raise damaged from error


class DamagedModelError(ValueError):
    """A file of a model entry's local folder (``path`` or ``adapter``) cannot be read; the message names it."""


def _damaged_folder_error(slug: str, settings: dict, error: Exception) -> DamagedModelError | None:
    """A :class:`DamagedModelError` naming the entry's local folders when ``error`` is what a damaged weight or
    JSON file raises (a cut safetensors header, JSON cut short, an empty torch file); else None. transformers and
    safetensors name no file in these messages."""
    import json
    import pickle
    from pathlib import Path

    kinds: tuple = (json.JSONDecodeError, EOFError, pickle.UnpicklingError)
    try:
        from safetensors import SafetensorError

        kinds += (SafetensorError,)
    except ImportError:
        pass
    folders = [f"{key} {settings[key]}" for key in ("path", "adapter")
               if isinstance(settings.get(key), str) and Path(settings[key]).is_dir()]
    if not isinstance(error, kinds) or not folders:
        return None
    return DamagedModelError(
        f"models.{slug}: a file in {' or '.join(folders)} cannot be read ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else 'empty or cut short'}). A folder the workflow built (a "
        "derived model under results/models/, a tiny model under resources/) is built again once it is deleted: "
        "delete it and rerun; otherwise replace the damaged file"
    )
