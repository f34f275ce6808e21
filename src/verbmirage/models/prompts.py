"""The exact prompt strings, one place for all backends.

A question's ``prompt`` (the question; for MC the stem and the lettered
options, one per line) is wrapped by a :class:`PromptTemplate` before the
backend applies the model's chat template. The defaults follow the common
practice of LLaVA-style evaluation (POPE, MMBench); a model entry may override
them in config: ``prompts: {yes_no: "...{question}...", multiple_choice: ...}``.
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

    def render(self, question: str, multiple_choice: bool) -> str:
        template = self.multiple_choice if multiple_choice else self.yes_no
        return template.replace("{question}", question)
