"""Readers for HICO (``anno.mat``) and HICO-DET (``anno_bbox.mat``).

The same functions read the real files and the demo fixtures, which are
written in the exact same layout (see ``verbmirage.demo``). HOI ids are
0-based here (row index of ``list_action``); HICO-DET stores them 1-based.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.io

from verbmirage.paths import UnsafePathError, safe_name

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
        bad = ~np.isnan(matrix) & ~np.isin(matrix, (-1.0, 0.0, 1.0))
        if bad.any():
            hoi, image = map(int, np.argwhere(bad)[0])
            raise AnnotationFormatError(
                f"{path}: anno_{split}[{hoi}, {image}] = {matrix[hoi, image]}; "
                "labels must be 1, 0, -1 or NaN"
            )
        labels[split] = matrix.T.copy()
        images[split] = names
    return HicoAnnotations(root=root, hois=hois, labels=labels, images=images)


def _struct_list(value) -> list:
    """A MATLAB struct array loaded with ``struct_as_record=False`` -> list of structs."""
    return list(np.atleast_1d(value).reshape(-1))


def _box_rows(boxes) -> list[tuple[float, float, float, float]]:
    """HICO-DET boxes are stored x1, x2, y1, y2 (1-based): return (x1, y1, x2, y2)."""
    return [(float(b.x1), float(b.y1), float(b.x2), float(b.y2)) for b in _struct_list(boxes)]


def load_hico_det(det_root: str | Path) -> pd.DataFrame:
    """Read ``<det_root>/anno_bbox.mat`` into one row per human-object pair.

    Columns: ``split, image, width, height, hoi_id`` (0-based), ``instance``,
    ``human_box``/``object_box`` as (x1, y1, x2, y2) in 1-based pixels,
    ``n_humans``/``n_objects`` (boxes of that HOI in the image) and ``invis``.
    """
    path = Path(det_root) / "anno_bbox.mat"
    if not path.is_file():
        raise FileNotFoundError(f"HICO-DET annotation file not found: {path}")
    try:
        mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    except Exception as error:  # scipy raises several types for broken files
        raise AnnotationFormatError(f"{path}: not a readable MATLAB file ({error})") from error
    rows = []
    for split in SPLITS:
        for index, entry in enumerate(_struct_list(_require(mat, f"bbox_{split}", path))):
            where = f"{path}: bbox_{split}[{index}].filename"
            try:
                safe_name(getattr(entry, "filename", None), where)
            except UnsafePathError as error:
                raise AnnotationFormatError(str(error)) from None
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
    return pd.DataFrame(rows)


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
