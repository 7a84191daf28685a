"""The graph hash: R3's six merge sites, in order, with a trace of the fold.

The key is built from an ordered list of named ingredients. Each ingredient has a 128-bit
hash and a readable summary; the running digest is merged with it, and every step is kept
in a ``FoldTrace`` (site, summary, ingredient hash, digest after the merge) so that a
recompile can be explained and the fold shown term by term:

1. ``force_ltc_data``: the seed of the fold (true on a sync, false on a value read);
2. ``environment``: the compilation environment together with the two build revisions
   (PyTorch's git revision; lazyxla's and jaxlib's versions), merged as one;
3. ``tensors``: one merge per synced tensor, its root IR hash, in arena order;
4. ``parameters``: the parameter sequence of the post-order;
5. ``donation``: the sorted donated parameter indices, only when there are any;
6. ``sharding``: the auto-sharding flag with the contents of ``XLA_AUTO_SPMD_MESH``.

Touches nothing but its own trace objects (and reads the environment once).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from .hashing import encode, fold, merge

SITES = ("force_ltc_data", "environment", "tensors", "parameters", "donation", "sharding")

# XLA_FLAGS that do not change compiled code (dump and debug output), left out of the key.
_IGNORED_FLAGS = {
    "--xla_dump_to", "--xla_dump_hlo_as_text", "--xla_dump_hlo_as_proto", "--xla_dump_hlo_as_dot",
    "--xla_dump_hlo_as_url", "--xla_dump_hlo_as_html", "--xla_dump_fusion_visualization",
    "--xla_dump_hlo_snapshots", "--xla_dump_include_timestamp", "--xla_dump_max_hlo_modules",
    "--xla_dump_module_metadata", "--xla_dump_hlo_pass_re", "--xla_dump_hlo_module_re",
    "--xla_dump_compress_protos", "--xla_dump_disable_metadata", "--xla_dump_large_constants",
    "--xla_dump_hlo_pipeline_re", "--xla_force_host_platform_device_count",
}


class Step:
    """One merge: its site, the ingredient's hash, the digest after it, and what it was."""

    __slots__ = ("site", "_summary", "ingredient", "digest", "detail")

    def __init__(self, site, summary, ingredient, digest, detail=None):
        self.site = site
        self._summary = summary
        self.ingredient = ingredient
        self.digest = digest
        self.detail = detail  # site-specific data for explanations (tensors: (tensor id, root value))

    @property
    def summary(self) -> str:
        s = self._summary
        if s is None:
            s = self._summary = _describe_root(self.detail)
        elif callable(s):  # written only when someone reads it: lookups are on the hot path
            s = self._summary = s()
        return s

    def as_dict(self):
        return {"site": self.site, "summary": self.summary, "ingredient": self.ingredient.hex(),
                "digest": self.digest.hex()}


def _describe_root(detail):
    if not detail:
        return ""
    uid, (node, idx) = detail
    from .ir import fmt_where
    outs = node.outs if hasattr(node, "outs") else node.sig.outs
    op = node.op
    w = f" at {fmt_where(node.where)}" if node.where else ""
    return f"tensor {uid}: {op} -> {outs[idx]!r}{w}"


@dataclass
class FoldTrace:
    steps: list = field(default_factory=list)

    @property
    def key(self) -> bytes:
        return self.steps[-1].digest

    @property
    def hex(self) -> str:
        return self.key.hex()

    def __str__(self):
        lines = [f"graph hash {self.hex}, folded in {len(self.steps)} merges:"]
        for i, s in enumerate(self.steps):
            lines.append(f"  {i:>3} {s.site:<15} {s.ingredient.hex()[:12]}.. -> {s.digest.hex()}  {s.summary}")
        return "\n".join(lines)


def _flags_text(value: str) -> str:
    keep = []
    for tok in value.split():
        if not tok.startswith("--xla"):
            continue
        if tok.split("=", 1)[0] in _IGNORED_FLAGS:
            continue
        keep.append(tok)
    return " ".join(sorted(keep))


_ENV = None


def environment():
    """(hash, summary) of the compilation environment and build revisions; computed once."""
    global _ENV
    if _ENV is None:
        import jax
        import jaxlib
        import torch

        from . import __version__
        dev = jax.devices()[0]
        backend = dev.client
        parts = {
            "platform": dev.platform,
            "platform_version": getattr(backend, "platform_version", ""),
            "devices": ",".join(str(d) for d in jax.devices()),
            "XLA_FLAGS": _flags_text(os.environ.get("XLA_FLAGS", "")),
            "XLA_IR_DEBUG": os.environ.get("XLA_IR_DEBUG", ""),
            "XLA_HLO_DEBUG": os.environ.get("XLA_HLO_DEBUG", ""),
        }
        env_h = fold(*(encode(k) + encode(v) for k, v in parts.items()))
        torch_rev = torch.version.git_version
        xla_rev = f"lazyxla {__version__}; jaxlib {jaxlib.__version__}"
        h = fold(env_h, fold(encode(torch_rev)), fold(encode(xla_rev)))
        summary = (f"{parts['platform']} ({parts['platform_version']}), devices {parts['devices']}, "
                   f"XLA_FLAGS='{parts['XLA_FLAGS']}'; torch {torch_rev[:10]}; {xla_rev}")
        _ENV = (h, summary, parts | {"TORCH_GITREV": torch_rev, "XLA_GITREV": xla_rev})
    return _ENV


_TRUE, _FALSE = fold(encode(True)), fold(encode(False))


def compute(force_ltc_data: bool, roots, param_sequence, donated, auto_sharding=False) -> FoldTrace:
    """Fold the six ingredients in order. ``roots``: (root value hash, (tensor id, root value))
    pairs; the second item only feeds summaries and explanations."""
    trace = FoldTrace()
    steps = trace.steps
    h = _TRUE if force_ltc_data else _FALSE
    steps.append(Step("force_ltc_data", f"force_ltc_data={'true' if force_ltc_data else 'false'}", h, h))
    env_h, env_summary, _ = environment()
    h = merge(h, env_h)
    steps.append(Step("environment", env_summary, env_h, h))
    for vh, desc in roots:
        h = merge(h, vh)
        steps.append(Step("tensors", None, vh, h, desc))
    ph = fold(b"params", ",".join(map(str, param_sequence)).encode())
    h = merge(h, ph)
    steps.append(Step("parameters", lambda: f"parameter sequence {_short_list(param_sequence)}", ph, h,
                      param_sequence))
    if donated:
        donors = sorted(donated)
        dh = fold(b"donors", ",".join(map(str, donors)).encode())
        h = merge(h, dh)
        steps.append(Step("donation", lambda: f"donated parameters {donors}", dh, h, donors))
    sh, summary = _sharding(bool(auto_sharding), os.environ.get("XLA_AUTO_SPMD_MESH", ""))
    h = merge(h, sh)
    steps.append(Step("sharding", summary, sh, h))
    return trace


@functools.lru_cache(maxsize=64)
def _sharding(auto_sharding: bool, mesh: str):
    """The sharding ingredient and its summary (the flag with the mesh's text)."""
    return (fold(encode(auto_sharding), encode(mesh)),
            f"auto-sharding={'on' if auto_sharding else 'off'}, XLA_AUTO_SPMD_MESH='{mesh}'")


def _short_list(xs, n=12):
    xs = list(xs)
    if len(xs) <= n:
        return str(xs)
    return "[" + ", ".join(map(str, xs[:n])) + f", ... ({len(xs)} in all)]"
