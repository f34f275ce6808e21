"""Backends by name, imported lazily so a CPU user never imports a GPU stack.

A config entry ``models: {slug: {backend: NAME, ...settings}}`` becomes
``create_model(slug, settings, context)``. Adding a backend is one line here.
"""

from __future__ import annotations

import importlib
import inspect

from verbmirage.models.base import ModelContext, VisionLanguageModel

BACKENDS: dict[str, str] = {
    "always_yes": "verbmirage.models.baselines:AlwaysYes",
    "random": "verbmirage.models.baselines:RandomGuess",
    "prior": "verbmirage.models.baselines:LanguagePrior",
}

# Keys of a model entry that belong to the workflow, not to the backend.
WORKFLOW_KEYS = frozenset({"backend", "batch_size", "resources"})


def backend_class(backend: str) -> type[VisionLanguageModel]:
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise KeyError(f"unknown backend '{backend}'; known: {sorted(BACKENDS)}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


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
    return cls(slug, **arguments)
