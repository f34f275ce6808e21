"""A deterministic, deliberately slow backend for the kill-and-resume tests (``backend: slow_backend:SlowModel``).

``hold_file`` makes a job's timing the test's to decide rather than the clock's: once ``hold_after`` questions
are answered, the model writes ``<hold_file>.held`` (its pid) and answers nothing more until ``hold_file``
exists. A test that needs the job still running at some step (killed, or found busy by a rerun) waits for the
``.held`` file, does that step however slow the machine is, and creates ``hold_file`` to let the job finish.
"""

import os
import time
import zlib
from pathlib import Path

from verbmirage.models.base import NO, YES, MultipleChoiceResult, VisionLanguageModel, YesNoResult

#: how often a held model looks for its hold file
POLL_SECONDS = 0.05


def held_mark(hold_file: Path) -> Path:
    """The file a model writes once it holds (its pid)."""
    return hold_file.with_name(hold_file.name + ".held")


class SlowModel(VisionLanguageModel):
    backend = "slow_backend:SlowModel"

    def __init__(self, name: str, seconds_per_batch: float = 0.05, hold_file: str | None = None,
                 hold_after: int = 0):
        super().__init__(name)
        self.seconds_per_batch = seconds_per_batch
        self.hold_file = Path(hold_file) if hold_file else None
        self.hold_after = hold_after
        self.answered = 0

    def _p(self, question) -> float:
        return (zlib.crc32(question.question_id.encode()) % 1000) / 1000

    def _answer(self, questions) -> None:
        """Take the time a batch takes: ``seconds_per_batch``, and, while held, until ``hold_file`` exists
        (SIGTERM still ends the wait: Python runs signal handlers between the sleeps)."""
        if self.hold_file is not None and self.answered >= self.hold_after and not self.hold_file.exists():
            held_mark(self.hold_file).write_text(str(os.getpid()))
            while not self.hold_file.exists():
                time.sleep(POLL_SECONDS)
        self.answered += len(questions)
        time.sleep(self.seconds_per_batch)

    def _score_yes_no(self, questions):
        self._answer(questions)
        return [YesNoResult(self._p(q), YES if self._p(q) >= 0.5 else NO, "x", 1.0, "test") for q in questions]

    def _score_multiple_choice(self, questions):
        self._answer(questions)
        return [MultipleChoiceResult(tuple([0.25] * len(q.options)), "A", "A", 0.25, "test") for q in questions]


class PixelModel(SlowModel):
    """Answers from the question and the bytes of its image: another image, another answer."""

    backend = "slow_backend:PixelModel"

    def _p(self, question) -> float:
        with open(question.image, "rb") as image:
            return (zlib.crc32(question.question_id.encode() + image.read()) % 1000) / 1000
