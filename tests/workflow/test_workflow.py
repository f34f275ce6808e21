"""The demo end to end through the Snakemake API, then the incremental re-runs (dry runs)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest
import yaml
from workflow_run import REPO, planned_jobs, write_config

from verbmirage.core.io import read_provenance, read_table
from verbmirage.core.schemas import METRICS

pytestmark = pytest.mark.slow


def test_demo_produces_metrics_and_tables(demo_run):
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    assert list(metrics.columns) == METRICS.names
    assert set(metrics.model[~metrics.model.str.contains("~")]) == {
        "always_yes", "random", "prior", "oracle", "tiny_llava", "tiny_llava_nullu", "tiny_llava_pangea", "tiny_clip",
        "blind_vote"}  # a~b: Table 7 pairs
    assert set(metrics.condition) == {"clean", "saltpepper", "crop", "clean_vs_saltpepper", "clean_vs_crop"}
    # crop: single-instance images only, the same questions in its error-consistency pair with clean
    tags = pd.read_parquet(demo_run / "results/benchmark/hico/image_tags.parquet")
    single = set("images/test2015/" + tags.image[tags.single_instance])
    mc_verb = pd.read_parquet(demo_run / "results/benchmark/hico/mc_verb.parquet")
    cropped = pd.read_parquet(demo_run / "results/predictions/hico/mc_verb/crop/prior/default.parquet")
    assert set(cropped.question_id) == set(mc_verb.question_id[mc_verb.image.isin(single)])
    crop_rows = metrics[metrics.condition.isin(["crop", "clean_vs_crop"]) & metrics.qset.eq("mc_verb")]
    assert set(crop_rows.n[crop_rows.subset.eq("all")]) == {cropped.question_id.map(mc_verb.set_index(
        "question_id").group_id).nunique()}  # MC counts circular groups
    # conditions.<slug>.qsets: crop asks the MC sets only, saltpepper four HICO sets and no CharadesEgo set
    asked = metrics[metrics.subset.eq("all")].groupby("condition").qset.agg(set)
    assert asked["crop"] == {"mc_obj", "mc_verb"} and asked["clean_vs_crop"] == {"mc_obj", "mc_verb"}
    assert asked["saltpepper"] == {"yn_obj", "yn_verb", "mc_verb", "obj_exist"}
    # models.<slug>.qsets: the demo's CLIP answers only yn_ko and yn_obj
    clip_tables = {p.parts[-4] for p in (demo_run / "results/predictions").rglob("tiny_clip/default.parquet")}
    assert clip_tables == {"yn_ko", "yn_obj"}
    assert set(metrics.dataset) == {"hico", "charadesego"}
    table4 = pd.read_parquet(demo_run / "results/tables/table4.parquet").set_index("model")
    assert table4.at["always_yes", "ego_recall"] == table4.at["always_yes", "exo_recall"] == 100.0
    ego = pd.read_parquet(demo_run / "results/benchmark/charadesego/yn_ego.parquet")
    exo = pd.read_parquet(demo_run / "results/benchmark/charadesego/yn_exo.parquet")
    assert ego.prompt.tolist() == exo.prompt.tolist() and ego.answer.tolist() == exo.answer.tolist()
    # NaN only where the metric is undefined (docs/analysis.md): kappa with c_exp = 1, a YN ratio whose
    # denominator is 0, confidence statistics of an empty group, an overlap/IoU of empty sets, AP without a
    # positive (accuracy, yes/unknown ratios and MC accuracies always have a denominator)
    undefined = metrics[metrics.value.isna()].metric
    assert undefined.isin({"error_consistency", "precision", "recall", "f1", "precision_no", "recall_no", "f1_no",
                           "conf_mean", "conf_median", "conf_auroc", "influential_object_overlap_index",
                           "influenced_verb_set_iou", "map", "map_voc11"}).all(), sorted(set(undefined))
    assert not metrics[metrics.metric.isin(["accuracy", "circular_accuracy", "unknown_ratio"])].value.isna().any()
    keyed = metrics[metrics.dataset.eq("hico") & metrics.variant.eq("default")].set_index(
        ["qset", "condition", "model", "subset", "metric"], verify_integrity=True)["value"]
    assert pd.isna(keyed[("yn_obj", "clean", "always_yes", "all", "precision_no")])  # never says no
    assert pd.isna(keyed[("yn_obj", "clean", "always_yes", "rare_no", "recall")])  # no yes question there
    assert keyed[("yn_obj", "clean", "always_yes", "rare_no", "f1_no")] == 0.0  # recall_no 0: F1 defined
    # always-yes: recall 1 and accuracy = share of yes questions, computed from the question table
    questions = pd.read_parquet(demo_run / "results/benchmark/hico/yn_obj.parquet")
    row = metrics.set_index(["qset", "condition", "model", "subset", "metric"])["value"]
    assert row[("yn_obj", "clean", "always_yes", "all", "recall")] == 1.0
    assert row[("yn_obj", "clean", "always_yes", "all", "accuracy")] == pytest.approx((questions.answer == "yes").mean())
    for n in (1, 2, 3, 4):
        table = pd.read_parquet(demo_run / f"results/tables/table{n}.parquet")
        assert len(table) >= 1 and (demo_run / f"results/tables/table{n}.md").read_text().startswith("## Table")
    table1 = pd.read_parquet(demo_run / "results/tables/table1.parquet")
    # ours (with intervals) and every row the paper published for Table 1, told apart by `source`
    assert set(table1.source) == {"measured", "paper"} and "yn_obj_acc_ci_low" in table1
    assert set(table1.model[table1.source.eq("paper")]) == {"LLaVA-1.5-7B", "InstructBLIP-7B", "Qwen2-VL-7B",
                                                            "Qwen-VL-Chat", "MiniCPM-Llama3-V2.5", "mPLUG-Owl2",
                                                            "Molmo-7B-D"}
    table1 = table1[table1.source.eq("measured")].set_index("model")
    assert table1.at["always_yes", "yn_obj_recall"] == 100.0
    # the demo's stand-in with signal has the shape of the paper's headline: verbs alone hallucinated far more
    oracle = table1.loc[["oracle"]]
    assert (oracle.yn_obj_acc > oracle.yn_verb_acc + 15).all() and (oracle.mc_obj_acc > oracle.mc_verb_acc + 15).all()
    counts = pd.read_parquet(demo_run / "results/benchmark/hico/counts.parquet")
    assert set(counts.qset) == {"yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist", "yn_ko"}
    provenance = read_provenance(demo_run / "results/predictions/hico/yn_obj/clean/random/default.parquet")
    assert provenance["model"] == {"backend": "random", "seed": 0, "shards": 2}
    assert (demo_run / "logs/predict/hico/clean/random/default/1.log").is_file()
    # one inference job per image shard for all sets: each set's finished answers stay as one hard-linked part
    for shard in (demo_run / "results/shards/hico/clean/random/default").glob("[0-9]"):
        for table in shard.glob("*.parquet"):
            kept = shard.with_name(shard.name + ".parts") / table.stem / "part-000000.parquet"
            assert kept.stat().st_ino == table.stat().st_ino
            assert len(list(kept.parent.glob("part-*.parquet"))) == 1
    # the demo configures HICO-DET boxes: every HICO question set gets the image subsets, CharadesEgo none
    tags = pd.read_parquet(demo_run / "results/benchmark/hico/image_tags.parquet")
    assert len(tags) == 60 and tags.image_id.is_unique
    image_subsets = {"ambiguous", "unambiguous", "amb_size", "amb_crowd", "amb_occlusion", "amb_invisible",
                     "single_instance"}
    asked = metrics.dataset.eq("hico") & metrics.condition.eq("clean") & metrics.qset.isin(set(counts.qset))
    hico_subsets = metrics[asked].groupby("qset").subset  # (analysis rows: pooled or paired qsets, own subsets)
    assert all({"unambiguous", "non_rare", "non_common"} <= set(s) for _, s in hico_subsets)
    assert not image_subsets & set(metrics[metrics.dataset.eq("charadesego")].subset)
    tiny = pd.read_parquet(demo_run / "results/predictions/hico/mc_obj/clean/tiny_llava/default.parquet")
    assert tiny.error.isna().all() and tiny.option_probs.map(len).eq(4).all()
    assert tiny.parse_rule.str.startswith("greedy:").all()  # decoded answers (first token, else the continuation)


def test_a_local_run_serves_its_jobs_from_the_warm_job_server(demo_run):
    """config job_server (on): the server imported once and forked the jobs, model inference included; each
    exited 0 (the run's other assertions check what they wrote)."""
    served = re.findall(r"job pid \d+ tmp\w+\.(\w+)\.py: exit (\d+)", (demo_run / "logs/job_server.log").read_text())
    scripts = {script for script, _ in served}
    assert {"predict_suite", "merge_predictions", "metric_part", "make_tables"} <= scripts, scripts
    assert all(status == "0" for _, status in served)


def test_complete_run_has_nothing_left_to_do(demo_run):
    assert planned_jobs(demo_run) == []


def test_adding_a_model_runs_only_its_jobs(demo_run):
    write_config(demo_run, lambda c: c["models"].update(prior_two={"backend": "prior"}))
    try:
        jobs = planned_jobs(demo_run)
    finally:
        write_config(demo_run)
    # merge and vote rules are generated per (dataset, condition, sets asked): merge_predictions_<n>, ensemble_<n>
    per_rule = Counter(re.sub(r"_\d+$", "", rule) for rule, _ in jobs)
    # One run per (dataset, condition): HICO clean, saltpepper, crop and CharadesEgo clean, each asking all its
    # sets (conditions.*.qsets): one inference job, one merge and one metric job each. Error consistency on
    # HICO only, one job per pair: clean~saltpepper, clean~crop. (prior_two is not in
    # analysis.known_object.models: no known_object job.) The analyses over all models (uncertainty: not for a
    # blind baseline) and the figures rerun as aggregates.
    aggregates = {"metrics", "tables", "mitigation_tables", "all", "fov", "fov_report", "object_reliance",
                  "reliance_report", "paper_figures", "uncertainty", "uncertainty_figures", "report_pages"}
    assert {rule: n for rule, n in per_rule.items() if rule not in aggregates} == {
        "predict_suite": 4, "merge_predictions": 4, "metric_part": 4, "consistency_part": 2}
    assert all(per_rule[rule] == 1 for rule in aggregates & set(per_rule)) and {"metrics", "tables"} <= set(per_rule)
    assert {w["model"] for rule, w in jobs if "model" in w} == {"prior_two"}


def test_changing_a_model_reruns_only_its_jobs(demo_run):
    write_config(demo_run, lambda c: c["models"]["random"].update(seed=7))
    try:
        jobs = planned_jobs(demo_run)
    finally:
        write_config(demo_run)
    predicted = {(w["model"], w["condition"], w["shard"]) for rule, w in jobs if rule == "predict_suite"}
    # the demo splits `random` into two shards; one job per (dataset, condition, shard) asks all its sets
    assert {(m, s) for m, _, s in predicted} == {("random", "0"), ("random", "1")}
    assert len([1 for rule, w in jobs if rule == "predict_suite"]) == 8  # HICO x3 conditions + CharadesEgo, x2
    # its ensemble depends on it; nothing upstream (questions, images) reruns
    assert {w["model"] for rule, w in jobs if rule.startswith("ensemble_")} == {"blind_vote"}
    upstream = {"question_set", "image_condition", "demo_hico", "image_tags", "train_stats", "tiny_model", "demo_charadesego",
                "charades_frames", "charades_question_set", "charades_train_stats"}
    assert not upstream & {rule for rule, _ in jobs}
    assert {w["model"] for rule, w in jobs if rule == "metric_part"} == {"random", "blind_vote"}


def test_resources_and_a_models_variant_list_rerun_nothing_already_answered(demo_run):
    """A shard's runtime raised after a time-out, or a variant added to a model's `variants:` list, keeps every
    finished job (and its saved answers): only the new variant's runs are planned."""
    def edit(config):
        config["models"]["tiny_clip"]["resources"]["runtime"] = 240
        config["models"]["tiny_llava_pangea"]["variants"].append("sample")

    write_config(demo_run, edit)
    try:
        jobs = planned_jobs(demo_run)
    finally:
        write_config(demo_run)
    predicted = {(w["model"], w["variant"]) for rule, w in jobs if rule == "predict_suite"}
    assert predicted == {("tiny_llava_pangea", "sample")}
    assert not {w.get("model") for _, w in jobs} & {"tiny_clip"}


def _prior_on_clean_hico(config):
    """The demo config cut to one model, one question set and one condition on HICO."""
    config["questions"]["sets"] = ["yn_obj"]
    config["models"] = {"prior": {"backend": "prior"}}
    config.update(ensembles={}, conditions={"clean": {"type": "clean"}})
    del config["datasets"]["charadesego"]
    config.pop("analysis", None)  # its models are not configured here
    config["metrics"]["error_consistency"] = []


def test_a_config_file_named_on_the_command_line_replaces_the_demo_config(tmp_path):
    """configs/paper.yaml, or an edited copy of config.yaml, is the whole config: Snakemake would merge it into
    the Snakefile's config.yaml and bring back the demo's models, ensembles and analyses. --config still applies."""
    def edit(config):
        _prior_on_clean_hico(config)
        config["questions"]["sets"] = ["yn_obj", "yn_verb"]

    write_config(tmp_path)  # the demo's config.yaml, where the Snakefile looks for its own
    (tmp_path / "mine").mkdir()
    mine = write_config(tmp_path / "mine", edit)
    jobs = planned_jobs(tmp_path, mine, "--config", "questions={'sets': ['yn_verb']}")
    assert {w["model"] for _, w in jobs if "model" in w} == {"prior"}
    assert {w["condition"] for _, w in jobs if "condition" in w} == {"clean"}
    assert {w["qset"] for _, w in jobs if "qset" in w} == {"yn_verb"}  # --config on top of the named file
    assert not {"known_object", "attention", "vcd_divergence"} & {rule for rule, _ in jobs}


def test_charadesego_videos_from_their_own_folder(tmp_path):
    """datasets.charadesego.videos: the videos outside <root>/CharadesEgo_v1_480, as its own download leaves them."""
    from verbmirage.data.charades import write_demo_charadesego

    root = write_demo_charadesego(tmp_path / "mine" / "charadesego", pairs=3)
    (root / "CharadesEgo_v1_480").rename(tmp_path / "mine" / "videos")
    workdir = tmp_path / "run"
    workdir.mkdir()
    write_config(workdir, lambda c: c["datasets"].update(
        charadesego={"root": str(root), "videos": str(tmp_path / "mine" / "videos")}))
    frames = "results/benchmark/charadesego/frames.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", frames, "--cores", "2", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir), "--configfile", str(workdir / "config.yaml")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = pd.read_parquet(workdir / frames)
    assert len(table) > 0 and table.error.isna().all(), table.error.dropna().head()


def test_dataset_from_a_local_archive(tmp_path):
    """datasets.hico.root inside a configured download: fetch_dataset unpacks it first (in place, no copy).

    A zip, because tar archives are refused on Pythons whose tarfile data filter can be bypassed."""
    import hashlib
    import json
    import zipfile

    from verbmirage.data.demo import DemoSizes, write_demo_hico

    write_demo_hico(tmp_path / "mine" / "hico_20150920", tmp_path / "mine" / "det", DemoSizes(train=60, test=20))
    archive = tmp_path / "hico_20150920.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted((tmp_path / "mine" / "hico_20150920").rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(tmp_path / "mine").as_posix())
    workdir = tmp_path / "run"
    workdir.mkdir()

    def edit(config):
        _prior_on_clean_hico(config)
        config["datasets"]["hico"] = {"root": "resources/data/hico/hico_20150920", "det_root": ""}
        config["downloads"] = {"hico": {"source": str(archive), "archive": "hico_20150920.zip"}}

    write_config(workdir, edit)
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(workdir), "--configfile", str(workdir / "config.yaml")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (workdir / "resources/data/hico/hico_20150920/anno.mat").is_file()
    assert not (workdir / "resources/archives").exists()  # the local archive was read in place
    done = json.loads((workdir / "resources/data/hico.done").read_text())
    assert done["source"] == str(archive) and done["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (workdir / "results/tables/table1.parquet").is_file()


def test_invalid_config_stops_before_any_job(tmp_path):
    write_config(tmp_path, lambda c: c["models"].update(llava={"backend": "llava_next_xl"}))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--snakefile", str(REPO / "Snakefile"),
         "--directory", str(tmp_path), "--configfile", str(tmp_path / "config.yaml")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "models.llava.backend: unknown backend 'llava_next_xl'" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()


def test_the_paper_config_plans_every_analysis_of_the_paper(tmp_path):
    """configs/paper.yaml is the whole paper: Fig. 11, the attention figures, CharadesEgo (Table 4, Fig. 5),
    Table 5's Nullu and Pangea rows and Appendix F's Qwen2.5-VL-7B cell are all planned (on the demo's data
    here: the real data is not on this machine)."""
    paper = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    paper["datasets"] = yaml.safe_load((REPO / "config.yaml").read_text())["datasets"]
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(paper))
    write_config(tmp_path)  # the Snakefile's own config.yaml, replaced by the named file
    jobs = planned_jobs(tmp_path, tmp_path / "paper.yaml")
    rules = {rule for rule, _ in jobs}
    assert {"known_object", "known_object_figure", "attention", "attention_figures", "charades_question_set",
            "mitigation_tables", "derive_model", "training_questions", "object_reliance"} <= rules
    assert {w["model"] for rule, w in jobs if rule == "derive_model"} == {"llava15_7b_nullu", "llava15_7b_pangea"}
    predicted = {(w["dataset"], w["model"], w["variant"]) for rule, w in jobs if rule == "predict_suite"}
    assert ("hico", "qwen2_5_vl_7b", "beam5") in predicted
    assert {m for d, m, v in predicted if d == "charadesego"} == {"qwen2_vl_7b", "qwen_vl_chat", "minicpm_llama3_v25"}
    assert {m for d, m, v in predicted if v == "beam5"} >= {"qwen_vl_chat", "minicpm_llama3_v25", "mplug_owl2"}
    assert {w["model"] for rule, w in jobs if rule == "attention"} == {"llava15_7b", "instructblip_7b"}
