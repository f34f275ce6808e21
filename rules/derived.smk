# Derived models (models.<slug>.derive; src/verbmirage/derived, docs/models.md "Derived models"): a model
# built from another entry, into its own folder, which the slug's inference and attention jobs take as input.


rule derive_model:
    """Build a derived model (Nullu's edited weights, a LoRA fine-tune's adapter) from its base: a GPU job with
    the entry's resources. The base's settings are params, so changing the base rebuilds it."""
    priority: 10
    input:
        unpack(get_derive_inputs),
    output:
        directory(PATHS.derived_model),
    wildcard_constraints:
        model=alternatives(PLAN.derived),
    params:
        derive=lambda wildcards: PLAN.derived[wildcards.model],  # method, base and the method's settings
        base=lambda wildcards: PLAN.derive_base_settings(PLAN.derived[wildcards.model]["base"]),
        data=get_derive_data,
        identity=get_derive_identity,  # the training data's (HICO or Pangea)
    resources:
        gpu=model_resource("gpu", 0),
        mem_mb=model_resource("mem_mb", 4000),
        runtime=model_resource("runtime", 60),
        cpus_per_gpu=model_resource("cpus_per_gpu", 4),
    log:
        PATHS.log("derive_model"),
    benchmark:
        PATHS.benchmark("derive_model")
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/derive_model.py"
