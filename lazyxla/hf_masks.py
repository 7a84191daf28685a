"""transformers' attention-mask checks inside a capture: told the step is traced.

transformers skips building an attention mask when it can prove it is not needed: it reads
``padding_mask.all()`` (and, for position ids, whether the sequences are packed) unless
``is_tracing(tensor)`` says the step is being traced, in which case it always builds the mask.
Both paths give the same attention values (a mask of all-visible positions masks nothing).
A captured step (``replay``) cannot read a value, so while one is captured, the name
``is_tracing`` in ``transformers.masking_utils`` answers True: the captured program builds the
mask, and HF models (GPT-2, BERT, Llama) replay unchanged. Outside a capture nothing changes.

May touch: ``transformers.masking_utils.is_tracing`` (while a capture runs, restored after),
only if transformers is already imported.
"""
from __future__ import annotations

import sys

_MODULE = "transformers.masking_utils"
_saved = None  # (module, its is_tracing) while a capture runs


def _traced(tensor=None) -> bool:
    return True


def enter() -> None:
    """A capture begins: transformers' mask checks see a traced step."""
    global _saved
    mod = sys.modules.get(_MODULE)
    if mod is None or _saved is not None or not hasattr(mod, "is_tracing"):
        return
    _saved = (mod, mod.is_tracing)
    mod.is_tracing = _traced


def leave() -> None:
    """The capture ended (or failed): transformers' own check again."""
    global _saved
    if _saved is not None:
        mod, original = _saved
        mod.is_tracing = original
        _saved = None
