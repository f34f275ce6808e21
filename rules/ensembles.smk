# One vote job per ensemble run (dataset, condition, ensemble, variant) writes the tables of all its sets; as for
# the merges, one rule per (dataset, condition, sets asked, variant): the plan's ensemble groups.
for _index, _group in enumerate(PLAN.ensemble_groups):

    rule:
        name:
            f"ensemble_{_index}"
        localrule: True
        input:
            lambda wildcards, g=_group: [
                PATHS.predictions.format(
                    dataset=g.dataset, qset=q, condition=g.condition, model=member, variant=wildcards.variant
                )
                for q in g.qsets
                for member in PLAN.ensembles[wildcards.model]
            ],
        output:
            PLAN.predictions(_group.dataset, _group.qsets, _group.condition, "{model}", "{variant}"),
        wildcard_constraints:
            model=alternatives(_group.models),
            variant=alternatives([_group.variant]),
        params:
            qsets=_group.qsets,
            members=lambda wildcards: PLAN.ensembles[wildcards.model],
        log:
            PATHS.log("ensemble", dataset=_group.dataset, condition=_group.condition),
        conda:
            "../envs/verbmirage.yaml"
        script:
            "../scripts/ensemble.py"
