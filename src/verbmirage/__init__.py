"""Verb Mirage: measure verb hallucination in multimodal LLMs.

The package holds all the logic of the workflow; the Snakemake rules only
call into it. Stages map one to one onto modules:

- ``verbmirage.data.download``: fetch (resumable, verified) and unpack archives safely.
- ``verbmirage.data.hico``: read HICO / HICO-DET annotations (real ``.mat`` files).
- ``verbmirage.data.demo``: write a mini HICO in the exact on-disk format.
- ``verbmirage.data.charades``: CharadesEgo annotations, frames, ego/exo questions, demo copy.
- ``verbmirage.benchmark.questions``: build the HICO question sets (paper Appendix A; docs/questions.md).
- ``verbmirage.benchmark.image_tags``: per-image HICO-DET tags (ambiguity rules, single instance).
- ``verbmirage.benchmark.condition_types``, ``verbmirage.benchmark.conditions``: image conditions (paper
  "High-Quality and Low-Quality Images"), crops included: their types, and their images.
- ``verbmirage.models``: the model interface, registry and backends; remote-code
  checkpoints run through ``models.remote_worker`` in their own environments.
- ``verbmirage.models.tiny``: tiny random-weight models of the real classes, built offline.
- ``verbmirage.inference.runs``: run a model over a question set, sharded and resumable.
- ``verbmirage.evaluation.ensembles``: majority-vote ensembles.
- ``verbmirage.evaluation.metrics``: metrics, bootstrap intervals, error consistency.
- ``verbmirage.evaluation.tables``: the paper's tables from the long metrics table.
- ``verbmirage.analysis``: analyses inside the model (attention) and their figures.
- ``verbmirage.workflow.config``, ``verbmirage.core.io``, ``verbmirage.core.joblog``: config checks,
  table schemas and their I/O, job logs.
- ``verbmirage.core.paths``, ``verbmirage.core.imaging``: names and paths that stay inside
  their roots, files written whole; opening images safely (shared by conditions and backends).
"""

__version__ = "0.1.0"
