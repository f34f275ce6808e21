"""The exact prompt strings, one place for all backends.

A question's ``prompt`` (the question; for MC the stem and the lettered
options, one per line) is wrapped by a :class:`PromptTemplate` before the
backend applies the model's chat template. The defaults are ours (the paper
gives no benchmark prompt): a yes/no question ends with "Answer yes or no."
(LLaVA's POPE evaluation asks "Answer the question using a single word or
phrase." instead), and an MC question with LLaVA's MMBench instruction; a model
entry may override them in config: ``prompts: {yes_no: "...{question}...",
multiple_choice: ...}``.

A LLaVA entry may instead ask for one of the original LLaVA repository's
conversation formats (``conversation: llava_v1``), written out here as
:class:`Conversation`: the format the paper's tool chain (LLaVA's own
evaluation code, which OPERA and VCD reuse) put around every question.
"""

from __future__ import annotations

from dataclasses import dataclass

YES_NO_INSTRUCTION = "Answer yes or no."
MULTIPLE_CHOICE_INSTRUCTION = "Answer with the option's letter from the given choices directly."


@dataclass(frozen=True)
class PromptTemplate:
    yes_no: str = "{question}\n" + YES_NO_INSTRUCTION
    multiple_choice: str = "{question}\n" + MULTIPLE_CHOICE_INSTRUCTION

    @classmethod
    def from_config(cls, overrides: dict | None, where: str = "prompts") -> "PromptTemplate":
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - {"yes_no", "multiple_choice"})
        if unknown:
            raise ValueError(f"{where}: unknown prompt key(s) {unknown}; use yes_no, multiple_choice")
        for key, text in overrides.items():
            if "{question}" not in text:
                raise ValueError(f"{where}.{key}: the template must contain {{question}}")
        return cls(**overrides)

    #: Appended to every question (a ``prompt_suffix`` variant, paper Appendix F): right after a YN question,
    #: on its own line after an MC question's options; the answer instruction follows. Empty: none.
    suffix: str = ""

    def render(self, question: str, multiple_choice: bool) -> str:
        template = self.multiple_choice if multiple_choice else self.yes_no
        if self.suffix:
            question = question + ("\n" + self.suffix.strip() if multiple_choice else self.suffix)
        return template.replace("{question}", question)


#: Use the processor's own chat template (the default of every transformers backend).
CHAT_TEMPLATE = "chat_template"


@dataclass(frozen=True)
class Conversation:
    """A single-turn conversation format of the original LLaVA code (``SeparatorStyle.TWO``).

    One user turn with the image first, then the assistant's role and a colon
    for the answer: ``{system}{sep}{user}: {image}\n{text}{sep}{assistant}:``.
    Written from haotian-liu/LLaVA ``llava/conversation.py`` (``get_prompt``
    for one user message and an empty assistant message); ``sep2`` (``</s>``)
    closes finished assistant turns only, so it never appears in a prompt.
    """

    system: str
    user: str = "USER"
    assistant: str = "ASSISTANT"
    separator: str = " "

    def render(self, text: str, image_token: str) -> str:
        return f"{self.system}{self.separator}{self.user}: {image_token}\n{text}{self.separator}{self.assistant}:"


#: Formats a ``conversation:`` key may name. ``llava_v1`` is LLaVA's ``conv_llava_v1`` (the default
#: ``conv_mode`` of LLaVA-based evaluation code such as OPERA and VCD); ``vicuna_v1`` is
#: ``conv_vicuna_v1``, which LLaVA-1.5's own benchmark scripts pass; they differ in "human" vs "user".
CONVERSATIONS: dict[str, Conversation] = {
    "llava_v1": Conversation(
        "A chat between a curious human and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the human's questions."
    ),
    "vicuna_v1": Conversation(
        "A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's questions."
    ),
}
