"""``torch.autocast("lazyxla", dtype=torch.bfloat16)``: PyTorch's autocast policy for our device.

PyTorch's Autocast keys need kernels from each backend. These register, for the
PrivateUse1 autocast key, CUDA's policy: matrix products and convolutions run in the
autocast dtype; numerically touchy ops (softmax, norms, losses, exp/log) run in float32;
every other op falls through unchanged. Touches only PyTorch's dispatcher registrations.
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


_lib = torch.library.Library("aten", "IMPL")
for _policy, _names in (("lower", LOWER), ("fp32", FP32)):
    for _name in _names:
        _n, _, _o = _name.partition(".")
        _packet = getattr(aten, _n, None)
        _op = getattr(_packet, _o, None) if _packet is not None else None
        if _op is not None:
            _lib.impl(_n if _o == "default" else _name, _kernel(_op, _policy), _KEY)

_fall = torch.library.Library("_", "IMPL")
_fall.fallback(torch.library.fallthrough_kernel, _KEY)
