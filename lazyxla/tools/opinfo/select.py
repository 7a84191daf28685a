"""Which OpInfos a run takes: every OpInfo of PyTorch's ``op_db`` that supports the mode's dtype on
the CPU (with ``-grad``, its backward too) and is not random (by name, ``RANDOM_NAME``, or by
``has_nondeterministic_output``); the modes a whole run is made of (``MODES``).

Touches nothing.
"""
from __future__ import annotations

import re

import torch


RANDOM_NAME = re.compile(r"^(nn\.functional\.)?(rand\w*|normal|bernoulli|multinomial|\w*dropout(\dd)?|uniform"
                         r"|exponential|geometric|cauchy|log_normal|poisson|rrelu|fractional_max_pool\dd"
                         r"|svd_lowrank|pca_lowrank)$")

# The dtypes ``--dtype`` takes by name, and the modes a whole run is made of (``MODES``: every
# dtype the issue-31 table covers, and float32 autograd).
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "complex64": torch.complex64, "int32": torch.int32,
          "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}
MODES = ("float32", "float32-grad", "float64", "float16", "bfloat16", "complex64", "int32", "int64", "bool")


def parse_mode(mode: str):
    """``(dtype, grad)`` of a mode name: a dtype (``bfloat16``) or ``float32-grad`` (autograd:
    the gradients of every input that requires one, for a fixed cotangent, are compared)."""
    name, grad = (mode[:-len("-grad")], True) if mode.endswith("-grad") else (mode, False)
    if name not in DTYPES:
        raise ValueError(f"lazyxla coverage --opinfo: unknown dtype {name!r}; one of {', '.join(DTYPES)} "
                         f"(a floating one may end in -grad)")
    if grad and not DTYPES[name].is_floating_point:
        raise ValueError(f"lazyxla coverage --opinfo: {mode}: gradients need a floating dtype")
    return DTYPES[name], grad


def full_name(opinfo) -> str:
    return opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")


def _op_db():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as e:  # PyTorch's test helpers need expecttest
        raise ImportError(f"lazyxla coverage --opinfo needs PyTorch's OpInfo database ({e}); "
                          "pip install expecttest (lazyxla's test extra)") from e
    return op_db


def select(names=None, dtype=torch.float32, grad=False):
    """``(opinfos, excluded)``: the OpInfos to run for ``dtype`` on the CPU (with ``grad``: those
    whose backward supports it), in ``op_db``'s order, and ``{name: reason}`` for those left out
    as random (by name or nondeterministic output). ``names``: OpInfo names (``div`` takes every
    variant, ``div.trunc_rounding`` one)."""
    chosen, excluded = [], {}
    want = None if names is None else set(names)
    for o in _op_db():
        n = full_name(o)
        if want is not None and not (o.name in want or n in want):
            continue
        try:
            if dtype not in o.supported_dtypes("cpu"):
                continue
            if grad and not (o.supports_autograd and dtype in o.supported_backward_dtypes("cpu")):
                continue
        except Exception:
            continue
        if RANDOM_NAME.match(o.name):
            excluded[n] = "random (by name)"
        elif getattr(o, "has_nondeterministic_output", False):
            excluded[n] = "nondeterministic output (values unspecified)"
        else:
            chosen.append(o)
    return chosen, excluded
