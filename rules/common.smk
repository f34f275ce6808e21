# The workflow's glue: validate the config, build the run plan (src/verbmirage/workflow/plan.py), the wildcard
# constraints from it, and the rules' input functions, each a line that asks the plan. The plan decides every
# run, group and input; every path is spelled in src/verbmirage/workflow/paths.py. Rule files hold rules only.

import os
import sys
from pathlib import Path

from snakemake.utils import validate

# The package lives in src/; import it here even when it is not pip-installed.
# Scripts find it the same way through the scripts/verbmirage link (Snakemake
# puts a script's folder on its sys.path), so conda and cluster jobs work too.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from verbmirage.core.errors import ConfigError
from verbmirage.workflow.config import check_config, check_schema, check_yaml_file, stop_message
from verbmirage.workflow.paths import (
    ARCHIVE,
    DEMO_CHARADES_FILES,
    DEMO_HICO_FILES,
    DEMO_PANGEA_FILES,
    DOWNLOAD_DONE,
    DOWNLOADED,
    TINY_MODEL,
    fill,
)
from verbmirage.workflow.plan import Plan, alternatives, figure_prints
from verbmirage.workflow.report_items import report_options
from verbmirage.workflow.run_folders import RunFolderError, claim, run_folders
from verbmirage.workflow.run_summary import save_summary

# A config that fails a check stops the run here, before any job, with one message: the config file, the key, the
# problem (no traceback).
try:
    for _configfile in workflow.configfiles:  # Snakemake's YAML reader keeps the last of two equal keys silently
        check_yaml_file(_configfile)
    check_schema(config, workflow.source_path("../schemas/config.schema.yaml"))  # one line per problem, key first
    validate(config, workflow.source_path("../schemas/config.schema.yaml"))  # fills the defaults
    check_config(config, workdir=os.getcwd())
    # Each config its own tree (verbmirage.workflow.run_folders): results/, logs/, benchmarks/ for the demo's
    # config.yaml, results/<name>/, logs/<name>/, benchmarks/<name>/ for configs/<name>.yaml or any other
    # --configfile, or the folder of the `results_dir` key.
    RUN_FOLDERS = run_folders(
        config["results_dir"], workflow.overwrite_configfiles, os.getcwd(), Path(workflow.main_snakefile).parent
    )
    # A tree belongs to the config whose run first wrote into it (the Snakefile's onstart records it): another
    # config writing there is refused here.
    TREE_CLAIM = claim(RUN_FOLDERS, workflow.overwrite_configfiles, os.getcwd(), Path(workflow.main_snakefile).parent)
    PLAN = Plan.from_config(config, RUN_FOLDERS)
except (ConfigError, RunFolderError) as _error:
    sys.exit(stop_message(_error, workflow.overwrite_configfiles))
PATHS = PLAN.paths
# What the end-of-run summary shows (src/verbmirage/workflow/run_summary.py), kept in the logs when the run is
# planned: `verbmirage report` prints it after the report, also when the run had nothing to do.
# (A dict display: Snakemake would read a line that starts with `report=` as its `report:` keyword.)
SUMMARY = {
    "outputs": PLAN.targets,
    "metrics": PATHS.metrics,
    "variants": config.get("variants"),
    "configfiles": workflow.overwrite_configfiles,
    "report": RUN_FOLDERS.report,
    "shown": PLAN.report_files,
}
save_summary(PATHS.log("run_summary"), SUMMARY)
# Derived models (models.<slug>.derive): from here on each is the entry its jobs load (its base's backend and
# settings, path or adapter = its built folder).
config["models"] = PLAN.config["models"]


wildcard_constraints:
    **PLAN.wildcard_constraints(),


# ---- dataset identity (verbmirage.data.identity) ------------------------------------------------------------
# Each job that reads a dataset takes its identity as the param `identity` (root, content digests of the
# annotation files, listings with sizes of the image and video folders); a changed identity reruns the job, also
# for data replaced under the same path with old modification times. Snakemake records a param function of
# `wildcards` only (not one of `input`) and calls it again just before its job runs, so data the run itself
# brings (the demo, a download) is recorded as built.
def identity(*parts):
    return lambda wildcards: PLAN.data.identity(*parts)


def get_image_identity(wildcards):
    return PLAN.data.image_identity(wildcards.dataset)


def get_derive_identity(wildcards):
    return PLAN.builds.derive_identity(wildcards.model)


# ---- resources: from the model entry's `resources` --------------------------------------------------------
def model_resource(key, default):
    return lambda wildcards: PLAN.model_resource(wildcards.model, key, default)


def attention_resource(key, default):
    return lambda wildcards: PLAN.attention.resource(wildcards.model, key, default)


# ---- input functions ------------------------------------------------------------------------------------------
def get_model_files(wildcards):
    """A tiny or derived model the workflow builds, and a LoRA adapter folder: inputs of the jobs loading it."""
    return PLAN.builds.model_files(config["models"][wildcards.model])


def get_attention_model_files(wildcards):
    return PLAN.builds.model_files(PLAN.attention.models[wildcards.model])


def get_run_qsets(wildcards):
    """The sets one run asks (its inference jobs) and scores (its metric job), in config order."""
    return PLAN.run_qsets(wildcards.dataset, wildcards.condition, wildcards.model, wildcards.variant)


def get_run_questions(wildcards):
    return PLAN.questions(wildcards.dataset, get_run_qsets(wildcards))


def get_run_predictions(wildcards):
    w = wildcards
    return PLAN.predictions(w.dataset, get_run_qsets(w), w.condition, w.model, w.variant)


def get_pair_qsets(wildcards):
    w = wildcards
    return PLAN.pair_qsets(w.dataset, w.reference, w.other, w.model, w.variant)


def get_pair_questions(wildcards):
    return PLAN.questions(wildcards.dataset, get_pair_qsets(wildcards))


def get_pair_predictions(side):
    """The prediction tables of a pair's ``side`` ("reference" or "other"), in :func:`get_pair_qsets` order."""
    return lambda w: PLAN.predictions(w.dataset, get_pair_qsets(w), w[side], w.model, w.variant)


def get_partial_images(wildcards):
    return PLAN.partial_images(wildcards.dataset, wildcards.condition)


def get_pair_partial_images(wildcards):
    return PLAN.pair_partial_images(wildcards.dataset, wildcards.reference, wildcards.other)


def get_dataset_questions(wildcards):
    return PLAN.dataset_questions(wildcards.dataset)


def get_frame_tables(wildcards):
    return PLAN.data.frame_tables(wildcards.dataset)


def get_decision_input(wildcards):
    w = wildcards
    return PLAN.calibration.decision_input(w.dataset, w.condition, w.model, w.variant)


def get_calibration_qsets(wildcards):
    w = wildcards
    return PLAN.calibration.qsets(w.dataset, w.condition, w.model, w.variant)


def get_calibration_tables(wildcards):
    w = wildcards
    return PLAN.calibration.tables(w.dataset, w.condition, w.model, w.variant)


def get_calibration_condition_tables(wildcards):
    return PLAN.calibration.condition_tables(wildcards.dataset, wildcards.condition)


def get_derive_inputs(wildcards):
    return PLAN.builds.derive_inputs(wildcards.model)


def get_derive_data(wildcards):
    return PLAN.builds.derive_data(wildcards.model)


# ---- the HTML report ------------------------------------------------------------------------------------------
def reported(path):
    """``path`` marked for the report, with its category, its place in the paper's order and its caption
    (verbmirage.workflow.report_items.REPORT_ITEMS, the one list of them)."""
    return report(path, **report_options(path))
