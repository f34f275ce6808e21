"""CLIP as a verb-hallucination baseline (the paper's mAP comparison, Fig. 11).

Each question becomes a caption ("a photo of a person riding a horse");
YN answers yes when the image-caption cosine similarity reaches
``threshold`` (P(yes) = sigmoid(logit_scale * (similarity - threshold)); the
argument of the sigmoid is stored as ``yes_margin``, the score average precision
ranks by); MC picks the option whose
caption is most similar (softmax of the scaled similarities). Images and
captions are each encoded once per batch.
"""

from __future__ import annotations

import math

import torch

from verbmirage.core.imaging import open_rgb
from verbmirage.core.text import hoi_phrase, object_with_article, verb_phrase
from verbmirage.models.base import NO, YES, MultipleChoiceResult, Question, VisionLanguageModel, YesNoResult
from verbmirage.models.hf.tokens import DTYPES


class ClipModel(VisionLanguageModel):
    """CLIP, zero-shot or fine-tuned: P(yes) from the image-caption similarity against a threshold."""

    backend = "clip"

    def __init__(
        self,
        name: str,
        path: str,
        threshold: float = 0.25,
        template: str = "a photo of {caption}",
        dtype: str = "float32",
        device: str = "cpu",
        local_files_only: bool = False,
        revision: str | None = None,
    ):
        super().__init__(name)
        from transformers import CLIPModel, CLIPProcessor

        if dtype not in DTYPES:
            raise ValueError(f"models.{name}.dtype: '{dtype}' is not one of {sorted(DTYPES)}")
        if "{caption}" not in template:
            raise ValueError(f"models.{name}.template: must contain {{caption}}")
        # {caption} is replaced, every other brace is text: "{}" or "{0}" must not fail every question
        self.threshold, self.template, self.device = threshold, template, torch.device(device)
        load = {"local_files_only": local_files_only, "revision": revision}
        self.processor = CLIPProcessor.from_pretrained(path, **load)
        self.model = CLIPModel.from_pretrained(path, dtype=DTYPES[dtype], **load).to(self.device).eval()

    def caption(self, question: Question, option: str | None = None) -> str:
        """The caption CLIP compares with the image."""
        if option is not None:
            return self.template.replace("{caption}", f"a person {option}")
        if question.verb and question.object:
            return self.template.replace("{caption}", f"a person {hoi_phrase(question.verb, question.object)}")
        if question.verb:
            return self.template.replace("{caption}", f"a person {verb_phrase(question.verb)} something")
        if question.object:
            return self.template.replace("{caption}", object_with_article(question.object))
        raise ValueError(f"question {question.question_id}: CLIP needs the verb or object of the question")

    @torch.inference_mode()
    def similarities(self, questions: list[Question], captions: list[list[str]]) -> tuple[list, list]:
        """Cosine similarity of each question's image with each of its captions; errors per question."""
        images, problems, errors = {}, {}, [None] * len(questions)
        for i, question in enumerate(questions):
            if question.image not in images:
                try:
                    images[question.image] = open_rgb(question.image)
                except (OSError, ValueError) as error:
                    images[question.image] = None
                    problems[question.image] = f"image {question.image}: {type(error).__name__}: {error}"
            if images[question.image] is None:
                errors[i] = problems[question.image]
        readable = [path for path, image in images.items() if image is not None]
        image_index = {path: i for i, path in enumerate(readable)}
        texts = sorted({c for row in captions for c in row})
        text_index = {t: i for i, t in enumerate(texts)}
        image_features = text_features = None
        if readable:
            pixels = self.processor(images=[images[p] for p in readable], return_tensors="pt")["pixel_values"]
            image_features = self.model.get_image_features(pixel_values=pixels.to(self.device, self.model.dtype))
            image_features = _embedding(image_features)
            image_features = torch.nn.functional.normalize(image_features.float(), dim=-1)
            tokens = self.processor(text=texts, return_tensors="pt", padding=True).to(self.device)
            text_features = _embedding(self.model.get_text_features(**tokens))
            text_features = torch.nn.functional.normalize(text_features.float(), dim=-1)
        sims = []
        for question, row, error in zip(questions, captions, errors):
            if error is not None:
                sims.append(None)
                continue
            image = image_features[image_index[question.image]]
            sims.append(torch.stack([image @ text_features[text_index[c]] for c in row]).cpu())
        return sims, errors

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    def _score_yes_no(self, questions):
        sims, errors = self.similarities(questions, [[self.caption(q)] for q in questions])
        results = []
        for sim, error in zip(sims, errors):
            if error is not None:
                results.append(YesNoResult.failed(error))
                continue
            value = float(sim[0])
            margin = self.logit_scale * (value - self.threshold)  # the logit of p_yes: a score for AP
            p_yes = 1 / (1 + math.exp(-margin))
            answer = YES if value >= self.threshold else NO
            results.append(YesNoResult(p_yes, answer, f"similarity={value:.4f}", max(p_yes, 1 - p_yes), "clip-threshold",
                                       yes_margin=margin))
        return results

    def _score_multiple_choice(self, questions):
        captions = [[self.caption(q, option) for option in q.options] for q in questions]
        sims, errors = self.similarities(questions, captions)
        results = []
        for question, sim, error in zip(questions, sims, errors):
            n = len(question.options)
            if error is not None:
                results.append(MultipleChoiceResult.failed(n, error))
                continue
            probs = torch.softmax(self.logit_scale * sim, dim=0)
            best = int(probs.argmax())
            letter = chr(ord("A") + best)
            results.append(MultipleChoiceResult(tuple(float(p) for p in probs), letter, letter, float(probs[best]), "clip-argmax"))
        return results


def _embedding(output) -> torch.Tensor:
    """``get_*_features`` returns a tensor in older transformers and an output object in newer ones."""
    if isinstance(output, torch.Tensor):
        return output
    for name in ("pooler_output", "image_embeds", "text_embeds"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    raise TypeError(f"unexpected CLIP feature output {type(output).__name__}")
