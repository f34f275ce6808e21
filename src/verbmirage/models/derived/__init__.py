"""Models the workflow makes from another model entry (``models.<slug>.derive``; paper Table 5; docs/models.md, "Derived models").

A derived entry names a method and a base model::

    tiny_llava_nullu: {derive: {method: nullu, base: tiny_llava, pairs: 40}, paper_method: Nullu}

Rule ``derive_model`` builds it into its own folder (:data:`DERIVED_FOLDER`); its jobs then load the
*effective entry* (:func:`effective_entry`): the base's backend and settings (prompts, conversation, dtype,
device, resources unless the derived entry gives them), with the built folder as ``path`` (Nullu: full edited
weights) or as ``adapter`` on the base's ``path`` (a LoRA fine-tune: a peft folder). The rest of the workflow
(variants, inference, fingerprint, tables) sees an ordinary model entry.

Each method is a ``build(slug, settings, base_entry, output, inputs)`` function in its own module, imported
only when a model is built (:func:`build_derived`): ``settings`` is the ``derive`` block without ``method``
and ``base``, ``base_entry`` the base's entry as its jobs load it, ``output`` the folder to write and
``inputs`` the paths of the data the method reads (Nullu: HICO's root or a LURE-format pairs file). Its
settings live in a light module of their own (:data:`DERIVE_SETTINGS`), whose ``check_settings(settings,
where)`` runs while the config is checked: planning imports no torch, pandas or image library.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from verbmirage.core.locks import BusyError, WriterLock
from verbmirage.models.registry import backends_of_kind

#: method -> "module:function" of its build (imported lazily).
DERIVE_METHODS = {
    "nullu": "verbmirage.models.derived.nullu:build",
    "lora_finetune": "verbmirage.models.derived.finetune:build",
}
#: method -> the module of its ``derive`` settings, with ``check_settings(settings, where)`` (imported when the
#: config is checked, so its imports stay light).
DERIVE_SETTINGS = {
    "nullu": "verbmirage.models.derived.nullu_settings",
    "lora_finetune": "verbmirage.models.derived.finetune_settings",
}
#: method -> the key of the effective entry the built folder fills: full weights or a peft adapter on the base.
OUTPUT_KEYS = {"nullu": "path", "lora_finetune": "adapter"}
#: Where rule ``derive_model`` builds a derived model (``{model}`` = its slug) in the demo's results tree; a
#: config with its own tree passes its folder (``verbmirage.workflow.paths.Paths.derived_model``).
DERIVED_FOLDER = "results/models/{model}"
#: Backends a method can derive from: the transformers ones (their weights load with from_pretrained).
TRANSFORMERS_BACKENDS = backends_of_kind("transformers")
#: Keys of the base entry a derived entry does not inherit: labels and planning of the base's own runs (its
#: own settings of the variants it runs, too: a derived entry runs its own list and sets its own).
NOT_INHERITED = frozenset({"paper_name", "paper_method", "qsets", "variants", "variant_settings"})
#: Keys a derived entry may not set itself: they come from its base (backend) or its build (path, adapter).
FROM_BASE_OR_BUILD = ("backend", "path", "adapter")


class DerivedModelError(ValueError):
    """A derived entry is invalid; the message names the key."""


class DerivedBusyError(BusyError):
    """Another job is building the same derived model (the message names its pid and host)."""


def build_lock(output: str | Path) -> WriterLock:
    """One writer per derived model: a lock on ``.<name>.lock`` beside its output folder (Snakemake removes the
    output folder before it reruns a build; a fine-tune's checkpoints live beside it too). A second build of the
    same output, in another process, fails at once naming the job that holds it."""
    output = Path(output)
    return WriterLock(output.parent / f".{output.name}.lock", f"derived model {output}", DerivedBusyError,
                      advice="wait for that build to finish, or stop it, before rerunning", reentrant=True)


def derived_entries(config: dict) -> dict[str, dict]:
    """Slug -> ``derive`` block of every derived entry of ``models:``, checked (:func:`check_derived`)."""
    check_derived(config)
    return {slug: dict(entry["derive"]) for slug, entry in config["models"].items() if "derive" in entry}


def check_derived(config: dict) -> None:
    """Refuse a derived entry whose base is missing, derived itself, not a transformers backend, or whose
    method is unknown or not installed; the error names the key."""
    models = config["models"]
    for slug, entry in models.items():
        if "derive" not in entry:
            continue
        where = f"models.{slug}.derive"
        derive = entry["derive"]
        method, base = derive.get("method"), derive.get("base")
        if method not in DERIVE_METHODS:
            raise DerivedModelError(f"{where}.method: unknown method {method!r}; known: {sorted(DERIVE_METHODS)}")
        own = [key for key in FROM_BASE_OR_BUILD if key in entry]
        if own:
            raise DerivedModelError(
                f"models.{slug}: a derived entry takes its backend from its base and its weights from its build; "
                f"remove {own}"
            )
        if base not in models:
            raise DerivedModelError(f"{where}.base: {base!r} is not a models: entry; known: {sorted(models)}")
        if base == slug or "derive" in models[base]:
            raise DerivedModelError(
                f"{where}.base: '{base}' is itself a derived model; derive from the model it derives from "
                "(chains of derived models are not supported)"
            )
        backend = models[base].get("backend")
        if backend not in TRANSFORMERS_BACKENDS:
            raise DerivedModelError(
                f"{where}.base: '{base}' has backend {backend!r}; {method} derives from a transformers backend "
                f"({sorted(TRANSFORMERS_BACKENDS)})"
            )
        if method == "lora_finetune" and models[base].get("adapter"):
            raise DerivedModelError(
                f"{where}.base: '{base}' already loads an adapter ({models[base]['adapter']}); a fine-tune's "
                "adapter goes on a plain base (merge the first adapter into a checkpoint and point path at it)"
            )
        _require_method(method, where)
        check = importlib.import_module(DERIVE_SETTINGS[method]).check_settings
        try:
            check(method_settings(derive), where)
        except (TypeError, ValueError) as error:
            raise DerivedModelError(str(error)) from None


def method_settings(derive: dict) -> dict:
    """A ``derive`` block's method settings (without ``method`` and ``base``)."""
    return {key: value for key, value in derive.items() if key not in ("method", "base")}


def effective_entry(config: dict, slug: str, folder: str = DERIVED_FOLDER) -> dict:
    """The entry the jobs of ``slug`` load: for a derived entry, its base's entry (without the base's labels
    and planning keys), its own keys on top (without ``derive``) and the built folder (``folder``, with
    ``{model}``) as ``path`` or ``adapter``; any other entry as it is."""
    entry = config["models"][slug]
    if "derive" not in entry:
        return dict(entry)
    method = entry["derive"]["method"]
    base = config["models"][entry["derive"]["base"]]
    inherited = {key: value for key, value in base.items() if key not in NOT_INHERITED}
    if OUTPUT_KEYS[method] == "path":  # full weights: a base adapter is merged into them by the build
        inherited.pop("adapter", None)
        inherited.pop("merge_adapter", None)
    own = {key: value for key, value in entry.items() if key != "derive"}
    return {**inherited, **own, OUTPUT_KEYS[method]: folder.format(model=slug)}


def effective_models(config: dict, folder: str = DERIVED_FOLDER) -> dict[str, dict]:
    """``models:`` with every derived entry replaced by :func:`effective_entry` (checked first)."""
    check_derived(config)
    return {slug: effective_entry(config, slug, folder) for slug in config["models"]}


def _method_module(method: str, where: str):
    """The module of ``method``'s build, imported; a clear error when it is not part of this installation."""
    return importlib.import_module(_require_method(method, where))


def _require_method(method: str, where: str) -> str:
    """The name of the module of ``method``'s build (not imported); a clear error when it is not part of this
    installation."""
    module_name = DERIVE_METHODS[method].partition(":")[0]
    if importlib.util.find_spec(module_name) is None:
        raise DerivedModelError(
            f"{where}.method: '{method}' is not available in this installation (module {module_name} not found)"
        )
    return module_name


def build_derived(slug: str, derive: dict, base_entry: dict, output: str | Path, inputs: dict) -> None:
    """Build derived model ``slug`` (its ``derive`` block) from ``base_entry`` into ``output``."""
    method = derive["method"]
    where = f"models.{slug}.derive"
    if method not in DERIVE_METHODS:
        raise DerivedModelError(f"{where}.method: unknown method {method!r}; known: {sorted(DERIVE_METHODS)}")
    module = _method_module(method, where)
    build = getattr(module, DERIVE_METHODS[method].partition(":")[2])
    with build_lock(output):  # before anything is read or removed: a second build stops here
        build(slug, method_settings(derive), base_entry, Path(output), dict(inputs))
