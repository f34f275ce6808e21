"""Question-set invariants, on the demo and on the real anno.mat when present."""

import numpy as np
import pandas as pd
import pytest

from verbmirage.hico import hoi_vocabulary
from verbmirage.io import QUESTIONS, write_table
from verbmirage.questions import (
    QUESTION_SETS,
    ImageLabels,
    QuestionSettings,
    Vocabulary,
    build_question_set,
    build_yn_obj,
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
    per_object = questions.groupby(["image_id", "object"]).answer.value_counts().unstack(fill_value=0)
    assert (per_object["no"] == 2 * per_object["yes"]).all()  # protocol "paired": exactly 1:2 per object


def test_yn_sets_are_exactly_one_to_two(built):
    _, _, frames = built
    for qset in ("yn_obj", "yn_verb", "obj_exist"):
        answers = frames[qset].answer.value_counts()
        assert answers["no"] == 2 * answers["yes"], qset
    per_image = frames["yn_verb"].groupby("image_id").answer.value_counts().unstack(fill_value=0)
    assert (per_image["no"] == 2 * per_image["yes"]).all()
    assert frames["yn_obj"].groupby("image_id").prompt.apply(lambda p: p.is_unique).all()  # no negative twice


def test_obj_exist_is_on_the_verb_sets_images(built):
    _, anno, frames = built
    both = set(frames["yn_obj"].image_id) & set(frames["yn_verb"].image_id)
    asked = set(frames["obj_exist"].image_id)
    assert asked <= both
    # the only images of both left out show no object but a person ("Is there a person?" is never asked)
    objects, labels_of = anno.hois.object.to_numpy(), _image_labels(anno)
    for image_id in both - asked:
        assert set(objects[~np.isnan(labels_of(image_id))]) == {"person"}


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

    def yes(seed, protocol):
        questions = build_question_set(demo_anno, "yn_obj", QuestionSettings(seed=seed, protocol=protocol))
        return set(questions.query("answer == 'yes'").question_id)

    # all_positives: positives do not depend on the seed, only the sampled negatives do; paired: how many do not
    assert yes(0, "all_positives") == yes(1, "all_positives")
    assert len(yes(0, "paired")) == len(yes(1, "paired"))


def test_real_counts_near_the_paper(built):
    """docs/questions.md, "Counts on the real anno.mat": the default protocol (paired), seed 0."""
    source, _, frames = built
    if source != "real":
        pytest.skip("real anno.mat counts")
    counts = question_counts(frames).set_index("qset")
    measured = {q: tuple(counts.loc[q, ["unique_questions", "yes", "no", "images"]]) for q in ("yn_obj", "yn_verb", "obj_exist")}
    assert measured == {
        "yn_obj": (40_749, 13_583, 27_166, 7_611),  # paper: 47K unique YN questions, Yes:No about 1:2
        "yn_verb": (40_731, 13_577, 27_154, 7_611),
        "obj_exist": (22_770, 7_590, 15_180, 7_445),
    }
    assert (counts.loc[["yn_obj", "yn_verb", "obj_exist"], "yes_share"] - 1 / 3).abs().max() < 1e-12
    assert counts.loc["yn_obj", "paper_yes_share"] == pytest.approx(1 / 3)
    mc = counts.loc["mc_obj"]
    assert abs(mc.unique_questions - 16_600) / 16_600 < 0.12  # 14,879: ambiguous HOIs are never negatives
    assert mc.rows == 4 * mc.unique_questions and pd.isna(mc.yes_share)


def test_real_counts_all_positives(real_anno):
    """The former default, kept as ``questions.protocol: all_positives``: every positive, Yes:No about 1:1.5."""
    settings = QuestionSettings(protocol="all_positives")
    frames = {qset: build_question_set(real_anno, qset, settings) for qset in ("yn_obj", "yn_verb")}
    counts = question_counts(frames).set_index("qset")
    assert tuple(counts.loc["yn_obj", ["unique_questions", "yes", "no", "images"]]) == (48_280, 19_145, 29_135, 8_593)
    assert tuple(counts.loc["yn_verb", ["unique_questions", "yes", "no", "images"]]) == (48_195, 19_092, 29_103, 8_593)
    assert counts.loc["yn_obj", "yes_share"] == pytest.approx(19_145 / 48_280)


def _one_image(positives: dict[str, int], negatives_available: dict[str, int]) -> tuple[ImageLabels, Vocabulary]:
    """An image with ``positives[o]`` positive HOIs of object o and ``negatives_available[o]`` absent ones."""
    vocab = Vocabulary.from_hois(hoi_vocabulary())
    chosen, present = set(), set()
    for obj, count in positives.items():
        hois_of = vocab.hois_of_object[obj]
        chosen |= set(hois_of[:count])
        present |= set(hois_of[: count + negatives_available[obj]])
    ambiguous = frozenset(h for obj in positives for h in vocab.hois_of_object[obj]) - present
    return ImageLabels("img", "img.jpg", frozenset(chosen), ambiguous, frozenset(positives)), vocab


def test_paired_protocol_oracle():
    """Per object: p positives, n negatives available, k = 2 -> min(p, n // 2) yes and twice as many no."""
    labels, vocab = _one_image({"horse": 3, "bed": 1, "dog": 1}, {"horse": 4, "bed": 1, "dog": 7})
    cases = {
        "paired": {"horse": (2, 4), "bed": (0, 0), "dog": (1, 2)},
        "all_positives": {"horse": (3, 4), "bed": (1, 1), "dog": (1, 2)},
    }
    for protocol, expected in cases.items():
        drafts = build_yn_obj(labels, vocab, QuestionSettings(protocol=protocol), np.random.default_rng(0))
        got = {o: (sum(d.answer == "yes" and d.object == o for d in drafts), sum(d.answer == "no" and d.object == o for d in drafts))
               for o in expected}
        assert got == expected, protocol
        assert all(d.hoi_id in labels.positives for d in drafts if d.answer == "yes")
        assert not {d.hoi_id for d in drafts if d.answer == "no"} & (labels.positives | labels.ambiguous)


def test_protocol_setting():
    assert QuestionSettings().protocol == "paired"
    assert QuestionSettings.from_config({"protocol": "all_positives", "seed": 3}).protocol == "all_positives"
    with pytest.raises(ValueError, match="questions.protocol: unknown protocol 'balanced'"):
        QuestionSettings(protocol="balanced")


def test_unknown_question_set(demo_anno):
    with pytest.raises(KeyError, match="unknown question set 'yn_objects'"):
        build_question_set(demo_anno, "yn_objects", SETTINGS)
