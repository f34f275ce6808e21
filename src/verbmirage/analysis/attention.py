"""Where the answer position looks: visual-token, verb-token and key-area attention (paper Eqs. 1/3/4, Figs. 7, 8, 13, 14).

The model is loaded as configured; only its language model is switched to
eager attention (the vision tower keeps its fast kernel), because only eager
attention returns the weights. A forward hook on each selected decoder
layer's self-attention keeps the single query row at the answer position q
(the last prompt position, whose logits give the first answer token) for all
heads, and drops the rest at once: the full ``output_attentions`` tensors
are never kept.

Per question and layer, with H heads and alpha_ij the weight of head j from
q to position i (rows sum to 1 over positions 0..q):

- ``visual_share``  = mean_j sum_{i in V} alpha_ij / sum_{i<=q} alpha_ij (Eqs. 1/4),
  V = the image-token positions;
- ``verb_share``    = mean_j sum_{T_v} alpha_ij / (sum_{T_v} + sum_{T_o}) (Eq. 3, ``yn_obj``),
  ``object_share`` its complement on the object tokens;
- ``key_area_share`` = mean_j sum_{i in K} alpha_ij / sum_{i in V} alpha_ij, K = the
  visual tokens whose patch centre lies inside a human or object box of a
  visible pair with the question's object (``yn_obj``, ``mc_obj``);
  ``key_area_raw`` = mean_j sum_{i in K} alpha_ij (not normalised by the visual share) and
  ``key_area_lift`` = key_area_share / (|K| / |V|): 1 when the key area gets exactly its
  share of the patches (both ours, the paper gives only the figure).

T_v and T_o come from character offsets of the rendered prompt (the fast
tokenizer's offset map), shifted for the expanded image tokens. The box to
token mapping goes through the model's own preprocessing, read from the loaded
image processor (:func:`token_grid`). Whole prompts run in right-padded
batches per image (no prefix reuse: the hook sees every key of the row).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from verbmirage.analysis.attention_settings import AttentionError
from verbmirage.benchmark.conditions import ImageResolver
from verbmirage.benchmark.question_sets import question_kind
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.imaging import size_field, square_input_side
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import ATTENTION
from verbmirage.core.text import object_name, verb_phrase
from verbmirage.data.hico import hoi_vocabulary, read_hico_det
from verbmirage.models import create_model
from verbmirage.models.base import Question
from verbmirage.models.parsing import decide_choice, decide_yes_no

log = logging.getLogger(__name__)

#: Question sets with a verb phrase and an object name in the prompt (Eq. 3).
VERB_QSETS = frozenset({"yn_obj"})
#: Question sets whose object is in the question, so its boxes are the key area (Fig. 7a).
KEY_AREA_QSETS = frozenset({"yn_obj", "mc_obj"})
NO_GRID_REASON = "no spatial grid: the language model sees Q-Former query tokens, not image patches"


# ---- the measures ------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenSets:
    """Positions (0-based, all <= q) of one prompt: V, T_v, T_o, and K (a subset of V; None = no grid/boxes)."""

    query: int
    visual: np.ndarray
    verb: np.ndarray
    object: np.ndarray
    key: np.ndarray | None


def head_shares(rows: np.ndarray, tokens: TokenSets) -> dict[str, np.ndarray]:
    """Per-head shares of one attention row per head (``rows``: [heads, keys]).

    ``visual`` + ``text`` = 1 for every head; NaN where a denominator is 0.
    """
    rows = np.asarray(rows, dtype=np.float64)[:, : tokens.query + 1]
    total = rows.sum(axis=1)
    visual = rows[:, tokens.visual].sum(axis=1)
    verb = rows[:, tokens.verb].sum(axis=1)
    obj = rows[:, tokens.object].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = {
            "visual": visual / total,
            "text": (total - visual) / total,
            "verb": verb / (verb + obj) if len(tokens.verb) else np.full(len(rows), np.nan),
            "object": obj / (verb + obj) if len(tokens.object) else np.full(len(rows), np.nan),
            "key_area": (rows[:, tokens.key].sum(axis=1) / visual if tokens.key is not None
                         else np.full(len(rows), np.nan)),
            "key_area_raw": (rows[:, tokens.key].sum(axis=1) if tokens.key is not None
                             else np.full(len(rows), np.nan)),
        }
    return shares


def question_shares(rows: np.ndarray, tokens: TokenSets) -> dict[str, float]:
    """The per-question measures: each head's share, averaged over heads (the paper's 1/H sum)."""
    per_head = head_shares(rows, tokens)

    def mean(values: np.ndarray) -> float:
        return float(values.mean()) if len(values) and not np.isnan(values).any() else math.nan

    key_area = mean(per_head["key_area"])
    key_fraction = len(tokens.key) / len(tokens.visual) if tokens.key is not None and len(tokens.visual) else 0.0
    return {
        "visual_share": mean(per_head["visual"]),
        "verb_share": mean(per_head["verb"]),
        "object_share": mean(per_head["object"]),
        "key_area_share": key_area,
        "key_area_raw": mean(per_head["key_area_raw"]),
        "key_area_lift": key_area / key_fraction if key_fraction > 0 else math.nan,
    }


# ---- boxes -> visual tokens ------------------------------------------------------------------
@dataclass(frozen=True)
class TokenGrid:
    """How the visual tokens tile the original image.

    A token (r, c) covers the cell of the model frame whose centre is
    ``((c + .5) * cell_w, (r + .5) * cell_h)``; a point (x, y) of the original
    image (continuous, 0 at the left/top edge) lands at
    ``(x * scale_x + offset_x, y * scale_y + offset_y)`` in that frame.
    ``leading`` tokens before the grid (LLaVA's CLS under ``full``) are never key tokens.
    """

    rows: int
    cols: int
    cell_w: float
    cell_h: float
    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    leading: int = 0

    @property
    def size(self) -> int:
        return self.leading + self.rows * self.cols

    def key_tokens(self, boxes: Iterable[tuple[float, float, float, float]]) -> np.ndarray:
        """Indices (into the visual tokens) whose cell centre lies inside one of the boxes.

        Boxes are HICO-DET's (x1, y1, x2, y2), 1-based and inclusive, i.e. the
        continuous box [x1 - 1, x2] x [y1 - 1, y2].
        """
        centre_x = (np.arange(self.cols) + 0.5) * self.cell_w
        centre_y = (np.arange(self.rows) + 0.5) * self.cell_h
        inside = np.zeros((self.rows, self.cols), dtype=bool)
        for x1, y1, x2, y2 in boxes:
            left, right = (x1 - 1) * self.scale_x + self.offset_x, x2 * self.scale_x + self.offset_x
            top, bottom = (y1 - 1) * self.scale_y + self.offset_y, y2 * self.scale_y + self.offset_y
            in_x = (centre_x >= left) & (centre_x <= right)
            in_y = (centre_y >= top) & (centre_y <= bottom)
            inside |= in_y[:, None] & in_x[None, :]
        return self.leading + np.flatnonzero(inside.reshape(-1))


def clip_style_grid(image_processor, width: int, height: int, grid: int, leading: int = 0,
                    image_mode: str = "crop") -> TokenGrid:
    """LLaVA-1.5's mapping, read from the image processor: optional pad-to-square, resize, optional center crop.

    ``do_pad`` (``LlavaImageProcessor``, the original ``expand2square``) or the model's ``image_mode: pad``
    pads the short side to a square, (L - side) // 2 before; ``image_mode: resize`` squashes the image to the
    processor's square input size (then nothing else moves it); ``size.shortest_edge`` resizes the short side
    to S and the long side to int(S * long / short); ``do_center_crop`` cuts ``crop_size`` at
    ((W' - w) // 2, (H' - h) // 2).
    """
    if image_mode == "resize":
        side = square_input_side(image_processor)
        return TokenGrid(grid, grid, side / grid, side / grid, side / width, side / height, 0.0, 0.0, leading)
    offset_x = offset_y = 0.0
    frame_w, frame_h = width, height
    if getattr(image_processor, "do_pad", False) or image_mode == "pad":
        side = max(width, height)
        offset_x, offset_y = (side - width) // 2, (side - height) // 2
        frame_w = frame_h = side
    size = image_processor.size
    shortest = size_field(size, "shortest_edge")
    if getattr(image_processor, "do_resize", True) and shortest:
        short, long = min(frame_w, frame_h), max(frame_w, frame_h)
        new_long = int(shortest * long / short)
        new_w, new_h = (shortest, new_long) if frame_w <= frame_h else (new_long, shortest)
    elif getattr(image_processor, "do_resize", True) and size_field(size, "height"):
        new_w, new_h = size_field(size, "width"), size_field(size, "height")
    else:
        new_w, new_h = frame_w, frame_h
    scale_x, scale_y = new_w / frame_w, new_h / frame_h
    offset_x, offset_y = offset_x * scale_x, offset_y * scale_y
    out_w, out_h = new_w, new_h
    if getattr(image_processor, "do_center_crop", False):
        crop = image_processor.crop_size
        out_w, out_h = size_field(crop, "width"), size_field(crop, "height")
        offset_x -= (new_w - out_w) // 2 if new_w >= out_w else -((out_w - new_w) // 2)
        offset_y -= (new_h - out_h) // 2 if new_h >= out_h else -((out_h - new_h) // 2)
    return TokenGrid(grid, grid, out_w / grid, out_h / grid, scale_x, scale_y, offset_x, offset_y, leading)


def qwen_grid(image_grid_thw, merge_size: int, patch_size: int, width: int, height: int) -> TokenGrid:
    """Qwen2-VL / Qwen2.5-VL: the whole image resized to (14 grid_w) x (14 grid_h), tokens = merged 2x2 cells."""
    _, grid_h, grid_w = (int(v) for v in image_grid_thw)
    frame_w, frame_h = patch_size * grid_w, patch_size * grid_h
    cell = patch_size * merge_size
    return TokenGrid(grid_h // merge_size, grid_w // merge_size, cell, cell, frame_w / width, frame_h / height, 0, 0)


def token_grid(model, encoded, row: int, width: int, height: int, n_visual: int) -> TokenGrid | str:
    """The model's grid for an image of ``width`` x ``height``, or the reason there is none."""
    config = model.model.config
    if model.backend == "instructblip" or type(model.model).__name__.startswith("InstructBlip"):
        return NO_GRID_REASON
    image_processor = model.processor.image_processor
    if "image_grid_thw" in encoded:
        merge = int(getattr(image_processor, "merge_size", None) or config.vision_config.spatial_merge_size)
        patch = int(getattr(image_processor, "patch_size", None) or config.vision_config.patch_size)
        grid = qwen_grid(encoded["image_grid_thw"][row], merge, patch, width, height)
    elif hasattr(config, "vision_config") and hasattr(config.vision_config, "image_size"):
        side = config.vision_config.image_size // config.vision_config.patch_size
        leading = 1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0
        grid = clip_style_grid(image_processor, width, height, side, leading, model.image_mode)
    else:
        return f"no known token grid for {type(model.model).__name__}"
    if grid.size != n_visual:
        return f"{n_visual} image tokens in the prompt but the grid has {grid.size}"
    return grid


def key_area_boxes(pairs: pd.DataFrame, image: str, obj: str) -> list[tuple[float, float, float, float]]:
    """Human and object boxes of every visible pair in ``image`` whose HOI has object ``obj``."""
    if pairs is None or pairs.empty:
        return []
    chosen = pairs[(pairs.image_path == image) & (pairs.object == obj) & pairs.human_box.notna()]
    return [tuple(box) for box in chosen.human_box] + [tuple(box) for box in chosen.object_box]


def annotated_size(pairs: pd.DataFrame | None, image: str) -> tuple[int, int] | None:
    """(width, height) HICO-DET gives ``image``, or None when it is not listed; boxes only fit an image of that size."""
    if pairs is None or pairs.empty:
        return None
    rows = pairs[pairs.image_path == image]
    return (int(rows.width.iloc[0]), int(rows.height.iloc[0])) if len(rows) else None


def box_table(det_pairs: pd.DataFrame) -> pd.DataFrame:
    """``hico.read_hico_det(...).pairs`` rows with the question tables' image path and the HOI's object."""

    objects = hoi_vocabulary().set_index("hoi_id").object
    frame = det_pairs.copy()
    frame["image_path"] = [f"images/{split}2015/{name}" for split, name in zip(frame.split, frame.image)]
    frame["object"] = frame.hoi_id.map(objects)
    return frame


# ---- prompt spans ----------------------------------------------------------------------------
def align_to_model_ids(plain_ids: list[int], model_ids: list[int], image_token: int | None, where: str) -> list[int]:
    """Position in ``model_ids`` of each token of the plain tokenization of the same text.

    The processor repeats the image placeholder (LLaVA, Qwen) or puts query
    tokens first (InstructBLIP); every other token must match in order.
    """
    positions, j = [], 0
    for token in plain_ids:
        while j < len(model_ids) and model_ids[j] != token and model_ids[j] == image_token:
            j += 1
        if j >= len(model_ids) or model_ids[j] != token:
            raise AttentionError(f"{where}: the processor's tokens do not extend the plain tokenization")
        positions.append(j)
        j += 1
    return positions


def span_positions(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    """Indices of the tokens whose character span overlaps [start, end)."""
    return [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]


def verb_object_spans(model, rendered: str, prompt: str, verb: str, obj: str, model_ids: list[int],
                      where: str) -> tuple[np.ndarray, np.ndarray]:
    """Model positions of the verb phrase and of the object name (without article) in a rendered prompt."""
    begin = rendered.find(prompt)
    if begin < 0:
        raise AttentionError(f"{where}: the question text is not in the rendered prompt")
    verb_text, object_text = verb_phrase(verb), object_name(obj)
    verb_start = rendered.find(verb_text, begin, begin + len(prompt))
    object_start = rendered.find(object_text, verb_start + len(verb_text), begin + len(prompt))
    if verb_start < 0 or object_start < 0:
        raise AttentionError(f"{where}: verb {verb_text!r} or object {object_text!r} not in the prompt {prompt!r}")
    encoded = model.tokenizer(rendered, return_offsets_mapping=True)
    plain = encoded["input_ids"]
    positions = align_to_model_ids(plain, model_ids, model.image_token_id(), where)
    verb_tokens = span_positions(encoded["offset_mapping"], verb_start, verb_start + len(verb_text))
    object_tokens = span_positions(encoded["offset_mapping"], object_start, object_start + len(object_text))
    decoded = model.tokenizer.decode([plain[i] for i in verb_tokens])
    if verb_text not in decoded:
        raise AttentionError(f"{where}: verb tokens decode to {decoded!r}, not containing {verb_text!r}")
    return (np.array([positions[i] for i in verb_tokens], dtype=int),
            np.array([positions[i] for i in object_tokens], dtype=int))


# ---- the pass --------------------------------------------------------------------------------
def resolve_layers(layers, count: int, where: str = "analysis.attention.layers") -> list[int]:
    """Config layers (``all`` or indices, negative from the end) as sorted non-negative indices."""
    if layers == "all":
        return list(range(count))
    resolved = set()
    for layer in layers:
        if not -count <= int(layer) < count:
            raise AttentionError(f"{where}: layer {layer} does not exist (the language model has {count})")
        resolved.add(int(layer) % count)
    return sorted(resolved)


class AttentionProbe:
    """Runs questions through a loaded :class:`~verbmirage.models.hf.engine.TransformersVLM` and keeps row q per layer.

    ``measure`` returns one dict per (question, layer) with the shares, the
    model's own prediction at q and whether it is correct.
    """

    def __init__(self, model, layers, batch_size: int):
        from verbmirage.models.hf.tokens import decoder_layers, use_eager_language_model  # deferred: imports torch

        self.model = model
        use_eager_language_model(model.model)
        self._modules = decoder_layers(model.model)
        self.layers = resolve_layers(layers, len(self._modules))
        self.batch_size = batch_size
        self._captured: dict[int, np.ndarray] = {}
        self._query: list[int] = []

    def _hook(self, layer: int):
        def keep_query_row(module, args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise AttentionError(f"models.{self.model.name}: layer {layer} returned no attention weights "
                                     "(is the language model running eager attention?)")
            rows = weights[range(len(self._query)), :, self._query, :]  # [batch, heads, keys]
            self._captured[layer] = rows.float().cpu().numpy()

        return keep_query_row

    def forward(self, encoded) -> tuple[dict[int, np.ndarray], "torch.Tensor"]:  # noqa: F821
        """One batch: the captured rows per layer ([batch, heads, keys]) and float logits at q."""
        import torch

        self._query = (encoded["attention_mask"].sum(dim=1) - 1).tolist()
        self._captured = {}
        handles = [self._modules[i].self_attn.register_forward_hook(self._hook(i)) for i in self.layers]
        try:
            with torch.inference_mode():
                logits = self.model.model(**encoded, use_cache=False).logits
        finally:
            for handle in handles:
                handle.remove()
        rows = torch.arange(len(self._query))
        return self._captured, logits[rows, torch.tensor(self._query)].float().cpu()

    def _predict(self, logits, asked: list, multiple_choice: bool) -> list[str]:
        """The answers as the prediction run decides them: the first (argmax) token when it is an answer,
        else the parse of the greedy continuation (the same rule and code as the scoring engine)."""

        first = [self.model._token_text(int(token)) for token in self.model.real_tokens(logits).argmax(dim=-1)]
        if multiple_choice:
            decide = [lambda f, t, q=q: decide_choice(f, t, q.options) for q in asked]
        else:
            decide = [decide_yes_no] * len(asked)
        undecided = [i for i in range(len(asked)) if decide[i](first[i], None)[0] == "unknown"]
        continued = self.model.continuations(asked, undecided, multiple_choice)
        return [decide[i](first[i], continued.get(i))[0] for i in range(len(asked))]

    def measure(self, questions: pd.DataFrame, image_path: Path, pairs: pd.DataFrame | None,
                multiple_choice: bool) -> list[dict]:
        """All questions of one image (rows of a question table) -> one dict per (question, layer)."""

        image = self.model.open_image(image_path)
        width, height = image.size
        records = []
        rows = list(questions.itertuples(index=False))
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            asked = [Question(r.question_id, r.prompt, image_path, tuple(r.options) if r.options is not None else ())
                     for r in chunk]
            texts = [self.model.render(q, multiple_choice) for q in asked]
            encoded = self.model.encode_shared_image(texts, image)
            captured, logits = self.forward(encoded)
            predictions = self._predict(logits, asked, multiple_choice)
            for b, row in enumerate(chunk):
                tokens, reason = self.token_sets(encoded, b, texts[b], row, pairs, width, height)
                if reason:
                    log.info("%s: key-area share NaN: %s", row.question_id, reason)
                prediction = predictions[b]
                for layer in self.layers:
                    shares = question_shares(captured[layer][b], tokens)
                    records.append({"question_id": row.question_id, "image_id": row.image_id, "layer": layer,
                                    **shares, "answer": row.answer, "prediction": prediction,
                                    "correct": prediction == row.answer})
        return records

    def token_sets(self, encoded, b: int, text: str, row, pairs, width: int, height: int) -> tuple[TokenSets, str]:
        """V, T_v, T_o and K of batch row ``b``, and why K is missing (empty string when it is not)."""
        where = f"question {row.question_id}"
        length = int(encoded["attention_mask"][b].sum())
        ids = encoded["input_ids"][b, :length].tolist()
        image_token = self.model.image_token_id()
        visual = np.array([i for i, token in enumerate(ids) if token == image_token], dtype=int)
        if len(visual) == 0:
            raise AttentionError(f"{where}: no image tokens in the model's input")
        verb = obj = np.array([], dtype=int)
        if row.qset in VERB_QSETS:
            verb, obj = verb_object_spans(self.model, text, row.prompt, row.verb, row.object, ids, where)
        key, reason = None, f"question set {row.qset} has no key area"
        if row.qset in KEY_AREA_QSETS:
            grid = token_grid(self.model, encoded, b, width, height, len(visual))
            boxes = key_area_boxes(pairs, row.image, row.object)
            annotated = annotated_size(pairs, row.image)
            if isinstance(grid, str):
                reason = grid
            elif annotated is not None and annotated != (width, height):
                reason = f"{row.image} is {width}x{height} here but {annotated[0]}x{annotated[1]} in HICO-DET"
            elif not boxes:
                reason = f"no visible HICO-DET pair with object {row.object!r} in {row.image}"
            else:
                key, reason = visual[grid.key_tokens(boxes)], ""
        return TokenSets(length - 1, visual, verb, obj, key), reason


def sample_questions(questions: pd.DataFrame, sample: int, seed: int) -> pd.DataFrame:
    """``sample`` question rows drawn with ``seed`` (all when the set is smaller), in table order."""
    if sample >= len(questions):
        return questions
    chosen = questions.sample(n=sample, random_state=seed).index
    return questions.loc[sorted(chosen)]


def run_attention(questions: pd.DataFrame, model, images, pairs: pd.DataFrame | None, layers, sample: int,
                  seed: int, batch_size: int) -> pd.DataFrame:
    """The attention table of one (question set, condition, model): one row per sampled question and layer.

    ``images`` resolves a question's ``image`` to the file the model sees
    (a :class:`~verbmirage.benchmark.conditions.ImageResolver`); ``pairs`` is
    :func:`box_table` of the HICO-DET annotation (None: no key area).
    """

    chosen = sample_questions(questions, sample, seed)
    probe = AttentionProbe(model, layers, batch_size)
    records = []
    for image, group in chosen.groupby("image", sort=True):
        multiple_choice = question_kind(group.qset.iloc[0]) == "mc"
        records += probe.measure(group, images.path(image), pairs, multiple_choice)
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    order = {qid: i for i, qid in enumerate(chosen.question_id)}
    return frame.sort_values(["question_id", "layer"], key=lambda s: s.map(order) if s.name == "question_id" else s,
                             kind="stable").reset_index(drop=True)


# ---- the workflow's pieces -----------------------------------------------------------------------


def attention_job(questions_paths, images_dir, det_root, model_slug: str, model_entry: dict, settings: dict,
                  condition: str, output) -> pd.DataFrame:
    """One (condition, model) job over every question set: the model loads once, then each set is sampled and
    probed in the order given; writes one ``io.ATTENTION`` table (the sets' rows one after the other).

    ``questions_paths``: the question tables (one path is one set). Reads the condition folder and (when
    ``det_root`` is set) HICO-DET's test boxes (``anno_bbox.mat`` or the instances JSON); never the
    prediction files.
    """

    paths = [questions_paths] if isinstance(questions_paths, (str, Path)) else list(questions_paths)
    pairs = box_table(read_hico_det(det_root, "test").pairs) if det_root else None
    model = create_model(model_slug, model_entry)  # drops the workflow keys (resources, ...) itself
    images = ImageResolver(images_dir)
    frames = []
    for path in paths:
        questions = read_table(path, QUESTIONS)
        frame = run_attention(questions, model, images, pairs, settings.get("layers", [-1]),
                              settings.get("sample", 200), settings.get("seed", 0), settings.get("batch_size", 8))
        dataset = questions.dataset.iloc[0] if len(questions) else ""
        qset = questions.qset.iloc[0] if len(questions) else ""
        n_key = int(frame.key_area_share.notna().sum()) if len(frame) else 0
        log.info("%s %s %s: %d rows (%d with a key area), accuracy at q %.3f", model_slug, qset, condition,
                 len(frame), n_key, float(frame.correct.mean()) if len(frame) else math.nan)
        if len(frame):
            frames.append(frame.assign(dataset=dataset, qset=qset, condition=condition, model=model_slug))
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ATTENTION.names)
    write_table(frame, output, ATTENTION, provenance={"model": model_entry, "attention": settings,
                                                      "model_slug": model_slug, "condition": condition})
    return frame


def collect_attention(paths: Iterable[str | Path], output, qsets: list[str] | None = None) -> pd.DataFrame:
    """The per-job tables as one ``results/analysis/attention.parquet``.

    ``qsets`` orders the rows set by set (then in the order of ``paths``, then as in each job's table), the
    order the summary's bootstrap draws its resamples in; None keeps the parts' order.
    """

    parts = [read_table(path, ATTENTION) for path in paths]
    parts = [part for part in parts if len(part)]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ATTENTION.names)
    if qsets is not None and len(frame):
        rank = {qset: index for index, qset in enumerate(qsets)}
        frame = frame.sort_values("qset", key=lambda column: column.map(rank), kind="stable").reset_index(drop=True)
    write_table(frame, output, ATTENTION, provenance={"parts": len(parts)})
    return frame
