"""The model interface, the backend registry and the backends."""

from verbmirage.models.base import (
    ModelContext,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
)
from verbmirage.models.registry import BACKENDS, create_model

__all__ = [
    "BACKENDS",
    "ModelContext",
    "MultipleChoiceResult",
    "Question",
    "VisionLanguageModel",
    "YesNoResult",
    "create_model",
]
