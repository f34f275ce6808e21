"""The transformers engine's collaborators read of their engine only what their Protocol declares.

The engine (``models/hf/engine.py``) hands itself to its collaborators: the prompt inputs (``InputsHost``), the
prefix cache (``PrefixHost``), the decoder and its rows (``DecoderHost``) and the steppers (``StepperHost``).
Read from the source (no model is loaded): every attribute a collaborator reads of its engine (``self.engine.X``,
``engine.X``, ``self.vlm.X``, ``getattr(self.vlm, "X")``) is one its Protocol declares, the Protocols declare no
private name, and no collaborator reads a private name (``_x``) of an object of another class.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HF = Path(__file__).resolve().parents[2] / "src" / "verbmirage" / "models" / "hf"
MODULES = ("decode", "inputs", "prefix_cache", "families", "steppers")
#: The names the collaborators give their engine (an attribute, a local or a parameter).
HOST_NAMES = {"engine", "vlm"}
#: Every collaborator (by module and class) and the Protocol that declares what it reads of its engine.
COLLABORATORS = {
    ("decode", "Decoder"): "DecoderHost",
    ("decode", "DecodeRows"): "DecoderHost",
    ("inputs", "PromptInputs"): "InputsHost",
    ("families", "InstructBlipInputs"): "InputsHost",
    ("families", "QwenInputs"): "InputsHost",
    ("prefix_cache", "PrefixCache"): "PrefixHost",
    ("families", "QwenPrefixes"): "PrefixHost",
    ("steppers", "InPlaceStepper"): "StepperHost",
    ("steppers", "PrefixStepper"): "StepperHost",
    ("steppers", "FullStepper"): "StepperHost",
    ("steppers", "AttendingStepper"): "StepperHost",
}


def _classes() -> dict[tuple[str, str], ast.ClassDef]:
    return {(module, node.name): node for module in MODULES
            for node in ast.parse((HF / f"{module}.py").read_text()).body if isinstance(node, ast.ClassDef)}


def _base_names(node: ast.ClassDef) -> list[str]:
    return [base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
            if isinstance(base, (ast.Name, ast.Attribute))]


def _declared(classes: dict, protocol: str) -> set[str]:
    """The names a Protocol declares (annotated attributes and methods), its base Protocols' included."""
    nodes = [node for (_, name), node in classes.items() if name == protocol]
    assert nodes, f"no Protocol {protocol} in {MODULES}"
    node = nodes[0]
    names = {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)} | \
        {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for base in _base_names(node):
        if base != "Protocol":
            names |= _declared(classes, base)
    return names


def _is_host(node: ast.AST) -> bool:
    """``engine``, ``vlm``, or ``<anything>.engine`` / ``<anything>.vlm``."""
    return isinstance(node, ast.Name) and node.id in HOST_NAMES or \
        isinstance(node, ast.Attribute) and node.attr in HOST_NAMES


def host_reads(node: ast.ClassDef) -> set[str]:
    """The attributes ``node``'s code reads of its engine."""
    reads = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and _is_host(child.value):
            reads.add(child.attr)
        elif isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in (
                "getattr", "hasattr") and child.args and _is_host(child.args[0]):
            name = child.args[1] if len(child.args) > 1 else None
            reads.add(name.value if isinstance(name, ast.Constant) else "<computed>")
    return reads


def _own_names(classes: dict, key: tuple[str, str]) -> set[str]:
    """What a class and its bases among the modules define: methods, class attributes, attributes stored on an
    instance (``self.x = ...``, ``other.x = ...`` in its own methods)."""
    module, _ = key
    node = classes[key]
    names = set()
    for item in ast.walk(node):
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
            names.add(item.attr)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {target.id for target in item.targets if isinstance(target, ast.Name)}
    for base in _base_names(node):
        found = [other for other in classes if other[1] == base]
        for other in found:
            names |= _own_names(classes, other)
    return names


def foreign_private_reads(classes: dict, key: tuple[str, str]) -> set[str]:
    """Private names (``_x``, not dunders) the class reads of an object other than itself, which neither it nor
    its bases define (another class's internals)."""
    own = _own_names(classes, key)
    found = set()
    for child in ast.walk(classes[key]):
        if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load) and child.attr.startswith("_") \
                and not child.attr.startswith("__"):
            itself = isinstance(child.value, ast.Name) and child.value.id in ("self", "cls")
            if not itself and child.attr not in own:
                found.add(f"{ast.unparse(child.value)}.{child.attr}")
    return found


@pytest.fixture(scope="module")
def classes() -> dict:
    return _classes()


def test_every_class_that_reads_an_engine_is_a_collaborator_with_a_protocol(classes):
    readers = {key for key, node in classes.items() if host_reads(node) and key not in COLLABORATORS}
    assert not readers, f"classes that read their engine without a Protocol in COLLABORATORS: {sorted(readers)}"
    assert set(COLLABORATORS) <= set(classes), set(COLLABORATORS) - set(classes)


@pytest.mark.parametrize("key", sorted(COLLABORATORS), ids=lambda key: f"{key[0]}.{key[1]}")
def test_a_collaborator_reads_of_its_engine_only_what_its_protocol_declares(classes, key):
    protocol = COLLABORATORS[key]
    declared = _declared(classes, protocol)
    assert not {name for name in declared if name.startswith("_")}, f"{protocol} declares private names"
    undeclared = host_reads(classes[key]) - declared
    assert not undeclared, f"{key[1]} reads {sorted(undeclared)} of its engine, which {protocol} does not declare"


@pytest.mark.parametrize("key", sorted(COLLABORATORS), ids=lambda key: f"{key[0]}.{key[1]}")
def test_a_collaborator_reads_no_private_name_of_another_object(classes, key):
    assert not foreign_private_reads(classes, key), foreign_private_reads(classes, key)


def test_the_checks_see_what_they_look_for():
    """The reads the checks find in a sample: an engine's undeclared and private members, another's private one."""
    sample = ast.parse(
        "class Rows:\n"
        "    def __init__(self, decoder):\n"
        "        self.vlm, self._own = decoder.engine, 1\n"
        "    def run(self, stepper):\n"
        "        engine = self.vlm\n"
        "        return engine.model, self.vlm._cache_of, getattr(self.vlm, '_row', None), stepper._store, self._own\n"
    ).body[0]
    assert host_reads(sample) == {"model", "_cache_of", "_row"}
    assert foreign_private_reads({("m", "Rows"): sample}, ("m", "Rows")) == {"self.vlm._cache_of", "stepper._store"}
