"""The last decoder layer's attention, kept for the steppers that copy their prefix (OPERA's
:class:`~.steppers.AttendingStepper`): a collaborator of :class:`~verbmirage.models.hf.engine.TransformersVLM` (its
``last_attention``) that owns the switch to eager attention, its hook and the row it keeps, and undoes all three
when the engine's variant no longer reads the attention.
"""

from __future__ import annotations

import torch

from verbmirage.models.hf.tokens import decoder_layers, language_attention, use_language_attention


class LastAttention:
    """While :attr:`kept`: eager attention in the language model and a hook on its last layer that keeps, after
    each forward, the attention row of the last fed token, max over heads (:attr:`row` [rows, keys]; None where the
    forward computed no weights: one that reads its prefixes in place records its own,
    :class:`~.shared_prefix.AttentionRecord`)."""

    def __init__(self, model):
        self.model = model
        #: The row the last forward kept (None: none kept, or not :attr:`kept`).
        self.row: torch.Tensor | None = None
        self._hook = None
        self._implementation: str | None = None  # the language model's attention before the switch

    @property
    def kept(self) -> bool:
        return self._hook is not None

    def keep(self) -> None:
        """Switch to eager attention and keep the last layer's row (no change where already kept)."""
        if self._hook is not None:
            return
        self._implementation = language_attention(self.model)
        use_language_attention(self.model, "eager")
        self._hook = decoder_layers(self.model)[-1].self_attn.register_forward_hook(self._keep_row)

    def release(self) -> None:
        """Back to the attention the language model ran before :meth:`keep`, the hook and its row gone."""
        if self._hook is None:
            return
        self._hook.remove()
        self._hook, self.row = None, None
        use_language_attention(self.model, self._implementation)

    def _keep_row(self, module, args, output) -> None:
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        self.row = None if weights is None else weights[:, :, -1, :].float().amax(dim=1)
