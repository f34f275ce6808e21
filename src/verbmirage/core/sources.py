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


def _class_node(module: str, name: str) -> tuple[ast.ClassDef | None, dict[str, str]]:
    """The class ``name`` of ``module``'s source and the module's top-level ``from X import Y`` (Y -> X)."""
    origin = source_file(module)
    if not origin:
        return None, {}
    with open(origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), origin)
    imported = {alias.asname or alias.name: node.module for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.level == 0 for alias in node.names}
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    return (found[0] if found else None), imported


def class_constant(target: str, attribute: str, default=None):
    """The value a class (``module:Class``) or its first base that sets it gives a class-level ``attribute``
    written as a literal (``uses_images = False``), read from the source; ``default`` where none does."""
    module, _, name = target.partition(":")
    node, imported = _class_node(module, name)
    if node is None:
        return default
    for statement in node.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else (
            [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value is not None else [])
        if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
            try:
                return ast.literal_eval(statement.value)
            except ValueError:
                return default
    for base in node.bases:
        if isinstance(base, ast.Name):
            where = imported.get(base.id, module)
            return class_constant(f"{where}:{base.id}", attribute, default)
    return default


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
