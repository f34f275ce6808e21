"""Stage 2, the benchmark: question sets, image tags, image conditions, calibration images, Pangea
fine-tuning questions.

See docs/architecture.md for the stages and where each thing lives.
"""
