"""The graph hash: R3's six merge sites, as one ordered list of named ingredients.

``INGREDIENTS`` is the key's recipe, in R3's order; each entry is a site name and a function
that turns a ``KeyRequest`` into the merges of that site, as (ingredient hash, summary,
detail) triples. ``compute`` walks the list once: the first ingredient seeds the digest,
every later one is merged into it (``hashing.merge``), and each merge is kept as a ``Step``
of a ``FoldTrace``. The same walk makes the key and its explanation, so the two cannot
disagree.

1. ``force_ltc_data``: true on a sync, false on a value read (the seed of the fold);
2. ``environment``: ``xla.compile_environment()`` and the matmul precision
   (``xla.precision``: it changes the program) with the two build revisions (PyTorch's git
   revision; lazyxla's and jaxlib's versions), merged as one;
3. ``tensors``: one merge per synced tensor, its root IR hash, in arena order;
4. ``parameters``: the parameter sequence of the post-order;
5. ``donation``: the sorted donated parameter indices, only when there are any;
6. ``sharding``: the auto-sharding flag with the contents of ``XLA_AUTO_SPMD_MESH``.

Summaries are written only when read (lookups run every step). May touch: nothing but the
trace objects it makes; reads ``XLA_AUTO_SPMD_MESH`` at each key.
"""
from __future__ import annotations

import functools

from ..config import env_str
from ..hashing import encode, fold, merge
from ..ir.user_line import fmt_where
from ..ir.node import skeleton
from ..xla.client import compile_environment
from ..xla.precision import get_mat_mul_precision


class KeyRequest:
    """What one key is computed from. ``roots``: (tensor id, root IR value) pairs in arena
    order; each root's merge is its value's hash, the tensor id only feeds summaries."""

    __slots__ = ("force_ltc_data", "roots", "param_sequence", "donated", "auto_sharding")

    def __init__(self, force_ltc_data: bool, roots, param_sequence, donated=(), auto_sharding=False):
        self.force_ltc_data = force_ltc_data
        self.roots = roots
        self.param_sequence = param_sequence
        self.donated = donated
        self.auto_sharding = auto_sharding

    def ingredients(self) -> tuple:
        """Everything the key is folded from, as one tuple: two requests with equal
        ingredients have the same key (the environment is fixed for the process but for the
        matmul precision, which the user sets)."""
        return (self.force_ltc_data, tuple([v[0].vh[v[1]] for _, v in self.roots]), tuple(self.param_sequence),
                tuple(sorted(self.donated)), bool(self.auto_sharding), env_str("XLA_AUTO_SPMD_MESH"),
                get_mat_mul_precision())


_TRUE, _FALSE = fold(encode(True)), fold(encode(False))


def _force_ltc_data(req):
    on = req.force_ltc_data
    yield (_TRUE if on else _FALSE), f"force_ltc_data={'true' if on else 'false'}", None


@functools.lru_cache(maxsize=8)
def _environment_ingredient(mat_mul_precision):
    env = compile_environment()
    parts = ("platform", "platform_version", "devices", "XLA_FLAGS", "XLA_IR_DEBUG", "XLA_HLO_DEBUG",
             "LAZYXLA_CHECK_VALUES", "LAZYXLA_PRNG_IMPL")
    if env["LAZYXLA_TPU_KERNELS"] != "off":  # folded only when kernels replace lowerings (lowering.tpu_kernels)
        parts += ("LAZYXLA_TPU_KERNELS",)
    env_h = fold(*(encode(k) + encode(env[k]) for k in parts),
                 encode("mat_mul_precision") + encode(mat_mul_precision))
    torch_rev = env["torch_git"]
    xla_rev = f"lazyxla {env['lazyxla']}; jaxlib {env['jaxlib']}"
    h = fold(env_h, fold(encode(torch_rev)), fold(encode(xla_rev)))
    summary = (f"{env['platform']} ({env['platform_version']}), devices {env['devices']}, "
               f"XLA_FLAGS='{env['XLA_FLAGS']}', mat_mul_precision={mat_mul_precision}; torch {torch_rev[:10]}; "
               f"{xla_rev}")
    return h, summary


def _environment(req):
    h, summary = _environment_ingredient(get_mat_mul_precision())
    yield h, summary, None


def _tensors(req):
    for detail in req.roots:
        v = detail[1]
        yield v[0].vh[v[1]], None, detail  # the summary is written from the detail when read


def _parameters(req):
    seq = req.param_sequence
    yield (fold(b"params", ",".join(map(str, seq)).encode()),
           lambda: f"parameter sequence {_short_list(seq)}", seq)


def _donation(req):
    if req.donated:
        donors = sorted(req.donated)
        yield fold(b"donors", ",".join(map(str, donors)).encode()), lambda: f"donated parameters {donors}", donors


def _sharding(req):
    yield _sharding_ingredient(bool(req.auto_sharding), env_str("XLA_AUTO_SPMD_MESH")) + (None,)


@functools.lru_cache(maxsize=64)
def _sharding_ingredient(auto_sharding: bool, mesh: str):
    return (fold(encode(auto_sharding), encode(mesh)),
            f"auto-sharding={'on' if auto_sharding else 'off'}, XLA_AUTO_SPMD_MESH='{mesh}'")


INGREDIENTS = (
    ("force_ltc_data", _force_ltc_data),
    ("environment", _environment),
    ("tensors", _tensors),
    ("parameters", _parameters),
    ("donation", _donation),
    ("sharding", _sharding),
)
SITES = tuple(site for site, _ in INGREDIENTS)


def compute(req: KeyRequest) -> "FoldTrace":
    """Fold the ingredients in order into the key, keeping every merge."""
    steps = []
    h = None
    for site, merges in INGREDIENTS:
        for ingredient, summary, detail in merges(req):
            h = ingredient if h is None else merge(h, ingredient)
            steps.append(Step(site, summary, ingredient, h, detail))
    return FoldTrace(steps)


class Step:
    """One merge: its site, the ingredient's hash, the digest after it, and what it was."""

    __slots__ = ("site", "_summary", "ingredient", "digest", "detail")

    def __init__(self, site, summary, ingredient, digest, detail=None):
        self.site = site
        self._summary = summary  # text, a function writing it, or None: written from the detail
        self.ingredient = ingredient
        self.digest = digest
        self.detail = detail  # site-specific data for explanations (tensors: (tensor id, root value))

    @property
    def summary(self) -> str:
        s = self._summary
        if s is None:
            s = self._summary = _describe_root(self.detail)
        elif callable(s):
            s = self._summary = s()
        return s

    def as_dict(self):
        return {"site": self.site, "summary": self.summary, "ingredient": self.ingredient.hex(),
                "digest": self.digest.hex()}


def _describe_root(detail):
    if not detail:
        return ""
    uid, (node, idx) = detail
    outs = node.outs if hasattr(node, "outs") else node.sig.outs
    w = f" at {fmt_where(node.where)}" if node.where else ""
    return f"tensor {uid}: {node.op} -> {outs[idx]!r}{w}"


class FoldTrace:
    """The merges of one key, in order (``steps``). A trace made by ``reusing`` an earlier
    trace of the same key writes its steps only when they are read (a warm lookup makes one
    per sync and almost never reads it)."""

    __slots__ = ("_steps", "_like", "_uids")

    def __init__(self, steps=None):
        self._steps = [] if steps is None else steps
        self._like = self._uids = None

    @classmethod
    def reusing(cls, like: "FoldTrace", uids) -> "FoldTrace":
        """The trace of ``like``'s key for a lookup whose synced tensors are ``uids`` (in
        arena order): the same merges, each tensor merge naming this lookup's tensor."""
        t = cls.__new__(cls)
        t._steps, t._like, t._uids = None, like, uids
        return t

    @property
    def steps(self) -> list:
        s = self._steps
        if s is None:
            uids = iter(self._uids)
            s = []
            for st in self._like.steps:
                if st.site == "tensors" and st.detail is not None:
                    st = Step(st.site, None, st.ingredient, st.digest, (next(uids), st.detail[1]))
                s.append(st)
            self._steps = s
        return s

    @property
    def key(self) -> bytes:
        if self._steps is None:
            return self._like.key
        return self._steps[-1].digest

    @property
    def hex(self) -> str:
        return self.key.hex()

    @property
    def force_ltc_data(self) -> bool:
        """The first merge's value: true for a sync's key, false for a value read's."""
        return self.steps[0].ingredient == _TRUE

    def by_site(self) -> dict:
        """site -> the steps merged there, in order, for every site of R3."""
        d = {s: [] for s in SITES}
        for st in self.steps:
            d[st.site].append(st)
        return d

    def keep_structure_only(self):
        """Before the trace is kept with a program: its tensor merges keep the IR's structure
        (``ir.skeleton``) and no device buffers."""
        memo = {}
        for st in self.steps:
            if st.site == "tensors" and st.detail is not None:
                uid, value = st.detail
                st.detail = (uid, skeleton(value, memo))

    def borrow_structure(self, cached: "FoldTrace"):
        """On a cache hit: the cached trace has this trace's key, so its IR skeletons describe
        this graph too; use them, and this trace pins none of this step's buffers."""
        old = [st for st in cached.steps if st.site == "tensors"]
        new = [st for st in self.steps if st.site == "tensors"]
        for st, o in zip(new, old):
            if st.detail is not None and o.detail is not None:
                st.detail = (st.detail[0], o.detail[1])

    def __str__(self):
        lines = [f"graph hash {self.hex}, folded in {len(self.steps)} merges:"]
        for i, s in enumerate(self.steps):
            lines.append(f"  {i:>3} {s.site:<15} {s.ingredient.hex()[:12]}.. -> {s.digest.hex()}  {s.summary}")
        return "\n".join(lines)


def _short_list(xs, n=12):
    xs = list(xs)
    if len(xs) <= n:
        return str(xs)
    return "[" + ", ".join(map(str, xs[:n])) + f", ... ({len(xs)} in all)]"
