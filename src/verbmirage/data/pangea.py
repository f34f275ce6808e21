"""The Pangea dataset as shipped in the authors' Drive folder (``Data/``), read in that exact format.

- ``B123_train_KIN-FULL_with_node.pkl``: a pickled list of 4-tuples ``(dataset_name, image_name,
  orig_action_labels, node_labels)``; labels and nodes are a string or a list/tuple/array of strings;
- ``verbnet_topology_898.pkl``: ``{"Father2Son": {parent: [children]}, "objects": [898 node ids]}``;
- ``mapping_node_index.pkl``: the indices into ``objects`` of the 290 selected (P2S) nodes;
- ``Label2Node_batch1+2+3.json``: ``{"<dataset>//<label>": [node ids, repeated per annotator]}``;
- ``Images/<image_name>``: the images.

A pickle runs code while it loads, so every pickle is read with :class:`PlainUnpickler`:
plain containers and scalars only, anything else is refused with an error naming the file.
The questions built from it for the paper's fine-tune, and the demo's small copy, are in
:mod:`verbmirage.benchmark.pangea_training`.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PangeaFiles:
    """File names inside a Pangea root (``datasets.pangea``); the defaults are the real ones."""

    samples: str = "B123_train_KIN-FULL_with_node.pkl"
    topology: str = "verbnet_topology_898.pkl"
    node_index: str = "mapping_node_index.pkl"
    label2node: str = "Label2Node_batch1+2+3.json"
    images: str = "Images"

    @classmethod
    def from_config(cls, entry: dict) -> "PangeaFiles":
        return cls(**{k: v for k, v in entry.items() if k in cls.__dataclass_fields__})

    def paths(self, root: str | Path) -> dict[str, Path]:
        """Every file (and the images folder) under ``root``."""
        return {name: Path(root) / getattr(self, name) for name in self.__dataclass_fields__}


# ---- reading pickles without running them -----------------------------------------------------------------
class UnsafePickleError(ValueError):
    """A pickle asks for something other than plain containers and scalars."""


#: Globals a Pangea pickle may name besides the opcodes of plain containers and scalars (tuple, list,
#: dict, str, int, float, bool, None need none): sets (pickle protocols < 4 build them by a call) and numpy
#: arrays of plain values (the notes allow an ndarray of labels; their elements pass through this check too).
_ALLOWED_GLOBALS = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5 arrays
    ("_codecs", "encode"),  # how protocols < 3 store bytes (an array's buffer): text -> bytes, nothing else
})


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: any other global (a function, a class) is refused.

    Written here because no maintained library offers this for plain data; it is the allow-list the
    Python documentation describes ("Restricting Globals").
    """

    def __init__(self, file, where: str):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str):
        if module == "__builtin__":  # protocols < 3 spell it the Python 2 way
            module = "builtins"
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self.where}: the pickle asks for {module}.{name}; only plain containers and scalars (tuple, "
            "list, dict, set, str, int, float, bool, None, numpy arrays of those) are loaded, since loading "
            "anything else can run code. Is this the right file?"
        )


def load_plain_pickle(path: str | Path):
    """The contents of a pickle of plain data; :class:`UnsafePickleError` (naming the file) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Pangea file not found: {path}")
    try:
        with path.open("rb") as stream:
            return PlainUnpickler(io.BufferedReader(stream), str(path)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError) as error:
        raise UnsafePickleError(f"{path}: not a readable pickle of plain data ({type(error).__name__}: "
                                f"{error or 'the file is empty or cut short'})") from None
    except MemoryError as error:  # an array whose declared shape does not fit in memory: damaged or hostile
        raise UnsafePickleError(f"{path}: the pickle asks for more memory than there is ({error or 'MemoryError'}); "
                                "is this the right file?") from None


# ---- the Pangea files ----------------------------------------------------------------------------------------
class PangeaFormatError(ValueError):
    """A Pangea file does not hold what the real format holds; the message names the file and the item."""


@dataclass(frozen=True)
class Pangea:
    """Pangea's samples and VerbNet nodes.

    ``samples``: one row per sample, columns ``source``, ``image``, ``labels`` (list of raw labels),
    ``nodes`` (list of node ids). ``selected_nodes``: the 290 nodes (``objects[index]``).
    """

    samples: pd.DataFrame
    objects: tuple[str, ...]
    father2son: dict
    selected_nodes: tuple[str, ...]
    label2node: dict[str, list[str]] = field(default_factory=dict)
    images: Path = Path(".")


def _strings(value, where: str) -> list[str]:
    """A label field as a list of strings (the real field may be one string, a list, a tuple or an array)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(item, str) for item in value):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise PangeaFormatError(f"{where}: expected a string or a list of strings, got {value!r:.80}")


def parse_samples(raw, where: str) -> pd.DataFrame:
    """The sample list as a table; each malformed item is named by its index."""
    if not isinstance(raw, (list, tuple)):
        raise PangeaFormatError(f"{where}: expected a list of (dataset_name, image_name, labels, nodes) tuples, "
                                f"got {type(raw).__name__}")
    columns: dict[str, list] = {"source": [], "image": [], "labels": [], "nodes": []}
    for index, item in enumerate(raw):
        at = f"{where}: item {index}"
        if not isinstance(item, (list, tuple)) or len(item) != 4:
            raise PangeaFormatError(f"{at}: expected a 4-tuple (dataset_name, image_name, orig_action_labels, "
                                    f"node_labels), got {item!r:.80}")
        source, image, labels, nodes = item
        if not isinstance(source, str) or not source:
            raise PangeaFormatError(f"{at}: dataset_name must be a non-empty string, got {source!r}")
        if not isinstance(image, str) or not image:
            raise PangeaFormatError(f"{at}: image_name must be a non-empty string, got {image!r}")
        columns["source"].append(source)
        columns["image"].append(image)
        columns["labels"].append(_strings(labels, f"{at} (orig_action_labels)"))
        columns["nodes"].append(_strings(nodes, f"{at} (node_labels)"))
    return pd.DataFrame(columns)


def _topology(raw, where: str) -> tuple[tuple[str, ...], dict]:
    if not isinstance(raw, dict) or "objects" not in raw or "Father2Son" not in raw:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise PangeaFormatError(f"{where}: expected a dict with keys 'Father2Son' and 'objects', got {keys}")
    objects = tuple(_strings(raw["objects"], f"{where} ['objects']"))
    if not isinstance(raw["Father2Son"], dict):
        raise PangeaFormatError(f"{where} ['Father2Son']: expected a dict parent -> children")
    return objects, raw["Father2Son"]


def _selected_nodes(raw, objects: tuple[str, ...], where: str) -> tuple[str, ...]:
    indices = raw.tolist() if isinstance(raw, np.ndarray) else raw
    if not isinstance(indices, (list, tuple)):
        raise PangeaFormatError(f"{where}: expected a list of indices into the topology's objects")
    for position, index in enumerate(indices):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(objects):
            raise PangeaFormatError(f"{where}: item {position} ({index!r}) is not an index into the "
                                    f"{len(objects)} topology objects")
    return tuple(objects[i] for i in indices)


def load_pangea(root: str | Path, files: PangeaFiles = PangeaFiles()) -> Pangea:
    """Read a Pangea root (every pickle through :class:`PlainUnpickler`); Label2Node is optional."""
    paths = files.paths(root)
    samples = parse_samples(load_plain_pickle(paths["samples"]), str(paths["samples"]))
    objects, father2son = _topology(load_plain_pickle(paths["topology"]), str(paths["topology"]))
    selected = _selected_nodes(load_plain_pickle(paths["node_index"]), objects, str(paths["node_index"]))
    label2node = {}
    if paths["label2node"].is_file():
        try:
            label2node = json.loads(paths["label2node"].read_text())
        except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
            raise PangeaFormatError(f"{paths['label2node']}: not a readable JSON file ({error})") from None
        if not isinstance(label2node, dict):
            raise PangeaFormatError(f"{paths['label2node']}: expected an object '<dataset>//<label>' -> [nodes]")
    return Pangea(samples, objects, father2son, selected, label2node, paths["images"])
