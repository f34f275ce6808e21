"""The data the run plan's jobs read (:class:`DataInputs`, a collaborator of
:class:`verbmirage.workflow.plan.Plan`): the datasets' roots and files, or the downloads that bring them, and
their identities (what reruns when the data change).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from verbmirage.data import identity as data_identity
from verbmirage.data.hico_files import hico_det_file
from verbmirage.workflow import paths as P
from verbmirage.workflow.paths import Paths

#: Pangea's pickles a fine-tune reads (Label2Node: optional, not an input).
PANGEA_FILE_KEYS = ("samples", "topology", "node_index")


@dataclass(repr=False)
class DataInputs:
    """The datasets' roots and files a job reads (or the download that brings them), and their identities
    (``datasets:``, ``downloads:``)."""

    config: dict
    paths: Paths

    # ---- HICO and HICO-DET ---------------------------------------------------------------------------------
    @property
    def hico_root(self) -> str:
        return self.config["datasets"]["hico"]["root"]

    @property
    def hico_det_root(self) -> str:
        """"" -> no boxes, no image subsets."""
        return self.config["datasets"]["hico"].get("det_root", "")

    @property
    def downloads(self) -> dict:
        return self.config["downloads"]

    def produced_by_download(self, root: str) -> str | None:
        """The flag of the download whose folder holds ``root``, or None."""
        for name in self.downloads:
            folder = Path(P.DOWNLOADED.format(download=name))
            if Path(root) == folder or folder in Path(root).parents:
                return P.DOWNLOAD_DONE.format(download=name)
        return None

    @property
    def hico_anno(self) -> str:
        """What HICO jobs wait for: the labels, or the download that brings them."""
        return self.produced_by_download(self.hico_root) or P.hico_annotations(self.hico_root)

    @property
    def hico_images(self) -> str:
        return self.produced_by_download(self.hico_root) or P.hico_images(self.hico_root)

    @property
    def hico_det_boxes(self) -> str | list:
        """The HICO-DET file the tags are computed from (anno_bbox.mat or instances_test2015.json), or what
        makes it; none without ``det_root``."""
        root = self.hico_det_root
        if not root:
            return []
        if Path(root) == Path(P.DEMO_HICO_DET_ROOT):
            return P.DEMO_HICO_FILES["bbox"]
        return self.produced_by_download(root) or str(hico_det_file(root) or P.hico_det_boxes(root))

    # ---- CharadesEgo (optional: Table 4) ---------------------------------------------------------------------
    @property
    def charades(self) -> dict | None:
        return self.config["datasets"].get("charadesego")

    @property
    def charades_root(self) -> str:
        return self.charades["root"] if self.charades else ""

    @property
    def charades_split(self) -> str:
        return self.charades["split"] if self.charades else "test"

    @property
    def charades_csv(self) -> str | list:
        """The annotation CSV the frames are cut by, or what makes it; none (an empty list, Snakemake's "no
        file") without ``datasets.charadesego``."""
        if not self.charades:
            return []
        return (self.produced_by_download(self.charades_root)
                or P.charades_annotations(self.charades_root, self.charades_split))

    @property
    def charades_video_folder(self) -> str:
        if not self.charades:
            return ""
        return self.charades.get("videos") or P.charades_videos(self.charades_root)

    @property
    def charades_videos(self) -> str | list:
        """The video folder, or what makes it; none without ``datasets.charadesego`` (as :attr:`charades_csv`)."""
        if not self.charades:
            return []
        return self.produced_by_download(self.charades_video_folder) or self.charades_video_folder

    # ---- Pangea (the training questions of a fine-tune) -------------------------------------------------------
    @property
    def pangea(self) -> dict | None:
        """``datasets.pangea``: the training questions of a fine-tune that names no ``questions`` table."""
        return self.config["datasets"].get("pangea")

    @property
    def pangea_root(self) -> str:
        return self.pangea["root"] if self.pangea else ""

    @property
    def pangea_files(self) -> dict[str, str]:
        if not self.pangea:
            return {}
        made = self.produced_by_download(self.pangea_root)
        return {key: made or f"{self.pangea_root}/{self.pangea[key]}" for key in PANGEA_FILE_KEYS}

    @property
    def pangea_images(self) -> str:
        """Pangea's image folder, or the download that brings it."""
        if not self.pangea:
            return ""
        return self.produced_by_download(self.pangea_root) or self.pangea_image_root

    @property
    def pangea_image_root(self) -> str:
        """Pangea's image folder (what a build reads)."""
        return f"{self.pangea_root}/{self.pangea['images']}" if self.pangea else ""

    # ---- identities and image folders ------------------------------------------------------------------------
    def identity(self, *parts: str) -> dict:
        """The ``identity`` param of a job that reads the named parts of a dataset (``verbmirage.data.identity``):
        root, content digests of the annotation files, listings of the image and video folders."""
        compute = {
            "hico_annotations": lambda: data_identity.hico_annotations(self.hico_root),
            "hico_images": lambda: data_identity.hico_images(self.hico_root, self.content_versions),
            "hico_boxes": lambda: data_identity.hico_boxes(self.hico_det_root),
            "charadesego": lambda: data_identity.charades(self.charades_root, self.charades_video_folder,
                                                          self.content_versions),
            "pangea": lambda: data_identity.pangea(self.pangea, PANGEA_FILE_KEYS, self.content_versions),
        }
        return {part: compute[part]() for part in parts}

    @functools.cached_property
    def content_versions(self) -> data_identity.ContentVersions:
        """The content versions of the data's image and video files (one cache for every config)."""
        return data_identity.ContentVersions(P.CONTENT_CACHE)

    def image_identity(self, dataset: str) -> dict:
        """An image condition's source: HICO's image folder (CharadesEgo's frames are built by the workflow)."""
        return self.identity("hico_images") if dataset == "hico" else {}

    def image_source(self, dataset: str) -> str:
        """The folder a dataset's question images live in (or what produces it)."""
        return self.hico_images if dataset == "hico" else self.paths.charades_frames

    def image_root(self, dataset: str) -> str:
        return self.hico_root if dataset == "hico" else self.paths.charades_frames

    def frame_tables(self, dataset: str) -> list[str]:
        """The frame table a dataset's question counts read (CharadesEgo: how each ego frame's time was chosen);
        none for HICO."""
        return [self.paths.charades_frame_table] if dataset == "charadesego" else []
