"""A deterministic, deliberately slow backend for the kill-and-resume test (``backend: slow_backend:SlowModel``)."""

import time
import zlib

from verbmirage.models.base import NO, YES, MultipleChoiceResult, VisionLanguageModel, YesNoResult


class SlowModel(VisionLanguageModel):
    backend = "slow_backend:SlowModel"

    def __init__(self, name: str, seconds_per_batch: float = 0.05):
        super().__init__(name)
        self.seconds_per_batch = seconds_per_batch

    def _p(self, question) -> float:
        return (zlib.crc32(question.question_id.encode()) % 1000) / 1000

    def _score_yes_no(self, questions):
        time.sleep(self.seconds_per_batch)
        return [YesNoResult(self._p(q), YES if self._p(q) >= 0.5 else NO, "x", 1.0, "test") for q in questions]

    def _score_multiple_choice(self, questions):
        time.sleep(self.seconds_per_batch)
        return [MultipleChoiceResult(tuple([0.25] * len(q.options)), "A", "A", 0.25, "test") for q in questions]


class PixelModel(SlowModel):
    """Answers from the question and the bytes of its image: another image, another answer."""

    backend = "slow_backend:PixelModel"

    def _p(self, question) -> float:
        with open(question.image, "rb") as image:
            return (zlib.crc32(question.question_id.encode() + image.read()) % 1000) / 1000
