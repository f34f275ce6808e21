"""Stage 5, inference: run a model under a variant over question sets, sharded, resumable, with provenance.

See docs/architecture.md for the stages and where each thing lives.
"""
