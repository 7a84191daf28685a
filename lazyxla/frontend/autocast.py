"""``torch.autocast("lazyxla", dtype=torch.bfloat16)``: PyTorch's autocast policy for our device.

PyTorch's Autocast keys need kernels from each backend. These register, for the
PrivateUse1 autocast key, CUDA's policy: matrix products and convolutions run in the
autocast dtype; numerically touchy ops (softmax, norms, losses, exp/log) run in float32;
every other op falls through unchanged. ``register()`` (called once by ``import lazyxla``)
registers them. Touches only PyTorch's dispatcher registrations.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER = ["_convolution.deprecated", "_convolution.default", "conv1d.default", "conv2d.default",
         "conv3d.default", "conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input",
         "convolution.default", "prelu.default", "addmm.default", "addmv.default", "addr.default",
         "matmul.default", "einsum.default", "mm.default", "mv.default", "linear.default",
         "addbmm.default", "baddbmm.default", "bmm.default", "chain_matmul.default",
         "linalg_multi_dot.default", "lstm_cell.default", "gru_cell.default", "rnn_tanh_cell.default",
         "rnn_relu_cell.default", "scaled_dot_product_attention.default"]
FP32 = ["acos.default", "asin.default", "cosh.default", "erfinv.default", "exp.default", "expm1.default",
        "log.default", "log10.default", "log2.default", "log1p.default", "reciprocal.default",
        "rsqrt.default", "sinh.default", "tan.default", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
        "pow.Scalar", "softplus.default", "layer_norm.default", "native_layer_norm.default",
        "group_norm.default", "norm.Scalar", "norm.ScalarOpt_dim", "cosine_similarity.default",
        "poisson_nll_loss.default", "cosine_embedding_loss.default", "nll_loss.default",
        "nll_loss2d.default", "hinge_embedding_loss.default", "kl_div.default", "l1_loss.default",
        "smooth_l1_loss.default", "huber_loss.default", "mse_loss.default", "margin_ranking_loss.default",
        "soft_margin_loss.default", "triplet_margin_loss.default", "binary_cross_entropy_with_logits.default",
        "dist.default", "cdist.default", "renorm.default", "logsumexp.default", "softmax.int",
        "log_softmax.int", "cumprod.default", "cumsum.default", "prod.default", "sum.default",
        "cross_entropy_loss.default"]


def _cast(x, to):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64 and x.dtype != to:
        return x.to(to)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, to) for y in x)
    return x


def _kernel(op, policy):
    def kernel(*args, **kwargs):
        to = torch.get_autocast_dtype("lazyxla") if policy == "lower" else torch.float32
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(args, to), **{k: _cast(v, to) for k, v in kwargs.items()})
    return kernel


_LIBRARIES: list = []  # PyTorch keeps a registration while its Library object lives


def register() -> None:
    """Register the policy's kernels (once per process)."""
    if _LIBRARIES:
        return
    lib = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", LOWER), ("fp32", FP32)):
        for name in names:
            n, _, o = name.partition(".")
            packet = getattr(aten, n, None)
            op = getattr(packet, o, None) if packet is not None else None
            if op is not None:
                lib.impl(n if o == "default" else name, _kernel(op, policy), _KEY)
    fall = torch.library.Library("_", "IMPL")
    fall.fallback(torch.library.fallthrough_kernel, _KEY)
    _LIBRARIES.extend((lib, fall))
