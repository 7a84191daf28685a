"""Which of PyTorch's core ATen ops lazyxla lowers, decomposes or runs on the CPU.

The core ATen op set is every ``torch.ops.aten`` overload tagged ``torch.Tag.core``. Each
is *classified* as the warm path (``frontend.tensor``, ``frontend.ops``) handles it, in its own order:

- ``lowered``: a JAX lowering is registered for it (for an in-place or out= variant, for
  its functional op), or ``ops`` handles it itself (aliases, transfers);
- ``composite``: PyTorch's CompositeImplicitAutograd kernel rewrites it into other ops;
- ``decomposed``: a ``torch._decomp`` decomposition rewrites it into other ops;
- ``fallback``: it runs on the CPU, counted as ``aten::<op>`` (R1.7).

``verify`` then *runs* each op on the lazy device and compares with eager CPU. Its inputs
are PyTorch's OpInfo samples (``op_db``), recorded at the ATen level: every sample of an
OpInfo runs on the CPU under a dispatch mode below autograd that keeps the arguments of
each core op it reaches (a composite op is kept, then followed into its decomposition), so
each core op is replayed exactly as PyTorch calls it; backward ops come from a backward
pass. Per op the result is ``ok``, ``fallback`` (an ``aten::*`` counter moved; expected
for ops whose output shape depends on the data), ``error`` (raised, or a wrong value) or
``no-sample``.

``lazyxla coverage [--verify] [--markdown FILE]`` prints the table and the totals;
``--markdown`` writes the whole page (``docs/coverage.md`` is this, with ``--verify``).
``lazyxla coverage --opinfo`` runs whole OpInfos instead (``tools.opinfo``, ``docs/opinfo.md``).
Needs ``expecttest`` for ``--verify`` (PyTorch's OpInfo database imports it). Touches the
lazy device's counters and compilation cache, and nothing else (the CPU RNG is restored).

Modules, in the order a run goes: ``ops`` (the op set and its classification), ``samples``
(OpInfo samples recorded at the ATen level), ``verify`` (each op on the lazy device against
eager), ``report`` (the table, the page, the subcommand). A tool on top of the package: it
imports the public API and the stages it checks, and nothing imports it but ``cli``.
"""
from .ops import (CATEGORIES, EXPECTED_FALLBACK, classification, classify, core_ops, counts,  # noqa: F401
                  fallback_share, op_name, packet_name)
from .report import add_arguments, markdown, page, run, summary  # noqa: F401
from .samples import collect_samples  # noqa: F401
from .verify import STATUSES, verify, verify_op  # noqa: F401
