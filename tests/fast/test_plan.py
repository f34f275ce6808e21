"""The run plan (verbmirage.workflow.plan) built directly from a config: runs, groups, jobs and paths per stage.

No Snakemake run: the config is checked and filled with the schema's defaults as rules/common.smk does it, then
planned (in this process; in a fresh one where a test checks what planning imports). The job counts of the demo
and of configs/paper.yaml are those a dry run of the workflow listed (rule by rule) before the plan moved into
the package.
"""

from __future__ import annotations

import ast
import copy
import re
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from verbmirage.workflow.config import check_config
from verbmirage.workflow.paths import LOGS, Paths, fill
from verbmirage.workflow.plan import Group, Plan, Run, alternatives
from verbmirage.workflow.report_items import report_item
from verbmirage.workflow.run_folders import run_folders

REPO = Path(__file__).resolve().parents[2]
SCHEMA = str(REPO / "schemas" / "config.schema.yaml")
DEMO = yaml.safe_load((REPO / "config.yaml").read_text())


def plan_of(config: dict, configfiles=(), workdir: Path = REPO) -> Plan:
    """What rules/common.smk plans for ``config`` (the demo's config.yaml unless ``configfiles`` names others)."""
    config = copy.deepcopy(config)
    validate(config, SCHEMA)  # fills the defaults, as the workflow does
    check_config(config, workdir=workdir)
    return Plan.from_config(config, run_folders(config["results_dir"], list(configfiles), workdir, REPO))


def job_counts(plan: Plan) -> Counter:
    """Jobs per rule of the inference and metric stages, as the plan groups them."""
    model_runs = [run for run in plan.scored if run.model in plan.models]
    return Counter({
        "predict_suite": sum(plan.n_shards(run.model) for run in model_runs),
        "merge_predictions": len(model_runs),
        "ensemble": len(plan.scored) - len(model_runs),
        "metric_part": len(plan.scored),
        "consistency_part": len(plan.consistency),
        "calibrate_decision": len(plan.calibration.runs),
        "derive_model": len(plan.derived),
        "training_questions": len(plan.builds.pangea_finetunes),
        "attention": len(plan.attention.parts),
        "image_condition": len({(run.dataset, run.condition) for run in model_runs}),
    })


@pytest.fixture(scope="module")
def demo() -> Plan:
    return plan_of(DEMO)


@pytest.fixture(scope="module")
def paper() -> Plan:
    config = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    config["datasets"] = copy.deepcopy(DEMO["datasets"])  # the real data is not on this machine
    return plan_of(config, configfiles=["configs/paper.yaml"])


def test_the_plan_module_does_not_import_snakemake():
    for module in ("plan", "paths"):
        tree = ast.parse((REPO / "src" / "verbmirage" / "workflow" / f"{module}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "snakemake" for name in imported), module


#: The modules of the plan's collaborators (the data, builds, calibration, figures, each analysis).
COLLABORATOR_MODULES = ("plan_data", "plan_inputs", "plan_figures", "plan_analyses")


def _facts_read(tree: ast.Module) -> dict[str, set[str]]:
    """Collaborator class -> the members it reads of the plan: ``self.plan.<name>``, and ``<local>.<name>`` of a
    local bound to ``self.plan`` or a parameter annotated ``PlanFacts``."""
    def is_plan(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "plan" and isinstance(node.value, ast.Name)
                and node.value.id == "self")

    read: dict[str, set[str]] = {}
    for owner in [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]:
        aliases = set()
        for node in ast.walk(owner):
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets
                           for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                aliases |= {t.id for t, v in zip(targets, values) if isinstance(t, ast.Name) and is_plan(v)}
            if isinstance(node, ast.arg) and ast.unparse(node.annotation or ast.Constant("")) == "PlanFacts":
                aliases.add(node.arg)
        read[owner.name] = {node.attr for node in ast.walk(owner) if isinstance(node, ast.Attribute)
                            and (is_plan(node.value) or isinstance(node.value, ast.Name) and node.value.id in aliases)}
    return read


def test_the_collaborators_read_only_the_plan_facts_they_declare_and_plan_has_no_mixins():
    """Each collaborator of the plan reads of it only what ``PlanFacts`` declares (its boundary: a new need is a
    line there, seen in review), and Plan holds its collaborators instead of inheriting them."""
    from verbmirage.workflow.plan_base import PlanFacts

    declared = set(PlanFacts.__annotations__) | {name for name in vars(PlanFacts) if not name.startswith("_")}
    assert {"asks", "variants_under", "config", "paths", "data"} <= declared
    for module in COLLABORATOR_MODULES:
        tree = ast.parse((REPO / "src" / "verbmirage" / "workflow" / f"{module}.py").read_text())
        for owner, names in _facts_read(tree).items():
            assert names <= declared, f"{module}.{owner} reads {sorted(names - declared)} of the plan: declare " \
                                      f"them in plan_base.PlanFacts"
    assert Plan.__mro__ == (Plan, object)
    for name in ("data", "builds", "calibration", "figures", "attention", "vcd_divergence", "known_object",
                 "uncertainty", "fov", "reliance"):
        assert type(getattr(Plan, name)).__name__ == "cached_property", name  # one object each, built once


#: Libraries that take seconds to import and that planning never needs: a Snakemake start (and every dry run)
#: imports the plan, so they would cost each one.
HEAVY_LIBRARIES = ("torch", "transformers", "pandas", "pyarrow", "scipy", "matplotlib", "PIL")


def test_planning_imports_no_heavy_library():
    """The package modules rules/common.smk imports (the plan, the config checks, the run folders and summary,
    the report's items) load none of them, in a fresh interpreter, and neither does checking and planning the
    demo and configs/paper.yaml; planning the paper's config takes under 5 s (about 1 s on a loaded 2-core
    machine). Importing the plan took 0.9 s and loaded pandas, pyarrow, scipy, Pillow and matplotlib; it takes
    about 0.2 s now (bench/README.md, "Plan size")."""
    common = (REPO / "rules" / "common.smk").read_text()
    modules = sorted(set(re.findall(r"^from (verbmirage[\w.]*) import", common, re.MULTILINE)))
    assert "verbmirage.workflow.plan" in modules and "verbmirage.workflow.config" in modules
    heavy = f"sorted(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules)"
    probe = "\n".join([
        "import importlib, sys, time",
        f"for module in {modules!r}:",
        "    importlib.import_module(module)",
        f"print('imported', *{heavy})",
        "sys.path.insert(0, 'tests/fast')",
        "from test_plan import DEMO, plan_of",
        "import yaml",
        "paper = yaml.safe_load(open('configs/paper.yaml'))",
        "paper['datasets'] = DEMO['datasets']",
        "for config in (DEMO, paper):",
        "    start = time.perf_counter()",
        "    plan_of(config).targets",
        f"print('planned', *{heavy})",
        "print(f'{time.perf_counter() - start:.2f}')",  # the paper's config
    ])
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    *loaded, seconds = result.stdout.split()
    assert loaded == ["imported", "planned"]
    assert float(seconds) < 5, f"planning configs/paper.yaml took {seconds} s"


# ---- the demo ----------------------------------------------------------------------------------------------
def test_the_demo_plans_the_jobs_of_every_stage(demo):
    assert job_counts(demo) == Counter({
        "predict_suite": 42, "merge_predictions": 38, "ensemble": 4, "metric_part": 42, "consistency_part": 17,
        "calibrate_decision": 1, "derive_model": 2, "training_questions": 1, "attention": 2, "image_condition": 4})
    assert (len(demo.merge_groups), len(demo.ensemble_groups)) == (16, 4)
    assert demo.datasets == ["hico", "charadesego"]
    assert demo.dataset_qsets == {"hico": ["yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist", "yn_ko"],
                                  "charadesego": ["yn_exo", "yn_ego", "mc_exo", "mc_ego"]}


def test_the_demo_runs_each_model_where_its_config_says(demo):
    runs = {(r.dataset, r.condition, r.model, r.variant): r.qsets for r in demo.scored}
    # beam5 runs under clean on HICO, on its four sets; a blind baseline cannot beam-search
    assert runs["hico", "clean", "tiny_llava", "beam5"] == ("yn_obj", "yn_verb", "mc_obj", "mc_verb")
    assert ("hico", "saltpepper", "tiny_llava", "beam5") not in runs
    assert not {m for (_, _, m, v) in runs if v == "beam5"} & {"always_yes", "random", "prior", "blind_vote"}
    # crop asks its MC sets only; tiny_clip its own yn_ko and yn_obj (so nothing under crop)
    assert runs["hico", "crop", "random", "default"] == ("mc_obj", "mc_verb")
    assert runs["hico", "clean", "tiny_clip", "default"] == ("yn_obj", "yn_ko")
    assert not [key for key in runs if key[1] == "crop" and key[2] == "tiny_clip"]
    # CharadesEgo: no box condition, the charades sets in their order
    assert runs["charadesego", "clean", "prior", "default"] == ("yn_exo", "yn_ego", "mc_exo", "mc_ego")
    assert not [key for key in runs if key[0] == "charadesego" and key[1] != "clean"]
    # the shards of the random baseline: two jobs per run
    assert demo.run_shards("hico", "clean", "random", "default") == [
        "results/shards/hico/clean/random/default/0", "results/shards/hico/clean/random/default/1"]


def test_merge_groups_claim_each_run_once_and_cover_every_model_run(demo, paper):
    for plan in (demo, paper):
        for groups, models in ((plan.merge_groups, plan.models), (plan.ensemble_groups, list(plan.ensembles))):
            claimed = [(g.dataset, g.condition, m, g.variant) for g in groups for m in g.models]
            assert len(claimed) == len(set(claimed))
            assert sorted(claimed) == sorted((r.dataset, r.condition, r.model, r.variant)
                                             for r in plan.scored if r.model in models)
            for g in groups:
                assert all(plan.run_qsets(g.dataset, g.condition, m, g.variant) == g.qsets for m in g.models)


def test_the_demo_paths_of_each_stage(demo):
    p = demo.paths
    assert demo.questions("hico", ["yn_obj"]) == ["results/benchmark/hico/yn_obj.parquet"]
    assert demo.predictions("hico", ["mc_verb", "yn_obj"], "crop", "prior", "default") == [
        "results/predictions/hico/mc_verb/crop/prior/default.parquet",
        "results/predictions/hico/yn_obj/crop/prior/default.parquet"]
    assert p.suite_shard == "results/shards/{dataset}/{condition}/{model}/{variant}/{shard}"
    assert p.condition_images == "results/images/{dataset}/{condition}"
    assert p.metric_part == "results/metrics/parts/{dataset}/{condition}/{model}/{variant}.parquet"
    assert p.consistency_part == "results/metrics/parts/{dataset}/{reference}_vs_{other}/{model}/{variant}.parquet"
    assert p.log("predict_suite") == "logs/predict/{dataset}/{condition}/{model}/{variant}/{shard}.log"
    assert p.log("merge_predictions", dataset="hico", condition="crop") == \
        "logs/merge_predictions/hico/crop/{model}/{variant}.log"
    assert p.benchmark("attention") == "benchmarks/attention/{dataset}/{condition}/{model}.tsv"
    assert demo.builds.model_files(demo.config["models"]["tiny_llava_nullu"]) == ["results/models/tiny_llava_nullu"]
    assert demo.builds.model_files(demo.config["models"]["tiny_llava"]) == ["resources/models/tiny_llava"]
    assert demo.builds.model_files(demo.config["models"]["prior"]) == []
    assert demo.partial_images("hico", "crop") == "results/images/hico/crop"
    assert demo.partial_images("hico", "clean") == []
    assert demo.pair_partial_images("hico", "clean", "crop") == ["results/images/hico/crop"]
    assert demo.data.hico_det_boxes == "resources/demo/hico_20160224_det/anno_bbox.mat"
    assert demo.calibration.decision_input("hico", "clean", "tiny_llava", "calibrated") == \
        "results/calibration/hico/clean/tiny_llava/calibrated.json"
    assert demo.calibration.decision_input("hico", "clean", "tiny_llava", "content_free") == "results/images/content_free/hico"
    assert demo.calibration.decision_input("hico", "clean", "tiny_llava", "default") == []
    assert demo.calibration.tables("hico", "clean", "tiny_llava", "calibrated") == [
        "results/benchmark/hico/calibration/yn_obj.parquet", "results/benchmark/hico/calibration/yn_verb.parquet"]
    assert demo.builds.derive_inputs("tiny_llava_pangea") == {
        "base_files": ["resources/models/tiny_llava"],
        "questions": "results/training/tiny_llava_pangea/questions.parquet",
        "train_images": "resources/demo/pangea/Data/Images"}
    assert demo.builds.derive_inputs("tiny_llava_nullu") == {
        "base_files": ["resources/models/tiny_llava"], "anno": "resources/demo/hico_20150920/anno.mat",
        "images": "resources/demo/hico_20150920/images"}


def test_every_log_of_a_rule_with_wildcards_names_them():
    """Two jobs of a rule never share a log: each template holds the wildcards of its rule's output."""
    wildcards = {"predict_suite": {"dataset", "condition", "model", "variant", "shard"},
                 "consistency_part": {"dataset", "reference", "other", "model", "variant"},
                 "attention": {"dataset", "condition", "model"}, "tiny_model": {"family"}}
    for rule, fields in wildcards.items():
        assert {name for _, name, _, _ in string.Formatter().parse(LOGS[rule]) if name} == fields


def test_the_demo_targets_of_rule_all(demo):
    targets = demo.targets
    # 62 + the counts' HTML (2), the report's own pages (2), Figs. 3 and 6 in parts (+1, +2), Fig. 10's 2nd page
    assert len(targets) == len(set(targets)) == 70
    assert targets[0] == "results/metrics/metrics.parquet"  # the end-of-run summary reads it first
    assert {f"results/tables/table{n}.{ext}" for n in (1, 2, 3, 4, 5, 6, 7, 8) for ext in ("parquet", "md", "html")} \
        <= set(targets)
    assert {"results/figures/fig5_ego_exo.png", "results/figures/fig6c_ambiguity.png",
            "results/figures/fig10a_fov.png", "results/figures/fig10b_fov.png",  # 4 models, 2 a page
            "results/figures/fig11_known_object_ap.png", "results/figures/vcd_divergence.png",
            "results/calibration/hico/clean/tiny_llava/calibrated.json", "results/models/tiny_llava_pangea",
            "results/training/tiny_llava_pangea/summary.md", "results/benchmark/charadesego/counts.md",
            "results/benchmark/hico/counts.html", "results/report/landing.html", "results/report/run_facts.html"
            } <= set(targets)


def test_every_figure_and_html_table_of_a_plan_has_its_place_in_the_report(demo, paper):
    for plan in (demo, paper):
        shown = [path for path in plan.targets if path.endswith((".png", ".html")) and not path.endswith("landing.html")]
        assert len(shown) > 25
        for path in shown:
            report_item(path)  # its category, its place in the paper's order, its caption
        # what the end-of-run summary checks the report against: every file it shows, nothing else
        assert sorted(plan.report_files) == sorted([*shown, plan.report_pages["landing"]])


def test_the_demo_metrics_collect_every_part(demo):
    parts = demo.metric_parts
    assert len(parts) == 42 + 17 + 3  # runs, pairs, then object reliance, uncertainty, Known-Object
    assert parts[-3:] == [f"results/metrics/parts/analysis/{a}.parquet"
                          for a in ("object_reliance", "uncertainty", "known_object")]
    assert "results/metrics/parts/hico/clean_vs_crop/random/default.parquet" in parts
    cells = demo.planned_cells
    assert ("hico", "clean_vs_crop", "random", "default", "mc_verb") in cells
    assert ("hico", "clean_vs_crop", "random", "default", "yn_obj") not in cells  # crop asks no YN set
    assert len(cells) == len(set(cells))


def test_the_demo_analyses_read_what_was_run(demo):
    assert demo.attention.parts == ["results/analysis/attention/hico/clean/tiny_llava.parquet",
                                    "results/analysis/attention/hico/clean/tiny_qwen2_vl.parquet"]
    assert set(demo.known_object.runs) == {"clean/tiny_llava/default", "clean/tiny_clip/default"}
    runs = demo.vcd_divergence.runs
    assert {(r["variant"], r["plain_variant"]) for r in runs} == {("vcd_beam", "beam5"), ("sample_vcd", "sample")}
    assert all(r["plain"] in demo.vcd_divergence.predictions for r in runs)
    assert {r["model"] for r in demo.uncertainty.runs} == {"oracle", "tiny_llava", "tiny_llava_nullu",
                                                            "tiny_llava_pangea"}
    assert {tuple(r["predictions"]) for r in demo.fov.runs} == {("clean", "crop")}
    assert demo.reliance.predictions[0] == "results/predictions/hico/yn_obj/clean/always_yes/default.parquet"
    assert demo.figures.pair == ("clean", "saltpepper")


# ---- configs/paper.yaml (on the demo's data) -----------------------------------------------------------------
def test_the_paper_config_plans_the_jobs_of_every_stage(paper):
    assert job_counts(paper) == Counter({
        "predict_suite": 338, "merge_predictions": 113, "ensemble": 10, "metric_part": 123, "consistency_part": 21,
        "calibrate_decision": 0, "derive_model": 2, "training_questions": 1, "attention": 2, "image_condition": 7})
    assert (len(paper.merge_groups), len(paper.ensemble_groups)) == (25, 10)
    scored = {(r.dataset, r.condition, r.model, r.variant) for r in paper.scored}
    assert ("hico", "clean", "qwen2_5_vl_7b", "beam5") in scored
    # Fig. 1's API models, GPT-4 and Gemini-1.5-Flash (Google's OpenAI-compatible endpoint), 100 questions a set
    assert {("hico", "clean", m, "default") for m in ("gpt4_turbo", "gemini_15_flash")} <= scored
    gemini = paper.config["models"]["gemini_15_flash"]
    assert (gemini["backend"], gemini["model"], gemini["sample_questions"]) == ("openai", "gemini-1.5-flash", 100)
    assert gemini["base_url"] == "https://generativelanguage.googleapis.com/v1beta/openai/"
    assert {r.model for r in paper.scored if r.dataset == "charadesego" and r.model in paper.models} == {
        "qwen2_vl_7b", "qwen_vl_chat", "minicpm_llama3_v25"}


def test_the_paper_config_writes_into_its_own_tree(paper):
    assert paper.paths.metrics == "results/paper/metrics/metrics.parquet"
    assert paper.paths.log("metrics") == "logs/paper/metrics.log"
    assert paper.paths.benchmark("predict_suite") == \
        "benchmarks/paper/predict/{dataset}/{condition}/{model}/{variant}/{shard}.tsv"
    assert paper.builds.derived_models == ["results/paper/models/llava15_7b_nullu", "results/paper/models/llava15_7b_pangea"]
    assert paper.config["models"]["llava15_7b_nullu"]["path"] == "results/paper/models/llava15_7b_nullu"
    assert all(path.startswith("results/paper/") for path in paper.targets)


def test_the_paper_figures_draw_each_models_run_of_the_papers_decoding(paper):
    """The paper drew its figures from beam-5 answers (Appendix C): each model's bars are its beam5 run, a model
    that cannot beam-search (Molmo, the API, the prior) its greedy one; Figs. 9, 10 and 12 alike."""
    figures = paper.figures.variants
    assert set(figures) == {"fig1", "fig3a", "fig3b", "fig4b", "fig5", "fig6a", "fig6b", "fig6c"}
    for figure, chosen in figures.items():
        assert chosen["llava15_7b"] == "beam5" and chosen["molmo_7b_d"] == "default", figure
        assert chosen["vote_table3"] == "beam5" and chosen["gpt4_turbo"] == "default", figure
    assert figures["fig1"]["llava15_7b_nullu"] == "beam5" and figures["fig5"]["qwen2_vl_7b"] == "beam5"
    assert paper.uncertainty.figure_variants["llava15_7b"] == "beam5"
    assert paper.uncertainty.figure_variants["instructblip_7b"] == "beam5"
    assert paper.fov.figure_variants["llava15_7b"] == "beam5" and paper.fov.figure_variants["molmo_7b_d"] == "default"


def test_the_figures_variant_where_a_model_lacks_its_runs_and_when_the_config_names_one(demo):
    """The demo runs beam5 under clean on HICO only: its noise pair (Fig. 4(b)), CharadesEgo (Fig. 5) and crops
    (Fig. 10) keep the greedy runs. ``analysis.figures`` names one variant for every model, or one per model."""
    figures = demo.figures.variants
    assert figures["fig1"]["tiny_llava"] == "beam5" and figures["fig1"]["random"] == "default"
    assert figures["fig4b"]["tiny_llava"] == "default" and figures["fig5"]["tiny_llava"] == "default"
    assert demo.fov.figure_variants["tiny_llava"] == "default"
    config = copy.deepcopy(DEMO)
    config["analysis"]["figures"] = {"variant": "sample", "models": {"tiny_llava_pangea": "default"}}
    chosen = plan_of(config).figures.variants["fig1"]
    assert [chosen[m] for m in ("tiny_llava", "tiny_llava_nullu", "tiny_llava_pangea", "random")] == [
        "sample", "beam5", "default", "default"]  # sample where it runs, else the paper's decoding, else greedy
    for figures, error in (({"variant": "beam7"}, r"analysis\.figures\.variant: 'beam7' is not a configured variant"),
                           ({"models": {"random": "beam5"}}, r"analysis\.figures\.models\.random: 'beam5' is not a "
                                                             r"variant it runs"),
                           ({"models": {"nobody": "default"}}, r"analysis\.figures\.models\.nobody")):
        config["analysis"]["figures"] = figures
        with pytest.raises(ValueError, match=error):
            plan_of(config)


# ---- many models, variants and conditions ------------------------------------------------------------------
def _grid_config() -> dict:
    """9 transformers models x 8 variants x 2 conditions, on HICO only, every variant under every condition."""
    config = copy.deepcopy(DEMO)
    config["datasets"] = {"hico": {"root": DEMO["datasets"]["hico"]["root"], "det_root": ""}}
    config["questions"]["sets"] = ["yn_obj", "yn_verb", "mc_obj", "mc_verb"]
    config["conditions"] = {"clean": {"type": "clean"}, "saltpepper": {"type": "saltpepper", "probability": 0.5}}
    tiny = {key: DEMO["models"]["tiny_llava"][key] for key in ("backend", "path", "local_files_only", "device")}
    config["models"] = {f"llava_{i}": dict(tiny) for i in range(9)}
    keep = ["default", "beam5", "vcd_beam", "sample", "sample_vcd", "opera", "verb_prompt", "content_free"]
    config["variants"] = {v: {k: s for k, s in (DEMO["variants"][v] or {}).items()
                              if k not in ("conditions", "datasets", "qsets")} for v in keep}
    config["ensembles"] = {}
    config["analysis"] = {}
    config["metrics"]["error_consistency"] = [["clean", "saltpepper"]]
    return config


def test_nine_models_eight_variants_two_conditions():
    plan = plan_of(_grid_config())
    assert len(plan.scored) == 9 * 8 * 2
    assert job_counts(plan) == Counter({"predict_suite": 144, "merge_predictions": 144, "metric_part": 144,
                                        "consistency_part": 72, "image_condition": 2})
    # one merge rule per (condition, variant): the nine models ask the same four sets
    assert len(plan.merge_groups) == 16 and all(len(g.models) == 9 for g in plan.merge_groups)
    assert plan.merge_groups[0] == Group("hico", "clean", ["yn_obj", "yn_verb", "mc_obj", "mc_verb"],
                                         [f"llava_{i}" for i in range(9)], "default")
    assert len(plan.planned_cells) == (144 + 72) * 4
    assert plan.calibration.decision_input("hico", "saltpepper", "llava_8", "content_free") == "results/images/content_free/hico"
    # no HICO-DET: no image subsets, no Fig. 6, no boxes; no CharadesEgo: no Table 4, no Fig. 5
    assert plan.metric_tags("hico") == [] and plan.data.hico_det_boxes == []
    assert set(plan.figures.files) == {"fig1", "fig3a", "fig3b", "fig4b"}
    assert plan.table_numbers == [1, 2, 3]
    assert plan.targets.count("results/tables/table1.parquet") == 1
    assert Run("hico", "saltpepper", "llava_8", "opera", ("yn_obj", "yn_verb", "mc_obj", "mc_verb")) in plan.scored


def test_wildcard_constraints_match_each_slug_whole():
    plan = plan_of(_grid_config())
    constraints = plan.wildcard_constraints()
    assert re.fullmatch(constraints["variant"], "sample_vcd") and re.fullmatch(constraints["variant"], "sample")
    assert not re.fullmatch(constraints["condition"], "crop")
    assert re.fullmatch(alternatives(["a", "a_b"]), "a_b") and re.fullmatch(alternatives([]), "") is None


# ---- planning decisions (were dry runs of the workflow) ----------------------------------------------------
def test_only_runs_a_backend_can_do_are_planned():
    """A beam variant: planned for the transformers model, not for the blind baselines nor their ensemble, and
    under its conditions and datasets only."""
    config = copy.deepcopy(DEMO)
    config["variants"] = {"default": {}, "beam5": {"decoding": "beam", "paper_name": "beam5",
                                                  "conditions": ["clean"], "datasets": ["hico"]}}
    config["analysis"] = {}
    plan = plan_of(config)
    beam = [run for run in plan.scored if run.variant == "beam5"]
    assert {(run.dataset, run.condition) for run in beam} == {("hico", "clean")}
    assert {run.model for run in beam} == {"tiny_llava", "tiny_llava_nullu", "tiny_llava_pangea"}
    assert {"random", "blind_vote"} <= {run.model for run in plan.scored if run.variant == "default"}


def _without_vcd(config):
    config["variants"] = {slug: entry for slug, entry in config["variants"].items() if (entry or {}).get("vcd") is None}
    for entry in config["models"].values():
        if "variants" in entry:
            entry["variants"] = [v for v in entry["variants"] if v in config["variants"]]
    return config


def test_a_run_without_a_vcd_variant_plans_no_vcd_divergence():
    plan = plan_of(_without_vcd(copy.deepcopy(DEMO)))
    assert plan.vcd_divergence.runs == [] and plan.vcd_divergence.outputs == []
    assert not [path for path in plan.targets if "vcd" in path]


def test_a_vcd_variant_plans_the_vcd_divergence_job():
    config = _without_vcd(copy.deepcopy(DEMO))
    config["variants"]["vcd_check"] = {"vcd": {}}
    for slug, entry in config["models"].items():  # only tiny_llava runs it (and its plain default)
        if slug != "tiny_llava" and "variants" not in entry:
            entry["variants"] = ["default"]  # an explicit variant its backend cannot run would stop the plan
    config["models"]["tiny_llava"]["variants"] = ["default", "vcd_check"]
    plan = plan_of(config)
    assert {(r["model"], r["variant"], r["plain_variant"]) for r in plan.vcd_divergence.runs} == {
        ("tiny_llava", "vcd_check", "default")}
    assert plan.vcd_divergence.outputs == ["results/analysis/vcd_divergence.parquet",
                                           "results/analysis/vcd_divergence.html",
                                           "results/analysis/vcd_kl_hist.parquet", "results/figures/vcd_divergence.png"]


def test_a_question_table_entry_is_planned_without_pangea(tmp_path):
    """derive.questions: the build reads that table (and its images folder); no Pangea questions are built."""
    config = copy.deepcopy(DEMO)
    (tmp_path / "hq.parquet").touch()
    (tmp_path / "hq_images").mkdir()
    config["models"]["tiny_llava_hq"] = {
        "derive": {"method": "lora_finetune", "base": "tiny_llava", "questions": "hq.parquet", "images": "hq_images",
                   "max_steps": 2},
        "paper_method": "HaloQuest", "variants": ["beam5"], "qsets": ["yn_obj"]}
    plan = plan_of(config, workdir=tmp_path)
    assert sorted(plan.derived) == ["tiny_llava_hq", "tiny_llava_nullu", "tiny_llava_pangea"]
    assert plan.builds.pangea_finetunes == ["tiny_llava_pangea"]
    assert plan.builds.derive_inputs("tiny_llava_hq") == {"base_files": ["resources/models/tiny_llava"],
                                                   "questions": "hq.parquet", "train_images": "hq_images"}
    assert plan.builds.derive_identity("tiny_llava_hq") == {}
    assert [(r.condition, r.variant, r.qsets) for r in plan.scored if r.model == "tiny_llava_hq"] == [
        ("clean", "beam5", ("yn_obj",))]


def test_a_threshold_variant_under_a_box_condition_stops_the_plan():
    config = copy.deepcopy(DEMO)
    config["variants"]["calibrated"]["conditions"] = ["clean", "crop"]
    config["conditions"]["crop"]["qsets"] = ["mc_obj", "mc_verb", "yn_obj"]
    with pytest.raises(ValueError, match=r"conditions\.crop\.qsets: model 'tiny_llava' with threshold variant "
                                         r"'calibrated' asks YN sets under 'crop'"):
        plan_of(config)


def test_the_plan_leaves_the_config_as_it_was():
    config = copy.deepcopy(DEMO)
    validate(config, SCHEMA)
    before = copy.deepcopy(config)
    plan = Plan.from_config(config, run_folders("", [], REPO, REPO))
    assert config == before
    assert plan.config["models"]["tiny_llava_nullu"]["path"] == "results/models/tiny_llava_nullu"
    assert "derive" in config["models"]["tiny_llava_nullu"]


def test_a_download_brings_the_data_its_jobs_wait_for():
    config = _grid_config()
    config["datasets"]["hico"] = {"root": "resources/data/hico/hico_20150920", "det_root": ""}
    config["downloads"] = {"hico": {"source": "/somewhere/hico.zip", "archive": "hico.zip"}}
    plan = plan_of(config)
    assert plan.data.hico_anno == plan.data.hico_images == "resources/data/hico.done"
    assert plan.data.hico_root == "resources/data/hico/hico_20150920"  # what the jobs read, once it is there


def test_fill_sets_some_fields_and_keeps_the_others():
    assert fill("a/{dataset}/{qset}.parquet", dataset="hico") == "a/hico/{qset}.parquet"
    assert fill("{shard:03d}/{model}", shard=7) == "007/{model}"
    paths = Paths(run_folders("results/v2", [], REPO, REPO))
    assert paths.metrics == "results/v2/metrics/metrics.parquet" and paths.log("tables") == "logs/v2/tables.log"


def test_a_config_without_charadesego_gives_its_rules_no_input_paths(demo):
    """Without ``datasets.charadesego`` the frame rule's inputs are Snakemake's "no file" (an empty list), not
    an empty path, which Snakemake warns about on every run."""
    config = copy.deepcopy(DEMO)
    del config["datasets"]["charadesego"]
    plan = plan_of(config)
    assert "charadesego" not in plan.datasets
    assert plan.data.charades_csv == [] and plan.data.charades_videos == []
    assert demo.data.charades_csv and demo.data.charades_videos  # the demo's own
