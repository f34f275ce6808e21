# Fine-tuning data (docs/models.md, "Fine-tuned models (Pangea LoRA)"): the mini Pangea of the demo and the
# Pangea training questions of a lora_finetune entry; rule derive_model (rules/derived.smk) trains on them.


rule demo_pangea:
    """A mini Pangea in the real format (pickled samples, VerbNet topology, node index, Label2Node, images)."""
    priority: 20
    output:
        samples=DEMO_PANGEA_FILES["samples"],
        topology=DEMO_PANGEA_FILES["topology"],
        node_index=DEMO_PANGEA_FILES["node_index"],
        label2node=DEMO_PANGEA_FILES["label2node"],
        images=directory(DEMO_PANGEA_FILES["images"]),
    params:
        seed=config["demo"]["seed"],
    log:
        PATHS.log("demo_pangea"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_pangea.py"


rule training_questions:
    """A Pangea fine-tune's MC and YN training questions (seeded, sources excluded by pattern), their
    per-source counts and node coverage beside the paper's; fails if a HICO test image is among them."""
    priority: 15
    input:
        **PLAN.data.pangea_files,
        images=PLAN.data.pangea_images or [],
        hico_anno=PLAN.data.hico_anno,
        hico_images=PLAN.data.hico_images,
    output:
        questions=PATHS.training_questions,
        sources=PATHS.training_sources,
        summary=PATHS.training_summary,
    wildcard_constraints:
        model=alternatives(PLAN.builds.pangea_finetunes),
    params:
        pangea=PLAN.data.pangea,
        settings=lambda wildcards: PLAN.derived[wildcards.model].get("pangea", {}),
        hico_root=lambda wildcards: PLAN.data.hico_root,  # the folder (its files may come from a download)
        identity=identity("pangea", "hico_annotations", "hico_images"),
    log:
        PATHS.log("training_questions"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/training_questions.py"
