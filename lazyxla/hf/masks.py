"""transformers' attention-mask checks on lazy tensors: told the step is traced.

transformers skips building an attention mask when it can prove it is not needed: it reads
``padding_mask.all()`` (and, for position ids, whether the sequences are packed) unless
``is_tracing(tensor)`` says the tensor is being traced, in which case it builds the mask. Both
paths give the same attention values (a mask of all-visible positions masks nothing). On the
lazy device that read is a value read in every forward: a small program the step waits for
(and in a captured step, a refusal). So, for a lazy tensor, the name ``is_tracing`` in
``transformers.masking_utils`` answers True: the mask is built in the step's own program, no
value is read, and HF models (GPT-2 and BERT, tested) replay unchanged. Every other tensor gets
transformers' own answer. ``LAZYXLA_HF_MASKS_TRACED=0`` leaves transformers as it is.

May touch: ``transformers.masking_utils.is_tracing`` (wrapped once, when that module is
loaded; ``sys.meta_path`` holds a finder until then).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

from ..config import env_flag
from ..frontend.tensor import LazyTensor

ENABLED = env_flag("LAZYXLA_HF_MASKS_TRACED", True)
_MODULE = "transformers.masking_utils"


def _patch(module) -> None:
    original = getattr(module, "is_tracing", None)
    if original is None or getattr(original, "lazyxla", False):
        return

    def is_tracing(tensor=None):
        return type(tensor) is LazyTensor or original(tensor)

    is_tracing.lazyxla = True
    module.is_tracing = is_tracing


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers.masking_utils is imported, its loader is
    wrapped so the module is patched once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def install() -> None:
    """Once, by ``import lazyxla``: patch transformers' mask checks now if they are loaded,
    else when they are."""
    if not ENABLED:
        return
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
