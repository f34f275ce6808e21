"""Verb Mirage: measure verb hallucination in multimodal LLMs.

The package holds all the logic of the workflow; the Snakemake rules only
call into it. Stages map one to one onto modules:

- ``verbmirage.download``: fetch (resumable, verified) and unpack archives safely.
- ``verbmirage.hico``: read HICO / HICO-DET annotations (real ``.mat`` files).
- ``verbmirage.demo``: write a mini HICO in the exact on-disk format.
- ``verbmirage.charades``: CharadesEgo annotations, frames, ego/exo questions, demo copy.
- ``verbmirage.questions``: build the HICO question sets (paper Appendix A; docs/questions.md).
- ``verbmirage.image_tags``: per-image HICO-DET tags (ambiguity rules, single instance).
- ``verbmirage.conditions``: image conditions (paper "High-Quality and Low-Quality Images"), crops included.
- ``verbmirage.models``: the model interface, registry and backends; remote-code
  checkpoints run through ``models.remote_worker`` in their own environments.
- ``verbmirage.tiny``: tiny random-weight models of the real classes, built offline.
- ``verbmirage.inference``: run a model over a question set, sharded and resumable.
- ``verbmirage.ensembles``: majority-vote ensembles.
- ``verbmirage.metrics``: metrics, bootstrap intervals, error consistency.
- ``verbmirage.tables``: the paper's tables from the long metrics table.
- ``verbmirage.analysis``: analyses inside the model (attention) and their figures.
- ``verbmirage.config``, ``verbmirage.io``, ``verbmirage.joblog``: config checks,
  table schemas and atomic writes, job logs.
- ``verbmirage.paths``, ``verbmirage.imaging``: names and paths that stay inside
  their roots; opening images safely (shared by conditions and backends).
"""

__version__ = "0.1.0"
