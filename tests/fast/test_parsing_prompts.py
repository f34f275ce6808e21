"""Answer parsing and prompt templates shared by all backends."""

import pytest

from verbmirage.models.parsing import letter_token, normalise_token, parse_choice, parse_yes_no
from verbmirage.models.prompts import PromptTemplate


@pytest.mark.parametrize("text, answer", [("Yes", "yes"), (" yes.", "yes"), ("NO, nobody", "no"),
                                          ("Maybe", "unknown"), ("", "unknown"), (None, "unknown")])
def test_parse_yes_no(text, answer):
    assert parse_yes_no(text)[0] == answer


@pytest.mark.parametrize("text, letter", [("B", "B"), ("(C)", "C"), ("A. riding a horse", "A"),
                                          ("riding a horse", "A"), ("E", "unknown"), ("I think", "unknown")])
def test_parse_choice(text, letter):
    assert parse_choice(text, ("riding a horse", "feeding a horse", "petting a horse", "washing a horse"))[0] == letter


@pytest.mark.parametrize("text, letter", [
    ("A man is riding a horse.", "unknown"),  # a word, not option A
    ("A horse", "unknown"), ("B, riding", "unknown"), ("(A man rides)", "unknown"),
    ("B) feeding a horse", "B"), ("C: petting", "C"), ("**D**", "D"), (" (B). ", "B"), ("A\n", "A"),
])
def test_parse_choice_letter_only_alone_or_marked(text, letter):
    """A letter counts only when it stands alone or is followed by ".", ")" or ":"."""
    assert parse_choice(text, ("riding a horse", "feeding a horse", "petting a horse", "washing a horse"))[0] == letter


def test_tokens():
    assert normalise_token("▁Yes") == "yes"
    assert letter_token(" B", 4) == "B" and letter_token("E", 4) is None and letter_token("Yes", 4) is None


def test_prompt_template_defaults_and_overrides():
    default = PromptTemplate()
    assert default.render("Is someone riding a horse?", False) == "Is someone riding a horse?\nAnswer yes or no."
    assert default.render("Which?\nA. x\nB. y", True).endswith(
        "Answer with the option's letter from the given choices directly."
    )
    custom = PromptTemplate.from_config({"yes_no": "USER asks: {question} Reply yes/no."})
    assert custom.render("Q?", False) == "USER asks: Q? Reply yes/no."
    with pytest.raises(ValueError, match="must contain"):
        PromptTemplate.from_config({"yes_no": "no placeholder"}, where="models.x.prompts")
    with pytest.raises(ValueError, match=r"models.x.prompts: unknown prompt key\(s\) \['yn'\]"):
        PromptTemplate.from_config({"yn": "{question}"}, where="models.x.prompts")
