"""Nullu (Ziwei-Zheng/Nullu): project the MLP weights of the upper layers off the "HalluSpace".

The official algorithm (docs/models.md, "Nullu"; the official code's ``utils/halluedit.py``, ``model/LLaVA.py``):

1. Pairs of a truthful and a hallucinated answer to the same image and prompt (LURE's captions there; here by
   default HICO *training* labels: a positive HOI against a label -1 verb of the same object in the same
   image, :func:`hico_pairs`; or a LURE-format jsonl, :func:`lure_pairs`).
2. One teacher-forced forward per sample with ``output_hidden_states``; ``hidden_states[l + 1]`` is the
   output of decoder layer ``l``; a sample's embedding is the mean over all positions (official), the last
   token, or the mean over the answer tokens (ours, a flagged deviation: the mean over all positions mixes
   answers of different lengths with the shared ~600-token prefix).
3. Per edited layer, D = (truthful - hallucinated) / 2 (pairs x hidden); its top-k right singular vectors V_k
   span the HalluSpace; P = V_k^T V_k.
4. ``mlp.down_proj.weight`` W of those layers becomes (I - P) W, so no MLP output has a component along the
   HalluSpace. Ours in float32, cast back to the model's dtype (official: P cast to fp16 first). The whole
   model is saved (``save_pretrained``) with the processor files and ``nullu.json``.

The ``derive`` block's settings, read when a run is planned: :mod:`verbmirage.models.derived.nullu_settings`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from verbmirage.core.imaging import open_rgb
from verbmirage.core.io import write_table
from verbmirage.core.paths import safe_relative_name, write_text
from verbmirage.core.schemas import NULLU_PAIRS
from verbmirage.core.text import hoi_phrase
from verbmirage.data.hico import NO_INTERACTION, load_hico
from verbmirage.models import create_model
from verbmirage.models.derived import build_lock
from verbmirage.models.derived.nullu_settings import CAPTION_PROMPT, PAIR_STYLES, NulluSettings

log = logging.getLogger(__name__)

#: The record written beside the edited weights.
RECORD = "nullu.json"
#: D counts as zero (refused) when its largest singular value is below this share of the embeddings' scale.
ZERO_DIFFERENCE = 1e-6


# ---- pairs ------------------------------------------------------------------------------------------------
#: Columns of a pairs table (``io.NULLU_PAIRS``): one truthful/hallucinated pair per row, images relative to
#: the data root; HOI ids -1 for LURE pairs.
PAIR_COLUMNS = ("image", "truthful_prompt", "hallucinated_prompt", "truthful", "hallucinated", "hoi_id",
                "negative_hoi_id")


def caption(verb: str, obj: str) -> str:
    """A one-sentence caption of an HOI: "A person is riding a horse." (only the verb differs within a pair)."""

    return f"A person is {hoi_phrase(verb, obj)}."


def yes_no_question(verb: str, obj: str) -> str:
    """The benchmark's YN question about an HOI (yn_obj's wording)."""

    return f"Is someone {hoi_phrase(verb, obj)}?"


def hico_pairs(anno, pairs: int, seed: int = 0, style: str = "caption", prompt: str = CAPTION_PROMPT):
    """Truthful/hallucinated pairs from HICO's TRAINING labels (never the test split the benchmark asks).

    For a training image and a positive HOI (v, o) (label 1), the hallucinated side is a verb v' of the same
    object with label -1 in that image (object present, HOI absent); never 0 (ambiguous), NaN (object not
    annotated) or no_interaction. At most one pair per image; HOIs take turns in a seeded order
    (stratified: each HOI with candidates gets about pairs / #HOIs), so the count is ``pairs`` or every
    image that has a candidate, whichever is smaller.
    """
    import pandas as pd


    if style not in PAIR_STYLES:
        raise ValueError(f"pair_style: {style!r} is not one of {list(PAIR_STYLES)}")
    labels = anno.labels["train"]  # images x 600
    names = anno.images["train"]
    verbs, objects = list(anno.hois.verb), list(anno.hois.object)
    rng = np.random.default_rng(seed)
    hois_of_object: dict[str, list[int]] = {}
    for hoi, (verb, obj) in enumerate(zip(verbs, objects)):
        if verb != NO_INTERACTION:
            hois_of_object.setdefault(obj, []).append(hoi)
    queues: dict[int, np.ndarray] = {}
    for obj, group in hois_of_object.items():
        has_negative = (labels[:, group] == -1).any(axis=1)
        for hoi in group:
            candidates = np.flatnonzero((labels[:, hoi] == 1) & has_negative)
            if len(candidates):
                queues[hoi] = rng.permutation(candidates)
    order = [int(h) for h in rng.permutation(sorted(queues))]
    position = dict.fromkeys(order, 0)
    used: set[int] = set()
    rows = []
    while len(rows) < pairs:
        progressed = False
        for hoi in order:
            queue = queues[hoi]
            while position[hoi] < len(queue) and int(queue[position[hoi]]) in used:
                position[hoi] += 1
            if position[hoi] == len(queue):
                continue
            image = int(queue[position[hoi]])
            position[hoi] += 1
            used.add(image)
            negatives = [g for g in hois_of_object[objects[hoi]] if labels[image, g] == -1]
            negative = negatives[int(rng.integers(len(negatives)))]
            rows.append(_pair_row(anno.image_relpath("train", names[image]), verbs, objects, hoi, negative, style,
                                  prompt))
            progressed = True
            if len(rows) == pairs:
                break
        if not progressed:
            break
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))


def _pair_row(image: str, verbs: list[str], objects: list[str], hoi: int, negative: int, style: str,
              prompt: str) -> dict:
    obj = objects[hoi]
    if style == "caption":
        return {"image": image, "truthful_prompt": prompt, "hallucinated_prompt": prompt,
                "truthful": caption(verbs[hoi], obj), "hallucinated": caption(verbs[negative], obj),
                "hoi_id": hoi, "negative_hoi_id": negative}
    # yn: the same answer to a question about a present vs an absent HOI
    return {"image": image, "truthful_prompt": yes_no_question(verbs[hoi], obj),
            "hallucinated_prompt": yes_no_question(verbs[negative], obj), "truthful": "Yes",
            "hallucinated": "Yes", "hoi_id": hoi, "negative_hoi_id": negative}


def lure_pairs(path: str | Path, pairs: int, seed: int = 0, prompt: str = CAPTION_PROMPT):
    """Pairs from a LURE-format jsonl (``image``, ``value`` = truthful, ``h_value`` = hallucinated caption),
    with ``prompt`` for both; a seeded sample of ``pairs`` lines when the file holds more (file order kept)."""
    import pandas as pd


    rows = []
    with open(path) as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {number} is not JSON ({error})") from None
            missing = [key for key in ("image", "value", "h_value")
                       if not isinstance(record, dict) or not isinstance(record.get(key), str) or not record[key]]
            if missing:
                raise ValueError(f"{path}: line {number} lacks a non-empty string {missing} (LURE format: "
                                 "image, value, h_value)")
            image = safe_relative_name(record["image"], f"{path}: line {number}: image")
            rows.append({"image": image, "truthful_prompt": prompt, "hallucinated_prompt": prompt,
                         "truthful": record["value"], "hallucinated": record["h_value"], "hoi_id": -1,
                         "negative_hoi_id": -1})
    if not rows:
        raise ValueError(f"{path}: no pairs")
    if len(rows) > pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=pairs, replace=False))
        rows = [rows[i] for i in keep]
    return pd.DataFrame(rows, columns=list(PAIR_COLUMNS))


def pairs_digest(pairs) -> str:
    """sha256 of the pairs (every column, in order): the ``data_hash`` of ``nullu.json``."""
    digest = hashlib.sha256()
    for row in pairs[list(PAIR_COLUMNS)].itertuples(index=False):
        digest.update(json.dumps([str(v) if isinstance(v, str) else int(v) for v in row]).encode())
    return digest.hexdigest()


# ---- hidden states ----------------------------------------------------------------------------------------
def decoder_layers(model):
    """The language model's decoder layers (a ModuleList whose items have ``mlp.down_proj``)."""
    import torch

    found = [
        (name, module) for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] == "layers"
        and "language_model" in name and len(module)
        and all(hasattr(getattr(layer, "mlp", None), "down_proj") for layer in module)
    ]
    if len(found) != 1:
        raise ValueError(
            f"Nullu edits mlp.down_proj of the language model's decoder layers; found {len(found)} such layer "
            f"lists ({[name for name, _ in found]}) in {type(model).__name__}"
        )
    return found[0][1]


def chosen_layers(layers: str | tuple[int, ...], count: int, where: str = "layers") -> list[int]:
    """The edited layer indices: ``upper_half`` = count // 2 .. count - 1 (Nullu's 16-31 of 32)."""
    if layers == "upper_half":
        return list(range(count // 2, count))
    outside = [layer for layer in layers if not 0 <= layer < count]
    if outside:
        raise ValueError(f"{where}: layers {outside} are not decoder layers of this model (0..{count - 1})")
    return sorted(layers)


def _full_texts(vlm, prompts: list[str], answers: list[str]) -> tuple[list[str], list[str]]:
    """(prompt turns, prompt turns + answer + end of sequence) in the model's own conversation format, as the
    official code teacher-forces ``... ASSISTANT: {answer}</s>``."""
    turns = [vlm.render_turn(prompt) for prompt in prompts]
    eos = vlm.tokenizer.eos_token or ""
    full = [turn + ("" if turn[-1:].isspace() else " ") + answer + eos for turn, answer in zip(turns, answers)]
    return turns, full


def sample_embeddings(vlm, images: list, prompts: list[str], answers: list[str], layers: list[int],
                      embedding: str):
    """One embedding per sample and layer: float32 tensor [len(layers), samples, hidden].

    A teacher-forced forward of prompt + answer; ``hidden_states[l + 1]`` is decoder layer ``l``'s output.
    ``mean`` averages every (unpadded) position, ``last`` takes the final token, ``answer_mean`` the
    positions after the prompt.
    """
    import torch

    turns, full = _full_texts(vlm, prompts, answers)
    encoded = vlm.encode(full, images, padding_side="right")
    mask = encoded["attention_mask"].bool()
    lengths = mask.sum(1)
    with torch.no_grad():
        output = vlm.model(**encoded, output_hidden_states=True, use_cache=False)
        hidden = output.hidden_states if getattr(output, "hidden_states", None) is not None else \
            output.language_model_outputs.hidden_states
        if embedding == "answer_mean":
            starts = _answer_starts(vlm, images, turns, encoded["input_ids"], lengths)
            positions = torch.arange(mask.shape[1], device=mask.device)[None, :]
            weights = (mask & (positions >= starts[:, None])).float()
        else:
            weights = mask.float()
        rows = torch.arange(len(full), device=mask.device)
        result = []
        for layer in layers:
            states = hidden[layer + 1].float()
            if embedding == "last":
                result.append(states[rows, lengths - 1])
            else:
                result.append((states * weights[..., None]).sum(1) / weights.sum(1, keepdim=True))
    return torch.stack(result).cpu()


def _answer_starts(vlm, images, turns: list[str], full_ids, lengths):
    """Per row, the first position after the prompt: where the prompt's own tokens stop matching."""
    import torch

    prompt = vlm.encode(turns, images, padding_side="right")
    prompt_lengths = prompt["attention_mask"].sum(1)
    starts = []
    for row in range(full_ids.shape[0]):
        n = int(prompt_lengths[row])
        same = (full_ids[row, :n] == prompt["input_ids"][row, :n].to(full_ids.device)).long()
        start = int(same.argmin()) if not bool(same.all()) else n
        if start >= int(lengths[row]):
            raise ValueError(f"answer_mean: sample {row} has no answer token after its prompt")
        starts.append(start)
    return torch.tensor(starts, device=full_ids.device)


def difference_matrices(vlm, pairs, image_root: str | Path, layers: list[int], embedding: str,
                        batch_size: int):
    """Per layer, D = (truthful - hallucinated) / 2 (pairs x hidden, float32), and the mean norm of the
    truthful embeddings (the scale a zero D is judged against)."""
    import torch


    blocks, norms = [], []
    image_root = Path(image_root)
    for start in range(0, len(pairs), batch_size):
        batch = pairs.iloc[start:start + batch_size]
        images = []
        for name in batch.image:
            image = open_rgb(image_root / name)
            images += [image, image]
        prompts = [p for pair in zip(batch.truthful_prompt, batch.hallucinated_prompt) for p in pair]
        answers = [a for pair in zip(batch.truthful, batch.hallucinated) for a in pair]
        states = sample_embeddings(vlm, images, prompts, answers, layers, embedding)  # layers x 2B x hidden
        truthful, hallucinated = states[:, 0::2], states[:, 1::2]
        blocks.append((truthful - hallucinated) / 2)
        norms.append(truthful.norm(dim=-1))
        if (start // batch_size) % 50 == 0:
            log.info("Nullu: hidden states of %d / %d pairs", min(start + batch_size, len(pairs)), len(pairs))
    differences = torch.cat(blocks, dim=1)
    scale = float(torch.cat(norms, dim=1).mean())
    return {layer: differences[i] for i, layer in enumerate(layers)}, scale


# ---- the edit ---------------------------------------------------------------------------------------------
def hallu_space(difference, top_k: int, scale: float, where: str = "layer"):
    """(V_k, singular values): the top-k right singular vectors of D (rows, [k, hidden]) and D's spectrum.

    Refuses a D that is numerically zero (identical truthful and hallucinated states): its directions would
    be noise.
    """
    import torch

    values, vectors = torch.linalg.svd(difference.float(), full_matrices=False)[1:]
    if top_k > len(values):
        raise ValueError(f"top_k: {top_k} directions asked but {where}'s D has rank at most {len(values)} "
                         "(pairs x hidden)")
    if top_k and float(values[0]) <= ZERO_DIFFERENCE * max(scale, 1e-30):
        raise ValueError(
            f"{where}: the truthful and hallucinated hidden states do not differ (largest singular value of D "
            f"{float(values[0]):.3g} against embeddings of norm {scale:.3g}); the pairs carry no direction"
        )
    return vectors[:top_k], values


def project_out(weight, directions):
    """(I - P) W with P = V^T V (``directions`` V: k orthonormal rows), computed in float32, cast back.

    k = 0 returns ``weight`` itself (bit-identical). Sign flips of the rows leave P unchanged.
    """
    if directions.shape[0] == 0:
        return weight
    w = weight.float()
    v = directions.to(device=w.device, dtype=w.dtype)
    return (w - v.T @ (v @ w)).to(weight.dtype)


def edit_model(model, projections: dict):
    """Replace ``mlp.down_proj.weight`` of each layer in ``projections`` (layer -> V_k) by (I - P) W, in place."""
    import torch

    layers = decoder_layers(model)
    with torch.no_grad():
        for layer, directions in projections.items():
            down = layers[layer].mlp.down_proj
            down.weight.copy_(project_out(down.weight, directions))
    return model


def nullu_edit(vlm, pairs, image_root: str | Path, settings: NulluSettings, where: str = "derive") -> dict:
    """Edit ``vlm.model`` in place (Nullu) from ``pairs``; returns the record of ``nullu.json``."""
    count = len(decoder_layers(vlm.model))
    layers = chosen_layers(settings.layers, count, f"{where}.layers")
    record = {"top_k": settings.top_k, "layers": layers, "decoder_layers": count, "embedding": settings.embedding,
              "pairs": len(pairs), "data_hash": pairs_digest(pairs), "edit_dtype": "float32",
              "edited": [f"layers.{layer}.mlp.down_proj.weight" for layer in layers] if settings.top_k else []}
    if settings.top_k == 0:  # nothing removed: the weights stay bit-identical
        return {**record, "singular_values": {}}
    differences, scale = difference_matrices(vlm, pairs, image_root, layers, settings.embedding,
                                             settings.batch_size)
    projections, spectrum = {}, {}
    for layer in layers:
        projections[layer], values = hallu_space(differences[layer].to(vlm.device), settings.top_k, scale,
                                                 f"{where}: layer {layer}")  # on the GPU when the model is
        spectrum[str(layer)] = [float(v) for v in values[: max(settings.top_k, 8)]]
    edit_model(vlm.model, projections)
    return {**record, "singular_values": spectrum}


def build(slug: str, settings: dict, base_entry: dict, output: Path, inputs: dict) -> None:
    """Rule derive_model's Nullu build: pairs, hidden states, edit, then the whole model, its processor files,
    ``pairs.parquet`` and ``nullu.json`` saved into ``output``."""

    with build_lock(output):  # one writer per output (build_derived takes it too; it is the same lock)
        _build(slug, settings, base_entry, output, inputs)


def _build(slug: str, settings: dict, base_entry: dict, output: Path, inputs: dict) -> None:

    where = f"models.{slug}.derive"
    chosen = NulluSettings.from_config(settings, where)
    if chosen.pairs_file:
        pairs = lure_pairs(inputs["pairs_file"], chosen.pairs, chosen.seed, chosen.prompt)
        image_root, source = inputs["image_root"], f"lure:{Path(inputs['pairs_file']).name}"
    else:
        anno = load_hico(inputs["hico_root"])
        pairs = hico_pairs(anno, chosen.pairs, chosen.seed, chosen.pair_style, chosen.prompt)
        image_root, source = inputs["hico_root"], "hico_train"
    if pairs.empty:
        raise ValueError(f"{where}: no truthful/hallucinated pairs in the data ({source})")
    log.info("Nullu %s: %d pairs (%s), layers %s, top_k %d", slug, len(pairs), source, chosen.layers, chosen.top_k)
    vlm = create_model(slug, {key: value for key, value in base_entry.items()})
    record = nullu_edit(vlm, pairs, image_root, chosen, where)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    vlm.model.save_pretrained(output)
    vlm.processor.save_pretrained(output)
    write_table(pairs, output / "pairs.parquet", NULLU_PAIRS)
    record = {"method": "nullu", "model": slug, "base_path": base_entry.get("path"),
              "base_adapter": base_entry.get("adapter"), "pair_source": source, "pair_style": chosen.pair_style,
              "prompt": chosen.prompt, "pairs_requested": chosen.pairs, "seed": chosen.seed, **record,
              "settings": asdict(chosen)}
    write_text(output / RECORD, json.dumps(record, indent=1, default=list) + "\n")
    log.info("Nullu %s: saved to %s", slug, output)
