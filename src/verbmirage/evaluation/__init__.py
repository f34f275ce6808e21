"""Stage 6, evaluation: metrics with bootstrap intervals, ensembles, the paper's tables and its numbers.

See docs/architecture.md for the stages and where each thing lives.
"""
