"""Readers for HICO (``anno.mat``) and HICO-DET (``anno_bbox.mat`` or ``instances_{split}2015.json``).

The same functions read the real files and the demo fixtures, which are
written in the exact same layout (see ``verbmirage.data.demo``). HOI ids are
0-based here (row index of ``list_action``); ``anno_bbox.mat`` stores them
1-based, the instances JSON of fredzzhang/hicodet 0-based.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.io

from verbmirage.core.paths import UnsafePathError, safe_name, safe_relative_name
from verbmirage.data.hico_files import HICO_DET_JSON, HICO_DET_MAT, hico_det_file

NO_INTERACTION = "no_interaction"
SPLITS = ("train", "test")
LIST_ACTION_FIELDS = ("nname", "vname", "vname_ing", "syn", "def", "synset", "add_def")


class AnnotationFormatError(ValueError):
    """An annotation file does not have the layout of the real dataset."""


@dataclass(frozen=True)
class HicoAnnotations:
    """Image-level HOI labels of HICO.

    ``hois`` has one row per HOI class (index = 0-based ``hoi_id``) with
    columns ``verb``, ``verb_ing``, ``object``. ``labels[split]`` is an
    (images x 600) float array: 1 positive, -1 object present but HOI absent,
    0 ambiguous, NaN object absent. ``images[split]`` lists file names.
    """

    root: Path
    hois: pd.DataFrame
    labels: dict[str, np.ndarray]
    images: dict[str, list[str]]

    def image_relpath(self, split: str, file_name: str) -> str:
        """Path of an image relative to the dataset root (as in the real tarball)."""
        return f"images/{split}2015/{file_name}"


def hoi_vocabulary() -> pd.DataFrame:
    """The real 600 (verb, object) classes of HICO in ``anno.mat`` order (packaged TSV)."""
    with resources.files("verbmirage.data").joinpath("hico_600_hoi_list.tsv").open() as handle:
        table = pd.read_csv(handle, sep="\t")
    return table.rename(columns={"hoi_idx0": "hoi_id"})[["hoi_id", "verb", "object"]]


def _mat_string(value, where: str = "value") -> str:
    """A MATLAB char array as loaded by scipy (possibly empty or nested in cells) -> str.

    Only arrays are unwrapped: a number (a numeric ``list_test``) is an error
    naming ``where``, not an endless recursion.
    """
    while isinstance(value, np.ndarray):
        if value.size == 0:
            return ""
        value = value.flat[0]
    if isinstance(value, str):
        return value
    raise AnnotationFormatError(f"{where}: expected a MATLAB string, got {type(value).__name__} {value!r}")


def _require(mat: dict, key: str, path: Path):
    if key not in mat:
        raise AnnotationFormatError(f"{path}: missing variable '{key}'")
    return mat[key]


def check_hoi_vocabulary(hois: pd.DataFrame, path: Path) -> None:
    """``list_action`` must be HICO's 600 (verb, object) classes in their order (the packaged list).

    Question sets, rare tags and the paper's tables index HOIs by row, so a
    missing, extra or swapped class would silently relabel every question.
    """
    expected = hoi_vocabulary()
    if len(hois) != len(expected):
        raise AnnotationFormatError(
            f"{path}: list_action has {len(hois)} actions, expected HICO's {len(expected)}"
        )
    for row, (got, want) in enumerate(zip(hois[["verb", "object"]].itertuples(index=False),
                                          expected[["verb", "object"]].itertuples(index=False))):
        if tuple(got) != tuple(want):
            raise AnnotationFormatError(
                f"{path}: list_action[{row}] is (vname={got[0]!r}, nname={got[1]!r}); "
                f"HICO's class {row} is (vname={want[0]!r}, nname={want[1]!r})"
            )


def _label_matrix(value, where: str) -> np.ndarray:
    """A label variable as floats; a non-numeric one is an error naming the variable."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise AnnotationFormatError(f"{where}: labels must be numeric ({error})") from None


def _image_names(value, where: str) -> list[str]:
    """An image list as unique, plain file names (they become paths under ``images/``)."""
    if not isinstance(value, np.ndarray):
        raise AnnotationFormatError(f"{where}: expected a cell array of file names, got {type(value).__name__}")
    names = []
    for index, cell in enumerate(value.reshape(-1)):
        try:
            names.append(safe_name(_mat_string(cell, f"{where}[{index}]"), f"{where}[{index}]"))
        except UnsafePathError as error:
            raise AnnotationFormatError(str(error)) from None
    seen = {}
    for index, name in enumerate(names):
        if name in seen:
            raise AnnotationFormatError(f"{where}[{index}]: duplicate image name {name!r} (also at [{seen[name]}])")
        seen[name] = index
    return names


def load_hico(root: str | Path) -> HicoAnnotations:
    """Read ``<root>/anno.mat`` (the ``hico_20150920`` folder)."""
    root = Path(root)
    path = root / "anno.mat"
    if not path.is_file():
        raise FileNotFoundError(f"HICO annotation file not found: {path}")
    try:
        mat = scipy.io.loadmat(path)
    except Exception as error:  # scipy raises several types for broken files
        raise AnnotationFormatError(f"{path}: not a readable MATLAB file ({error})") from error

    list_action = _require(mat, "list_action", path)
    missing = [f for f in LIST_ACTION_FIELDS if f not in (list_action.dtype.names or ())]
    if missing:
        raise AnnotationFormatError(f"{path}: list_action lacks fields {missing}")
    actions = list_action.reshape(-1)
    hois = pd.DataFrame(
        {
            "hoi_id": np.arange(len(actions)),
            "verb": [_mat_string(a["vname"], f"{path}: list_action[{i}].vname") for i, a in enumerate(actions)],
            "verb_ing": [_mat_string(a["vname_ing"], f"{path}: list_action[{i}].vname_ing")
                         for i, a in enumerate(actions)],
            "object": [_mat_string(a["nname"], f"{path}: list_action[{i}].nname") for i, a in enumerate(actions)],
        }
    )
    check_hoi_vocabulary(hois, path)

    labels, images = {}, {}
    for split in SPLITS:
        matrix = _label_matrix(_require(mat, f"anno_{split}", path), f"{path}: anno_{split}")
        names = _image_names(_require(mat, f"list_{split}", path), f"{path}: list_{split}")
        if matrix.shape != (len(hois), len(names)):
            raise AnnotationFormatError(
                f"{path}: anno_{split} has shape {matrix.shape}, expected "
                f"({len(hois)}, {len(names)}) from list_action and list_{split}"
            )
        # four comparisons, not np.isin (which sorts the whole 600 x 38K matrix)
        bad = ~(np.isnan(matrix) | (matrix == 1.0) | (matrix == 0.0) | (matrix == -1.0))
        if bad.any():
            hoi, image = map(int, np.argwhere(bad)[0])
            raise AnnotationFormatError(
                f"{path}: anno_{split}[{hoi}, {image}] = {matrix[hoi, image]}; "
                "labels must be 1, 0, -1 or NaN"
            )
        # images x HOIs. MATLAB files are column-major, so the transpose is already C-contiguous: a view, not a
        # copy (copying the 600 x 38K training matrix took ~2.4 s, most of loading)
        labels[split] = np.ascontiguousarray(matrix.T)
        images[split] = names
    return HicoAnnotations(root=root, hois=hois, labels=labels, images=images)


def _struct_list(value) -> list:
    """A MATLAB struct array loaded with ``struct_as_record=False`` -> list of structs."""
    return list(np.atleast_1d(value).reshape(-1))


def _box_rows(boxes) -> list[tuple[float, float, float, float]]:
    """HICO-DET boxes are stored x1, x2, y1, y2 (1-based): return (x1, y1, x2, y2)."""
    return [(float(b.x1), float(b.y1), float(b.x2), float(b.y2)) for b in _struct_list(boxes)]


@dataclass(frozen=True)
class HicoDetBoxes:
    """The boxes of HICO-DET, whichever file they came from.

    ``pairs``: one row per human-object pair (columns of :func:`load_hico_det`).
    ``images``: ``split, image, width, height`` of every listed image, with or
    without pairs. ``lists_invisible``: whether invisible HOIs are rows of
    ``pairs`` (``anno_bbox.mat``) or left out (the instances JSON, where a
    HICO positive without a pair is the invisible one).
    """

    source: Path
    pairs: pd.DataFrame
    images: pd.DataFrame
    lists_invisible: bool


PAIR_COLUMNS = ("split", "image", "width", "height", "hoi_id", "instance", "human_box", "object_box",
                "n_humans", "n_objects", "invis")


def load_hico_det(det_root: str | Path) -> pd.DataFrame:
    """Read ``<det_root>/anno_bbox.mat`` into one row per human-object pair.

    Columns: ``split, image, width, height, hoi_id`` (0-based), ``instance``,
    ``human_box``/``object_box`` as (x1, y1, x2, y2) in 1-based pixels,
    ``n_humans``/``n_objects`` (boxes of that HOI in the image) and ``invis``.
    """
    return load_hico_det_mat(det_root).pairs


def load_hico_det_mat(det_root: str | Path) -> HicoDetBoxes:
    """``<det_root>/anno_bbox.mat`` as pairs and image sizes (both splits)."""
    path = Path(det_root) / HICO_DET_MAT
    if not path.is_file():
        raise FileNotFoundError(f"HICO-DET annotation file not found: {path}")
    try:
        mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    except Exception as error:  # scipy raises several types for broken files
        raise AnnotationFormatError(f"{path}: not a readable MATLAB file ({error})") from error
    rows, images = [], []
    for split in SPLITS:
        for index, entry in enumerate(_struct_list(_require(mat, f"bbox_{split}", path))):
            where = f"{path}: bbox_{split}[{index}].filename"
            try:
                safe_name(getattr(entry, "filename", None), where)
            except UnsafePathError as error:
                raise AnnotationFormatError(str(error)) from None
            images.append({"split": split, "image": str(entry.filename),
                           "width": int(entry.size.width), "height": int(entry.size.height)})
            for hoi in _struct_list(entry.hoi):
                humans, objects = _box_rows(hoi.bboxhuman), _box_rows(hoi.bboxobject)
                connection = np.atleast_2d(np.asarray(hoi.connection, dtype=int)).reshape(-1, 2)
                if len(connection) == 0:  # an invisible HOI: labelled, but without boxes
                    rows.append(_pair_row(split, entry, hoi, 0, None, None, humans, objects))
                for instance, (h, o) in enumerate(connection):
                    if not (1 <= h <= len(humans) and 1 <= o <= len(objects)):
                        raise AnnotationFormatError(
                            f"{path}: {entry.filename} HOI {int(hoi.id)} connection "
                            f"({h}, {o}) points outside its {len(humans)} human / "
                            f"{len(objects)} object boxes"
                        )
                    rows.append(_pair_row(split, entry, hoi, instance, humans[h - 1], objects[o - 1], humans, objects))
    return HicoDetBoxes(path, pd.DataFrame(rows, columns=list(PAIR_COLUMNS)), pd.DataFrame(images), True)


def _pair_row(split, entry, hoi, instance, human_box, object_box, humans, objects) -> dict:
    return {
        "split": split,
        "image": str(entry.filename),
        "width": int(entry.size.width),
        "height": int(entry.size.height),
        "hoi_id": int(hoi.id) - 1,
        "instance": instance,
        "human_box": human_box,
        "object_box": object_box,
        "n_humans": len(humans),
        "n_objects": len(objects),
        "invis": int(hoi.invis),
    }


def _json_box(value, where: str) -> tuple[float, float, float, float]:
    """One (x1, y1, x2, y2) box of 1-based pixels; anything else is an error naming ``where``."""
    if not isinstance(value, list) or len(value) != 4 or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    ):
        raise AnnotationFormatError(f"{where}: expected a box [x1, y1, x2, y2] of 4 finite numbers, got {value!r}")
    x1, y1, x2, y2 = (float(v) for v in value)
    if x1 > x2 or y1 > y2:
        raise AnnotationFormatError(f"{where}: box {value!r} has x1 > x2 or y1 > y2")
    return x1, y1, x2, y2


def _json_list(data: dict, key: str, where: str) -> list:
    if key not in data:
        raise AnnotationFormatError(f"{where}: missing key '{key}'")
    if not isinstance(data[key], list):
        raise AnnotationFormatError(f"{where}: '{key}' must be a list, got {type(data[key]).__name__}")
    return data[key]


def _check_json_correspondence(data: dict, path: Path) -> None:
    """``correspondence[i]`` = [i, object, verb] must name HICO's class i (HOI ids index our tables)."""
    expected = hoi_vocabulary()
    correspondence = _json_list(data, "correspondence", str(path))
    objects, verbs = data.get("objects"), data.get("verbs")
    if len(correspondence) != len(expected):
        raise AnnotationFormatError(
            f"{path}: correspondence has {len(correspondence)} HOIs, expected HICO's {len(expected)}"
        )
    for index, (entry, verb, obj) in enumerate(zip(correspondence, expected.verb, expected.object)):
        try:
            hoi, object_index, verb_index = (int(v) for v in entry)
            names = (verbs[verb_index], objects[object_index]) if objects and verbs else (verb, obj)
        except (TypeError, ValueError, IndexError):
            raise AnnotationFormatError(f"{path}: correspondence[{index}] = {entry!r} is not [hoi, object, verb]")
        if hoi != index or names != (verb, obj):
            raise AnnotationFormatError(
                f"{path}: correspondence[{index}] = {entry!r} names HOI {hoi} ({names[0]}, {names[1]}); "
                f"HICO's class {index} is ({verb}, {obj})"
            )


def load_hico_det_json(det_root: str | Path, split: str = "test") -> HicoDetBoxes:
    """``<det_root>/instances_{split}2015.json`` (fredzzhang/hicodet) as pairs and image sizes.

    Each ``annotation[i]`` lists one human-object pair per position of
    ``boxes_h``/``boxes_o``/``hoi``; boxes are (x1, y1, x2, y2), 1-based like
    ``anno_bbox.mat``. Invisible HOIs have no pair here (``lists_invisible``
    is False). ``n_humans``/``n_objects`` count the distinct boxes of the HOI.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; known: {list(SPLITS)}")
    path = Path(det_root) / HICO_DET_JSON.format(split=split)
    if not path.is_file():
        raise FileNotFoundError(f"HICO-DET instances file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise AnnotationFormatError(f"{path}: not a readable JSON file ({error})") from error
    if not isinstance(data, dict):
        raise AnnotationFormatError(f"{path}: expected a JSON object, got {type(data).__name__}")
    _check_json_correspondence(data, path)
    names = _json_list(data, "filenames", str(path))
    annotations = _json_list(data, "annotation", str(path))
    sizes = _json_list(data, "size", str(path))
    if not len(names) == len(annotations) == len(sizes):
        raise AnnotationFormatError(
            f"{path}: filenames ({len(names)}), annotation ({len(annotations)}) and size ({len(sizes)}) differ in length"
        )
    n_hois = len(hoi_vocabulary())
    rows, images, seen = [], [], {}
    for index, (name, size, entry) in enumerate(zip(names, sizes, annotations)):
        where = f"{path}: annotation[{index}]"
        try:
            safe_relative_name(name, f"{path}: filenames[{index}]")
        except UnsafePathError as error:
            raise AnnotationFormatError(str(error)) from None
        if name in seen:
            raise AnnotationFormatError(f"{path}: filenames[{index}]: duplicate image name {name!r} "
                                        f"(also at [{seen[name]}])")
        seen[name] = index
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
            raise AnnotationFormatError(f"{path}: size[{index}]: expected [width, height] of positive integers, "
                                        f"got {size!r}")
        width, height = size
        images.append({"split": split, "image": name, "width": width, "height": height})
        if not isinstance(entry, dict):
            raise AnnotationFormatError(f"{where}: expected an object, got {type(entry).__name__}")
        humans, objects, hois = (_json_list(entry, key, where) for key in ("boxes_h", "boxes_o", "hoi"))
        if not len(humans) == len(objects) == len(hois):
            raise AnnotationFormatError(f"{where}: boxes_h ({len(humans)}), boxes_o ({len(objects)}) and hoi "
                                        f"({len(hois)}) differ in length")
        pairs = []
        for k, (human, obj, hoi) in enumerate(zip(humans, objects, hois)):
            if not isinstance(hoi, int) or isinstance(hoi, bool) or not 0 <= hoi < n_hois:
                raise AnnotationFormatError(f"{where}.hoi[{k}] = {hoi!r}: expected an HOI index in [0, {n_hois})")
            pairs.append((hoi, _json_box(human, f"{where}.boxes_h[{k}]"), _json_box(obj, f"{where}.boxes_o[{k}]")))
        for hoi in dict.fromkeys(h for h, _, _ in pairs):
            own = [(h, o) for i, h, o in pairs if i == hoi]
            distinct_h, distinct_o = len(set(h for h, _ in own)), len(set(o for _, o in own))
            for instance, (human, obj) in enumerate(own):
                rows.append({"split": split, "image": name, "width": width, "height": height, "hoi_id": hoi,
                             "instance": instance, "human_box": human, "object_box": obj,
                             "n_humans": distinct_h, "n_objects": distinct_o, "invis": 0})
    return HicoDetBoxes(path, pd.DataFrame(rows, columns=list(PAIR_COLUMNS)), pd.DataFrame(images), False)


def read_hico_det(det_root: str | Path, split: str = "test") -> HicoDetBoxes:
    """The boxes of one split from whichever HICO-DET layout ``det_root`` holds."""
    path = hico_det_file(det_root, split)
    if path is None:
        raise FileNotFoundError(
            f"HICO-DET boxes not found in {det_root}: expected {HICO_DET_MAT} or {HICO_DET_JSON.format(split=split)}"
        )
    if path.name == HICO_DET_MAT:
        boxes = load_hico_det_mat(det_root)
        keep = boxes.pairs.split.eq(split)
        return HicoDetBoxes(boxes.source, boxes.pairs[keep].reset_index(drop=True),
                            boxes.images[boxes.images.split.eq(split)].reset_index(drop=True), True)
    return load_hico_det_json(det_root, split)
