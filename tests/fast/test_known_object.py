"""Known-Object mAP: the yn_ko question set, AP per HOI (oracles, sklearn, an exact loop), rare sets, intervals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score

from verbmirage.analysis.known_object import (
    _Rankings,
    ap_differences,
    average_precision,
    draw_known_object_figure,
    evaluate_run,
    grouped_average_precision,
    hico_det_rare,
    known_object_job,
    map_label,
    ranking_scores,
)
from verbmirage.analysis.known_object_settings import KnownObjectError, known_object_settings
from verbmirage.data.hico import NO_INTERACTION
from verbmirage.core.io import read_provenance, read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import KNOWN_OBJECT_AP, METRICS, PREDICTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

from conftest import REAL_HICO_DET_JSON
from known_object_reference import ranking_ap, reference_ap_table


# ---- oracles of the notes (section 2) ----------------------------------------------------------------
def test_known_object_oracle():
    ap, ap11 = average_precision([0.9, 0.8, 0.95, 0.7, 0.6], [1, -1, np.nan, 0, 1])
    assert ap11 == pytest.approx((6 * 1 + 5 * 2 / 3) / 11) and round(ap11, 4) == 0.8485
    assert ap == pytest.approx((1 + 2 / 3) / 2)
    # HICO's default setting (object-absent NaN counted as negative) gives 0.5
    assert average_precision([0.9, 0.8, 0.95, 0.7, 0.6], [1, -1, -1, 0, 1]) == pytest.approx((0.5, 0.5))


def test_ties_keep_the_question_order():
    assert average_precision([1, 1, 1], [-1, 1, 1])[1] == pytest.approx(2 / 3)
    assert average_precision([1, 1, 1], [1, 1, -1]) == pytest.approx((1.0, 1.0))
    # non-interpolated with ties in stable order: precision 1/2 and 2/3 at the positives
    assert average_precision([1, 1, 1], [-1, 1, 1])[0] == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_eleven_point_recall_is_compared_exactly():
    """Recall 3/10 must count at t = 0.3 (in floating point 3 * 0.1 > 0.3)."""
    positives = [True] * 3 + [False] * 5 + [True] * 7
    scores = list(range(len(positives), 0, -1))
    assert average_precision(scores, np.where(positives, 1, -1)) == pytest.approx(ranking_ap(scores, positives))


def test_non_interpolated_ap_equals_sklearn_on_random_rankings():
    rng = np.random.default_rng(0)
    groups, positives, scores = [], [], []
    for g in range(40):
        n = int(rng.integers(2, 60))
        groups += [g] * n
        labels = rng.random(n) < rng.uniform(0.05, 0.6)
        labels[0] = True  # every group has a positive
        positives += labels.tolist()
        scores += rng.normal(size=n).tolist()
    groups, positives, scores = np.array(groups), np.array(positives), np.array(scores)
    ranking = _Rankings.build(groups, positives, scores, np.zeros(len(groups), int), 40)
    n, n_pos, ap, ap11 = ranking.average_precisions()
    for g in range(40):
        mine = groups == g
        assert ap[g] == pytest.approx(average_precision_score(positives[mine], scores[mine]), abs=1e-12)
        assert (ap[g], ap11[g]) == pytest.approx(ranking_ap(scores[mine].tolist(), positives[mine].tolist()), abs=1e-12)
        assert n[g] == mine.sum() and n_pos[g] == positives[mine].sum()


def test_group_without_positive_has_no_ap():
    n, n_pos, ap, ap11 = grouped_average_precision(np.array([0, 0, 1, 1]), np.array([True, False, False, False]), 3)
    assert ap[0] == 1.0 and ap11[0] == 1.0
    assert math.isnan(ap[1]) and math.isnan(ap11[1]) and math.isnan(ap[2])
    assert n.tolist() == [2, 2, 0] and n_pos.tolist() == [1, 0, 0]


# ---- scores ------------------------------------------------------------------------------------------------
def _predictions(ids, margins=None, p_yes=None, errors=None) -> pd.DataFrame:
    n = len(ids)
    return pd.DataFrame({"question_id": ids, "raw_answer": "x", "prediction": "yes", "parse_rule": "logits",
                         "p_yes": p_yes if p_yes is not None else [0.5] * n,
                         "yes_margin": margins if margins is not None else [None] * n,
                         "option_probs": [None] * n, "confidence": 0.5, "error": errors or [None] * n})


def test_score_is_the_margin_else_the_logit_of_p_yes_else_last():
    questions = pd.DataFrame({"question_id": ["a", "b", "c", "d", "e"]})
    predictions = _predictions(["a", "b", "c", "d"], margins=[2.0, None, None, 50.0], p_yes=[0.9, 0.75, 1.0, 1.0])
    score, counts = ranking_scores(questions, predictions)
    assert score[:2] == pytest.approx([2.0, math.log(3)])
    assert score[2] == math.inf and score[3] == 50.0 and score[4] == -math.inf  # e: no answer, ranked last
    assert counts == {"yes_margin": 2, "p_yes_fallback": 2, "no_score": 1}
    with pytest.raises(KnownObjectError, match="answer no known question"):
        ranking_scores(questions.head(2), predictions)


def test_saturated_p_yes_ties_but_margins_rank():
    """The notes' reason for yes_margin: P(yes) == 1.0 everywhere ties every row, the margins do not."""
    questions = pd.DataFrame({"question_id": list("abc"), "hoi_id": 7, "image_id": ["i1", "i2", "i3"],
                              "answer": ["no", "yes", "yes"], "verb": "ride", "object": "horse", "rare": False})
    saturated = _predictions(list("abc"), p_yes=[1.0, 1.0, 1.0])
    ranked = _predictions(list("abc"), margins=[30.0, 40.0, 35.0], p_yes=[1.0, 1.0, 1.0])
    keys = {"dataset": "hico", "qset": "yn_ko", "condition": "clean", "model": "m", "variant": "default"}
    tied, _ = evaluate_run(questions, saturated, keys, resamples=0)
    assert tied.ap_voc11.iloc[0] == pytest.approx(2 / 3) and tied.n_tied_scores.iloc[0] == 3
    by_margin, _ = evaluate_run(questions, ranked, keys, resamples=0)
    assert by_margin.ap.iloc[0] == 1.0 and by_margin.n_tied_scores.iloc[0] == 0


def test_the_raw_yes_mass_ranks_where_it_differs_from_the_renormalised_p_yes():
    """P(Yes) over the whole vocabulary and P(yes) renormalised over yes + no rank differently when mass goes
    elsewhere: the setting `score` picks one; a model that stores no yes_mass (CLIP) keeps its margin."""
    questions = pd.DataFrame({"question_id": list("ab"), "hoi_id": 7, "image_id": ["i1", "i2"],
                              "answer": ["no", "yes"], "verb": "ride", "object": "horse", "rare": False})
    # a: yes .30 no .10 (renormalised .75, raw .30); b: yes .40 no .40 (renormalised .50, raw .40)
    predictions = _predictions(list("ab"), margins=[math.log(3), 0.0], p_yes=[0.75, 0.5])
    predictions["yes_mass"] = [0.30, 0.40]
    keys = {"dataset": "hico", "qset": "yn_ko", "condition": "clean", "model": "m", "variant": "default"}
    by_margin, _ = evaluate_run(questions, predictions, keys, resamples=0)
    by_mass, _ = evaluate_run(questions, predictions, keys, resamples=0, score="yes_mass")
    assert by_margin.ap.iloc[0] == 0.5 and by_mass.ap.iloc[0] == 1.0
    score, counts = ranking_scores(questions, predictions.assign(yes_mass=None), "yes_mass")
    assert score.tolist() == pytest.approx([math.log(3), 0.0]) and counts["yes_mass_absent"] == 1
    with pytest.raises(KnownObjectError, match=r"analysis\.known_object\.score: 'raw' is not one of"):
        known_object_settings({"analysis": {"known_object": {"models": ["m"], "reference_model": "m",
                                                              "score": "raw"}},
                               "models": {"m": {}}, "questions": {"sets": ["yn_ko"]}, "conditions": {"clean": {}}})


# ---- one run: AP table, mAP rows, bootstrap ---------------------------------------------------------
def _toy(seed=0, images=30, hois=(3, 5, 8, 11)):
    rng = np.random.default_rng(seed)
    rows, preds = [], []
    for i in range(images):
        for h in hois:
            if rng.random() < 0.8:
                qid = f"{i}-{h}"
                answer = "yes" if rng.random() < 0.3 else "no"
                rows.append({"question_id": qid, "image_id": f"img{i:03d}", "hoi_id": h, "verb": f"v{h}",
                             "object": "horse", "answer": answer, "rare": h == 3})
                preds.append((qid, float(rng.normal() + (answer == "yes"))))
    questions = pd.DataFrame(rows)
    predictions = _predictions([q for q, _ in preds], margins=[s for _, s in preds])
    return questions, predictions


KEYS = {"dataset": "hico", "qset": "yn_ko", "condition": "clean", "model": "m", "variant": "default"}


def test_run_equals_the_exact_loop_and_subsets_average_it():
    questions, predictions = _toy()
    table, metrics = evaluate_run(questions, predictions, KEYS, rare=frozenset({5}), resamples=50, seed=1)
    assert list(table.columns) == KNOWN_OBJECT_AP.names
    expected = reference_ap_table(questions, predictions).set_index("hoi_id")
    mine = table.set_index("hoi_id")
    for column in ("n", "n_pos"):
        assert mine[column].tolist() == expected[column].tolist()
    assert mine.ap.to_numpy() == pytest.approx(expected.ap.to_numpy(), abs=1e-12)
    assert mine.ap_voc11.to_numpy() == pytest.approx(expected.ap_voc11.to_numpy(), abs=1e-12)
    assert mine.rare.tolist() == [h == 5 for h in mine.index]  # the given rare set, not the question flag
    value = metrics.set_index(["subset", "metric"])
    assert value.at[("all", "map"), "value"] == pytest.approx(expected.ap.mean())
    assert value.at[("all", "map_voc11"), "value"] == pytest.approx(expected.ap_voc11.mean())
    assert value.at[("rare", "map"), "value"] == pytest.approx(expected.ap[5])
    assert value.at[("non_rare", "map"), "value"] == pytest.approx(expected.ap.drop(5).mean())
    assert value.n.to_dict() == {("all", "map"): 4, ("all", "map_voc11"): 4, ("rare", "map"): 1,
                                 ("rare", "map_voc11"): 1, ("non_rare", "map"): 3, ("non_rare", "map_voc11"): 3}
    assert (value.ci_low <= value.value + 1e-9).all() and (value.value <= value.ci_high + 1e-9).all()
    assert set(metrics.qset) == {"yn_ko"} and list(metrics.columns) == METRICS.names
    # same seed, same interval; no resamples, no interval
    again = evaluate_run(questions, predictions, KEYS, rare=frozenset({5}), resamples=50, seed=1)[1]
    assert again.ci_low.tolist() == metrics.ci_low.tolist()
    assert evaluate_run(questions, predictions, KEYS, resamples=0)[1].ci_low.isna().all()
    # without a rare set, the question table's flag
    assert evaluate_run(questions, predictions, KEYS, resamples=0)[0].set_index("hoi_id").rare.to_dict() == {
        3: True, 5: False, 8: False, 11: False}


def test_a_resampled_image_counts_its_questions_that_many_times():
    questions, predictions = _toy(images=8)
    score, _ = ranking_scores(questions, predictions)
    images, image = np.unique(questions.image_id, return_inverse=True)
    hois, group = np.unique(questions.hoi_id, return_inverse=True)
    ranking = _Rankings.build(group, questions.answer.eq("yes").to_numpy(), score, image, len(hois))
    counts = np.array([2, 0, 1, 3, 0, 1, 1, 0])
    _, n_pos, ap, ap11 = ranking.resampled(counts).average_precisions()
    # the same thing written out: each question repeated, copies adjacent, in question-table order
    repeated = questions.loc[questions.index.repeat(counts[image])].reset_index(drop=True)
    repeated_scores = np.repeat(score, counts[image])
    for k, hoi in enumerate(hois):
        mine = repeated.hoi_id.eq(hoi).to_numpy()
        expected = ranking_ap(repeated_scores[mine].tolist(), repeated.answer[mine].eq("yes").tolist())
        if n_pos[k]:
            assert (ap[k], ap11[k]) == pytest.approx(expected, abs=1e-12)
        else:
            assert math.isnan(ap[k]) and all(math.isnan(e) for e in expected)


def test_bootstrap_drops_hois_without_a_positive_in_a_replicate():
    """HOI 1's only positive is on one image: replicates without it average the other HOI alone."""
    questions = pd.DataFrame({"question_id": list("abcdef"), "image_id": ["i0", "i1", "i2", "i0", "i1", "i2"],
                              "hoi_id": [1, 1, 1, 2, 2, 2], "answer": ["yes", "no", "no", "yes", "yes", "no"],
                              "verb": "v", "object": "o", "rare": False})
    predictions = _predictions(list("abcdef"), margins=[0.0, 1.0, 2.0, 3.0, 2.0, 1.0])
    _, metrics = evaluate_run(questions, predictions, KEYS, resamples=200, seed=0)
    row = metrics.set_index(["subset", "metric"]).loc[("all", "map")]
    assert not math.isnan(row.ci_low) and row.ci_high == 1.0  # HOI 2 alone (AP 1) in some replicates


# ---- settings -------------------------------------------------------------------------------------
def _config(**block):
    return {"models": {"llava": {"backend": "llava"}, "clip": {"backend": "clip"},
                       "blip": {"backend": "instructblip", "qsets": ["yn_obj"]}},
            "ensembles": {"vote": ["llava", "blip"]},
            "questions": {"sets": ["yn_obj", "yn_ko"]},
            "conditions": {"clean": {"type": "clean"}, "noise": {"type": "saltpepper", "qsets": ["yn_obj"]}},
            "analysis": {"known_object": {"models": ["llava", "clip"], "reference_model": "clip", **block}}}


def test_settings_are_checked_against_the_config():
    settings = known_object_settings(_config())
    assert settings.models == ("llava", "clip") and settings.conditions == ("clean",) and settings.qset == "yn_ko"
    assert known_object_settings({"models": {}}) is None
    problems = {
        "analysis.known_object.models\\[1\\]: 'gpt' is not in models: or ensembles:": {"models": ["llava", "gpt"]},
        "reference_model: 'blip' is not one of": {"reference_model": "blip"},
        "conditions\\[0\\]: 'fog' is not a configured condition": {"conditions": ["fog"]},
        "conditions\\[1\\]: condition 'noise' does not ask yn_ko": {"conditions": ["clean", "noise"]},
        "qset: 'mc_obj' is not one of": {"qset": "mc_obj"},
        # not asked the set: it would silently get no AP
        r"models\[2\]: 'blip' is not asked yn_ko \(models.blip.qsets, or an ensemble member's: \['yn_obj'\]\)":
            {"models": ["llava", "clip", "blip"]},
        r"models\[2\]: 'vote' is not asked yn_ko": {"models": ["llava", "clip", "vote"]},
    }
    for message, block in problems.items():
        with pytest.raises(KnownObjectError, match=message):
            known_object_settings(_config(**block))
    config = _config()
    config["questions"]["sets"] = ["yn_obj"]
    with pytest.raises(KnownObjectError, match="qset: 'yn_ko' is not in questions.sets"):
        known_object_settings(config)


# ---- the question set ------------------------------------------------------------------------------
def test_yn_ko_asks_every_labelled_hoi_of_each_image(demo_anno):
    table = build_question_set(demo_anno, "yn_ko", QuestionSettings())
    labels, hois = demo_anno.labels["test"], demo_anno.hois
    expected = {}
    for name, row in zip(demo_anno.images["test"], labels):
        for h in np.flatnonzero((row == 1) | (row == -1)):
            if hois.verb.iloc[h] != NO_INTERACTION:
                expected[(name.rsplit(".", 1)[0], int(h))] = "yes" if row[h] == 1 else "no"
    assert dict(zip(zip(table.image_id, table.hoi_id.astype(int)), table.answer)) == expected
    assert len(table) == len(expected)
    yn_obj = build_question_set(demo_anno, "yn_obj", QuestionSettings())
    assert set(yn_obj.prompt) <= set(table.prompt)  # the same prompt wording
    images = table.image_id.drop_duplicates().tolist()
    assert images == sorted(images)  # list_test order: ties keep it


@pytest.fixture(scope="module")
def real_yn_ko(real_anno):
    return build_question_set(real_anno, "yn_ko", QuestionSettings())


def test_real_yn_ko_counts(real_anno, real_yn_ko):
    """The notes' real counts: 72,353 questions (19,145 yes / 53,208 no), 520 HOIs, 7,872 ambiguous labels skipped."""
    table = real_yn_ko
    assert len(table) == 72_353
    assert (table.answer == "yes").sum() == 19_145 and (table.answer == "no").sum() == 53_208
    assert table.hoi_id.nunique() == 520 and table.image_id.nunique() == 9_658
    per_hoi = table.groupby("hoi_id")
    assert per_hoi.size().min() == 13 and per_hoi.size().max() == 558
    assert per_hoi.answer.apply(lambda a: (a == "yes").sum()).min() == 5
    labels = real_anno.labels["test"]
    interacting = ~real_anno.hois.verb.eq(NO_INTERACTION).to_numpy()
    assert int((labels[:, interacting] == 0).sum()) == 7_872  # skipped: ambiguous


def test_real_hico_det_rare_list(real_yn_ko):
    if not REAL_HICO_DET_JSON.is_file():
        pytest.skip(f"real HICO-DET instances JSON not present at {REAL_HICO_DET_JSON}")
    rare, definition = hico_det_rare(REAL_HICO_DET_JSON.parent)
    assert len(rare) == 138 and "rare list" in definition
    assert len(rare & set(real_yn_ko.hoi_id.astype(int))) == 132  # the notes: 132 of them asked


def test_demo_hico_det_rare_counts_training_pairs(demo_roots):
    from verbmirage.data.hico import load_hico_det_mat

    rare, definition = hico_det_rare(demo_roots[1])
    pairs = load_hico_det_mat(demo_roots[1]).pairs
    counts = pairs[pairs.split.eq("train") & pairs.human_box.notna()].groupby("hoi_id").size()
    assert rare == {h for h in range(600) if counts.get(h, 0) < 10} and "< 10 training pairs" in definition
    assert 0 < len(rare) < 600


# ---- the job: files in, files out, equal to the exact loop -----------------------------------------
def test_job_writes_tables_equal_to_an_independent_computation(demo_anno, tmp_path):
    questions = build_question_set(demo_anno, "yn_ko", QuestionSettings())
    write_table(questions, tmp_path / "yn_ko.parquet", QUESTIONS)
    rng = np.random.default_rng(3)
    runs = {}
    for model in ("llava", "clip"):
        n = len(questions)
        margins = np.round(rng.normal(size=n), 1)  # rounded: ties happen, and keep the question order
        margins[rng.random(n) < 0.1] = np.nan  # some rows fall back to p_yes
        # logits half a step off the margins' grid: a fallback row never ties with a margin only up to an ulp
        # (numpy's AVX-512 log and Python's math.log differ there, and would break such a tie either way)
        p_yes = 1 / (1 + np.exp(-(np.round(rng.normal(size=n), 1) + 0.05)))
        errors = [("boom" if e else None) for e in rng.random(n) < 0.02]
        p_yes[[e is not None for e in errors]] = np.nan
        frame = _predictions(questions.question_id.tolist(), margins=margins, p_yes=p_yes, errors=errors)
        write_table(frame, tmp_path / f"{model}.parquet", PREDICTIONS)
        runs[f"clean/{model}/default"] = tmp_path / f"{model}.parquet"
    settings = {"qset": "yn_ko", "bootstrap_resamples": 20, "seed": 0, "confidence_level": 0.95}
    known_object_job(tmp_path / "yn_ko.parquet", runs, tmp_path / "ap.parquet", tmp_path / "map.parquet", settings)
    table = read_table(tmp_path / "ap.parquet", KNOWN_OBJECT_AP)
    metrics = read_table(tmp_path / "map.parquet", METRICS)
    assert read_provenance(tmp_path / "ap.parquet")["rare_definition"].startswith("question table")
    for model in ("llava", "clip"):
        mine = table[table.model.eq(model)].set_index("hoi_id").sort_index()
        expected = reference_ap_table(questions, read_table(runs[f"clean/{model}/default"], PREDICTIONS))
        expected = expected.set_index("hoi_id")
        assert mine.index.tolist() == expected.index.tolist() == sorted(questions.hoi_id.unique())
        assert (mine.n.tolist(), mine.n_pos.tolist()) == (expected.n.tolist(), expected.n_pos.tolist())
        finite = expected.n_pos > 0
        assert mine.ap[finite].to_numpy() == pytest.approx(expected.ap[finite].to_numpy(), abs=1e-12)
        assert mine.ap_voc11[finite].to_numpy() == pytest.approx(expected.ap_voc11[finite].to_numpy(), abs=1e-12)
        assert mine.n_tied_scores.sum() > 0
        row = metrics[metrics.model.eq(model) & metrics.subset.eq("all")].set_index("metric")
        assert row.at["map", "value"] == pytest.approx(expected.ap[finite].mean())
        assert row.at["map_voc11", "value"] == pytest.approx(expected.ap_voc11[finite].mean())
        assert row.at["map", "n"] == finite.sum()
    # Fig. 11 from the two tables
    delta = ap_differences(table, "llava", "clip", "clean", "default")
    assert delta.delta.is_monotonic_decreasing
    assert delta.delta.to_numpy() == pytest.approx((delta.model - delta.reference).to_numpy())
    figure = tmp_path / "fig11.png"
    draw_known_object_figure(table, metrics, "clip", figure, paper_names={"llava": "LLaVA-1.5-7B"},
                             notes={"llava": "random weights"})
    assert figure.stat().st_size > 10_000
    # the paper's mAP only beside a model whose paper_name it measured (not by backend: a zero-shot CLIP is not
    # the paper's HICO-finetuned one)
    assert map_label("llava", 0.3493, "LLaVA-1.5-7B") == "llava 34.93 (paper LLaVA-1.5-7B: 68.41)"
    assert map_label("clip_l14", 0.398) == "clip_l14 39.80"
    assert map_label("clip_l14", 0.398, "CLIP (HICO-finetuned)").endswith("(paper CLIP (HICO-finetuned): 60.45)")


def test_paper_config_runs_fig11():
    """configs/paper.yaml runs Fig. 11: LLaVA-1.5-7B and the CLIP reference ask yn_ko (no other model does)."""
    import yaml
    from snakemake.utils import validate

    from verbmirage.workflow.config import check_config
    from verbmirage.models.entries import model_question_sets

    repo = Path(__file__).resolve().parents[2]
    schema = str(repo / "schemas" / "config.schema.yaml")
    paper = yaml.safe_load((repo / "configs" / "paper.yaml").read_text())
    validate(paper, schema)
    paper["datasets"] = yaml.safe_load((repo / "config.yaml").read_text())["datasets"]  # the real data is not here
    check_config(paper, repo)
    settings = known_object_settings(paper)
    assert settings.models == ("llava15_7b", "clip_l14") and settings.reference_model == "clip_l14"
    assert settings.figure_metric == "map_voc11" and settings.seed == 0 and settings.score == "margin"  # defaults
    asking = {slug for slug in paper["models"] if "yn_ko" in (model_question_sets(paper, slug) or {"yn_ko"})}
    assert asking == {"llava15_7b", "clip_l14"}
    assert "yn_ko" not in paper["variants"]["beam5"]["qsets"]
    demo = yaml.safe_load((repo / "config.yaml").read_text())
    validate(demo, schema)
    assert known_object_settings(demo).reference_model == "tiny_clip"
