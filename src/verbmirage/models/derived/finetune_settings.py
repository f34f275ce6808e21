"""A ``lora_finetune`` entry's ``derive`` block: its settings, their check and how they depart from the paper's
Pangea fine-tune (Appendix D). Read when a run is planned (:mod:`verbmirage.models.derived`); the fine-tune
itself is :mod:`verbmirage.models.derived.finetune`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verbmirage.benchmark.pangea_settings import TrainingQuestionSettings

#: LLaVA's ``find_all_linear_names``: every linear layer of the language model (not the vision tower, the
#: projector or lm_head); a regex peft matches against full module names.
LANGUAGE_MODEL_LINEARS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@dataclass(frozen=True)
class FinetuneSettings:
    """A ``lora_finetune`` entry's ``derive`` block (without method and base); defaults as documented."""

    #: A question table in our schema to train on (``io.QUESTIONS``); empty: the Pangea questions.
    questions: str = ""
    #: The folder its ``image`` paths are relative to (with ``questions``).
    images: str = ""
    #: Pangea question building (derived/pangea.py ``TrainingQuestionSettings``), without ``questions``.
    pangea: dict = field(default_factory=dict)
    rank: int = 128
    alpha: int = 256
    dropout: float = 0.05
    target_modules: str | tuple[str, ...] = LANGUAGE_MODEL_LINEARS
    learning_rate: float = 2e-5
    batch_size: int = 64
    micro_batch_size: int = 8
    epochs: float = 1.0
    max_steps: int = 0  # > 0: stop after this many optimizer steps instead
    warmup_ratio: float = 0.03
    scheduler: str = "cosine"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: bool = False
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on CPU
    device: str = "auto"  # auto: cuda when there is one
    gradient_checkpointing: bool = False

    def __post_init__(self):
        problems = []
        if self.rank < 1 or self.alpha <= 0:
            problems.append("rank must be >= 1 and alpha > 0")
        if not 0 <= self.dropout < 1:
            problems.append("dropout must be in [0, 1)")
        if self.batch_size < 1 or self.micro_batch_size < 1 or self.batch_size % self.micro_batch_size:
            problems.append(f"batch_size ({self.batch_size}) must be a multiple of micro_batch_size "
                            f"({self.micro_batch_size})")
        if self.learning_rate <= 0 or self.epochs <= 0 or self.max_steps < 0 or self.checkpoint_every < 1:
            problems.append("learning_rate and epochs must be > 0, max_steps >= 0, checkpoint_every >= 1")
        if self.scheduler not in SCHEDULERS:
            problems.append(f"scheduler '{self.scheduler}' is not one of {sorted(SCHEDULERS)}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(f"dtype '{self.dtype}' is not auto, float32, bfloat16 or float16")
        if bool(self.questions) != bool(self.images):
            problems.append("questions and images go together (a question table and the folder of its images)")
        if self.questions and self.pangea:
            problems.append("pangea settings apply only without questions (the Pangea questions)")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_config(cls, settings: dict, where: str = "derive") -> "FinetuneSettings":
        settings = dict(settings)
        unknown = sorted(set(settings) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{where}: unknown lora_finetune setting(s) {unknown}; known: "
                             f"{sorted(cls.__dataclass_fields__)}")
        if isinstance(settings.get("target_modules"), list):
            settings["target_modules"] = tuple(settings["target_modules"])
        try:
            made = cls(**settings)
            if made.pangea:

                TrainingQuestionSettings.from_config(made.pangea)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None
        return made

    @property
    def accumulation(self) -> int:
        return self.batch_size // self.micro_batch_size


#: What the paper states of its Pangea fine-tune's training (Appendix D): "The learning rate is 2e-5", "a
#: total batch size of 64" (the rest of the recipe is LLaVA's task-LoRA script: "common practice").
PAPER_TRAINING = {"learning_rate": 2e-5, "batch_size": 64}


def paper_departures(settings: dict, where: str = "derive") -> list[str]:
    """How a ``lora_finetune`` block (without method and base) departs from the paper's Pangea fine-tune
    (Appendix D: its question set, ``TrainingQuestionSettings.departures_from_paper``, its lr and batch), one
    short phrase each; empty for the paper's recipe. Table 5 names a departing model a variant of the paper's
    method."""

    made = FinetuneSettings.from_config(settings, where)
    found = (["trained on another question table"] if made.questions
             else TrainingQuestionSettings.from_config(made.pangea).departures_from_paper())
    if made.learning_rate != PAPER_TRAINING["learning_rate"]:
        found.append(f"lr {made.learning_rate:g}, the paper's 2e-5")
    if made.batch_size != PAPER_TRAINING["batch_size"]:
        found.append(f"batch {made.batch_size}, the paper's 64")
    return found


SCHEDULERS = {"cosine": "get_cosine_schedule_with_warmup", "linear": "get_linear_schedule_with_warmup",
              "constant": "get_constant_schedule_with_warmup"}


def check_settings(settings: dict, where: str) -> None:
    """Called while the config is checked (derived/__init__.py): refuse a bad block before any job runs."""
    FinetuneSettings.from_config(settings, where)
