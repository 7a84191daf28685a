"""An iteration's work: what a loop's body computes, in floating-point operations, against the
loop's own cost per iteration (``settings.MIN_WORK``).

A rolled loop runs its body once per iteration, and each iteration costs the platform something
besides the body: on XLA:CPU a while loop's condition is read back to the host and every op of
the body is a call of its own, ~13 us per iteration on this project's machine (a 32-layer MLP of
width 64, batch 16: its captured step 1.64 ms rolled, 0.82 ms unrolled, 62 iterations). A body
whose own work takes less than that makes the rolled step up to twice as slow as the unrolled
one, and rolling only saves compile time, which a step replayed thousands of times never gets
back. So a loop is taken only when its iteration's work is at least the platform's floor.

The count is an estimate from the IR's shapes: a contraction (``CONTRACTIONS``) is 2 x its output's
elements x the length it sums over, anything else one operation per output element.

Touches nothing.
"""
from __future__ import annotations


def _k_last(i):
    """The contracted length is operand ``i``'s last dimension (``mm``, ``addmm``, ``bmm``...)."""
    return lambda ins: ins[i].shape[-1] if ins[i].shape else 1


def _k_weight(i):
    """A convolution's: one output element reads ``weight.numel / out_channels`` products."""
    def k(ins):
        w = ins[i]
        return w.numel // w.shape[0] if w.shape and w.shape[0] else 1
    return k


def _k_attention(ins):
    """Attention: the scores' and the output's products, each over the keys (``S``) and the
    head dimension (``E``): per output element 2 x S multiply-adds."""
    return 2 * ins[1].shape[-2] if len(ins) > 1 and len(ins[1].shape) >= 2 else 1


# op -> (the contracted length from the operands' metas, a multiplier: a backward computes the
# gradients of both inputs)
CONTRACTIONS = {
    "aten::mm": (_k_last(0), 1),
    "aten::addmm": (_k_last(1), 1),
    "aten::bmm": (_k_last(0), 1),
    "aten::baddbmm": (_k_last(1), 1),
    "aten::addbmm": (_k_last(1), 1),
    "aten::matmul": (_k_last(0), 1),
    "aten::linear": (_k_last(0), 1),
    "aten::convolution": (_k_weight(1), 1),
    "aten::convolution_backward": (_k_weight(2), 2),
    "aten::_scaled_dot_product_attention_math": (_k_attention, 1),
    "aten::scaled_dot_product_attention": (_k_attention, 1),
}


def flops(nodes) -> int:
    """The estimated floating-point operations of ``nodes`` (IR nodes: one iteration's)."""
    total = 0
    for n in nodes:
        out = sum(m.numel for m in n.sig.outs)
        rule = CONTRACTIONS.get(n.sig.op)
        if rule is None:
            total += out
            continue
        k, times = rule
        ins = [o.sig.outs[j] for o, j in n.operands]
        try:
            total += 2 * n.sig.outs[0].numel * k(ins) * times
        except IndexError:  # fewer tensor operands than the schema's (an optional one given as None)
            total += out
    return total
