"""The shared plumbing of remote-code adapters (the checkpoints themselves cannot load offline)."""

import math

import pytest
from PIL import Image

from verbmirage.models import Question, create_model
from verbmirage.models.remote import RemoteCodeVLM


class ScriptedReplies(RemoteCodeVLM):
    """Answers from a table, so the parsing and error paths of the base class can be checked."""

    backend = "scripted"

    def load(self):
        self.prompts_seen = []

    def reply(self, image, image_path, prompt, max_new_tokens):
        self.prompts_seen.append(prompt)
        return {"horse": "Yes, someone is.", "bench": "no", "cup": "hard to say"}.get(prompt.split()[4].strip("?"), "(B)")


@pytest.mark.parametrize("backend", ["qwen_vl_chat", "molmo", "minicpm_v", "mplug_owl2"])
def test_remote_code_must_be_allowed_in_the_entry(backend):
    with pytest.raises(ValueError, match=f"models.m.trust_remote_code: backend '{backend}' runs code"):
        create_model("m", {"backend": backend, "path": "some/checkpoint"})


def test_text_replies_are_parsed(tmp_path):
    image = tmp_path / "i.png"
    Image.new("RGB", (4, 4)).save(image)
    model = ScriptedReplies("s", "unused", trust_remote_code=True, device="cpu")
    questions = [Question(str(i), f"Is someone riding a {o}?", image=image) for i, o in enumerate(["horse", "bench", "cup"])]
    results = model.score_yes_no(questions + [Question("x", "Is someone riding a horse?", image=tmp_path / "gone.png")])
    assert [r.prediction for r in results] == ["yes", "no", "unknown", "unknown"]
    assert results[0].p_yes == 1.0 and results[1].p_yes == 0.0 and math.isnan(results[2].p_yes)
    assert results[2].parse_rule == "text:unparsed" and "gone.png" in results[3].error
    assert model.prompts_seen[0].endswith("Answer yes or no.")
    mc = model.score_multiple_choice([Question("m", "Which of the following? A B", image=image, options=("a", "b", "c"))])
    assert mc[0].prediction == "B" and mc[0].option_probs == (0.0, 1.0, 0.0)
