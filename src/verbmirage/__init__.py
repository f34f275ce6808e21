"""Verb Mirage: measure verb hallucination in multimodal LLMs.

The package holds all the logic of the workflow; the Snakemake rules only
call into it. Stages map one to one onto modules:

- ``verbmirage.hico``: read HICO / HICO-DET annotations (real ``.mat`` files).
- ``verbmirage.demo``: write a mini HICO in the exact on-disk format.
- ``verbmirage.questions``: build the question sets (SPEC section 2).
- ``verbmirage.conditions``: image conditions (SPEC section 3).
- ``verbmirage.models``: the model interface, registry and backends.
- ``verbmirage.inference``: run a model over a question set.
- ``verbmirage.ensembles``: majority-vote ensembles.
- ``verbmirage.metrics``: metrics, bootstrap intervals, error consistency.
- ``verbmirage.tables``: the paper's tables from the long metrics table.
"""

__version__ = "0.1.0"
