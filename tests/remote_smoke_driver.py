"""The fake driver of ``remote_fake_driver.py`` with a knob that moves its answers (for the smoke-test tests).

``options: {shift: x}`` adds ``x`` to the "No" logit of yes/no questions and,
when positive, makes the decoded answer "No": what a new revision or
environment might do.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from remote_fake_driver import FakeDriver  # noqa: E402


class ShiftedDriver(FakeDriver):
    def logits(self, image_path, question):
        row = super().logits(image_path, question)
        if "Which" not in question:
            row[2] += float(self.options.get("shift", 0.0))
        return row

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0):
        text, tag = super().generate(image_path, question, max_new_tokens, num_beams, repetition_penalty)
        return ("No, I think" if float(self.options.get("shift", 0.0)) > 0 else text), tag
