"""Reading a module's source without importing it: planning and ``verbmirage list`` learn what a backend or a
decoding takes and does from its code, and never pay for (or run) the imports a backend needs."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util


def source_file(module: str) -> str | None:
    """The source file of ``module``, found without importing it or the packages above it (a package's
    ``__init__`` may import what planning should not); None where it cannot be found."""
    locations, spec = None, None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            spec = importlib.util.find_spec(module)  # not on a plain path (a custom import hook): ask the hook
            break
        locations = spec.submodule_search_locations
    return spec.origin if spec is not None else None


def class_summary(target: str) -> str:
    """The first paragraph of the docstring of ``module:Class``, on one line, without reST markup ("" if none)."""
    module, _, name = target.partition(":")
    origin = source_file(module)
    if not origin:
        return ""
    with open(origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), origin)
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    text = (ast.get_docstring(found[0]) or "") if found else ""
    return " ".join(text.split("\n\n")[0].split()).replace("``", "")
