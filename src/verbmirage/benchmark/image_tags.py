"""Per-image tags from HICO-DET boxes: ambiguity and single-instance images (paper Figs. 6 and 10).

The paper compares models on "ambiguous" images (a tiny object next to a big
person, crowds, people hiding each other, interactions that cannot be seen)
and crops "single-instance" images to the interaction. Its rules are not
given precisely; the defaults below are our proposal (each flags roughly the
extreme decile of the real test images) and every threshold is a config key
(``subsets:``). Definitions and real counts: ``docs/questions.md``.

Boxes are (x1, y1, x2, y2), 1-based and inclusive, as HICO-DET stores them:
area = (x2 - x1 + 1)(y2 - y1 + 1), and intersections use the same +1 rule.
HICO-DET boxes every HOI separately, so one person doing three things is
three nearly equal boxes: people (and objects of one class) are counted as
single-linkage clusters of boxes that overlap with IoU >= ``merge_iou``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from verbmirage.data.hico import HicoAnnotations, HicoDetBoxes, hoi_vocabulary

Box = tuple[float, float, float, float]

AMBIGUITY_TAGS = ("amb_size", "amb_crowd", "amb_occlusion", "amb_invisible")
TAG_COLUMNS = (*AMBIGUITY_TAGS, "ambiguous", "single_instance")

IMAGE_TAGS = pa.schema(
    [
        ("image_id", pa.string()),
        ("image", pa.string()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("n_pairs", pa.int64()),
        ("n_humans", pa.int64()),
        ("n_objects", pa.int64()),
        ("max_size_ratio", pa.float64()),
        ("max_human_overlap", pa.float64()),
        ("has_invisible", pa.bool_()),
        ("union_x1", pa.float64()),
        ("union_y1", pa.float64()),
        ("union_x2", pa.float64()),
        ("union_y2", pa.float64()),
        ("union_frac", pa.float64()),
        *[(tag, pa.bool_()) for tag in TAG_COLUMNS],
    ]
)


@dataclass(frozen=True)
class TagSettings:
    """Config key ``subsets``: the thresholds of every tag (defaults: the notes' proposal)."""

    merge_iou: float = 0.5  # boxes with at least this IoU are one person / one object
    size_ratio: float = 50.0  # amb_size: object/human area ratio (either way) of some pair
    min_humans: int = 4  # amb_crowd: at least this many people
    overlap: float = 0.5  # amb_occlusion: intersection / smaller area of two different people
    max_union_frac: float = 0.25  # single_instance: union box at most this share of the image
    single_strict: bool = False  # single_instance needs exactly one pair (one HOI label)

    @classmethod
    def from_config(cls, config: dict | None) -> "TagSettings":
        config = dict(config or {})
        unknown = sorted(set(config) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"subsets: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        settings = cls(**config)
        if not 0 < settings.merge_iou <= 1:
            raise ValueError(f"subsets.merge_iou: {settings.merge_iou} is not in (0, 1]")
        if settings.size_ratio < 1:
            raise ValueError(f"subsets.size_ratio: {settings.size_ratio} must be at least 1")
        if not 0 < settings.max_union_frac <= 1:
            raise ValueError(f"subsets.max_union_frac: {settings.max_union_frac} is not in (0, 1]")
        return settings


def box_area(box: Box) -> float:
    x1, y1, x2, y2 = box
    return (x2 - x1 + 1) * (y2 - y1 + 1)


def box_intersection(a: Box, b: Box) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0]) + 1
    height = min(a[3], b[3]) - max(a[1], b[1]) + 1
    return max(0.0, width) * max(0.0, height)


def box_iou(a: Box, b: Box) -> float:
    inter = box_intersection(a, b)
    return inter / (box_area(a) + box_area(b) - inter)


def cluster_boxes(boxes: Sequence[Box], merge_iou: float) -> list[int]:
    """Single-linkage cluster label of each box (boxes chained by IoU >= ``merge_iou`` share one)."""
    parent = list(range(len(boxes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if box_iou(boxes[i], boxes[j]) >= merge_iou:
                parent[root(j)] = root(i)
    roots = [root(i) for i in range(len(boxes))]
    first = {r: n for n, r in enumerate(dict.fromkeys(roots))}
    return [first[r] for r in roots]


def max_cross_overlap(boxes: Sequence[Box], clusters: Sequence[int]) -> float:
    """Largest intersection / smaller area over two boxes of *different* clusters (0 if none)."""
    best = 0.0
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if clusters[i] != clusters[j]:
                smaller = min(box_area(boxes[i]), box_area(boxes[j]))
                best = max(best, box_intersection(boxes[i], boxes[j]) / smaller)
    return best


def measure_image(
    pairs: Sequence[tuple[str, Box, Box]], width: float, height: float, has_invisible: bool, settings: TagSettings
) -> dict:
    """The measured quantities and tags of one image from its visible (object class, human, object) pairs."""
    humans = list(dict.fromkeys(h for _, h, _ in pairs))
    human_clusters = cluster_boxes(humans, settings.merge_iou)
    n_objects = 0
    for obj_class in dict.fromkeys(c for c, _, _ in pairs):
        boxes = list(dict.fromkeys(o for c, _, o in pairs if c == obj_class))
        n_objects += len(set(cluster_boxes(boxes, settings.merge_iou)))
    n_humans = len(set(human_clusters))
    log_ratio = max((abs(math.log(box_area(o) / box_area(h))) for _, h, o in pairs), default=math.nan)
    overlap = max_cross_overlap(humans, human_clusters)
    if pairs:
        every = [b for _, h, o in pairs for b in (h, o)]
        union = (min(b[0] for b in every), min(b[1] for b in every), max(b[2] for b in every), max(b[3] for b in every))
        union_frac = box_area(union) / (width * height) if width and height else math.nan
    else:
        union, union_frac = (math.nan,) * 4, math.nan
    tags = {
        # compare logs: a ratio of exactly size_ratio must not flip on rounding of exp/log
        "amb_size": bool(log_ratio >= math.log(settings.size_ratio) - 1e-12),
        "amb_crowd": n_humans >= settings.min_humans,
        "amb_occlusion": overlap >= settings.overlap,
        "amb_invisible": bool(has_invisible),
    }
    single = n_humans == 1 and n_objects == 1 and not has_invisible and union_frac <= settings.max_union_frac
    if settings.single_strict:
        single = single and len(pairs) == 1
    return {
        "n_pairs": len(pairs),
        "n_humans": n_humans,
        "n_objects": n_objects,
        "max_size_ratio": math.exp(log_ratio),
        "max_human_overlap": overlap,
        "has_invisible": bool(has_invisible),
        "union_x1": union[0], "union_y1": union[1], "union_x2": union[2], "union_y2": union[3],
        "union_frac": union_frac,
        **tags,
        "ambiguous": any(tags.values()),
        "single_instance": bool(single),
    }


def image_tags(
    boxes: HicoDetBoxes, anno: HicoAnnotations, settings: TagSettings = TagSettings(), split: str = "test"
) -> pd.DataFrame:
    """One row per HICO image of ``split`` (``IMAGE_TAGS`` columns), in ``list_{split}`` order.

    An image is ``amb_invisible`` when it has an HOI marked invisible
    (``anno_bbox.mat``) or, for the instances JSON that leaves those out, a
    HICO positive (label 1) with no pair. An image HICO lists but HICO-DET
    does not gets no boxes (no size tags, never single-instance).
    """
    names = anno.images[split]
    known = set(names)
    extra = sorted(set(boxes.images.image) - known)
    if extra:
        raise ValueError(
            f"{boxes.source}: {len(extra)} {split} images are not in HICO's list_{split} "
            f"(e.g. {extra[:3]}); the two annotations do not belong together"
        )
    object_of = hoi_vocabulary().object.to_numpy()
    sizes = boxes.images.drop_duplicates("image").set_index("image")[["width", "height"]]
    pairs = boxes.pairs
    visible = pairs[pairs.human_box.notna() & pairs.object_box.notna()]
    by_image = {
        image: list(zip(object_of[group.hoi_id.to_numpy(dtype=int)], group.human_box, group.object_box))
        for image, group in visible.groupby("image", sort=False)
    }
    if boxes.lists_invisible:
        invisible = set(pairs.image[pairs.invis.astype(int).eq(1)])
    else:
        paired = set(zip(visible.image, visible.hoi_id.astype(int)))
        labels = anno.labels[split]
        invisible = {
            names[i] for i, hoi in zip(*np.nonzero(labels == 1)) if (names[i], int(hoi)) not in paired
        }
    rows = []
    for name in names:
        width, height = (int(v) for v in sizes.loc[name]) if name in sizes.index else (0, 0)
        measured = measure_image(by_image.get(name, []), width, height, name in invisible, settings)
        rows.append({"image_id": name.rsplit(".", 1)[0], "image": name, "width": width, "height": height, **measured})
    return pd.DataFrame(rows, columns=IMAGE_TAGS.names)


def subset_counts(tags: pd.DataFrame, questions: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Images, and questions (YN) or groups (MC) of each question set, per tag (docs/questions.md table)."""
    columns = {**{tag: tags[tag] for tag in TAG_COLUMNS}, "unambiguous": ~tags.ambiguous}
    rows = []
    for tag, selected in columns.items():
        chosen = set(tags.image_id[selected.astype(bool)])
        row = {"tag": tag, "images": len(chosen)}
        for qset, frame in questions.items():
            on_tagged = frame[frame.image_id.isin(chosen)]
            row[qset] = on_tagged.group_id.nunique() if qset.startswith("mc") else len(on_tagged)
        rows.append(row)
    return pd.DataFrame(rows)


def single_instance_boxes(tags: pd.DataFrame, images) -> dict[str, Box]:
    """Question image path -> union box, for the images whose file is tagged ``single_instance`` (crop input)."""
    single = tags[tags.single_instance.astype(bool)]
    boxes = {name: (x1, y1, x2, y2) for name, x1, y1, x2, y2 in
             zip(single.image, single.union_x1, single.union_y1, single.union_x2, single.union_y2)}
    return {image: boxes[image.rsplit("/", 1)[-1]] for image in images if image.rsplit("/", 1)[-1] in boxes}
