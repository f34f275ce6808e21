"""Field of view: the ``crop`` condition on single-instance images (notes section 1, "Crop condition")."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from verbmirage.benchmark.conditions import MANIFEST, ImageResolver, apply_condition, condition_questions
from verbmirage.benchmark.condition_types import crop_box, crop_to_box
from verbmirage.workflow.config import check_config
from verbmirage.core.errors import ConfigError
from verbmirage.data.hico import read_hico_det
from verbmirage.benchmark.image_tags import image_tags, single_instance_boxes
from verbmirage.inference.runs import RunSpec, run_shard
from verbmirage.core.io import read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set

REPO = Path(__file__).resolve().parents[2]


def test_crop_box_oracles_from_the_notes():
    assert crop_box((101, 51, 300, 250), 640, 480, margin=0.1) == (80, 30, 320, 270)  # a 240 x 240 crop
    assert crop_box((1, 1, 100, 100), 640, 480, margin=0.5) == (0, 0, 150, 150)  # clipped at the top-left
    assert crop_box((101, 51, 300, 250), 640, 480, margin=0.0) == (100, 50, 300, 250)  # exactly the box's pixels
    assert crop_box((501, 401, 640, 480), 640, 480, margin=0.5) == (430, 360, 640, 480)  # clipped at the edge
    with pytest.raises(ValueError, match="bad box"):
        crop_box((10, 10, 5, 20), 640, 480)


def test_crop_keeps_the_pixels_of_the_box():
    pixels = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    cropped = crop_to_box(Image.fromarray(pixels), np.random.default_rng(0), box=(11, 6, 30, 25), margin=0.0)
    assert np.array_equal(np.array(cropped), pixels[5:25, 10:30])  # 1-based inclusive rows 6..25, cols 11..30


@pytest.fixture(scope="module")
def crop_setup(demo_roots, demo_anno, tmp_path_factory):
    base = tmp_path_factory.mktemp("crop")
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings())
    write_table(questions, base / "yn_obj.parquet", QUESTIONS)
    tags = image_tags(read_hico_det(demo_roots[1]), demo_anno)
    images = sorted(set(questions.image))
    boxes = single_instance_boxes(tags, images)
    manifest = apply_condition(demo_roots[0], images, base / "crop", "crop", {"type": "crop", "margin": 0.1},
                               boxes=boxes)
    apply_condition(demo_roots[0], images, base / "clean", "clean", {"type": "clean"})
    return base, questions, tags, boxes, manifest


def test_crop_condition_covers_single_instance_images_only(crop_setup, demo_roots):
    base, questions, tags, boxes, manifest = crop_setup
    single = {f"images/test2015/{name}" for name in tags.image[tags.single_instance]}
    assert boxes and set(boxes) == single & set(questions.image)
    assert set(manifest.image) == set(boxes) and manifest.error.isna().all()
    assert (pq.read_schema(base / "crop" / MANIFEST).metadata or {})[b"verbmirage.partial"] == b"true"
    resolver = ImageResolver(base / "crop")
    for image, box in boxes.items():
        with Image.open(demo_roots[0] / image) as original:
            expected = original.convert("RGB").crop(crop_box(box, *original.size, margin=0.1))
            frac = expected.width * expected.height / (original.width * original.height)
        with Image.open(resolver.path(image)) as stored:
            assert np.array_equal(np.array(stored), np.array(expected))
        assert manifest.set_index("image").at[image, "crop_area_frac"] == pytest.approx(frac)
    row = tags[tags.image.eq(next(iter(boxes)).rsplit("/", 1)[-1])].iloc[0]
    assert row.union_frac <= 0.25 and row.n_humans == 1 and row.n_objects == 1


def test_condition_questions_restricts_only_partial_conditions(crop_setup):
    base, questions, _, boxes, _ = crop_setup
    on_crop = condition_questions(questions, base / "crop")
    assert set(on_crop.image) == set(boxes) and len(on_crop) == questions.image.isin(set(boxes)).sum()
    assert condition_questions(questions, base / "clean") is questions


def test_crop_without_boxes_is_refused(demo_roots, tmp_path):
    with pytest.raises(ValueError, match="conditions.crop_m0: type 'crop' needs boxes"):
        apply_condition(demo_roots[0], [], tmp_path / "c", "crop_m0", {"type": "crop", "margin": 0.0})


def test_inference_under_crop_asks_only_single_instance_questions(crop_setup):
    base, questions, _, boxes, _ = crop_setup
    output = base / "pred_crop.parquet"
    frame = run_shard(base / "yn_obj.parquet", output, RunSpec("always_yes", {"backend": "always_yes"}, base / "crop", condition_settings={"type": "crop", "margin": 0.1}))
    asked = questions[questions.image.isin(set(boxes))]
    assert set(frame.question_id) == set(asked.question_id) and len(frame) < len(questions)
    assert frame.error.isna().all() and frame.prediction.eq("yes").all()
    assert set(read_table(output, PREDICTIONS).question_id) == set(asked.question_id)


def test_config_checks_crop_conditions():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    assert config["conditions"]["crop"] == {"type": "crop", "margin": 0.1, "qsets": ["mc_obj", "mc_verb"]}
    cases = [
        (lambda c: c["datasets"]["hico"].update(det_root=""), "conditions.crop: type 'crop' crops to HICO-DET boxes"),
        (lambda c: c["conditions"]["crop"].update(margin=-0.1), "conditions.crop.margin: -0.1"),
        (lambda c: c["conditions"]["crop"].update(probability=0.5), r"conditions.crop: unknown key\(s\) \['probability'\] for type 'crop' \(known: type, qsets, margin\)"),
    ]
    for edit, message in cases:
        changed = copy.deepcopy(config)
        edit(changed)
        with pytest.raises(ConfigError, match=message):
            check_config(changed, REPO)
    check_config(config, REPO)


def test_a_crop_without_any_question_gives_empty_typed_tables():
    """A demo or subset with no single-instance image: predictions, votes and metrics are empty, not errors."""
    from verbmirage.evaluation.ensembles import majority_vote
    from verbmirage.core.io import to_arrow
    from verbmirage.core.schemas import METRICS
    from verbmirage.evaluation.metrics import BootstrapSettings, evaluate

    empty_predictions = pd.DataFrame(columns=PREDICTIONS.names)
    votes = majority_vote({"a": empty_predictions, "b": empty_predictions}, "yn")
    assert list(votes.columns) == PREDICTIONS.names and votes.empty
    questions = pd.DataFrame(columns=QUESTIONS.names)
    keys = dict(dataset="hico", qset="mc_obj", condition="crop", model="m", variant="default")
    for kind in ("yn", "mc"):
        rows = evaluate(questions, votes, kind, keys, BootstrapSettings(resamples=0))
        assert rows.empty and to_arrow(rows, METRICS).num_rows == 0
