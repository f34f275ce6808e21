"""Stage 1, the data: download archives, read HICO / HICO-DET, CharadesEgo and Pangea, write the demo data.

See docs/architecture.md for the stages and where each thing lives.
"""
