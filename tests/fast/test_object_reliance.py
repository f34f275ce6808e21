"""Object reliance (Fig. 15, Tables 6 and 7): attribution, the notes' oracles, NaN cases, tables, figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, jaccard_score, recall_score

from verbmirage.analysis.object_reliance import (
    IOU_METRIC,
    OVERLAP_METRIC,
    PAPER_FIG15,
    PAPER_TABLE6,
    PAPER_TABLE7,
    attribute_objects,
    draw_fig15,
    iou_matrix,
    model_reliance,
    object_deltas,
    object_reliance,
    overlap_index,
    per_object,
    set_iou,
    table6,
    table7,
    table_pages,
    verb_influence,
    yes_no_units,
)
from verbmirage.analysis.object_reliance_settings import RelianceError, RelianceSettings, reliance_plan
from verbmirage.data.hico import HicoAnnotations, hoi_vocabulary
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import OBJECT_RELIANCE, RELIANCE_TABLE6, RELIANCE_TABLE7, VERB_INFLUENCE

PAPER_TABLES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "paper_tables.csv"
HOIS = hoi_vocabulary()
KEYS = {"dataset": "hico", "condition": "clean", "variant": "default"}


def hoi(verb: str, obj: str) -> int:
    return int(HOIS.hoi_id[(HOIS.verb == verb) & (HOIS.object == obj)].iloc[0])


def make_anno(images: dict[str, dict[tuple[str, str], float]]) -> HicoAnnotations:
    """Test labels by hand: image stem -> {(verb, object): 1 | 0 | -1}; every other label NaN (object absent)."""
    labels = np.full((len(images), len(HOIS)), np.nan)
    for row, entries in enumerate(images.values()):
        for (verb, obj), value in entries.items():
            labels[row, hoi(verb, obj)] = value
    return HicoAnnotations(
        root=Path("."), hois=HOIS.assign(verb_ing=HOIS.verb),
        labels={"test": labels, "train": np.full((0, len(HOIS)), np.nan)},
        images={"test": [f"{name}.jpg" for name in images], "train": []},
    )


def question(qid, qset, image, verb, obj=None, answer="yes", group=None, rotation=0):
    return {"question_id": qid, "qset": qset, "image_id": image, "image": f"images/test2015/{image}.jpg",
            "verb": verb, "object": obj, "answer": answer, "group_id": group or qid, "rotation": rotation,
            "rare": False, "common": False}


# ---- attribution ---------------------------------------------------------------------------------------------
ANNO = make_anno({
    # a person riding and holding a bicycle, holding a cup; a dog is present (not fed), a kite absent
    "img1": {("ride", "bicycle"): 1, ("hold", "bicycle"): 1, ("hold", "cup"): 1, ("feed", "dog"): -1,
             ("wash", "bicycle"): -1},
    "img2": {("ride", "horse"): 1, ("feed", "horse"): 0, ("walk", "dog"): -1},
})


def test_attribution_follows_the_notes():
    questions = pd.DataFrame([
        question("a", "yn_obj", "img1", "ride", "bicycle"),
        question("b", "yn_verb", "img1", "hold"),            # yes: the objects held there
        question("c", "yn_verb", "img1", "feed", answer="no"),  # no: present objects that can be fed
        question("d", "yn_verb", "img1", "wash", answer="no"),
        question("e", "mc_verb", "img2", "ride", answer="B"),   # the correct verb's positive objects
        question("f", "mc_obj", "img2", "ride", "horse", answer="A"),
        question("g", "yn_verb", "img2", "walk", answer="no"),
    ])
    refs = dict(zip(questions.question_id, attribute_objects(questions, ANNO).ref_objects))
    assert refs["a"] == ["bicycle"] and refs["f"] == ["horse"]
    assert refs["b"] == ["bicycle", "cup"]
    # feed: dog is present and (feed, dog) is an HOI; cup/bicycle are present but not feedable
    assert refs["c"] == ["dog"]
    # wash: bicycle, cup and dog are all washable and present
    assert refs["d"] == ["bicycle", "cup", "dog"]
    assert refs["e"] == ["horse"]
    # img2's present objects are horse (positive + ambiguous) and dog (negative); both can be walked
    assert refs["g"] == ["dog", "horse"]


def test_a_question_the_labels_cannot_explain_is_named():
    done_elsewhere = pd.DataFrame([question("x1", "yn_verb", "img2", "hold")])  # nobody holds anything in img2
    with pytest.raises(RelianceError, match=r"row 0 \(question x1.*'hold'.*anno.mat"):
        attribute_objects(done_elsewhere, ANNO, where="yn_verb.parquet")
    unknown_image = pd.DataFrame([question("x2", "mc_verb", "img9", "ride", answer="A")])
    with pytest.raises(RelianceError, match="image 'img9' is not in the HICO test labels"):
        attribute_objects(unknown_image, ANNO)
    with pytest.raises(RelianceError, match="obj_exist"):
        attribute_objects(pd.DataFrame([question("x3", "obj_exist", "img1", None, "dog")]), ANNO)


# ---- the notes' oracles ---------------------------------------------------------------------------------------
def units(objects_and_correct):
    return pd.DataFrame({"ref_objects": [list(o) for o, _ in objects_and_correct],
                         "correct": [c for _, c in objects_and_correct]})


def test_oracle_bicycle_is_in_s1():
    with_object = per_object(units([(["bicycle"], k < 8) for k in range(10)]))
    without = per_object(units([(["bicycle"], k < 6) for k in range(10)]))
    deltas = object_deltas(with_object, without, RelianceSettings())
    row = deltas.set_index("object").loc["bicycle"]
    assert (row.n_obj, row.n_verb) == (10, 10)
    assert row.acc_obj == pytest.approx(0.8) and row.acc_verb == pytest.approx(0.6)
    assert row.delta == pytest.approx(0.2) and row.in_set


def test_oracle_overlap_index_and_iou():
    assert overlap_index({"bicycle", "cup", "horse"}, {"cup", "horse", "kite", "dog"}) == pytest.approx(2 / 3)
    assert set_iou({"ride", "hold", "eat"}, {"hold", "eat", "cut"}) == pytest.approx(0.5)


def yn_units(verb, n, yes, answer="yes"):
    return pd.DataFrame({"verb": [verb] * n, "answer": [answer] * n, "said_yes": [k < yes for k in range(n)]})


def test_oracle_ride_is_influenced():
    table = verb_influence(yn_units("ride", 10, 9), yn_units("ride", 10, 8), RelianceSettings())
    row = table.set_index("verb").loc["ride"]
    assert row.yes_obj == pytest.approx(0.9) and row.yes_verb == pytest.approx(0.8)
    assert row.delta == pytest.approx(0.1) and row.influenced


# ---- thresholds and NaN ---------------------------------------------------------------------------------------
def test_min_questions_tau_and_ties():
    settings = RelianceSettings(min_questions=10)
    with_object = per_object(units([(["cup"], True)] * 9 + [(["dog"], k < 5) for k in range(10)]))
    without = per_object(units([(["cup"], False)] * 10 + [(["dog"], k < 5) for k in range(10)]
                               + [(["kite"], True)] * 12))
    deltas = object_deltas(with_object, without, settings).set_index("object")
    assert math.isnan(deltas.loc["cup", "delta"]) and not deltas.loc["cup", "in_set"]  # 9 < 10 questions
    assert deltas.loc["dog", "delta"] == 0 and not deltas.loc["dog", "in_set"]  # Δ > τ_obj = 0 is strict
    assert deltas.loc["kite", "n_obj"] == 0 and math.isnan(deltas.loc["kite", "acc_obj"])
    assert object_deltas(with_object, without, RelianceSettings(min_questions=9)).set_index("object").loc[
        "cup", "in_set"]


def test_direction_and_answers_choose_the_influenced_verbs():
    yn_obj = pd.concat([yn_units("ride", 10, 9), yn_units("hold", 10, 2), yn_units("eat", 10, 5, answer="no")])
    yn_verb = pd.concat([yn_units("ride", 10, 5), yn_units("hold", 10, 6), yn_units("eat", 10, 0, answer="no")])
    chosen = {
        direction: set(verb_influence(yn_obj, yn_verb, RelianceSettings(direction=direction)).query("influenced").verb)
        for direction in ("abs", "pos", "neg")
    }
    assert chosen == {"abs": {"ride", "hold", "eat"}, "pos": {"ride", "eat"}, "neg": {"hold"}}
    only_no = verb_influence(yn_obj, yn_verb, RelianceSettings(answers="no"))
    assert set(only_no.query("influenced").verb) == {"eat"}
    assert "ride" not in set(only_no.verb)  # no "no" question asks about ride
    assert set(verb_influence(yn_obj, yn_verb, RelianceSettings(tau_verb=0.45)).query("influenced").verb) == {"eat"}


def test_empty_sets_give_nan_not_zero_or_one():
    assert math.isnan(overlap_index(set(), {"cup"}))
    assert math.isnan(set_iou(set(), set()))
    assert set_iou(set(), {"ride"}) == 0


def test_settings_are_checked_with_the_key_named():
    with pytest.raises(RelianceError, match="analysis.object_reliance.direction"):
        RelianceSettings(direction="up")
    with pytest.raises(RelianceError, match="analysis.object_reliance.min_questions"):
        RelianceSettings(min_questions=0)
    assert RelianceSettings.from_config({"tau_verb": 0.1, "models": ["x"]}).tau_verb == 0.1


# ---- one model end to end, and the independent computation -------------------------------------------------
def build_run(seed: int = 0):
    """Questions over three images with their labels, and two models' seeded answers."""
    anno = make_anno({
        "i1": {("ride", "bicycle"): 1, ("hold", "bicycle"): 1, ("wash", "bicycle"): -1, ("hold", "cup"): 1,
               ("wash", "cup"): -1},
        "i2": {("ride", "horse"): 1, ("feed", "horse"): -1, ("walk", "horse"): -1, ("hold", "cup"): -1},
        "i3": {("hold", "cup"): 1, ("wash", "cup"): -1, ("ride", "bicycle"): -1, ("hold", "bicycle"): 1},
    })
    rows = {q: [] for q in ("yn_obj", "yn_verb", "mc_obj", "mc_verb")}
    for image, positives in (("i1", [("ride", "bicycle"), ("hold", "bicycle"), ("hold", "cup")]),
                             ("i2", [("ride", "horse")]), ("i3", [("hold", "cup"), ("hold", "bicycle")])):
        for repeat in range(4):
            for verb, obj in positives:
                rows["yn_obj"].append(question(f"{image}o{repeat}{verb}{obj}", "yn_obj", image, verb, obj))
                rows["yn_obj"].append(question(f"{image}on{repeat}{verb}{obj}", "yn_obj", image, "wash"
                                               if obj != "horse" else "feed", obj, answer="no"))
                group = f"{image}g{repeat}{verb}{obj}"
                for rotation in range(4):
                    rows["mc_obj"].append(question(f"{group}r{rotation}", "mc_obj", image, verb, obj,
                                                   answer="ABCD"[rotation], group=group, rotation=rotation))
            for verb in sorted({v for v, _ in positives}):
                rows["yn_verb"].append(question(f"{image}v{repeat}{verb}", "yn_verb", image, verb))
                negative = "walk" if image == "i2" else "wash"
                rows["yn_verb"].append(question(f"{image}vn{repeat}{verb}", "yn_verb", image, negative, answer="no"))
                group = f"{image}h{repeat}{verb}"
                for rotation in range(4):
                    rows["mc_verb"].append(question(f"{group}r{rotation}", "mc_verb", image, verb,
                                                    answer="ABCD"[rotation], group=group, rotation=rotation))
    questions = {q: pd.DataFrame(r) for q, r in rows.items()}
    rng = np.random.default_rng(seed)
    predictions = {}
    for model in ("m1", "m2"):
        for qset, frame in questions.items():
            if qset.startswith("yn"):
                answer = rng.choice(["yes", "no"], size=len(frame), p=[0.7, 0.3])
            else:  # right on 85% of the rotations, so some groups are circularly right
                answer = np.where(rng.random(len(frame)) < 0.85, frame.answer, rng.choice(list("ABCD"), len(frame)))
            predictions[(model, qset)] = pd.DataFrame({"question_id": frame.question_id, "prediction": answer})
    return anno, questions, predictions


def test_per_object_accuracy_equals_sklearn_on_each_objects_questions():
    anno, questions, predictions = build_run()
    settings = RelianceSettings(min_questions=1)
    objects, _, _ = object_reliance(questions, predictions, anno, ["m1"], settings, KEYS)
    attributed = attribute_objects(questions["yn_verb"], anno)
    joined = attributed.merge(predictions[("m1", "yn_verb")], on="question_id")
    for obj in ("bicycle", "cup", "horse"):
        mine = joined[joined.ref_objects.map(lambda refs, o=obj: o in refs)]
        row = objects[(objects.object == obj) & (objects.qset_pair == "yn")].iloc[0]
        assert row.n_verb == len(mine)
        assert row.acc_verb == pytest.approx(accuracy_score(mine.answer, mine.prediction))
    recall = object_reliance(questions, predictions, anno, ["m1"], RelianceSettings(min_questions=1, metric="recall"),
                             KEYS)[0]
    on_bicycle = joined[joined.ref_objects.map(lambda refs: "bicycle" in refs)]
    row = recall[(recall.object == "bicycle") & (recall.qset_pair == "yn")].iloc[0]
    assert row.acc_verb == pytest.approx(recall_score(on_bicycle.answer, on_bicycle.prediction, pos_label="yes"))
    assert row.n_verb == int((on_bicycle.answer == "yes").sum())


def test_the_iou_metric_row_equals_sklearn_jaccard_of_the_influenced_sets():
    anno, questions, predictions = build_run(seed=3)
    settings = RelianceSettings(min_questions=1, tau_verb=0.1)
    _, verbs, rows = object_reliance(questions, predictions, anno, ["m1", "m2"], settings, KEYS)
    table = verbs.pivot(index="verb", columns="model", values="influenced")
    assert table.m1.any() and table.m2.any() and not table.m1.equals(table.m2)  # a case with something to check
    iou = rows[rows.metric == IOU_METRIC].set_index("model").loc["m1~m2"]
    assert iou.value == pytest.approx(jaccard_score(table.m1, table.m2))
    assert iou.n == int((table.m1 | table.m2).sum()) and iou.qset == "yn"


def test_mc_uses_circular_accuracy_per_group():
    anno, questions, predictions = build_run()
    preds = dict(predictions)
    # m1 answers every mc_obj rotation right except all four of one bicycle group's: 1 of 12 bicycle groups wrong
    mc = questions["mc_obj"]
    right = mc.answer.copy()
    wrong_group = mc.group_id[mc.object == "bicycle"].iloc[0]
    right[mc.group_id == wrong_group] = "Z"
    right[(mc.group_id != wrong_group) & (mc.rotation == 3) & (mc.object == "cup")] = "Z"  # one rotation: all cup groups wrong
    preds[("m1", "mc_obj")] = pd.DataFrame({"question_id": mc.question_id, "prediction": right})
    objects, _ = model_reliance({q: attribute_objects(f, anno) for q, f in questions.items()},
                                {q: preds[("m1", q)] for q in questions}, RelianceSettings(min_questions=1))
    mc_rows = objects[objects.qset_pair == "mc"].set_index("object")
    assert mc_rows.loc["bicycle", "n_obj"] == 12 and mc_rows.loc["bicycle", "acc_obj"] == pytest.approx(11 / 12)
    assert mc_rows.loc["cup", "acc_obj"] == 0


def test_a_constant_yes_model_has_no_influenced_verbs_and_an_undefined_overlap():
    anno, questions, _ = build_run()
    predictions = {}
    for model in ("always_yes", "always_a"):
        for qset, frame in questions.items():
            predictions[(model, qset)] = pd.DataFrame(
                {"question_id": frame.question_id, "prediction": "yes" if qset.startswith("yn") else "A"})
    objects, verbs, rows = object_reliance(questions, predictions, anno, ["always_yes", "always_a"],
                                           RelianceSettings(min_questions=1), KEYS)
    assert not verbs.influenced.any() and (verbs.delta.dropna() == 0).all()
    assert not objects[objects.qset_pair == "mc"].in_set.any()  # circular accuracy 0 with and without
    overlap = rows[rows.metric == OVERLAP_METRIC]
    assert overlap.value.isna().all() and (overlap.n == 0).all()
    iou = rows[rows.metric == IOU_METRIC]
    assert iou.model.tolist() == ["always_yes~always_a"] and iou.value.isna().all()
    # the tables keep NaN (empty cells), never 0 or 100
    assert table6(rows, objects, ["always_yes", "always_a"], KEYS).query("source == 'ours'").overlap_index.isna().all()


def test_missing_predictions_count_as_wrong_and_not_yes():
    frame = pd.DataFrame([question("q1", "yn_obj", "i1", "ride", "bicycle"),
                          question("q2", "yn_obj", "i1", "wash", "bicycle", answer="no")])
    joined = yes_no_units(frame, pd.DataFrame({"question_id": ["q2"], "prediction": ["no"]}))
    assert joined.correct.tolist() == [False, True] and joined.said_yes.tolist() == [False, False]


# ---- metric rows, tables, schemas ------------------------------------------------------------------------------
def test_metric_rows_tables_and_schemas(tmp_path):
    anno, questions, predictions = build_run(seed=1)
    settings = RelianceSettings(min_questions=2, tau_verb=0.1)
    objects, verbs, rows = object_reliance(questions, predictions, anno, ["m1", "m2"], settings, KEYS)
    write_table(objects, tmp_path / "o.parquet", OBJECT_RELIANCE)
    write_table(verbs, tmp_path / "v.parquet", VERB_INFLUENCE)
    from verbmirage.core.schemas import METRICS
    write_table(rows, tmp_path / "m.parquet", METRICS)
    assert set(rows.metric) == {OVERLAP_METRIC, IOU_METRIC}
    assert set(rows[rows.metric == OVERLAP_METRIC].qset) == {"yn+mc"}
    for model in ("m1", "m2"):
        s1 = set(objects.object[(objects.model == model) & (objects.qset_pair == "yn") & objects.in_set])
        s2 = set(objects.object[(objects.model == model) & (objects.qset_pair == "mc") & objects.in_set])
        value = rows[(rows.metric == OVERLAP_METRIC) & (rows.model == model)].value.iloc[0]
        expected = len(s1 & s2) / min(len(s1), len(s2)) if min(len(s1), len(s2)) else float("nan")
        assert value == pytest.approx(expected, nan_ok=True)
    assert rows[rows.metric == OVERLAP_METRIC].value.notna().any()  # a defined index among them

    t6 = table6(rows, objects, ["m1", "m2"], KEYS)
    write_table(t6, tmp_path / "t6.parquet", RELIANCE_TABLE6)
    assert t6.source.tolist() == ["measured", "measured"] + ["paper"] * 4
    ours = t6[t6.source == "measured"].set_index("model")
    for model in ("m1", "m2"):
        value = rows[(rows.metric == OVERLAP_METRIC) & (rows.model == model)].value.iloc[0]
        assert ours.loc[model, "overlap_index"] == pytest.approx(100 * value, nan_ok=True)
    assert t6[t6.source == "paper"].set_index("model").overlap_index.to_dict() == PAPER_TABLE6

    t7 = table7(rows, verbs, ["m1", "m2"], KEYS)
    write_table(t7, tmp_path / "t7.parquet", RELIANCE_TABLE7)
    assert read_table(tmp_path / "t7.parquet", RELIANCE_TABLE7).shape == (1 + len(PAPER_TABLE7), 9)
    pair = t7[t7.source == "measured"].iloc[0]
    value = rows[rows.metric == IOU_METRIC].value.iloc[0]
    assert (pair.model_a, pair.model_b) == ("m1", "m2") and pair.iou == pytest.approx(100 * value, nan_ok=True)
    assert pair.w_a_or_w_b == rows[rows.metric == IOU_METRIC].n.iloc[0]

    paper = iou_matrix(t7, "paper").set_index("IoU")
    assert paper.loc["Qwen-VL-Chat", "LLaVA-1.5-7B"] == paper.loc["LLaVA-1.5-7B", "Qwen-VL-Chat"] == "59.30"
    assert all(paper.loc[m, m] == "–" for m in paper.index)
    markdown, html = table_pages([("pairs", t7), ("paper", iou_matrix(t7, "paper"))], "Table 7")
    assert "59.30" in markdown and "<h3>paper</h3>" in html and html.count("<table") == 2
    assert "<NA>" not in markdown and "nan" not in markdown and "<NA>" not in html  # the paper's set sizes: "–"


@pytest.mark.skipif(not PAPER_TABLES.is_file(), reason="paper_tables.csv not present")
def test_the_paper_numbers_match_paper_tables_csv():
    paper = pd.read_csv(PAPER_TABLES, dtype={"table": str})
    t6 = paper[paper.table == "6"]
    assert dict(zip(t6.model, t6.value)) == PAPER_TABLE6
    assert set(t6.metric) == {OVERLAP_METRIC + "_x100"} and set(t6.qset) == {"yn+mc"}
    t7 = paper[paper.table == "7"]
    assert {tuple(m.split("~")): v for m, v in zip(t7.model, t7.value)} == PAPER_TABLE7
    assert set(t7.metric) == {IOU_METRIC + "_x100"} and set(t7.qset) == {"yn"}
    fig15 = paper[(paper.table == "1") & (paper.model == PAPER_FIG15["model"])].set_index("qset")
    assert fig15.loc["yn_obj"].query("metric == 'accuracy'").value.iloc[0] == PAPER_FIG15["yn_obj_accuracy"]
    assert fig15.loc["yn_verb"].query("metric == 'accuracy'").value.iloc[0] == PAPER_FIG15["yn_verb_accuracy"]


# ---- Fig. 15 ----------------------------------------------------------------------------------------------------
def test_fig15_draws_the_sorted_deltas_of_the_model(tmp_path):
    objects = pd.DataFrame({
        "model": ["m", "m", "m", "m", "other"], "object": ["cup", "dog", "kite", "horse", "cup"],
        "qset_pair": ["yn", "yn", "yn", "mc", "yn"], "n_obj": [10, 40, 10, 10, 10], "n_verb": [10, 40, 10, 10, 10],
        "acc_obj": 0.5, "acc_verb": 0.5, "delta": [-0.1, 0.3, np.nan, 0.9, 0.7], "in_set": False,
    })
    path = tmp_path / "fig15.png"
    figure = draw_fig15(objects, "m", path, overall={"yn_obj": 61.0, "yn_verb": 60.0}, variant="default")
    axis = figure.axes[0]
    assert [p.get_height() for p in axis.patches] == pytest.approx([30.0, -10.0])
    assert [t.get_text() for t in axis.get_xticklabels()] == ["dog", "cup (n=10/10)"]  # under 30 questions: said
    # ours and the paper's, each with its decoding (the paper's Table 1 is beam search)
    heading = " ".join(figure.get_suptitle().split())  # wrapped to the page
    assert "ours (default) 61.00 / 60.00; paper (mPLUG-Owl2, Table 1: beam5) 62.94 / 62.61" in heading
    assert path.stat().st_size > 1000 and path.with_suffix(".pdf").is_file() and path.with_suffix(".svg").is_file()


# ---- config ---------------------------------------------------------------------------------------------------
CONFIG = {
    "models": {"always_yes": {"backend": "always_yes"}, "prior": {"backend": "prior"},
               "tiny_llava": {"backend": "llava"}},
    "ensembles": {"vote": ["always_yes", "prior", "tiny_llava"]},
    "conditions": {"clean": {"type": "clean"}},
    "variants": {"default": {}},
    "questions": {"sets": ["yn_obj", "yn_verb", "mc_obj", "mc_verb"]},
}


def test_plan_defaults_and_errors():
    assert reliance_plan(CONFIG) is None
    plan = reliance_plan({**CONFIG, "analysis": {"object_reliance": {"min_questions": 3}}})
    assert plan["models"] == ["always_yes", "prior", "tiny_llava"] and plan["figure_model"] == "tiny_llava"
    assert plan["settings"].min_questions == 3 and plan["settings"].tau_verb == 0.05
    assert (plan["condition"], plan["variant"]) == ("clean", "default")
    mplug = {**CONFIG, "models": {**CONFIG["models"], "owl": {"backend": "mplug_owl2"}},
             "analysis": {"object_reliance": {}}}
    assert reliance_plan(mplug)["figure_model"] == "owl"
    baselines = {**CONFIG, "analysis": {"object_reliance": {"models": ["prior", "vote"]}}}
    assert reliance_plan(baselines)["figure_model"] == "prior"
    for block, message in (
        ({"models": ["nope"]}, r"models\[0\]: 'nope'"),
        ({"condition": "saltpepper"}, "condition: 'saltpepper'"),
        ({"figure_model": "vote", "models": ["prior"]}, "figure_model: 'vote'"),
        ({"answers": "maybe"}, "answers"),
    ):
        with pytest.raises(RelianceError, match=message):
            reliance_plan({**CONFIG, "analysis": {"object_reliance": block}})
    noisy = {**CONFIG, "conditions": {**CONFIG["conditions"], "noise": {"type": "saltpepper", "qsets": ["yn_verb"]}},
             "analysis": {"object_reliance": {"condition": "noise"}}}
    with pytest.raises(RelianceError, match=r"'noise' does not ask \['yn_obj', 'mc_obj', 'mc_verb'\]"):
        reliance_plan(noisy)
    fewer_sets = {**CONFIG, "questions": {"sets": ["yn_obj", "yn_verb"]}, "analysis": {"object_reliance": {}}}
    with pytest.raises(RelianceError, match=r"\['mc_obj', 'mc_verb'\] in questions.sets"):
        reliance_plan(fewer_sets)


def test_models_must_answer_all_four_sets_and_run_the_variant():
    """Checked when the run is planned: otherwise Snakemake stops on a missing predictions file."""
    config = {**CONFIG, "variants": {"default": {}, "beam5": {"decoding": "beam", "num_beams": 5}},
              "models": {**CONFIG["models"], "clip": {"backend": "clip", "qsets": ["yn_obj", "yn_verb"]},
                         "owl": {"backend": "mplug_owl2"}}}
    default = reliance_plan({**config, "analysis": {"object_reliance": {}}})
    assert default["models"] == ["always_yes", "prior", "tiny_llava", "owl"]  # clip skips the MC sets
    beam = reliance_plan({**config, "analysis": {"object_reliance": {"variant": "beam5"}}})
    assert beam["models"] == ["tiny_llava", "owl"]  # the blind baselines do not beam-search; mPLUG-Owl2's code does
    config["models"]["owl"] = {"backend": "molmo"}  # Molmo's cannot
    assert reliance_plan({**config, "analysis": {"object_reliance": {"variant": "beam5"}}})["models"] == ["tiny_llava"]
    for block, message in (
        ({"models": ["tiny_llava", "clip"]}, r"models\[1\]: 'clip' does not answer \['mc_obj', 'mc_verb'\]"),
        ({"models": ["prior"], "variant": "beam5"},
         r"models\[0\]: 'prior' does not run variant 'beam5' \(analysis.object_reliance.variant; it runs \['default'\]\)"),
        ({"models": ["vote"], "variant": "beam5"}, r"models\[0\]: 'vote' does not run variant 'beam5'"),
    ):
        with pytest.raises(RelianceError, match=message):
            reliance_plan({**config, "analysis": {"object_reliance": block}})
    blind = {**config, "models": {"prior": {"backend": "prior"}}, "ensembles": {}}
    with pytest.raises(RelianceError, match=r"no model to analyse \(none answers all of .* runs variant 'beam5'\)"):
        reliance_plan({**blind, "analysis": {"object_reliance": {"variant": "beam5"}}})


# ---- real HICO --------------------------------------------------------------------------------------------------
def test_every_real_verb_question_has_an_attribution(real_anno):
    """On the real anno.mat (a sample of the built sets): every yn_verb / mc_verb question names ≥ 1 object."""
    from verbmirage.benchmark.questions import QuestionSettings, build_question_set

    anno = HicoAnnotations(root=real_anno.root, hois=real_anno.hois,
                           labels={"test": real_anno.labels["test"][:600], "train": real_anno.labels["train"]},
                           images={"test": real_anno.images["test"][:600], "train": real_anno.images["train"]})
    for qset in ("yn_verb", "mc_verb"):
        built = build_question_set(anno, qset, QuestionSettings())
        refs = attribute_objects(built, anno).ref_objects
        assert refs.map(len).min() >= 1
        if qset == "yn_verb":
            # a "no" verb was drawn because a present object makes it plausible
            assert refs[built.answer == "no"].map(len).mean() >= 1
