# Verb Mirage: verb hallucination in multimodal LLMs, end to end.
# download/demo -> question sets -> image conditions -> inference -> ensembles
# -> metrics (Parquet) -> tables. All logic lives in src/verbmirage.

from snakemake.utils import min_version

min_version("9.0")


# The demo's config.yaml, unless the command line names config files: those replace it rather than being merged
# into it (Snakemake's default), so configs/paper.yaml or an edited copy never brings back the demo's tiny
# models, ensembles or analyses. Keys a file leaves out take the schema's defaults. (`--config key=value`
# still adjusts whichever config is in use.)
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/questions.smk"
include: "rules/subsets.smk"
include: "rules/charades.smk"
include: "rules/images.smk"
include: "rules/derived.smk"
include: "rules/finetune.smk"
include: "rules/inference.smk"
include: "rules/decisions.smk"
include: "rules/ensembles.smk"
include: "rules/metrics.smk"
include: "rules/tables.smk"
include: "rules/analysis.smk"
include: "rules/known_object.smk"
include: "rules/uncertainty.smk"
include: "rules/reliance.smk"
include: "rules/figures.smk"
include: "rules/report.smk"


# Rule priorities order the ready jobs: those that unblock most of the DAG first (demo data 20-30, question sets
# and image conditions 20, model builds 10-15), inference (5) before the light jobs that follow it (0).

# Local runs: one warm process imports torch, transformers and pandas once and forks every job, so jobs skip
# seconds of Python start-up each (config `job_server`; src/verbmirage/workflow/jobserver.py). Off under a cluster
# executor: there each job runs in its own process as always, and so does any job the server cannot take.
# Local jobs also stop (their answered rows saved) when this Snakemake process dies, SIGKILL included, instead of
# running on unseen (jobserver.mark_run; docs/faults.md).
# While jobs run, a line every `progress_interval` seconds per long job whose progress bar moved (questions done,
# rate, time left), read from its log (src/verbmirage/workflow/progress.py).
_job_server = []
_progress = []


onstart:
    from verbmirage.workflow import jobserver, progress

    TREE_CLAIM.record()  # this config's tree from now on (rules/common.smk)
    _job_server.append(
        jobserver.start_run(workflow.local_exec, config.get("job_server", True), PATHS.log("job_server"))
    )
    _progress.append(progress.ProgressLines(RUN_FOLDERS.logs, config["progress_interval"]).start())


# The end of a run (src/verbmirage/workflow/run_summary.py): on success where the results are, Table 1's headline
# numbers and whether the config's report is up to date; on failure which jobs failed and their logs. It never
# fails the run.
onsuccess:
    from verbmirage.workflow import jobserver, run_summary

    jobserver.stop(_job_server.pop() if _job_server else None)
    for _watcher in _progress:
        _watcher.stop()
    run_summary.print_summary("success", **SUMMARY)


onerror:
    from verbmirage.workflow import jobserver, run_summary

    jobserver.stop(_job_server.pop() if _job_server else None)
    for _watcher in _progress:
        _watcher.stop()
    run_summary.print_summary("error", snakemake_logs=log)


# Everything but the inference shards runs on the submitting node under a cluster profile.
localrules:
    all,
    fetch_dataset,
    demo_hico,
    demo_pangea,
    training_questions,
    tiny_model,
    question_set,
    train_stats,
    demo_charadesego,
    charades_frames,
    charades_question_set,
    charades_train_stats,
    question_counts,
    image_tags,
    image_condition,
    metric_part,
    consistency_part,
    metrics,
    tables,
    mitigation_tables,
    attention_figures,
    vcd_divergence,
    known_object,
    known_object_figure,
    uncertainty,
    uncertainty_figures,
    fov,
    fov_report,
    object_reliance,
    reliance_report,
    paper_figures,
    report_pages,
    calibration_question_set,
    calibration_images,
    content_free_images,


rule all:
    input:
        PLAN.targets,  # every table, figure and analysis of this config (src/verbmirage/workflow/plan.py)
