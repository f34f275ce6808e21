"""Attention at the answer position: the notes' oracles, real tiny models and the real image processors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image, ImageDraw

from verbmirage.analysis.attention import (
    NO_GRID_REASON,
    AttentionProbe,
    TokenGrid,
    TokenSets,
    clip_style_grid,
    head_shares,
    qwen_grid,
    question_shares,
    resolve_layers,
)
from verbmirage.analysis.attention_settings import AttentionError, attention_models, figure_models
from sklearn.metrics import roc_auc_score

from verbmirage.analysis.attention_figures import draw_attention_figures
from verbmirage.analysis.attention_summary import bootstrap_difference, summarize_attention
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import ATTENTION, ATTENTION_SUMMARY
from verbmirage.models import create_model

FAMILIES = ["llava", "qwen2_vl", "instructblip"]
IMAGE = "images/test2015/HICO_test2015_00000001.jpg"


# ---- the notes' hand-built pattern --------------------------------------------------------------
def oracle_tokens() -> TokenSets:
    """Positions [BOS, t1, v1, v2, v3, v4, verb, obj, q]; v1..v4 a 2x2 grid; K = {v1, v3}."""
    return TokenSets(query=8, visual=np.array([2, 3, 4, 5]), verb=np.array([6]), object=np.array([7]),
                     key=np.array([2, 4]))


ORACLE_ROWS = np.array([[.4, .1, .1, .1, .05, .05, .1, .05, .05],
                        [.2, .1, .2, .1, .1, 0, .05, .15, .1]])


def test_hand_built_pattern_gives_the_notes_shares():
    shares = question_shares(ORACLE_ROWS, oracle_tokens())
    assert shares["visual_share"] == pytest.approx(0.35)
    assert shares["verb_share"] == pytest.approx((0.1 / 0.15 + 0.05 / 0.20) / 2)  # .4583
    assert shares["verb_share"] == pytest.approx(0.4583, abs=1e-4)
    assert shares["object_share"] == pytest.approx(1 - 0.4583, abs=1e-4)
    assert shares["key_area_share"] == pytest.approx(0.625)
    assert shares["key_area_raw"] == pytest.approx(0.225) and shares["key_area_lift"] == pytest.approx(1.25)


def test_positions_after_q_and_missing_sets_do_not_count():
    padded = np.concatenate([ORACLE_ROWS, np.full((2, 3), 0.7)], axis=1)  # keys past q (padding) are ignored
    assert question_shares(padded, oracle_tokens()) == pytest.approx(question_shares(ORACLE_ROWS, oracle_tokens()))
    no_spans = TokenSets(8, np.array([2, 3, 4, 5]), np.array([], dtype=int), np.array([], dtype=int), None)
    shares = question_shares(ORACLE_ROWS, no_spans)
    assert np.isnan(shares["verb_share"]) and np.isnan(shares["key_area_share"])
    assert shares["visual_share"] == pytest.approx(0.35)


def test_notes_grid_oracle_crop_and_pad_modes():
    """640x480, box (81,1,160,100): crop mode rows 0-4 x cols 0-3, pad mode rows 3-6 x cols 3-5."""
    from transformers import LlavaImageProcessor

    crop = LlavaImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    pad = LlavaImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}, do_pad=True)
    box = [(81, 1, 160, 100)]
    expected_crop = {24 * r + c for r in range(5) for c in range(4)}
    expected_pad = {24 * r + c for r in range(3, 7) for c in range(3, 6)}
    assert set(clip_style_grid(crop, 640, 480, 24).key_tokens(box)) == expected_crop
    assert set(clip_style_grid(pad, 640, 480, 24).key_tokens(box)) == expected_pad


# ---- box -> tokens against the processors' own resize / crop of a marker image ----------------------
def marker(width: int, height: int, box) -> Image.Image:
    """Black image, white box: the continuous box [x1-1, x2] x [y1-1, y2] is pixels x1-1..x2-1."""
    image = Image.new("RGB", (width, height), "black")
    x1, y1, x2, y2 = box
    ImageDraw.Draw(image).rectangle((x1 - 1, y1 - 1, x2 - 1, y2 - 1), fill="white")
    return image


def lit_tokens(frame: np.ndarray, grid: TokenGrid, box, margin: float = 3.0) -> tuple[set, set]:
    """Tokens whose cell centre is bright in the processed image, and the tokens too near a box edge to judge."""
    brightness = frame.mean(axis=0)
    threshold = 0.5  # black 0, white 1 (rescaled, mean 0, std 1)
    x1, y1, x2, y2 = box
    edges_x = [(x1 - 1) * grid.scale_x + grid.offset_x, x2 * grid.scale_x + grid.offset_x]
    edges_y = [(y1 - 1) * grid.scale_y + grid.offset_y, y2 * grid.scale_y + grid.offset_y]
    lit, unclear = set(), set()
    for r in range(grid.rows):
        for c in range(grid.cols):
            cx, cy = (c + 0.5) * grid.cell_w, (r + 0.5) * grid.cell_h
            k = grid.leading + r * grid.cols + c
            if min(abs(cx - e) for e in edges_x) < margin or min(abs(cy - e) for e in edges_y) < margin:
                unclear.add(k)
            px, py = int(cx), int(cy)  # the 2x2 pixels around the centre
            if brightness[py - 1 : py + 1, px - 1 : px + 1].mean() > threshold:
                lit.add(k)
    return lit, unclear


BOXES = [(81, 1, 160, 100), (300, 200, 520, 470), (1, 1, 640, 480), (10, 300, 90, 420), (401, 51, 639, 180)]


@pytest.mark.parametrize("do_pad", [False, True], ids=["crop", "pad"])
@pytest.mark.parametrize("size", [(640, 480), (427, 640)], ids=["landscape", "portrait"])
def test_llava_mapping_matches_the_processor_on_a_marker(do_pad, size):
    from transformers import LlavaImageProcessor

    processor = LlavaImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                                    do_pad=do_pad, image_mean=[0, 0, 0], image_std=[1, 1, 1])
    width, height = size
    for box in BOXES:
        if box[0] >= width or box[1] >= height:
            continue
        box = (box[0], box[1], min(box[2], width), min(box[3], height))
        frame = processor(images=marker(width, height, box), return_tensors="np")["pixel_values"][0]
        grid = clip_style_grid(processor, width, height, 24)
        lit, unclear = lit_tokens(frame, grid, box)
        mapped = set(grid.key_tokens([box]).tolist())
        assert mapped - unclear == lit - unclear, (size, do_pad, box)
        assert lit or not mapped  # the comparison saw something when the box is in view


@pytest.mark.parametrize("size", [(640, 427), (333, 500)])
def test_qwen2_vl_mapping_matches_the_processor_on_a_marker(size):
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=700 * 500, image_mean=[0, 0, 0],
                                      image_std=[1, 1, 1])
    width, height = size
    for box in BOXES:
        if box[0] >= width or box[1] >= height:
            continue
        box = (box[0], box[1], min(box[2], width), min(box[3], height))
        out = processor(images=marker(width, height, box), return_tensors="np")
        thw = out["image_grid_thw"][0]
        _, gh, gw = (int(v) for v in thw)
        m, p = processor.merge_size, processor.patch_size
        patches = out["pixel_values"].reshape(gh // m, gw // m, m, m, 3, processor.temporal_patch_size, p, p)[:, :, :, :, :, 0]
        frame = patches.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * p, gw * p)
        grid = qwen_grid(thw, m, p, width, height)
        lit, unclear = lit_tokens(frame, grid, box)
        mapped = set(grid.key_tokens([box]).tolist())
        assert mapped - unclear == lit - unclear, (size, box)
    if size == (640, 427):  # the notes' example: 644 x 420 -> 23 x 15 = 345 tokens
        assert (grid.cols, grid.rows) == (23, 15)


# ---- tiny models ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probes(tiny_dirs):
    models = {f: create_model(f, {"backend": f, "path": str(tiny_dirs[f]), "local_files_only": True})
              for f in FAMILIES}
    return {f: AttentionProbe(model, "all", batch_size=4) for f, model in models.items()}


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("attention") / "scene.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path)
    return path


def questions_frame() -> pd.DataFrame:
    rows = [("a", "yn_obj", "Is someone sitting on a hair drier?", "sit_on", "hair_drier", None, "yes"),
            ("b", "yn_obj", "Is someone riding a bicycle?", "ride", "bicycle", None, "no"),
            ("c", "yn_verb", "Is someone riding something?", "ride", None, None, "yes")]
    return pd.DataFrame([dict(question_id=q, qset=s, image_id="img", image=IMAGE, prompt=p, verb=v, object=o, options=opts, answer=a)
                         for q, s, p, v, o, opts, a in rows])


def box_pairs(human, obj_box, obj="bicycle", size=(64, 48)) -> pd.DataFrame:
    return pd.DataFrame([dict(image_path=IMAGE, object=obj, human_box=human, object_box=obj_box, width=size[0],
                              height=size[1])])


def test_language_model_eager_vision_tower_untouched(probes):
    for family, probe in probes.items():
        config = probe.model.model.config
        assert config.get_text_config()._attn_implementation == "eager", family
        assert config.vision_config._attn_implementation != "eager", family
        assert probe.layers == [0, 1]


@pytest.mark.parametrize("family", FAMILIES)
def test_shares_in_unit_interval_and_visual_plus_text_is_one_per_head(probes, image_file, family):
    probe = probes[family]
    questions = questions_frame()
    texts = [probe.model.render(_question(row, image_file), False) for row in questions.itertuples()]
    encoded = probe.model.encode_shared_image(texts, Image.open(image_file).convert("RGB"))
    captured, logits = probe.forward(encoded)
    heads = probe.model.model.config.get_text_config().num_attention_heads
    for layer, rows in captured.items():
        assert rows.shape == (3, heads, encoded["input_ids"].shape[1])  # only row q is kept
        for b, row in enumerate(questions.itertuples()):
            tokens, _ = probe.token_sets(encoded, b, texts[b], row, box_pairs((1, 1, 64, 48), (1, 1, 5, 5)), 64, 48)
            per_head = head_shares(rows[b], tokens)
            np.testing.assert_allclose(per_head["visual"] + per_head["text"], 1.0, atol=1e-9)
            for name, values in per_head.items():
                finite = values[~np.isnan(values)]
                assert ((finite >= 0) & (finite <= 1 + 1e-9)).all(), (family, name)
            assert (rows[b, :, tokens.query + 1 :] == 0).all()  # padding after q gets no weight
    assert logits.shape[0] == 3


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_batched_hook_rows_equal_an_unbatched_output_attentions_pass(probes, image_file, family):
    """The hook's row q of a right-padded batch is the row q of each prompt's own full attention map."""
    import torch

    probe = probes[family]
    questions = questions_frame()
    image = Image.open(image_file).convert("RGB")
    texts = [probe.model.render(_question(row, image_file), False) for row in questions.itertuples()]
    captured, _ = probe.forward(probe.model.encode_shared_image(texts, image))
    for b, text in enumerate(texts):
        single = probe.model.encode([text], [image])
        with torch.inference_mode():
            maps = probe.model.model(**single, output_attentions=True, use_cache=False).attentions
        q = single["input_ids"].shape[1] - 1
        for layer in probe.layers:
            np.testing.assert_allclose(captured[layer][b, :, : q + 1], maps[layer][0, :, q].numpy(), atol=1e-5)


def _question(row, image_file):
    from verbmirage.models.base import Question

    return Question(row.question_id, row.prompt, image_file, ())


@pytest.mark.parametrize("family", FAMILIES)
def test_verb_and_object_spans_come_from_character_offsets(probes, image_file, family):
    probe = probes[family]
    row = next(questions_frame().itertuples())  # "Is someone sitting on a hair drier?"
    text = probe.model.render(_question(row, image_file), False)
    encoded = probe.model.encode_shared_image([text], Image.open(image_file).convert("RGB"))
    tokens, _ = probe.token_sets(encoded, 0, text, row, None, 64, 48)
    ids = encoded["input_ids"][0].tolist()
    decode = probe.model.tokenizer.decode
    assert decode([ids[i] for i in tokens.verb]).strip() == "sitting on"
    assert decode([ids[i] for i in tokens.object]).strip() == "hair drier"
    assert tokens.verb.min() > tokens.visual.max() or family == "instructblip" or tokens.verb.min() > 0
    assert not set(tokens.verb) & set(tokens.visual)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_box_over_the_whole_image_gives_key_area_share_one(probes, image_file, family):
    records = probes[family].measure(questions_frame(), image_file, box_pairs((1, 1, 64, 48), (10, 10, 20, 20)), False)
    by_question = {(r["question_id"], r["layer"]): r for r in records}
    for layer in (0, 1):
        assert by_question[("b", layer)]["key_area_share"] == pytest.approx(1.0)
        assert np.isnan(by_question[("a", layer)]["key_area_share"])  # no hair drier box in the image
        assert np.isnan(by_question[("c", layer)]["key_area_share"])  # yn_verb has no key area
        assert 0 < by_question[("a", layer)]["visual_share"] < 1


def test_small_box_gives_a_partial_key_area(probes, image_file):
    records = probes["llava"].measure(questions_frame(), image_file, box_pairs((1, 1, 32, 24), (1, 1, 4, 4)), False)
    share = next(r for r in records if r["question_id"] == "b")["key_area_share"]
    assert 0 < share < 1


def test_boxes_of_another_image_size_give_no_key_area(probes, image_file):
    """A condition that changes the geometry (a crop) must not reuse the original boxes."""
    pairs = box_pairs((1, 1, 640, 480), (1, 1, 40, 40), size=(640, 480))
    records = probes["llava"].measure(questions_frame(), image_file, pairs, False)
    assert np.isnan(next(r for r in records if r["question_id"] == "b")["key_area_share"])


def test_instructblip_has_no_key_area_and_says_why(probes, image_file):
    probe = probes["instructblip"]
    row = list(questions_frame().itertuples())[1]
    text = probe.model.render(_question(row, image_file), False)
    encoded = probe.model.encode_shared_image([text], Image.open(image_file).convert("RGB"))
    tokens, reason = probe.token_sets(encoded, 0, text, row, box_pairs((1, 1, 64, 48), (1, 1, 5, 5)), 64, 48)
    assert tokens.key is None and reason == NO_GRID_REASON
    assert len(tokens.visual) == probe.model.model.config.num_query_tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_prediction_at_q_agrees_with_the_scoring_engine(probes, tiny_dirs, image_file, family):
    """The attention pass answers like the prediction run (eager vs sdpa numerics, float32)."""
    scorer = create_model(family, {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
    questions = questions_frame()
    expected = [r.prediction for r in scorer.score_yes_no([_question(row, image_file) for row in questions.itertuples()])]
    records = probes[family].measure(questions, image_file, None, False)
    got = [r["prediction"] for r in records if r["layer"] == 0]
    assert got == expected
    assert [r["correct"] for r in records if r["layer"] == 0] == [p == a for p, a in zip(expected, questions.answer)]


def test_layers_resolve_and_bad_layers_name_the_key():
    assert resolve_layers([-1], 32) == [31]
    assert resolve_layers([0, -1, 31], 32) == [0, 31]
    assert resolve_layers("all", 3) == [0, 1, 2]
    with pytest.raises(AttentionError, match=r"analysis.attention.layers: layer 40 does not exist"):
        resolve_layers([40], 32)


def test_config_names_unknown_and_unsuitable_models():
    config = {"models": {"prior": {"backend": "prior"}, "llava": {"backend": "llava", "path": "x"}},
              "analysis": {"attention": {"models": ["llava", "qwen"], "extra_models": {"qwen": {"backend": "qwen2_vl"}}}}}
    assert list(attention_models(config)) == ["llava", "qwen"]
    config["analysis"]["attention"]["models"] = ["llava", "prior"]
    with pytest.raises(AttentionError, match=r"analysis.attention.models\[1\]: 'prior' has backend 'prior'"):
        attention_models(config)
    config["analysis"]["attention"]["models"] = ["nope"]
    with pytest.raises(AttentionError, match=r"models\[0\]: 'nope' is neither"):
        attention_models(config)
    assert attention_models({"models": {}}) == {}
    config["analysis"]["attention"].update(models=["llava", "qwen"], figures={"fig14": "prior"})
    with pytest.raises(AttentionError, match=r"analysis.attention.figures.fig14: 'prior' is not one of"):
        attention_models(config)
    config["analysis"]["attention"].update(figures={}, conditions=["foggy"])
    with pytest.raises(AttentionError, match=r"analysis.attention.conditions\[0\]: 'foggy'"):
        attention_models({**config, "conditions": {"clean": {"type": "clean"}}})


def test_attention_is_added_to_a_run_without_inference(tmp_path):
    """The demo config plans attention jobs for both tiny models and no prediction job (dry run)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "results/analysis/attention.parquet", "--dry-run", "--snakefile",
         str(repo / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(repo / "config.yaml")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rules = re.findall(r"^(?:localrule|rule) (\w+):", result.stdout, re.M)
    assert not any(rule.startswith(("predict", "merge_predictions")) for rule in rules)
    models = re.findall(r"wildcards: dataset=hico, condition=clean, model=(\w+)$", result.stdout, re.M)
    assert sorted(models) == ["tiny_llava", "tiny_qwen2_vl"]  # one job per model: every set, the model loaded once
    assert "results/predictions" not in result.stdout


# ---- table and figures --------------------------------------------------------------------------------
def attention_table(rng) -> pd.DataFrame:
    rows = []
    for i in range(40):
        qset = ["yn_obj", "yn_verb", "mc_obj", "mc_verb"][i % 4]
        answer = ("yes" if i % 3 else "no") if qset.startswith("yn") else "A"
        for layer in (0, 1):
            rows.append(dict(dataset="hico", qset=qset, condition="clean", model="llava", question_id=f"q{i}",
                             layer=layer, visual_share=rng.random(), verb_share=rng.random() if qset == "yn_obj" else None,
                             object_share=None, key_area_share=rng.random(), key_area_raw=rng.random(),
                             key_area_lift=rng.random(), image_id=f"img{i % 7}", answer=answer, correct=bool(i // 4 % 2)))
    return pd.DataFrame(rows)


def test_figures_are_drawn_from_the_parquet_table(tmp_path):
    table_path = tmp_path / "attention.parquet"
    write_table(attention_table(np.random.default_rng(0)), table_path, ATTENTION)
    table = read_table(table_path, ATTENTION)
    paths = {n: tmp_path / f"fig{n}.png" for n in (7, 8, 13, 14)}
    roles = figure_models(["llava"], {"llava": "llava"})
    assert roles == {7: "llava", 8: "llava", 13: "llava", 14: "llava"}
    draw_attention_figures(table, paths, roles, {"llava": "random weights"}, backends={"llava": "llava"})
    for path in paths.values():
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 300
            assert np.asarray(image.convert("L")).std() > 1  # something was drawn


def test_figure_roles_follow_the_paper_then_the_config():
    backends = {"q": "qwen2_vl", "l": "llava", "b": "instructblip"}
    assert figure_models(["q", "l", "b"], backends) == {7: "l", 8: "l", 13: "l", 14: "b"}
    assert figure_models(["l", "q"], backends)[14] == "q"
    assert figure_models(["l", "q"], backends, {"fig8": "q"})[8] == "q"


def test_table_schema_is_the_declared_one():
    assert ATTENTION.names == ["dataset", "qset", "condition", "model", "question_id", "layer", "visual_share",
                               "verb_share", "object_share", "key_area_share", "key_area_raw", "key_area_lift",
                               "image_id", "answer", "correct"]


# ---- summary: correct vs hallucinated ---------------------------------------------------------------
def test_summary_compares_correct_and_hallucinated_per_figure_group():
    table = attention_table(np.random.default_rng(1))
    summary = summarize_attention(table, resamples=200, seed=0)
    assert list(summary.columns) == ATTENTION_SUMMARY.names
    assert set(summary.group) == {"answer_yes", "answer_no", "mc"}
    # an independent computation on one group: yn_obj, ground truth yes, layer 0, visual share
    rows = table[table.qset.eq("yn_obj") & table.answer.eq("yes") & table.layer.eq(0)]
    wrong = ~rows.correct
    got = summary[summary.qset.eq("yn_obj") & summary.group.eq("answer_yes") & summary.layer.eq(0)
                  & summary.measure.eq("visual_share")].set_index("statistic")
    delta = rows.visual_share[wrong].mean() - rows.visual_share[~wrong].mean()
    assert got.at["delta_mean", "value"] == pytest.approx(delta)
    assert got.at["delta_mean", "ci_low"] <= delta <= got.at["delta_mean", "ci_high"]
    assert got.at["auroc_hallucinated", "value"] == pytest.approx(roc_auc_score(wrong, rows.visual_share))
    assert got.at["median_correct", "value"] == pytest.approx(rows.visual_share[~wrong].median())
    assert got.at["mean_hallucinated", "n"] == wrong.sum()
    # a measure that is NaN everywhere in a group (verb share outside yn_obj) gives no rows
    assert not summary[summary.qset.eq("mc_obj") & summary.measure.eq("verb_share")].size


def test_summary_with_one_outcome_only_has_no_difference():
    table = attention_table(np.random.default_rng(2)).assign(correct=True)
    summary = summarize_attention(table, resamples=50)
    deltas = summary[summary.statistic.isin(["delta_mean", "auroc_hallucinated"])]
    assert len(deltas) and deltas.value.isna().all()
    assert summary[summary.statistic.eq("mean_hallucinated")].n.eq(0).all()


def test_bootstrap_resamples_images_not_rows():
    # two images: all of image a's rows correct, all of b's hallucinated; a replicate without one of them has
    # no difference, so the interval comes from the replicates that draw both
    values, hallucinated, images = [0.1, 0.1, 0.9, 0.9], [False, False, True, True], ["a", "a", "b", "b"]
    point, low, high = bootstrap_difference(values, hallucinated, images, resamples=200, confidence=0.95, seed=0)
    assert point == pytest.approx(0.8) and low == pytest.approx(0.8) and high == pytest.approx(0.8)
