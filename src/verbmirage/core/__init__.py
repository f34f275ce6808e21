"""Helpers every stage shares: config errors, safe paths, table I/O and atomic writes, text, images, locks, job logs.

See docs/architecture.md for the stages and where each thing lives.
"""
