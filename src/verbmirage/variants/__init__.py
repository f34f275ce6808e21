"""Stage 3, the variants: what a variant is (decoding, VCD, OPERA, prompt suffix, decision rule) and the
model-independent algorithms behind it (search loops, VCD's contrast, threshold fitting).

Models (the stage above) implement the steps a variant asks for; nothing here imports a model.

See docs/architecture.md for the stages and where each thing lives.
"""
