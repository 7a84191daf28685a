"""HuggingFace integration (on top of capture and replay): ``lazyxla.hf.generate``, a decoding
method for ``model.generate(..., custom_generate=lazyxla.hf.generate)`` whose per-token loop runs
one replayed program per token (``generation``), and transformers' attention-mask checks told a
lazy tensor is traced, so a lazy step builds its mask in its own program and reads nothing
(``masks``, installed by ``import lazyxla``).

May import: ``replay`` (the token step), ``frontend``, ``engine``, ``dynamic`` (the prompt's
bucket) and the shared modules. ``import lazyxla`` does not import transformers.
"""
from .generation import generate  # noqa: F401
