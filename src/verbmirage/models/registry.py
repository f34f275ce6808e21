"""Backends by name: one row per backend, read without importing it (a CPU user never imports a GPU stack).

A config entry ``models: {slug: {backend: NAME, ...settings}}`` becomes ``create_model(slug, settings,
context)``. Everything the package knows about a backend before it is imported is its :class:`Backend` row in
:data:`BACKENDS`: its class, the variant features it offers, how its images reach its processor, its tiny test
model, the transformers names the job server preloads for it and the worker environment it runs in. Adding a
backend is its class and one row here (docs/architecture.md, "Adding things"); ``tests/fast/test_registry.py``
checks that every row is complete and that no list elsewhere names a backend.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import re
from dataclasses import dataclass

from verbmirage.core.sources import class_constant, class_summary, source_file
from verbmirage.models.base import ModelContext, VisionLanguageModel
from verbmirage.variants.settings import ALL_FEATURES, PLAIN_ONLY

#: Scorers that return P(yes) (CLIP, remote-code adapters): greedy answers, prompt suffix, calibrated decisions.
SCORING = frozenset({"decoding:greedy", "prompt_suffix", "decision:threshold", "decision:content_free"})
#: OpenAI-compatible APIs: the server samples; the prompt and the decision rule are ours.
API = SCORING | {"decoding:sample"}
#: Remote-code checkpoints: scored from logits, decoded by their own ``generate`` (beam search, sampling); no VCD
#: or OPERA, which need the engine's steps.
REMOTE = SCORING | {"decoding:beam", "decoding:sample"}
#: Molmo's ``generate_from_batch`` cannot run beam search (its caches have no reordering).
REMOTE_NO_BEAM = SCORING | {"decoding:sample"}

#: The kinds of backend: the transformers engine (``models/hf/``), remote-code checkpoints (``models/remote.py``),
#: an API, a blind baseline, a stand-in with a stated accuracy, CLIP.
KINDS = ("transformers", "remote", "api", "baseline", "stand_in", "clip")


@dataclass(frozen=True)
class Backend:
    """All the package knows about one backend before it is imported."""

    #: ``module:Class`` of its :class:`~verbmirage.models.base.VisionLanguageModel` (imported when a model is
    #: built; its constructor's settings are read from the source while planning).
    target: str
    #: One of :data:`KINDS`.
    kind: str
    #: The variant features it offers (:mod:`verbmirage.variants.settings`): planning reads them here; the class
    #: declares the same as ``variant_features`` (a test keeps them equal).
    features: frozenset[str]
    #: How its images reach its processor (``image_mode``; docs/models.md, "Image processing"): the first is the
    #: default, the checkpoint's processor as shipped. ``pad`` expands the image to a square in the processor's
    #: mean colour first (the original LLaVA-1.5's ``image_aspect_ratio: pad``); ``resize`` squashes it to the
    #: processor's square input first (OPERA's LLaVA processor), so nothing is cropped. Transformers backends only.
    image_modes: tuple[str, ...] = ()
    #: ``module:function`` writing its tiny random-weight model to a folder (rule ``tiny_model``; the tests' and
    #: the demo's models): one per transformers family.
    tiny: str | None = None
    #: The transformers names its classes load lazily, which the job server touches before it serves.
    preload: tuple[str, ...] = ()
    #: The worker environment its entries run in (``env:``, built from ``envs/<environment>.txt`` by
    #: ``tools/make_envs.sh``); remote-code backends.
    environment: str | None = None
    #: Whether its ``confidence`` is the probability of an answer token (the uncertainty analysis).
    token_probabilities: bool = True


_LLAVA = ("LlavaForConditionalGeneration", "LlavaProcessor", "LlavaConfig", "LlamaConfig", "CLIPVisionConfig",
          "CLIPImageProcessor")
_QWEN2_VL = ("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor", "Qwen2VLImageProcessor")

BACKENDS: dict[str, Backend] = {
    "always_yes": Backend("verbmirage.models.baselines:AlwaysYes", "baseline", PLAIN_ONLY, token_probabilities=False),
    "random": Backend("verbmirage.models.baselines:RandomGuess", "baseline", PLAIN_ONLY, token_probabilities=False),
    "prior": Backend("verbmirage.models.baselines:LanguagePrior", "baseline", PLAIN_ONLY, token_probabilities=False),
    # a stand-in with a stated accuracy (the demo's signal)
    "oracle": Backend("verbmirage.models.oracle:NoisyOracle", "stand_in", PLAIN_ONLY),
    "openai": Backend("verbmirage.models.api:OpenAIChatModel", "api", API),
    # whatever the checkpoint's processor does
    "hf": Backend("verbmirage.models.hf.engine:TransformersVLM", "transformers", ALL_FEATURES, ("native", "pad")),
    # llava-hf: short side to 336, then the centre 336 x 336
    "llava": Backend("verbmirage.models.hf.families:LlavaVLM", "transformers", ALL_FEATURES, ("crop", "pad", "resize"),
                     tiny="verbmirage.models.tiny:build_tiny_llava", preload=_LLAVA),
    # its processor squashes to 224 x 224: nothing is cropped
    "instructblip": Backend("verbmirage.models.hf.families:InstructBlipVLM", "transformers", ALL_FEATURES,
                            ("resize", "pad"), tiny="verbmirage.models.tiny:build_tiny_instructblip",
                            preload=("InstructBlipForConditionalGeneration", "InstructBlipProcessor",
                                     "BlipImageProcessor", "BertTokenizerFast")),
    # dynamic resolution: the whole image at its own aspect ratio
    "qwen2_vl": Backend("verbmirage.models.hf.families:QwenVLM", "transformers", ALL_FEATURES, ("native",),
                        tiny="verbmirage.models.tiny:build_tiny_qwen2_vl", preload=_QWEN2_VL),
    "qwen2_5_vl": Backend("verbmirage.models.hf.families:QwenVLM", "transformers", ALL_FEATURES, ("native",),
                          tiny="verbmirage.models.tiny:build_tiny_qwen2_5_vl",
                          preload=("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", *_QWEN2_VL)),
    "clip": Backend("verbmirage.models.clip:ClipModel", "clip", PLAIN_ONLY,
                    tiny="verbmirage.models.tiny:build_tiny_clip",
                    preload=("CLIPModel", "CLIPProcessor", "CLIPTokenizer", "CLIPTokenizerFast"),
                    token_probabilities=False),
    # trust_remote_code checkpoints (docs/models.md), each in its worker environment
    "qwen_vl_chat": Backend("verbmirage.models.remote:QwenVLChat", "remote", REMOTE, environment="remote-qwen_vl_chat"),
    "molmo": Backend("verbmirage.models.remote:MolmoVLM", "remote", REMOTE_NO_BEAM, environment="remote-molmo"),
    "minicpm_v": Backend("verbmirage.models.remote:MiniCPMV", "remote", REMOTE, environment="remote-minicpm_v"),
    "mplug_owl2": Backend("verbmirage.models.remote:MplugOwl2", "remote", REMOTE, environment="remote-mplug_owl2"),
}

#: Backend -> its image modes, for the transformers engine (a view of :data:`BACKENDS`).
IMAGE_MODES: dict[str, tuple[str, ...]] = {name: row.image_modes for name, row in BACKENDS.items() if row.image_modes}
#: The families with a tiny test model, in table order (rule ``tiny_model``'s ``{family}``; a view of the rows).
TINY_FAMILIES: tuple[str, ...] = tuple(name for name, row in BACKENDS.items() if row.tiny)


def backends_of_kind(*kinds: str) -> frozenset[str]:
    """The registered backends of the given kinds (:data:`KINDS`)."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown backend kind(s) {unknown}; known: {list(KINDS)}")
    return frozenset(name for name, row in BACKENDS.items() if row.kind in kinds)


def tiny_builder(family: str):
    """The function that writes family ``family``'s tiny model to a folder (imports ``models.tiny``)."""
    if family not in TINY_FAMILIES:
        raise KeyError(f"no tiny model for '{family}'; families: {list(TINY_FAMILIES)}")
    module, _, name = BACKENDS[family].tiny.partition(":")
    return getattr(importlib.import_module(module), name)


def preload_names() -> tuple[str, ...]:
    """The transformers names every registered backend loads lazily (for the job server), each once."""
    return tuple(dict.fromkeys(name for row in BACKENDS.values() for name in row.preload))


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
    return BACKENDS[backend].features if backend in BACKENDS else None


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
    module, _, name = BACKENDS[backend].target.partition(":")
    return _constructor_settings(module, name)


def backend_uses_images(backend: str) -> bool:
    """Whether a backend's answers look at the image (its class's ``uses_images``, read from the source; a custom
    ``module:Class`` counts as looking)."""
    return backend not in BACKENDS or bool(class_constant(BACKENDS[backend].target, "uses_images", True))


def backend_summary(backend: str) -> str:
    """The first paragraph of a registered backend class's docstring, read from its source (nothing imported)."""
    return class_summary(BACKENDS[backend].target)


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
        target = BACKENDS[backend].target
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
