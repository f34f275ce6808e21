"""Apply one image condition to every image a dataset's question sets ask about.

Inputs: ``source`` (the image folder, or what produces it), ``questions`` (the
dataset's question sets), optional ``tags`` (``image_tags.parquet``: a box condition such as ``crop``
covers only the single-instance images, cropped to their union box). Output: the condition folder with
``manifest.parquet`` (with each image's SHA-256; the source images' digests are kept in the content cache,
``resources/cache/contents/``, so planning sees a later change). Stops, naming the count and the first few, when any question image is missing under
the root.
Settings: ``params.root`` (where ``image`` paths are relative to),
``params.settings`` (config ``conditions.<slug>``), ``params.seed``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from verbmirage.benchmark.conditions import apply_condition, require_images
from verbmirage.benchmark.image_tags import IMAGE_TAGS, single_instance_boxes
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.joblog import job_log
from verbmirage.data.identity import ContentVersions
from verbmirage.workflow.paths import CONTENT_CACHE

with job_log(snakemake.log[0]) as log:
    questions = [read_table(path, QUESTIONS) for path in snakemake.input.questions]  # types and domains checked
    images = sorted(set().union(*(set(frame.image) for frame in questions)))
    require_images(snakemake.params.root, images, snakemake.wildcards.condition)  # every one, before any model job
    boxes = None
    if snakemake.input.get("tags"):
        boxes = single_instance_boxes(read_table(snakemake.input.tags, IMAGE_TAGS), images)
        log.info("%d of %d question images are single-instance", len(boxes), len(images))
    versions = ContentVersions(CONTENT_CACHE)
    manifest = apply_condition(
        snakemake.params.root, images, snakemake.output[0], snakemake.wildcards.condition,
        snakemake.params.settings, seed=snakemake.params.seed, boxes=boxes, digest=versions.digest,
    )
    versions.save()
    log.info("%d images, %d failed", len(manifest), manifest.error.notna().sum())
