# One vote job per ensemble run (dataset, condition, ensemble, variant) writes the tables of all its sets; as for
# the merges, one rule per (dataset, condition, sets asked, variant), generated from the config (rules/common.smk).
for _index, (_dataset, _condition, _qsets, _ensembles, _variant) in enumerate(ENSEMBLE_GROUPS):

    rule:
        name:
            f"ensemble_{_index}"
        localrule: True
        input:
            lambda wildcards, d=_dataset, c=_condition, sets=_qsets: [
                PREDICTIONS.format(dataset=d, qset=q, condition=c, model=member, variant=wildcards.variant)
                for q in sets
                for member in ENSEMBLES[wildcards.model]
            ],
        output:
            [PREDICTIONS.format(dataset=_dataset, qset=q, condition=_condition, model="{model}", variant="{variant}")
             for q in _qsets],
        wildcard_constraints:
            model=_alternatives(_ensembles),
            variant=_alternatives([_variant]),
        params:
            qsets=_qsets,
            members=lambda wildcards: ENSEMBLES[wildcards.model],
        log:
            in_logs(f"ensemble/{_dataset}/{_condition}/{{model}}/{{variant}}.log"),
        conda:
            "../envs/verbmirage.yaml"
        script:
            "../scripts/ensemble.py"
