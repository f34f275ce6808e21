"""Nullu weight editing (verbmirage.models.derived.nullu) on a tiny LLaVA with 4 decoder layers (real classes).

Oracles (hand-computed): k = 0 changes nothing; only the chosen layers' down_proj weights
change; the edited matrices have no output along the removed directions; editing twice == once; sign flips of
the singular vectors do not change P; hidden_states[l + 1] is layer l's output; save -> reload -> same logits;
HICO pairs come from training images with labels 1 and -1 only; a zero difference is refused.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from verbmirage.models.derived import build_derived
from verbmirage.models.derived.nullu import (
    chosen_layers,
    decoder_layers,
    difference_matrices,
    edit_model,
    hallu_space,
    hico_pairs,
    lure_pairs,
    nullu_edit,
    pairs_digest,
    project_out,
    sample_embeddings,
)
from verbmirage.models.derived.nullu_settings import NulluSettings
from verbmirage.data.hico import NO_INTERACTION
from verbmirage.core.imaging import open_rgb
from verbmirage.core.io import read_table
from verbmirage.core.schemas import NULLU_PAIRS
from verbmirage.models import create_model

PAIRS = 12


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory) -> Path:
    from verbmirage.models.tiny import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("nullu") / "tiny_llava4", layers=4)


def load(path) -> object:
    return create_model("tiny", {"backend": "llava", "path": str(path), "local_files_only": True})


@pytest.fixture(scope="module")
def pairs(demo_anno):
    return hico_pairs(demo_anno, PAIRS, seed=0)


def weights(model) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def edited(tiny4, pairs, demo_roots, **settings):
    vlm = load(tiny4)
    record = nullu_edit(vlm, pairs, demo_roots[0], replace(NulluSettings(), **settings))
    return vlm, record


# ---- pairs -----------------------------------------------------------------------------------------------
def check_pairs(anno, pairs):
    train = {anno.image_relpath("train", name): i for i, name in enumerate(anno.images["train"])}
    test = {anno.image_relpath("test", name) for name in anno.images["test"]}
    assert pairs.image.is_unique  # at most one pair per image
    assert set(pairs.image) <= set(train) and not set(pairs.image) & test
    rows = pairs.image.map(train).to_numpy()
    labels = anno.labels["train"]
    assert (labels[rows, pairs.hoi_id] == 1).all()  # truthful: a positive HOI
    assert (labels[rows, pairs.negative_hoi_id] == -1).all()  # hallucinated: object present, HOI absent (never 0/NaN)
    verbs, objects = anno.hois.verb.to_numpy(), anno.hois.object.to_numpy()
    assert (objects[pairs.hoi_id] == objects[pairs.negative_hoi_id]).all()
    assert NO_INTERACTION not in set(verbs[pairs.hoi_id]) | set(verbs[pairs.negative_hoi_id])


def test_hico_pairs_are_training_positives_against_label_minus_one_verbs(demo_anno, pairs):
    assert len(pairs) == PAIRS
    check_pairs(demo_anno, pairs)
    first = pairs.iloc[0]
    obj = demo_anno.hois.object[first.hoi_id]
    assert first.truthful_prompt == first.hallucinated_prompt == "Please describe this image in detail."
    assert first.truthful.startswith("A person is ") and first.truthful.endswith(".")
    assert first.truthful != first.hallucinated and obj.replace("_", " ") in first.truthful


def test_hico_pairs_are_seeded_stratified_and_capped(demo_anno, pairs):
    assert hico_pairs(demo_anno, PAIRS, seed=0).equals(pairs)
    assert not hico_pairs(demo_anno, PAIRS, seed=1).equals(pairs)
    everything = hico_pairs(demo_anno, 10**6, seed=0)
    check_pairs(demo_anno, everything)
    # capped by what exists: every training image with a positive HOI and a -1 verb of its object
    labels, objects = demo_anno.labels["train"], demo_anno.hois.object.to_numpy()
    usable = set()
    valid = demo_anno.hois.verb.to_numpy() != NO_INTERACTION
    for obj in set(objects):
        group = np.flatnonzero((objects == obj) & valid)
        hit = (labels[:, group] == 1).any(1) & (labels[:, group] == -1).any(1)
        usable |= set(np.flatnonzero(hit))
    assert len(everything) == len(usable)
    # HOIs take turns: the first round gives each HOI with candidates at most one pair
    first_round = hico_pairs(demo_anno, everything.hoi_id.nunique(), seed=0)
    assert first_round.hoi_id.is_unique


def test_yn_pairs_ask_about_the_present_and_the_absent_hoi(demo_anno):
    pairs = hico_pairs(demo_anno, 5, seed=0, style="yn")
    check_pairs(demo_anno, pairs)
    assert (pairs.truthful == "Yes").all() and (pairs.hallucinated == "Yes").all()
    assert all(p.startswith("Is someone ") and p.endswith("?") for p in pairs.truthful_prompt)
    assert (pairs.truthful_prompt != pairs.hallucinated_prompt).all()


def test_real_hico_pairs(real_anno):
    pairs = hico_pairs(real_anno, 5000, seed=0)
    assert len(pairs) == 5000
    check_pairs(real_anno, pairs)
    assert pairs.hoi_id.nunique() > 400  # stratified over HOIs, not the most frequent ones


def test_lure_pairs_read_the_format_and_name_a_bad_line(tmp_path):
    path = tmp_path / "lure.jsonl"
    lines = [{"image": f"COCO_train2014_{i:012d}.jpg", "value": f"true {i}", "h_value": f"false {i}"} for i in range(5)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    pairs = lure_pairs(path, 10)
    assert list(pairs.truthful) == [f"true {i}" for i in range(5)] and (pairs.hoi_id == -1).all()
    assert len(lure_pairs(path, 3, seed=0)) == 3 and lure_pairs(path, 3, seed=0).equals(lure_pairs(path, 3, seed=0))
    path.write_text(path.read_text() + json.dumps({"image": "x.jpg", "value": "only truthful"}) + "\n")
    with pytest.raises(ValueError, match=r"line 6 lacks a non-empty string \['h_value'\]"):
        lure_pairs(path, 10)
    path.write_text(json.dumps({"image": "../x.jpg", "value": "a", "h_value": "b"}) + "\n")
    with pytest.raises(ValueError, match="line 1: image"):
        lure_pairs(path, 10)


# ---- hidden states -----------------------------------------------------------------------------------------
def test_hidden_state_index_convention_is_the_layer_output(tiny4, demo_roots, pairs):
    """hidden_states[l + 1] == what a forward hook on decoder layer l returns (l < L - 1)."""
    vlm = load(tiny4)
    layers = decoder_layers(vlm.model)
    assert len(layers) == 4 and chosen_layers("upper_half", 4) == [2, 3] and chosen_layers("upper_half", 32) == list(range(16, 32))
    seen = {}
    hooks = [layers[index].register_forward_hook(
                 lambda m, a, out, index=index: seen.__setitem__(index, out[0] if isinstance(out, tuple) else out))
             for index in range(3)]
    image = open_rgb(demo_roots[0] / pairs.image[0])
    text = vlm.render_turn("Please describe this image in detail.") + " A person is riding a horse."
    encoded = vlm.encode([text], [image])
    with torch.no_grad():
        hidden = vlm.model(**encoded, output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    assert len(hidden) == 5
    for index in range(3):
        assert torch.equal(hidden[index + 1], seen[index])
    # the embeddings: `mean` over every position, `last` the final token, `answer_mean` after the prompt
    mean = sample_embeddings(vlm, [image], ["Please describe this image in detail."], ["A person is riding a horse."],
                             [1], "mean")
    full = vlm.render_turn("Please describe this image in detail.") + " A person is riding a horse." + vlm.tokenizer.eos_token
    encoded = vlm.encode([full], [image])
    prompt_length = vlm.encode([vlm.render_turn("Please describe this image in detail.")], [image])["input_ids"].shape[1]
    with torch.no_grad():
        states = vlm.model(**encoded, output_hidden_states=True).hidden_states[2][0]
    assert torch.allclose(mean[0, 0], states.mean(0), atol=1e-6)
    last = sample_embeddings(vlm, [image], ["Please describe this image in detail."], ["A person is riding a horse."],
                             [1], "last")
    assert torch.allclose(last[0, 0], states[-1], atol=1e-6)
    answer = sample_embeddings(vlm, [image], ["Please describe this image in detail."], ["A person is riding a horse."],
                               [1], "answer_mean")
    assert torch.allclose(answer[0, 0], states[prompt_length:].mean(0), atol=1e-6)


def test_padding_does_not_change_an_embedding(tiny4, demo_roots, pairs):
    """A sample's embedding is the same alone and in a batch with a longer answer (padding is masked out)."""
    vlm = load(tiny4)
    image = open_rgb(demo_roots[0] / pairs.image[0])
    prompts = ["Please describe this image in detail."] * 2
    answers = ["A person is riding a horse.", "A person is riding a horse while holding a very long umbrella."]
    for embedding in ("mean", "last", "answer_mean"):
        batch = sample_embeddings(vlm, [image, image], prompts, answers, [2, 3], embedding)
        alone = sample_embeddings(vlm, [image], prompts[:1], answers[:1], [2, 3], embedding)
        assert torch.allclose(batch[:, 0], alone[:, 0], atol=1e-5), embedding


# ---- the edit ------------------------------------------------------------------------------------------------
def test_k_zero_leaves_every_weight_bit_identical(tiny4, pairs, demo_roots):
    before = weights(load(tiny4).model)
    vlm, record = edited(tiny4, pairs, demo_roots, top_k=0)
    after = weights(vlm.model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert record["edited"] == [] and record["singular_values"] == {}


def test_only_the_chosen_layers_down_proj_change(tiny4, pairs, demo_roots):
    before = weights(load(tiny4).model)
    vlm, record = edited(tiny4, pairs, demo_roots, top_k=2, layers=(1, 3))
    after = weights(vlm.model)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {"model.language_model.layers.1.mlp.down_proj.weight",
                       "model.language_model.layers.3.mlp.down_proj.weight"}
    assert record["layers"] == [1, 3] and record["pairs"] == PAIRS and record["data_hash"] == pairs_digest(pairs)
    assert all(len(values) == 8 and values == sorted(values, reverse=True) for values in record["singular_values"].values())


def test_edited_matrices_give_nothing_along_the_removed_directions(tiny4, pairs, demo_roots):
    vlm = load(tiny4)
    differences, scale = difference_matrices(vlm, pairs, demo_roots[0], [2, 3], "mean", batch_size=8)
    projections = {layer: hallu_space(differences[layer], 4, scale)[0] for layer in (2, 3)}
    before = {layer: decoder_layers(vlm.model)[layer].mlp.down_proj.weight.detach().clone() for layer in (2, 3)}
    edit_model(vlm.model, projections)
    outputs = {}
    hooks = [decoder_layers(vlm.model)[layer].mlp.down_proj.register_forward_hook(
        lambda m, a, out, layer=layer: outputs.__setitem__(layer, out)) for layer in (2, 3)]
    image = open_rgb(demo_roots[0] / pairs.image[0])
    with torch.no_grad():
        vlm.model(**vlm.encode([vlm.render_turn("Is someone riding a horse?")], [image]))
    for hook in hooks:
        hook.remove()
    for layer in (2, 3):
        v = projections[layer]
        weight = decoder_layers(vlm.model)[layer].mlp.down_proj.weight
        assert v.shape == (4, 32) and torch.allclose(v @ v.T, torch.eye(4), atol=1e-5)  # orthonormal rows
        assert (v @ weight).norm() <= 1e-5 * before[layer].norm()  # rows of W'^T orthogonal to the HalluSpace
        assert (v @ before[layer]).norm() > 1e-3 * before[layer].norm()  # ... which the base's were not
        assert (outputs[layer] @ v.T).norm() <= 1e-5 * outputs[layer].norm()  # the MLP writes nothing along them


def test_projection_is_idempotent_sign_free_and_matches_numpy():
    generator = torch.Generator().manual_seed(0)
    difference = torch.randn(20, 16, generator=generator)
    weight = torch.randn(16, 40, generator=generator)
    v, values = hallu_space(difference, 3, scale=float(difference.norm(dim=1).mean()))
    once = project_out(weight, v)
    assert torch.allclose(project_out(once, v), once, atol=1e-6)  # P idempotent: editing twice == once
    signs = torch.tensor([-1.0, 1.0, -1.0])[:, None]
    assert torch.equal(project_out(weight, v * signs), once)  # sign flips of singular vectors: same P
    assert project_out(weight, v[:0]) is weight  # k = 0: untouched
    # independent: numpy's SVD and the explicit (I - P) W
    _, _, vt = np.linalg.svd(difference.numpy().astype(np.float64), full_matrices=False)
    p = vt[:3].T @ vt[:3]
    expected = (np.eye(16) - p) @ weight.numpy().astype(np.float64)
    assert np.allclose(once.numpy(), expected, atol=1e-5)
    assert np.allclose(values.numpy(), np.linalg.svd(difference.numpy(), compute_uv=False), rtol=1e-5)
    # bfloat16 weights: edited in float32, cast back
    assert project_out(weight.bfloat16(), v).dtype == torch.bfloat16


def test_identical_truthful_and_hallucinated_states_are_refused(tiny4, pairs, demo_roots):
    same = pairs.assign(hallucinated=pairs.truthful)
    with pytest.raises(ValueError, match="do not differ"):
        edited(tiny4, same, demo_roots, top_k=4)
    with pytest.raises(ValueError, match="top_k: 40 directions asked but .* rank at most"):
        edited(tiny4, pairs, demo_roots, top_k=40)
    with pytest.raises(ValueError, match=r"derive.layers: layers \[4\] are not decoder layers"):
        edited(tiny4, pairs, demo_roots, layers=(4,))


# ---- the build -------------------------------------------------------------------------------------------
def test_build_saves_a_model_that_reloads_to_the_same_logits(tiny4, demo_roots, tmp_path):
    output = tmp_path / "tiny_llava_nullu"
    base = {"backend": "llava", "path": str(tiny4), "local_files_only": True}
    build_derived("tiny_llava_nullu", {"method": "nullu", "base": "tiny_llava4", "pairs": PAIRS, "top_k": 2},
                  base, output, {"hico_root": str(demo_roots[0])})
    record = json.loads((output / "nullu.json").read_text())
    assert record["pair_source"] == "hico_train" and record["top_k"] == 2 and record["layers"] == [2, 3]
    assert record["pairs"] == PAIRS and record["embedding"] == "mean"
    stored = read_table(output / "pairs.parquet", NULLU_PAIRS)
    assert pairs_digest(stored) == record["data_hash"]
    # the same edit in memory, then the saved folder through the backend: same logits
    vlm = load(tiny4)
    nullu_edit(vlm, stored, demo_roots[0], NulluSettings(pairs=PAIRS, top_k=2))
    reloaded = load(output)
    image = open_rgb(demo_roots[0] / stored.image[0])
    encoded = vlm.encode([vlm.render_turn("Is someone riding a horse?")], [image])
    with torch.no_grad():
        assert torch.equal(vlm.model(**encoded).logits, reloaded.model(**encoded).logits)
        assert not torch.equal(load(tiny4).model(**encoded).logits, reloaded.model(**encoded).logits)


def test_build_from_a_lure_file(tiny4, demo_roots, pairs, tmp_path):
    """pairs_file: LURE-format captions of images under image_root, the same prompt for both sides."""
    lure = tmp_path / "hallucination_train.jsonl"
    lure.write_text("".join(json.dumps({"image": image, "value": truthful, "h_value": hallucinated}) + "\n"
                            for image, truthful, hallucinated in zip(pairs.image, pairs.truthful, pairs.hallucinated)))
    output = tmp_path / "lure_nullu"
    build_derived("lure_nullu", {"method": "nullu", "base": "b", "pairs_file": str(lure), "image_root": "x",
                                 "top_k": 1},
                  {"backend": "llava", "path": str(tiny4), "local_files_only": True}, output,
                  {"pairs_file": str(lure), "image_root": str(demo_roots[0])})
    record = json.loads((output / "nullu.json").read_text())
    assert record["pair_source"] == "lure:hallucination_train.jsonl" and record["pairs"] == PAIRS
    stored = read_table(output / "pairs.parquet", NULLU_PAIRS)
    assert list(stored.truthful) == list(pairs.truthful) and (stored.hoi_id == -1).all()
    # the same captions from HICO give the same D, so the same edit: only the pair bookkeeping differs
    vlm = load(tiny4)
    nullu_edit(vlm, pairs, demo_roots[0], NulluSettings(top_k=1))
    assert torch.equal(load(output).model.state_dict()["model.language_model.layers.3.mlp.down_proj.weight"],
                       vlm.model.state_dict()["model.language_model.layers.3.mlp.down_proj.weight"])
