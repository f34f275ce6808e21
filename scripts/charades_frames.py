"""Extract the frames of the CharadesEgo ego/exo pairs.

Inputs: the split's CSV and the videos (or the download that brings them).
Outputs: ``frames`` (folder), ``table`` (one row per frame, with ``error``).
Settings: ``params.root`` (annotations in ``CharadesEgo/``), ``params.videos`` (the ``<id>.mp4`` folder),
``params.split``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

from pathlib import Path

from verbmirage.core.io import write_parquet
from verbmirage.data.charades import extract_frames, frame_table, load_split, video_pairs
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    root = Path(snakemake.params.root)
    pairs = video_pairs(load_split(root / "CharadesEgo", snakemake.params.split))
    frames = extract_frames(frame_table(pairs), snakemake.params.videos, snakemake.output.frames)
    write_parquet(frames, snakemake.output.table)
    log.info("%d pairs, %d frames, %d failed", len(pairs), len(frames), frames.error.notna().sum())
