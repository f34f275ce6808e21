rule ensemble:
    """Majority vote of the member models' answers, written as one more model's predictions."""
    input:
        ensemble_member_predictions,
    output:
        PREDICTIONS,
    wildcard_constraints:
        model=_alternatives(ENSEMBLES),
    params:
        kind=lambda wildcards: question_kind(wildcards.qset),
        members=lambda wildcards: ENSEMBLES[wildcards.model],
    log:
        "logs/ensemble/{dataset}/{qset}/{condition}/{model}/{variant}.log",
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/ensemble.py"
