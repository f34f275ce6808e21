# Verb Mirage: verb hallucination in multimodal LLMs, end to end.
# download/demo -> question sets -> image conditions -> inference -> ensembles
# -> metrics (Parquet) -> tables. All logic lives in src/verbmirage.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/questions.smk"
include: "rules/images.smk"
include: "rules/inference.smk"
include: "rules/ensembles.smk"
include: "rules/metrics.smk"
include: "rules/tables.smk"


rule all:
    input:
        METRICS,
        TABLES,
        QUESTION_COUNTS,
