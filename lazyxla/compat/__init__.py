"""torch_xla's module names for ``lazyxla run``: ``import torch_xla`` gives lazyxla's compatibility
modules (``lazyxla/compat/torch_xla/...``).

``install()`` puts a finder first on ``sys.meta_path`` that answers ``torch_xla`` and every
``torch_xla.x.y`` with the module ``lazyxla.compat.torch_xla.x.y`` itself (both names give the
same module object); a torch_xla module lazyxla has no counterpart for is a
``ModuleNotFoundError`` naming it (and, for those in ``NOT_OFFERED_MODULES``, the nearest
alternative). It also makes processes started with multiprocessing's
``spawn`` (``torch_xla.launch``, ``xmp.spawn`` with several processes) install the finder before
they run the script again as ``__mp_main__``. Only ``lazyxla run`` calls ``install()``: nothing
changes in any other process, and no package named ``torch_xla`` is installed.

``not_offered(module_name, alternatives)`` makes a compat module's ``__getattr__``: a torch_xla
name lazyxla does not offer raises ``NotOffered`` (a ``NotImplementedError``, and an
``AttributeError`` so that ``hasattr`` says False) naming it and the nearest lazyxla alternative.

May touch: ``sys.meta_path``, ``sys.modules`` (the torch_xla names), multiprocessing's spawn
preparation (wrapped once).

Above the public API, which it forwards to; only ``cli`` (``lazyxla run``) imports it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import multiprocessing.spawn
import sys

PREFIX = "torch_xla"
HOME = __name__ + ".torch_xla"   # lazyxla.compat.torch_xla
README = "see the manual's 'Porting from torch_xla' (docs/guide/porting.md, 'Every name') for what is offered"


class NotOffered(NotImplementedError, AttributeError):
    """A torch_xla name lazyxla does not offer."""


def torch_xla_name(module_name: str) -> str:
    """``lazyxla.compat.torch_xla.core.xla_model`` -> ``torch_xla.core.xla_model``."""
    return PREFIX + module_name[len(HOME):] if module_name.startswith(HOME) else module_name


def not_offered(module_name: str, alternatives: dict | None = None):
    """A module ``__getattr__`` that refuses torch_xla names lazyxla does not offer, saying what
    to use instead (``alternatives``: name -> the nearest lazyxla alternative, as text)."""
    alternatives = dict(alternatives or {})
    public = torch_xla_name(module_name)

    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {public!r} has no attribute {name!r}")
        alt = alternatives.get(name)
        hint = f"nearest lazyxla alternative: {alt}" if alt else README
        raise NotOffered(f"{public}.{name} is not offered by lazyxla ({hint})")

    return __getattr__


class _Alias(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


# torch_xla modules lazyxla does not offer that scripts and libraries reach for, with the nearest
# alternative an import error names (any other missing one names the README)
NOT_OFFERED_MODULES = {
    "torch_xla.amp.syncfree": "torch.optim's Adam, AdamW or SGD, fused or not, whose steps lazyxla records on the "
                              "device; for the HuggingFace Trainer, optim=\"adamw_torch_fused\" (its default) or "
                              "\"adamw_torch\" instead of \"adamw_torch_xla\"",
    "torch_xla.distributed.fsdp": "data-parallel training across processes (the HuggingFace Trainer under torchrun "
                                  "without fsdp, lazyxla.distributed.optimizer_step), or parameters sharded over a "
                                  "device mesh with lazyxla.distributed.spmd.mark_sharding",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel": "lazyxla.distributed.spmd.mark_sharding on the "
                                                               "parameters, or data-parallel training under "
                                                               "torchrun without fsdp",
}


class TorchXlaFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch_xla[.x.y]`` as ``lazyxla.compat.torch_xla[.x.y]``, the same module object."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        real = HOME + fullname[len(PREFIX):]
        try:
            module = importlib.import_module(real)
        except ModuleNotFoundError as e:
            if e.name != real:
                raise
            alt = next((a for m, a in NOT_OFFERED_MODULES.items() if fullname == m or fullname.startswith(m + ".")),
                       None)
            hint = f"nearest lazyxla alternative: {alt}" if alt else README
            raise ModuleNotFoundError(f"{fullname} is not offered by lazyxla ({hint})", name=fullname) from None
        return importlib.util.spec_from_loader(fullname, _Alias(module))


_FINDER = TorchXlaFinder()


class _InstallInChild:
    """Unpickled first in a process started by multiprocessing's spawn: installs the finder
    there before the script is run again as ``__mp_main__``."""

    def __reduce__(self):
        return (install, ())


def _with_finder(get_preparation_data):
    def prepared(name):
        data = get_preparation_data(name)
        data["lazyxla_compat"] = _InstallInChild()  # multiprocessing's prepare() ignores unknown keys
        return data
    prepared.lazyxla_wrapped = True
    return prepared


def install() -> None:
    """Make ``import torch_xla`` give lazyxla's compatibility modules in this process (and in
    the processes it spawns). Idempotent."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if not getattr(multiprocessing.spawn.get_preparation_data, "lazyxla_wrapped", False):
        multiprocessing.spawn.get_preparation_data = _with_finder(multiprocessing.spawn.get_preparation_data)


def installed() -> bool:
    return _FINDER in sys.meta_path
