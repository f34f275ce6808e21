"""The fast question builder against the slow, obvious one (tests/question_reference.py): same rows, order, ids."""

import json
import os

import pandas as pd
import pytest

from question_reference import reference_question_set

from verbmirage.benchmark import questions
from verbmirage.benchmark.question_sets import QUESTION_SETS
from verbmirage.benchmark.questions import (
    QuestionSettings,
    build_question_set,
    build_question_sets,
)
from verbmirage.benchmark.sampling import _compact_json, content_hash


def _assert_same_table(fast: pd.DataFrame, slow: pd.DataFrame, what: str) -> None:
    assert len(fast) > 0, what
    assert list(fast.columns) == list(slow.columns), what
    assert list(fast.dtypes.astype(str)) == list(slow.dtypes.astype(str)), what
    pd.testing.assert_frame_equal(fast, slow, check_exact=True, obj=what)


@pytest.mark.parametrize("protocol", ["paired", "all_positives"])
def test_every_set_equals_the_reference_on_the_demo(demo_anno, protocol):
    settings = QuestionSettings(protocol=protocol)
    fast = build_question_sets(demo_anno, list(QUESTION_SETS), settings)
    assert list(fast) == list(QUESTION_SETS)
    for qset, table in fast.items():
        _assert_same_table(table, reference_question_set(demo_anno, qset, protocol=protocol), f"{qset} ({protocol})")


def test_other_settings_equal_the_reference(demo_anno):
    settings = QuestionSettings(seed=7, negatives_per_positive=3, mc_options=3, rare_threshold=0.3,
                                common_verbs=("ride",))
    for qset in ("yn_obj", "mc_verb", "obj_exist"):
        slow = reference_question_set(demo_anno, qset, seed=7, k=3, mc_options=3, rare_threshold=0.3,
                                      common_verbs=("ride",))
        _assert_same_table(build_question_set(demo_anno, qset, settings), slow, qset)


def test_real_images_equal_the_reference(real_anno):
    """600 real test images (the real label mix: ambiguous labels, no_interaction, crowded images)."""
    images = set(real_anno.images["test"][::16])
    fast = build_question_sets(real_anno, ["yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist"], QuestionSettings(),
                               images=images)
    for qset, table in fast.items():
        assert table.image_id.nunique() > 300, qset
        _assert_same_table(table, reference_question_set(real_anno, qset, images=images), qset)


def test_one_set_alone_equals_the_same_set_built_with_others(demo_anno):
    together = build_question_sets(demo_anno, ["mc_obj", "yn_verb"], QuestionSettings())
    for qset in ("yn_verb", "mc_obj"):
        _assert_same_table(build_question_set(demo_anno, qset, QuestionSettings()), together[qset], qset)


@pytest.mark.parametrize("workers", [2, 3])
def test_sets_split_over_forked_workers_equal_one_process(demo_anno, monkeypatch, workers):
    """Each image has its own random stream, so any split of the images gives the same tables (shares of one
    image each here, so some shares ask a set nothing)."""
    monkeypatch.setattr(questions, "MIN_IMAGES_PER_WORKER", 1)
    alone = build_question_sets(demo_anno, list(QUESTION_SETS), QuestionSettings())
    split = build_question_sets(demo_anno, list(QUESTION_SETS), QuestionSettings(), workers=workers)
    for qset in QUESTION_SETS:
        _assert_same_table(split[qset], alone[qset], f"{qset} on {workers} workers")


def test_real_images_split_over_workers_equal_the_reference(real_anno, monkeypatch):
    monkeypatch.setattr(questions, "MIN_IMAGES_PER_WORKER", 100)
    images = set(real_anno.images["test"][1::16])
    split = build_question_sets(real_anno, ["yn_obj", "mc_obj", "obj_exist"], QuestionSettings(), images=images,
                                workers=2)
    for qset, table in split.items():
        _assert_same_table(table, reference_question_set(real_anno, qset, images=images), qset)


def test_image_shares_are_contiguous_and_large_enough(monkeypatch):
    monkeypatch.setattr(questions, "MIN_IMAGES_PER_WORKER", 10)
    rows = list(range(35))
    assert questions.image_shares(rows, 1) == [rows]
    shares = questions.image_shares(rows, 8)  # at most 35 // 10 shares of at least 10 images
    assert [len(share) for share in shares] == [12, 11, 12]
    assert sum(shares, []) == rows
    assert questions.image_shares(rows[:19], 4) == [rows[:19]]
    with pytest.raises(ValueError, match="workers must be at least 1"):
        questions.image_shares(rows, 0)


def test_a_forked_worker_s_error_reaches_the_caller(demo_anno, monkeypatch):
    monkeypatch.setattr(questions, "MIN_IMAGES_PER_WORKER", 1)
    real_build, caller = questions.BUILDERS["yn_obj"], os.getpid()

    def fails_in_a_forked_worker(labels, *args):
        if os.getpid() != caller:
            raise RuntimeError(f"cannot draft {labels.image_id} in a worker")
        return real_build(labels, *args)

    monkeypatch.setitem(questions.BUILDERS, "yn_obj", fails_in_a_forked_worker)
    with pytest.raises(RuntimeError, match="cannot draft .* in a worker"):
        build_question_sets(demo_anno, ["yn_obj"], QuestionSettings(), workers=2)


def test_unknown_set_is_named():
    with pytest.raises(KeyError, match="unknown question set 'yn_nothing'"):
        build_question_sets(None, ["yn_obj", "yn_nothing"], QuestionSettings())


@pytest.mark.parametrize("value", [
    ("hico", "yn_obj", "images/test2015/HICO_test2015_00000001.jpg", "Is someone riding a horse?", [], "yes"),
    ("hico", "mc_obj", "x.jpg", "Which?\nA. riding\nB. \"quoted\" \\ back", ["a", "b\u00e9", "\u2603"], "A"),
    ("charadesego", "mc_exo", "f.jpg", "Opening a door", ("Laughing", ("nested", ["deeper", 3])), "B"),
    ("s", 0, -12, 10**20, None, True, False, 1.5, float("nan"), {"b": 1, "a": [None]}, [], ()),
    ("tab\tnewline\n\u0000control", "emoji \U0001F600", ""),
])
def test_compact_json_is_json_dumps(value):
    assert _compact_json(value) == json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def test_content_hash_is_stable():
    # ids written by the builder before the fast encoding: a change would renumber every question of every run
    assert content_hash("hico", "yn_obj", "images/test2015/a.jpg", "Is someone riding a horse?", [], "yes") == (
        "5d62da9bd4b7da98")
    assert content_hash("hico", "mc_obj", "images/test2015/a.jpg", "riding a horse",
                        ("feeding a horse", "riding a horse")) == "98f7c92d26925d76"


def test_label_check_names_the_bad_cell(demo_roots, tmp_path):
    """The fast label check of load_hico still names a value that is not 1, 0, -1 or NaN (and passes -0.0)."""
    import scipy.io

    from verbmirage.data.hico import AnnotationFormatError, load_hico

    mat = scipy.io.loadmat(demo_roots[0] / "anno.mat")
    root = tmp_path / "hico"
    root.mkdir()
    mat["anno_test"] = mat["anno_test"].astype(float)
    mat["anno_test"][4, 1] = -0.0
    scipy.io.savemat(root / "anno.mat", {k: v for k, v in mat.items() if not k.startswith("__")})
    assert load_hico(root).labels["test"][1, 4] == 0
    mat["anno_test"][3, 2] = 0.5
    scipy.io.savemat(root / "anno.mat", {k: v for k, v in mat.items() if not k.startswith("__")})
    with pytest.raises(AnnotationFormatError, match=r"anno_test\[3, 2\] = 0.5; labels must be 1, 0, -1 or NaN"):
        load_hico(root)
