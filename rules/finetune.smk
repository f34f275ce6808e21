# Fine-tuning data (docs/models.md, "Fine-tuned models (Pangea LoRA)"): the mini Pangea of the demo and the
# Pangea training questions of a lora_finetune entry; rule derive_model (rules/derived.smk) trains on them.


rule demo_pangea:
    """A mini Pangea in the real format (pickled samples, VerbNet topology, node index, Label2Node, images)."""
    priority: 20
    output:
        samples=f"{DEMO_PANGEA_ROOT}/B123_train_KIN-FULL_with_node.pkl",
        topology=f"{DEMO_PANGEA_ROOT}/verbnet_topology_898.pkl",
        node_index=f"{DEMO_PANGEA_ROOT}/mapping_node_index.pkl",
        label2node=f"{DEMO_PANGEA_ROOT}/Label2Node_batch1+2+3.json",
        images=directory(f"{DEMO_PANGEA_ROOT}/Images"),
    params:
        seed=config["demo"]["seed"],
    log:
        in_logs("demo_pangea.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/make_demo_pangea.py"


rule training_questions:
    """A Pangea fine-tune's MC and YN training questions (seeded, sources excluded by pattern), their
    per-source counts and node coverage beside the paper's; fails if a HICO test image is among them."""
    priority: 15
    input:
        **PANGEA_FILES,
        images=PANGEA_IMAGES or [],
        hico_anno=HICO_ANNO,
        hico_images=HICO_IMAGES,
    output:
        questions=TRAINING_QUESTIONS,
        sources=TRAINING_SOURCES,
        summary=TRAINING_SUMMARY,
    wildcard_constraints:
        model=_alternatives(PANGEA_FINETUNES),
    params:
        pangea=PANGEA,
        settings=lambda wildcards: DERIVED[wildcards.model].get("pangea", {}),
        hico_root=HICO_ROOT,
        identity=identity("pangea", "hico_annotations", "hico_images"),
    log:
        in_logs("training_questions/{model}.log"),
    conda:
        "../envs/verbmirage.yaml"
    script:
        "../scripts/training_questions.py"
