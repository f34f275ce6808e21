"""A mini HICO / HICO-DET written in the exact on-disk format of the real data.

The demo lets the whole workflow run on a laptop and gives the tests real
``.mat`` files: ``anno.mat`` (``list_action`` with all seven fields and the
nested ``synset`` struct, ``anno_train``/``anno_test`` holding 1/0/-1/NaN,
``list_train``/``list_test``), ``anno_bbox.mat`` in the HICO-DET layout and
JPEG images under ``images/{train,test}2015/``. It uses the real 600-HOI
vocabulary and plants the hard cases on purpose: ambiguous labels,
``no_interaction``, objects with fewer than four plausible verbs, several
positives of one object in an image, several humans, invisible HOIs.
Everything is drawn from one seeded generator, so the output is deterministic.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.io
from PIL import Image, ImageDraw

from verbmirage.core.text import gerund
from verbmirage.data.hico import NO_INTERACTION, hoi_vocabulary

# A spread of objects: many verbs (horse, dog, bicycle), few verbs (bear, bed,
# tv, toaster: MC cannot be built on them), and person (human-human HOIs).
DEMO_OBJECTS = (
    "horse", "dog", "bicycle", "motorcycle", "boat", "sports_ball", "elephant", "surfboard",
    "cup", "pizza", "person", "kite", "skateboard", "umbrella", "laptop", "car",
    "bear", "bed", "tv", "toaster", "baseball_glove", "skis",
)


@dataclass(frozen=True)
class DemoSizes:
    train: int = 400
    test: int = 200
    seed: int = 0


#: The text MATLAB v5 files open with (116 bytes); scipy writes the time of writing into it, we the date
#: HICO's own anno.mat names, so that the demo data (and all built from it) is the same bytes on every run.
MAT_HEADER = b"MATLAB 5.0 MAT-file Platform: posix, Created on: Sun Sep 20 00:00:00 2015".ljust(116)


def _save_mat(path: Path, contents: dict) -> None:
    """``scipy.io.savemat`` (compressed) with a fixed header text instead of the time of writing."""
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, contents, do_compression=True)
    path.write_bytes(MAT_HEADER + buffer.getvalue()[len(MAT_HEADER):])


def _struct_array(records: list[dict]) -> np.ndarray:
    """A 1xN MATLAB struct array for ``scipy.io.savemat`` (fields in the first record's order)."""
    fields = list(records[0]) if records else []
    array = np.zeros((1, len(records)), dtype=[(f, object) for f in fields])
    for i, record in enumerate(records):
        for f in fields:
            array[0, i][f] = record[f]
    return array


def _list_action(vocab: pd.DataFrame) -> np.ndarray:
    """``list_action`` as a 600x1 struct array with HICO's seven fields."""
    records = []
    for verb, obj in zip(vocab.verb, vocab.object):
        if verb == NO_INTERACTION:
            synset = np.zeros((1, 0), dtype=[(f, object) for f in ("id", "wid", "name", "count", "syn", "def", "ex")])
        else:
            synset = _struct_array(
                [
                    {
                        "id": np.array([[1]], dtype=np.uint8),
                        "wid": "v00000000",
                        "name": f"{verb}.v.01",
                        "count": "1",
                        "syn": verb.replace("_", " "),
                        "def": f"(demo) to {verb.replace('_', ' ')}",
                        "ex": "",
                    }
                ]
            )
        records.append(
            {
                "nname": obj,
                "vname": verb,
                "vname_ing": gerund(verb),
                "syn": verb.replace("_", ", "),
                "def": f"(demo) a person {gerund(verb).replace('_', ' ')} the {obj.replace('_', ' ')}",
                "synset": synset,
                "add_def": "",
            }
        )
    return _struct_array(records).reshape(-1, 1)


def _random_box(rng, width: int, height: int, scale: tuple[float, float]) -> tuple[int, int, int, int]:
    w = int(width * rng.uniform(*scale))
    h = int(height * rng.uniform(*scale))
    x1 = int(rng.integers(1, max(2, width - w)))
    y1 = int(rng.integers(1, max(2, height - h)))
    return x1, y1, min(width, x1 + w), min(height, y1 + h)


def _box_struct(boxes: list[tuple[int, int, int, int]]) -> np.ndarray:
    """HICO-DET stores boxes as structs with fields in the order x1, x2, y1, y2."""
    return _struct_array([{"x1": b[0], "x2": b[2], "y1": b[1], "y2": b[3]} for b in boxes])


def _sample_image(rng, vocab: pd.DataFrame, by_object: dict[str, list[int]], no_interaction: dict[str, int]):
    """Labels (600,) and box annotations of one synthetic image."""
    labels = np.full(len(vocab), np.nan)
    n_objects = int(rng.choice([1, 2, 3], p=[0.55, 0.35, 0.10]))
    objects = rng.choice(len(DEMO_OBJECTS), size=n_objects, replace=False)
    positives = []
    for obj in (DEMO_OBJECTS[i] for i in objects):
        hois = by_object[obj]
        labels[hois] = -1
        labels[no_interaction[obj]] = -1
        if rng.random() < 0.1:  # the person ignores the object
            labels[no_interaction[obj]] = 1
            continue
        # Zipf-like weights: the first HOIs of an object are common, the tail is rare.
        weights = 1.0 / np.arange(1, len(hois) + 1) ** 1.3
        k = int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1]))
        chosen = rng.choice(hois, size=min(k, len(hois)), replace=False, p=weights / weights.sum())
        labels[chosen] = 1
        positives += [int(h) for h in chosen]
        for h in hois:
            if labels[h] == -1 and rng.random() < 0.12:
                labels[h] = 0  # ambiguous
    return labels, positives


def write_demo_hico(root: str | Path, det_root: str | Path, sizes: DemoSizes = DemoSizes()) -> None:
    """Write ``<root>/anno.mat``, ``<root>/images/...`` and ``<det_root>/anno_bbox.mat``."""
    root, det_root = Path(root), Path(det_root)
    rng = np.random.default_rng(sizes.seed)
    vocab = hoi_vocabulary()
    by_object = {
        obj: [int(h) for h, v in zip(group.hoi_id, group.verb) if v != NO_INTERACTION]
        for obj, group in vocab.groupby("object", sort=False)
    }
    no_interaction = {o: int(h) for h, v, o in zip(vocab.hoi_id, vocab.verb, vocab.object) if v == NO_INTERACTION}
    mat = {"list_action": _list_action(vocab)}
    bbox = {"list_action": mat["list_action"]}
    for split, count in (("train", sizes.train), ("test", sizes.test)):
        names, columns, entries = [], [], []
        for index in range(1, count + 1):
            name = f"HICO_{split}2015_{index:08d}.jpg"
            labels, positives = _sample_image(rng, vocab, by_object, no_interaction)
            width, height = int(rng.integers(200, 321)), int(rng.integers(150, 241))
            hoi_records, drawn = [], []
            for hoi in positives:
                invisible = rng.random() < 0.03
                n_humans = 0 if invisible else int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1]))
                humans = [_random_box(rng, width, height, (0.2, 0.6)) for _ in range(n_humans)]
                objects = [] if invisible else [_random_box(rng, width, height, (0.05, 0.5))]
                connection = np.array([[h + 1, 1] for h in range(n_humans)], dtype=float).reshape(-1, 2)
                hoi_records.append(
                    {
                        "id": float(hoi + 1),
                        "bboxhuman": _box_struct(humans) if humans else np.zeros((0, 0)),
                        "bboxobject": _box_struct(objects) if objects else np.zeros((0, 0)),
                        "connection": connection if n_humans else np.zeros((0, 0)),
                        "invis": float(invisible),
                    }
                )
                drawn.append((humans, objects))
            image = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(90, 200, 3)))
            draw = ImageDraw.Draw(image)
            for humans, objects in drawn:
                for box in objects:
                    draw.rectangle(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
                for box in humans:
                    draw.rectangle(box, outline=(220, 40, 40), width=3)
            path = root / "images" / f"{split}2015" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, format="JPEG", quality=85)
            names.append(name)
            columns.append(labels)
            entries.append(
                {
                    "filename": name,
                    "size": {"width": float(width), "height": float(height), "depth": 3.0},
                    "hoi": _struct_array(hoi_records) if hoi_records else np.zeros((0, 0)),
                }
            )
        mat[f"anno_{split}"] = np.stack(columns, axis=1)
        mat[f"list_{split}"] = np.array(names, dtype=object).reshape(-1, 1)
        bbox[f"bbox_{split}"] = _struct_array(entries)
    root.mkdir(parents=True, exist_ok=True)
    det_root.mkdir(parents=True, exist_ok=True)
    _save_mat(root / "anno.mat", mat)
    _save_mat(det_root / "anno_bbox.mat", bbox)
