"""HICO-DET loaders (anno_bbox.mat and instances JSON), per-image tags and the image subsets of the metrics.

Hand-checkable cases follow docs/questions.md; the real
counts are checked when the real test instances (and anno.mat) are present.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from conftest import REAL_HICO_DET_JSON
from verbmirage.workflow.config import check_config
from verbmirage.core.errors import ConfigError
from verbmirage.data.hico import (
    AnnotationFormatError,
    HicoAnnotations,
    hoi_vocabulary,
    load_hico_det,
    load_hico_det_json,
    read_hico_det,
)
from verbmirage.benchmark.image_tags import (
    IMAGE_TAGS,
    TAG_COLUMNS,
    TagSettings,
    box_iou,
    cluster_boxes,
    image_tags,
    measure_image,
)
from verbmirage.core.io import read_table, write_table
from verbmirage.evaluation.metrics import BootstrapSettings, attach_tags, evaluate, mc_group_correctness

REPO = Path(__file__).resolve().parents[2]
VOCAB = hoi_vocabulary()


def _hoi(verb: str, obj: str) -> int:
    return int(VOCAB.hoi_id[(VOCAB.verb == verb) & (VOCAB.object == obj)].iloc[0])


# ---- the notes' oracle image (640 x 480) -------------------------------------------------------------
H1, H2, H3 = (101, 101, 200, 300), (103, 99, 202, 301), (151, 101, 250, 300)
O1, O3 = (181, 201, 190, 210), (151, 301, 250, 400)
ORACLE_PAIRS = [("cup", H1, O1), ("cup", H2, O1), ("bicycle", H3, O3)]


def test_oracle_image_from_the_notes():
    assert box_iou(H1, H2) == pytest.approx(0.95, abs=0.01)
    assert box_iou(H1, H3) == pytest.approx(10_000 / 30_000)
    measured = measure_image(ORACLE_PAIRS, 640, 480, False, TagSettings())
    assert measured["n_humans"] == 2 and measured["n_objects"] == 2 and measured["n_pairs"] == 3
    assert not measured["amb_crowd"]
    assert measured["max_human_overlap"] == pytest.approx(10_400 / 20_000)  # h2 vs h3; h1 vs h3 gives 0.50
    assert measured["amb_occlusion"]
    # h1/o1: 20,000 / 100, |ln| = 5.30 (the notes); the maximum is h2/o1: 100 x 203 / 100, |ln| = 5.31
    assert math.log(measured["max_size_ratio"]) == pytest.approx(math.log(20_300 / 100), abs=1e-9)
    assert measured["amb_size"] and measured["ambiguous"] and not measured["amb_invisible"]
    # union of every box: (101, 99, 250, 400) -> 150 x 302 pixels
    assert (measured["union_x1"], measured["union_y1"], measured["union_x2"], measured["union_y2"]) == (
        101, 99, 250, 400)
    assert measured["union_frac"] == pytest.approx(150 * 302 / (640 * 480))
    assert not measured["single_instance"]  # two people


def test_thresholds_come_from_the_settings():
    strict = TagSettings(size_ratio=300, overlap=0.6, min_humans=2)
    measured = measure_image(ORACLE_PAIRS, 640, 480, False, strict)
    assert not measured["amb_size"] and not measured["amb_occlusion"] and measured["amb_crowd"]


def test_single_linkage_chains_boxes():
    # a~b and b~c at IoU >= 0.5, a and c alone below: one person (single linkage), two with a higher merge_iou
    a, b, c = (1, 1, 100, 100), (21, 1, 120, 100), (41, 1, 140, 100)
    assert box_iou(a, b) >= 0.5 and box_iou(b, c) >= 0.5 and box_iou(a, c) < 0.5
    assert cluster_boxes([a, b, c], 0.5) == [0, 0, 0]
    assert len(set(cluster_boxes([a, b, c], 0.7))) == 3


def test_size_ratio_counts_both_directions_and_the_exact_threshold():
    human = (1, 1, 10, 10)  # 100 px
    big_object = (1, 1, 50, 100)  # 5,000 px: ratio exactly 50, object larger than the person
    small_object = (1, 1, 2, 1)  # 2 px: ratio exactly 1/50
    for obj in (big_object, small_object):
        measured = measure_image([("car", human, obj)], 1000, 1000, False, TagSettings())
        assert measured["max_size_ratio"] == pytest.approx(50) and measured["amb_size"]
    measured = measure_image([("car", human, (1, 1, 7, 7))], 1000, 1000, False, TagSettings())
    assert not measured["amb_size"]  # 100 / 49 ~ 2


def test_single_instance_rule():
    person, cup = (101, 101, 200, 300), (181, 201, 190, 210)  # union 100 x 200 of 640 x 480: 6.5%
    two_verbs = [("cup", person, cup), ("cup", (102, 100, 201, 300), cup)]  # one person, one cup, two HOIs
    assert measure_image(two_verbs, 640, 480, False, TagSettings())["single_instance"]
    assert not measure_image(two_verbs, 640, 480, False, TagSettings(single_strict=True))["single_instance"]
    assert measure_image(two_verbs[:1], 640, 480, False, TagSettings(single_strict=True))["single_instance"]
    assert not measure_image(two_verbs, 640, 480, True, TagSettings())["single_instance"]  # an invisible HOI
    assert not measure_image(two_verbs, 640, 480, False, TagSettings(max_union_frac=0.05))["single_instance"]
    two_cups = [("cup", person, cup), ("cup", person, (1, 1, 20, 20))]
    assert not measure_image(two_cups, 640, 480, False, TagSettings())["single_instance"]
    nothing = measure_image([], 640, 480, False, TagSettings())
    assert not nothing["single_instance"] and not nothing["ambiguous"] and math.isnan(nothing["union_frac"])


# ---- the instances JSON loader -----------------------------------------------------------------------
def _instances(annotations: list[dict], names: list[str], sizes: list[list[int]]) -> dict:
    """A file in the exact fredzzhang/hicodet layout (objects/verbs/correspondence from HICO's classes)."""
    objects = sorted(set(VOCAB.object))
    verbs = sorted(set(VOCAB.verb))
    return {
        "annotation": annotations,
        "filenames": names,
        "empty": [i for i, a in enumerate(annotations) if not a["hoi"]],
        "objects": objects,
        "verbs": verbs,
        "correspondence": [[int(h), objects.index(o), verbs.index(v)]
                           for h, v, o in zip(VOCAB.hoi_id, VOCAB.verb, VOCAB.object)],
        "size": sizes,
        "rare": [],
        "non_rare": list(range(600)),
    }


def _pair_entry(pairs: list[tuple[int, tuple, tuple]]) -> dict:
    objects = sorted(set(VOCAB.object))
    return {
        "boxes_h": [list(map(float, h)) for _, h, _ in pairs],
        "boxes_o": [list(map(float, o)) for _, _, o in pairs],
        "hoi": [hoi for hoi, _, _ in pairs],
        "object": [objects.index(VOCAB.object[hoi]) for hoi, _, _ in pairs],
        "verb": [0 for _ in pairs],
    }


HOLD_CUP, DRINK_CUP, RIDE_BIKE = _hoi("hold", "cup"), _hoi("drink_with", "cup"), _hoi("ride", "bicycle")
NAMES = ["HICO_test2015_00000001.jpg", "HICO_test2015_00000002.jpg", "HICO_test2015_00000003.jpg"]


def _write_instances(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "instances_test2015.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def json_root(tmp_path) -> Path:
    annotations = [
        _pair_entry([(HOLD_CUP, H1, O1), (DRINK_CUP, H2, O1), (RIDE_BIKE, H3, O3)]),  # the oracle image
        _pair_entry([(HOLD_CUP, (101, 101, 200, 300), (151, 151, 200, 250))]),  # single instance, ratio 4
        _pair_entry([]),  # only an invisible HOI (an "empty" image)
    ]
    return _write_instances(tmp_path / "det", _instances(annotations, NAMES, [[640, 480], [640, 480], [500, 400]]))


def _anno(names: list[str], positives: dict[int, list[int]]) -> HicoAnnotations:
    labels = np.full((len(names), 600), np.nan)
    for image, hois in positives.items():
        labels[image, hois] = 1
    return HicoAnnotations(root=Path("."), hois=VOCAB, labels={"test": labels}, images={"test": names})


def test_json_loader_reads_pairs_and_sizes(json_root):
    boxes = load_hico_det_json(json_root)
    assert not boxes.lists_invisible
    assert boxes.images.to_dict("list") == {"split": ["test"] * 3, "image": NAMES, "width": [640, 640, 500],
                                            "height": [480, 480, 400]}
    first = boxes.pairs[boxes.pairs.image.eq(NAMES[0])]
    assert first.hoi_id.tolist() == [HOLD_CUP, DRINK_CUP, RIDE_BIKE]
    assert first.human_box.tolist() == [H1, H2, H3] and first.object_box.tolist() == [O1, O1, O3]
    assert len(boxes.pairs) == 4 and boxes.pairs.invis.eq(0).all()
    assert read_hico_det(json_root).source == json_root / "instances_test2015.json"


def test_json_tags_mark_positives_without_pairs_invisible(json_root):
    # image 3 is labelled "ride bicycle" but has no pair: invisible; image 2's positive has its pair
    anno = _anno(NAMES, {0: [HOLD_CUP, DRINK_CUP, RIDE_BIKE], 1: [HOLD_CUP], 2: [RIDE_BIKE]})
    tags = image_tags(read_hico_det(json_root), anno).set_index("image_id")
    assert tags.loc["HICO_test2015_00000001", ["amb_size", "amb_occlusion", "amb_crowd", "amb_invisible"]].tolist() \
        == [True, True, False, False]
    assert tags.loc["HICO_test2015_00000002", "single_instance"] and not tags.loc["HICO_test2015_00000002",
                                                                                   "ambiguous"]
    assert tags.loc["HICO_test2015_00000003", ["amb_invisible", "ambiguous", "n_pairs"]].tolist() == [True, True, 0]
    # a positive without a pair in an image that has other pairs is invisible too
    anno = _anno(NAMES, {1: [HOLD_CUP, DRINK_CUP]})
    assert image_tags(read_hico_det(json_root), anno).amb_invisible.tolist() == [False, True, False]


def test_tags_refuse_images_hico_does_not_list(json_root):
    with pytest.raises(ValueError, match="HICO_test2015_00000003.jpg.*do not belong together"):
        image_tags(read_hico_det(json_root), _anno(NAMES[:2], {}))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["filenames"].__setitem__(1, "../HICO_test2015_00000002.jpg"), r"filenames\[1\]"),
        (lambda d: d["filenames"].__setitem__(1, NAMES[0]), r"filenames\[1\]: duplicate image name"),
        (lambda d: d["annotation"][0]["boxes_h"].__setitem__(2, [1.0, 2.0, 3.0]), r"annotation\[0\].boxes_h\[2\]"),
        (lambda d: d["annotation"][1]["boxes_o"].__setitem__(0, [50.0, 1.0, 10.0, 5.0]), r"x1 > x2"),
        (lambda d: d["annotation"][0]["hoi"].__setitem__(1, 600), r"annotation\[0\].hoi\[1\] = 600"),
        (lambda d: d["annotation"][0]["hoi"].pop(), r"annotation\[0\]: boxes_h \(3\), boxes_o \(3\) and hoi \(2\)"),
        (lambda d: d["size"].__setitem__(2, [500]), r"size\[2\]"),
        (lambda d: d["size"].pop(), r"differ in length"),
        (lambda d: d["correspondence"].__setitem__(5, d["correspondence"][6]), r"correspondence\[5\]"),
        (lambda d: d.pop("annotation"), "missing key 'annotation'"),
    ],
)
def test_json_loader_names_the_bad_entry(json_root, edit, message):
    path = json_root / "instances_test2015.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationFormatError, match=message) as caught:
        load_hico_det_json(json_root)
    assert str(path) in str(caught.value)


def test_read_hico_det_needs_one_of_the_layouts(tmp_path):
    with pytest.raises(FileNotFoundError, match="anno_bbox.mat or instances_test2015.json"):
        read_hico_det(tmp_path)
    (tmp_path / "instances_test2015.json").write_text("{not json")
    with pytest.raises(AnnotationFormatError, match="not a readable JSON"):
        read_hico_det(tmp_path)


# ---- anno_bbox.mat (the demo writes the real layout with scipy.io) ------------------------------------
def test_mat_and_json_layouts_give_the_same_tags(demo_roots, demo_anno, tmp_path):
    """The demo's anno_bbox.mat, rewritten in the JSON layout, measures the same boxes."""
    root, det_root = demo_roots
    from_mat = read_hico_det(det_root)
    assert from_mat.lists_invisible and from_mat.source.name == "anno_bbox.mat"
    assert from_mat.pairs.split.eq("test").all() and len(from_mat.images) == len(demo_anno.images["test"])
    visible = from_mat.pairs[from_mat.pairs.human_box.notna()]
    annotations = [_pair_entry(list(zip(g.hoi_id, g.human_box, g.object_box)))
                   for g in (visible[visible.image.eq(name)] for name in from_mat.images.image)]
    sizes = [[int(w), int(h)] for w, h in zip(from_mat.images.width, from_mat.images.height)]
    json_root = _write_instances(tmp_path / "json", _instances(annotations, list(from_mat.images.image), sizes))
    mat_tags, json_tags = image_tags(from_mat, demo_anno), image_tags(read_hico_det(json_root), demo_anno)
    measured = ["image_id", "width", "height", "n_pairs", "n_humans", "n_objects", "max_size_ratio",
                "max_human_overlap", "union_x1", "union_y1", "union_x2", "union_y2", "union_frac",
                "amb_size", "amb_crowd", "amb_occlusion"]
    pd.testing.assert_frame_equal(mat_tags[measured], json_tags[measured])
    # the mat marks invisible HOIs; the demo has some, and they are the images with an invis=1 row
    invisible = set(from_mat.pairs.image[from_mat.pairs.invis.eq(1)])
    assert invisible and set(mat_tags.image[mat_tags.amb_invisible]) == invisible
    assert mat_tags.single_instance.any() and mat_tags.ambiguous.any() and (~mat_tags.ambiguous).any()
    assert load_hico_det(det_root).split.eq("train").any()  # the old reader still returns both splits


def test_tag_table_round_trips_its_schema(demo_roots, demo_anno, tmp_path):
    tags = image_tags(read_hico_det(demo_roots[1]), demo_anno)
    write_table(tags, tmp_path / "image_tags.parquet", IMAGE_TAGS)
    back = read_table(tmp_path / "image_tags.parquet", IMAGE_TAGS)
    assert list(back.columns) == IMAGE_TAGS.names and len(back) == len(demo_anno.images["test"])
    assert back.image_id.is_unique and all(back[tag].dtype == bool for tag in TAG_COLUMNS)


# ---- the real test instances ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_tags():
    from conftest import REAL_HICO
    from verbmirage.data.hico import load_hico

    if not REAL_HICO_DET_JSON.is_file() or not (REAL_HICO / "anno.mat").is_file():
        pytest.skip("real HICO-DET test instances or HICO anno.mat not present")
    boxes = read_hico_det(REAL_HICO_DET_JSON.parent)
    return boxes, image_tags(boxes, load_hico(REAL_HICO))


def test_real_instances_counts(real_tags):
    boxes, tags = real_tags
    assert len(boxes.images) == 9_658 and len(boxes.pairs) == 33_405 and boxes.pairs.image.nunique() == 9_546
    assert boxes.pairs.human_box.map(min).min() == 1.0  # 1-based boxes
    counts = {tag: int(tags[tag].sum()) for tag in TAG_COLUMNS}
    # the notes' real counts (analyses.md section 1), default thresholds
    assert counts == {"amb_size": 1_042, "amb_crowd": 946, "amb_occlusion": 1_125, "amb_invisible": 221,
                      "ambiguous": 2_341, "single_instance": 1_400}
    assert int((~tags.ambiguous).sum()) == 7_317
    assert int((tags.n_humans >= 3).sum()) == 1_442 and int((tags.max_size_ratio >= 10).sum()) == 3_285


# ---- subsets in the metrics table -------------------------------------------------------------------
def _tags_frame(image_ids: list[str], rng) -> pd.DataFrame:
    flags = {tag: rng.random(len(image_ids)) < 0.4 for tag in ("amb_size", "amb_crowd", "amb_occlusion",
                                                                "amb_invisible", "single_instance")}
    flags["ambiguous"] = flags["amb_size"] | flags["amb_crowd"] | flags["amb_occlusion"] | flags["amb_invisible"]
    return pd.DataFrame({"image_id": image_ids, **flags})


def _yes_no_questions(rng, n_images=30, per_image=6):
    rows = []
    for i in range(n_images):
        for k in range(per_image):
            rows.append({"question_id": f"q{i}_{k}", "image_id": f"img{i}", "answer": rng.choice(["yes", "no"]),
                         "rare": bool(rng.random() < 0.3), "common": bool(rng.random() < 0.5)})
    questions = pd.DataFrame(rows)
    predictions = pd.DataFrame({"question_id": questions.question_id,
                                "prediction": rng.choice(["yes", "no", "unknown"], len(questions), p=[.5, .4, .1])})
    return questions, predictions


KEYS = dict(dataset="hico", qset="yn_obj", condition="clean", model="m", variant="default")
IMAGE_SUBSETS = {"ambiguous", "unambiguous", "amb_size", "amb_crowd", "amb_occlusion", "amb_invisible",
                 "single_instance"}


def test_yes_no_subset_rows_equal_a_direct_computation():
    rng = np.random.default_rng(3)
    questions, predictions = _yes_no_questions(rng)
    tags = _tags_frame([f"img{i}" for i in range(30)], rng)
    rows = evaluate(questions, predictions, "yn", KEYS, BootstrapSettings(resamples=200, seed=0), tags=tags)
    assert IMAGE_SUBSETS | {"non_rare", "non_common"} <= set(rows.subset)
    joined = questions.merge(predictions, on="question_id").merge(tags, on="image_id")
    selections = {
        "unambiguous": ~joined.ambiguous, "non_rare": ~joined.rare, "non_common": ~joined.common,
        **{tag: joined[tag] for tag in IMAGE_SUBSETS - {"unambiguous"}},
    }
    for subset, chosen in selections.items():
        part = joined[chosen]
        said_yes = part.prediction.eq("yes")
        expected = {"accuracy": part.prediction.eq(part.answer).mean(),
                    "recall": (said_yes & part.answer.eq("yes")).sum() / part.answer.eq("yes").sum(),
                    "yes_ratio": said_yes.mean()}
        got = rows[rows.subset.eq(subset)].set_index("metric")
        for metric, value in expected.items():
            assert got.at[metric, "value"] == pytest.approx(value), (subset, metric)
            assert got.at[metric, "ci_low"] <= got.at[metric, "value"] <= got.at[metric, "ci_high"]
        assert (got.n == len(part)).all()


def test_mc_subset_rows_count_groups_on_tagged_images():
    rng = np.random.default_rng(5)
    rows = []
    for i in range(20):
        for g in range(2):
            answer = "ABCD"[rng.integers(4)]
            for rotation in range(4):
                rows.append({"question_id": f"q{i}_{g}_{rotation}", "group_id": f"g{i}_{g}", "image_id": f"img{i}",
                             "rotation": rotation, "answer": answer, "rare": g == 0, "common": False})
    questions = pd.DataFrame(rows)
    predictions = pd.DataFrame({"question_id": questions.question_id,
                                "prediction": np.where(rng.random(len(questions)) < 0.7, questions.answer, "A")})
    tags = _tags_frame([f"img{i}" for i in range(20)], rng)
    result = evaluate(questions, predictions, "mc", {**KEYS, "qset": "mc_obj"}, BootstrapSettings(resamples=0),
                      tags=tags)
    joined = questions.merge(predictions, on="question_id")
    joined["correct"] = joined.prediction.eq(joined.answer)
    groups = joined.groupby(["group_id", "image_id"]).correct.all().reset_index().merge(tags, on="image_id")
    for subset, chosen in (("single_instance", groups.single_instance), ("unambiguous", ~groups.ambiguous)):
        got = result[result.subset.eq(subset) & result.metric.eq("circular_accuracy")].iloc[0]
        assert got.value == pytest.approx(groups[chosen].correct.mean()) and got.n == chosen.sum()
    carried = mc_group_correctness(attach_tags(joined.drop(columns="correct"), tags))
    assert set(TAG_COLUMNS) <= set(carried.columns)


def test_without_tags_there_are_no_image_subsets_and_unknown_images_are_refused():
    rng = np.random.default_rng(7)
    questions, predictions = _yes_no_questions(rng, n_images=5)
    rows = evaluate(questions, predictions, "yn", KEYS, BootstrapSettings(resamples=0))
    assert not IMAGE_SUBSETS & set(rows.subset) and "all" in set(rows.subset)
    tags = _tags_frame([f"img{i}" for i in range(4)], rng)  # img4 missing
    with pytest.raises(ValueError, match="img4"):
        evaluate(questions, predictions, "yn", KEYS, BootstrapSettings(resamples=0), tags=tags)


# ---- config -------------------------------------------------------------------------------------------
def test_config_accepts_either_layout_and_names_det_root(json_root, tmp_path):
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    validate(config, str(REPO / "schemas" / "config.schema.yaml"))
    assert config["subsets"] == {"merge_iou": 0.5, "size_ratio": 50, "min_humans": 4, "overlap": 0.5,
                                 "max_union_frac": 0.25, "single_strict": False}
    assert TagSettings.from_config(config["subsets"]) == TagSettings()
    with_json = copy.deepcopy(config)
    with_json["datasets"]["hico"]["det_root"] = str(json_root)
    check_config(with_json, REPO)
    with_nothing = copy.deepcopy(config)
    with_nothing["datasets"]["hico"]["det_root"] = str(tmp_path / "empty")
    with pytest.raises(ConfigError, match="datasets.hico.det_root: .* has no anno_bbox.mat or instances_test2015"):
        check_config(with_nothing, REPO)
    with pytest.raises(ValueError, match="subsets: unknown keys"):
        TagSettings.from_config({"size_ration": 10})
