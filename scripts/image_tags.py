"""Per-image HICO-DET tags of the HICO test images.

Inputs: ``anno`` (HICO), ``boxes`` (anno_bbox.mat or instances_test2015.json). Output: ``image_tags.parquet``.
Settings: ``params.root``, ``params.det_root``, ``params.settings`` (config ``subsets``).
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.data.hico import load_hico, read_hico_det
from verbmirage.benchmark.image_tags import IMAGE_TAGS, TagSettings, image_tags
from verbmirage.core.io import write_table
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]):
    settings = TagSettings.from_config(snakemake.params.settings)
    boxes = read_hico_det(snakemake.params.det_root, "test")
    tags = image_tags(boxes, load_hico(snakemake.params.root), settings)
    print(f"{len(tags)} images from {boxes.source}; tagged: "
          + ", ".join(f"{tag} {int(tags[tag].sum())}" for tag in IMAGE_TAGS.names if tags[tag].dtype == bool))
    write_table(tags, snakemake.output[0], IMAGE_TAGS,
                provenance={"subsets": snakemake.params.settings, "boxes": str(boxes.source)})
