"""Which HICO-DET file a folder holds, by name only (:mod:`verbmirage.data.hico` reads it): the run plan and the
config checks ask this without loading the readers' libraries."""

from __future__ import annotations

from pathlib import Path

HICO_DET_MAT = "anno_bbox.mat"
HICO_DET_JSON = "instances_{split}2015.json"  # fredzzhang/hicodet layout


def hico_det_file(det_root: str | Path, split: str = "test") -> Path | None:
    """The HICO-DET file ``det_root`` holds: ``anno_bbox.mat`` first, else the split's instances JSON."""
    for name in (HICO_DET_MAT, HICO_DET_JSON.format(split=split)):
        if (Path(det_root) / name).is_file():
            return Path(det_root) / name
    return None
