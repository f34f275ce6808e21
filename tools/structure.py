"""The package's structure figures: module sizes and each class's *effective* size.

A class's effective size is its own source lines plus those of every base class it inherits from inside the
package, transitively (each base counted once): what a reader has to hold in mind to follow one ``self``. A
class split into mixins is as large as before, so this is the figure the limit applies to
(docs/architecture.md, "Size"). Run it to print the figures; it exits 1 when a class is over the limit (the
fast tier runs the same check: tests/fast/test_structure.py).

    .venv/bin/python tools/structure.py            # the figures and any problem
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "verbmirage"

#: The most effective lines a class may have.
CLASS_LIMIT = 800
#: Modules longer than this are listed with the figures (the layout's aim; not enforced here).
MODULE_AIM = 600
#: Classes still over the limit, each with its effective size when it was listed: a ceiling that may only fall.
#: A class that grows past its figure, or gets under the limit while still listed here, fails the check.
PENDING: dict[str, int] = {}


@dataclass(frozen=True)
class ClassSize:
    """A class (``module.Class``; a nested class ``module.Outer.Inner``), its own lines and its effective lines
    with the in-package bases they count."""

    name: str
    own: int
    effective: int
    bases: tuple[str, ...]


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``verbmirage.a.b`` of ``root``/a/b.py (the package's folder is ``root``)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Module:
    """One module's classes (name -> node) and the names it imports (local name -> dotted target)."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.is_package = path.name == "__init__.py"
        self.tree = ast.parse(path.read_text(), str(path))
        self.classes: dict[str, ast.ClassDef] = {}
        self.imports: dict[str, str] = {}
        self._collect(self.tree.body, prefix="")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(node)
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.imports[top] = top

    def _collect(self, body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                self.classes[prefix + node.name] = node
                self._collect(node.body, prefix + node.name + ".")

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.name.split(".")
        keep = len(parts) - node.level + (1 if self.is_package else 0)
        return ".".join(parts[:keep] + ([node.module] if node.module else []))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.C`` of a base expression; ``Base[T]`` is ``Base``; None for anything else (a call, ...)."""
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


class Package:
    """Every module of the package, and the class a dotted name refers to (following re-exports)."""

    def __init__(self, root: Path = PACKAGE):
        names = {path: module_name(path, root) for path in sorted(root.rglob("*.py"))}
        self.modules = {name: _Module(name, path) for path, name in names.items()}

    def resolve(self, dotted: str, seen: frozenset = frozenset()) -> str | None:
        """The in-package class ``dotted`` (``module.Class``) names, or None (outside the package)."""
        if dotted in seen:
            return None
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self.modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            rest = ".".join(parts[cut:])
            if rest in module.classes:
                return f"{module.name}.{rest}"
            head, _, tail = rest.partition(".")
            if head in module.imports:
                return self.resolve(".".join(filter(None, (module.imports[head], tail))), seen | {dotted})
            return None
        return None

    def _local(self, module: _Module, expression: ast.expr, scope: str) -> str | None:
        dotted = _dotted(expression)
        if dotted is None:
            return None
        head, _, tail = dotted.partition(".")
        # a name defined in the module (or in the enclosing class, for a nested class) comes first
        for candidate in (f"{scope}.{dotted}" if scope else None, dotted):
            if candidate and candidate in module.classes:
                return f"{module.name}.{candidate}"
        if head in module.imports:
            return self.resolve(".".join(filter(None, (module.imports[head], tail))))
        return None

    def class_sizes(self) -> list[ClassSize]:
        """Every class of the package, largest effective size first."""
        own: dict[str, int] = {}
        direct: dict[str, list[str]] = {}
        for module in self.modules.values():
            for qualified, node in module.classes.items():
                name = f"{module.name}.{qualified}"
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                own[name] = node.end_lineno - first + 1
                scope = qualified.rpartition(".")[0]
                direct[name] = [b for b in (self._local(module, base, scope) for base in node.bases) if b]

        def ancestors(name: str) -> list[str]:
            found: list[str] = []
            stack = list(direct.get(name, ()))
            while stack:
                base = stack.pop(0)
                if base not in found and base != name and base in own:
                    found.append(base)
                    stack.extend(direct.get(base, ()))
            return found

        sizes = []
        for name in own:
            bases = ancestors(name)
            sizes.append(ClassSize(name, own[name], own[name] + sum(own[b] for b in bases), tuple(bases)))
        return sorted(sizes, key=lambda s: (-s.effective, s.name))


def module_lines(root: Path = PACKAGE) -> dict[str, int]:
    """Module -> its lines, longest first."""
    lines = {module_name(path, root): len(path.read_text().splitlines()) for path in root.rglob("*.py")}
    return dict(sorted(lines.items(), key=lambda item: (-item[1], item[0])))


def problems(sizes: list[ClassSize], limit: int = CLASS_LIMIT, pending: dict[str, int] = PENDING) -> list[str]:
    """What breaks the limit: a class over it that is not pending, a pending class over its ceiling, a pending
    class now under the limit (take it off the list), a pending class that no longer exists."""
    found = []
    by_name = {size.name: size for size in sizes}
    for size in sizes:
        ceiling = pending.get(size.name)
        if ceiling is None and size.effective > limit:
            found.append(f"{size.name}: {size.effective} effective lines, over the limit of {limit} "
                         f"(own {size.own}; bases: {', '.join(size.bases) or 'none'})")
        elif ceiling is not None and size.effective > ceiling:
            found.append(f"{size.name}: {size.effective} effective lines, over its pending ceiling of {ceiling} "
                         f"(tools/structure.py PENDING): it may only shrink")
        elif ceiling is not None and size.effective <= limit:
            found.append(f"{size.name}: {size.effective} effective lines, now within the limit of {limit}: take it "
                         f"off PENDING in tools/structure.py")
    found += [f"{name}: listed in PENDING (tools/structure.py) but no such class" for name in pending
              if name not in by_name]
    return found


def report(sizes: list[ClassSize], modules: dict[str, int], top: int = 12) -> str:
    """The figures: the largest classes by effective size, the pending ones, the modules over the aim."""
    lines = [f"classes by effective size (own lines + in-package bases; limit {CLASS_LIMIT}):"]
    for size in sizes[:top]:
        mark = f"  pending, ceiling {PENDING[size.name]}" if size.name in PENDING else ""
        lines.append(f"  {size.effective:5d}  {size.name}  (own {size.own}, {len(size.bases)} bases){mark}")
    long = {name: n for name, n in modules.items() if n > MODULE_AIM}
    lines.append(f"modules over {MODULE_AIM} lines: "
                 + (", ".join(f"{name} {n}" for name, n in long.items()) or "none"))
    return "\n".join(lines)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sizes = Package().class_sizes()
    print(report(sizes, module_lines()))
    found = problems(sizes)
    for problem in found:
        print(f"problem: {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
