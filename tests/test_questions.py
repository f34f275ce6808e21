"""Question-set invariants, on the demo and on the real anno.mat when present."""

import numpy as np
import pytest

from verbmirage.io import QUESTIONS, write_table
from verbmirage.questions import (
    QUESTION_SETS,
    QuestionSettings,
    Vocabulary,
    build_question_set,
    question_counts,
    rare_hois,
)

SETTINGS = QuestionSettings()


@pytest.fixture(scope="module", params=["demo", "real"])
def built(request):
    anno = request.getfixturevalue(f"{request.param}_anno")
    frames = {qset: build_question_set(anno, qset, SETTINGS) for qset in QUESTION_SETS}
    return request.param, anno, frames


def _image_labels(anno):
    index = {name.rsplit(".", 1)[0]: i for i, name in enumerate(anno.images["test"])}
    return lambda image_id: anno.labels["test"][index[image_id]]


def test_yn_obj_invariants(built):
    _, anno, frames = built
    questions, labels_of = frames["yn_obj"], _image_labels(anno)
    hois = anno.hois.set_index("hoi_id")
    for row in questions.itertuples():
        label = labels_of(row.image_id)[row.hoi_id]
        assert hois.at[row.hoi_id, "object"] == row.object and hois.at[row.hoi_id, "verb"] == row.verb
        assert row.verb != "no_interaction"
        # yes: positive; no: object present, HOI absent (neither positive nor ambiguous)
        assert label == (1 if row.answer == "yes" else -1), row
    per_image = questions.groupby(["image_id", "object"]).answer.value_counts().unstack(fill_value=0)
    assert (per_image["no"] <= 2 * per_image["yes"]).all()


def test_yn_verb_negatives_are_absent_from_the_image(built):
    _, anno, frames = built
    verbs, objects = anno.hois.verb.to_numpy(), anno.hois.object.to_numpy()
    labels_of = _image_labels(anno)
    for row in frames["yn_verb"].itertuples():
        labels = labels_of(row.image_id)
        of_verb = verbs == row.verb
        if row.answer == "yes":
            assert (labels[of_verb] == 1).any()
        else:
            assert not np.isin(labels[of_verb], (0, 1)).any(), row
            present = set(objects[~np.isnan(labels)])
            assert present & set(objects[of_verb]), "negative verb not plausible for any present object"
        assert row.prompt.endswith("something?") and row.object is None


@pytest.mark.parametrize("qset", ["mc_obj", "mc_verb"])
def test_mc_groups_rotate_one_correct_option(built, qset):
    _, anno, frames = built
    questions = frames[qset]
    n = SETTINGS.mc_options
    for _, group in questions.groupby("group_id"):
        group = group.sort_values("rotation")
        assert group.rotation.tolist() == list(range(n))
        assert group.image_id.nunique() == 1
        base = list(group.options.iloc[0])
        assert len(set(base)) == n
        correct_text = base[ord(group.answer.iloc[0]) - ord("A")]
        for rotation, (options, answer) in enumerate(zip(group.options, group.answer)):
            assert list(options) == base[rotation:] + base[:rotation]
            assert [o == correct_text for o in options].count(True) == 1
            assert options[ord(answer) - ord("A")] == correct_text
        letters = [ord(a) - ord("A") for a in group.answer]
        assert all((letters[i] - letters[i + 1]) % n == 1 for i in range(n - 1))  # the letter moves


def test_mc_obj_negative_options_are_absent_hois(built):
    _, anno, frames = built
    labels_of = _image_labels(anno)
    hoi_of = {(v, o): h for h, v, o in zip(anno.hois.hoi_id, anno.hois.verb, anno.hois.object)}
    from verbmirage.text import hoi_phrase

    phrase_to_hoi = {hoi_phrase(v, o): h for (v, o), h in hoi_of.items()}
    first = frames["mc_obj"][frames["mc_obj"].rotation == 0]
    for row in first.head(2000).itertuples():
        labels = labels_of(row.image_id)
        for k, option in enumerate(row.options):
            expected = 1 if chr(ord("A") + k) == row.answer else -1
            assert labels[phrase_to_hoi[option]] == expected


def test_obj_exist_invariants(built):
    _, anno, frames = built
    objects = anno.hois.object.to_numpy()
    labels_of = _image_labels(anno)
    questions = frames["obj_exist"]
    assert "person" not in set(questions.object)
    for row in questions.itertuples():
        present = ~np.isnan(labels_of(row.image_id)[objects == row.object])
        assert present.all() if row.answer == "yes" else not present.any()


def test_ids_unique_and_tags(built):
    _, anno, frames = built
    vocab = Vocabulary.from_hois(anno.hois)
    rare = rare_hois(anno.labels["train"], vocab, SETTINGS.rare_threshold)
    for qset, questions in frames.items():
        assert questions.question_id.is_unique
        assert list(questions.columns[: len(QUESTIONS.names)]) == QUESTIONS.names
        with_hoi = questions[questions.hoi_id.notna()]
        assert (with_hoi.rare == with_hoi.hoi_id.astype(int).isin(rare)).all()
        assert (questions.common == questions.verb.isin(SETTINGS.common_verbs)).all()
    assert frames["yn_obj"].rare.any() and not frames["yn_obj"].rare.all()


def test_byte_identical_and_seeded(demo_anno, tmp_path):
    first = build_question_set(demo_anno, "mc_obj", SETTINGS)
    second = build_question_set(demo_anno, "mc_obj", SETTINGS)
    write_table(first, tmp_path / "a.parquet", QUESTIONS, provenance={"seed": 0})
    write_table(second, tmp_path / "b.parquet", QUESTIONS, provenance={"seed": 0})
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    other = build_question_set(demo_anno, "mc_obj", QuestionSettings(seed=1))
    assert set(other.question_id) != set(first.question_id)
    # positives do not depend on the seed, only the sampled negatives do
    yes = lambda s: set(build_question_set(demo_anno, "yn_obj", QuestionSettings(seed=s)).query("answer == 'yes'").question_id)
    assert yes(0) == yes(1)


def test_real_counts_near_the_paper(real_anno):
    frames = {qset: build_question_set(real_anno, qset, SETTINGS) for qset in ("yn_obj", "mc_obj")}
    counts = question_counts(frames).set_index("qset")
    yn = counts.loc["yn_obj"]
    assert abs(yn.unique_questions - 47_000) / 47_000 < 0.05  # 48,280
    assert 1.3 < yn["no"] / yn["yes"] < 2.2  # 1:1.52 (paper: "about 1:2")
    mc = counts.loc["mc_obj"]
    assert abs(mc.unique_questions - 16_600) / 16_600 < 0.12  # 14,879: ambiguous HOIs are never negatives
    assert mc.rows == 4 * mc.unique_questions


def test_unknown_question_set(demo_anno):
    with pytest.raises(KeyError, match="unknown question set 'yn_objects'"):
        build_question_set(demo_anno, "yn_objects", SETTINGS)
