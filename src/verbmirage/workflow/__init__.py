"""Stage 8, the workflow: plan-time config checks, the run plan, the job runtime, run summaries, the CLI.

See docs/architecture.md for the stages and where each thing lives.
"""
