"""The OpInfo figure: PyTorch's OpInfo database run op by op on the lazy device.

Where ``tools.coverage.verify`` checks core ATen ops one by one, this checks the ops a user calls
(``torch.cumsum``, ``F.conv2d``, ``torch.linalg.solve``, ``x[m]``, ...): every OpInfo of
``torch.testing._internal.common_methods_invocations.op_db`` that supports float32 on the CPU
and is not random, on the first ``samples`` (3) of
``opinfo.sample_inputs("cpu", torch.float32)``, in ``op_db``'s order, seeds fixed.

Not random means none of:
- the name is a random op (``RANDOM_NAME``, as ``torch.X`` or ``torch.nn.functional.X``:
  ``rand*``, ``normal``, ``bernoulli``, ``multinomial``, ``uniform``, ``exponential``,
  ``geometric``, ``cauchy``, ``log_normal``, ``poisson``, the dropouts (``dropout``,
  ``dropout2d/3d``, ``alpha_dropout``, ``feature_alpha_dropout``), ``rrelu``,
  ``fractional_max_pool2d/3d``, ``svd_lowrank``, ``pca_lowrank``; not
  ``signal.windows.exponential``, ``nn.functional.normalize``, ``poisson_nll_loss`` or
  ``native_dropout_backward``, which are deterministic);
- ``opinfo.has_nondeterministic_output`` (``empty`` and friends: values unspecified);
- the eager CPU run of every one of its samples reaches an ATen op tagged
  ``torch.Tag.nondeterministic_seeded`` (a safety net for random ops the names miss; a single
  random sample, such as attention with ``dropout_p > 0``, is passed over for the next one).
Those are listed as excluded and left out of the count.

Per sample: eager on the CPU (a sample eager rejects is skipped), then the same call with
every tensor moved to ``lazyxla.device()`` (and ``device="cpu"`` arguments pointed at it;
``CPU_ARGS``: the few tensor arguments PyTorch wants on the CPU on any device stay there),
the results read back in one ``read_values``, compared with ``torch.testing.assert_close``
(float32 to rtol 1e-4, atol 1e-5, NaN equal to NaN; where they differ beyond that the lazy
value must be no farther than eager's from a float64 run: ill-conditioned samples; integers,
bools and Python scalars exactly), and the ``aten::*`` counters that moved are noted. The
runner reads through ``read_values``, never ``.item()``, so an ``aten::_local_scalar_dense``
that moves is a value read the op itself made (``equal``, ``allclose``, a Python-side
``.item()`` or ``.tolist()``): it counts as falling back to the host.

Per OpInfo the status is ``ok`` (every sample matches, no ``aten::*`` counter moved),
``fallback`` (matches, but an ``aten::*`` counter moved), ``wrong`` (a value, shape, dtype or
output count differs), ``error`` (lazyxla raised where eager did not; eager CPU raised only
because lazyxla is imported (a lazyxla frame or ``torch.lazyxla`` in the error); the op ran
past its time limit, ``--time-limit``, 60 s), ``refused`` (every problem is lazyxla's own
error for an input it does not support on purpose, ``REFUSED``: sparse layouts) or
``no-sample`` (no sample eager accepts). A
wrong sample outranks an error, an error a fallback. The first problem is kept. One op never
stops the run: each sample's failure is caught, and pending IR is synced and garbage collected
after each OpInfo.

``lazyxla coverage --opinfo [--ops NAME,...] [--samples 3] [--json FILE] [--markdown FILE]``
prints the table and the totals line; ``docs/opinfo.md`` is its ``--markdown`` page. Needs
``expecttest`` (PyTorch's OpInfo database imports it). Touches the lazy device's counters,
compilation cache and seeds; the CPU RNG state is restored.

Modules, in the order a run goes: ``select`` (which OpInfos, the modes), ``sample`` (one
sample against eager), ``runner`` (one OpInfo, a whole run), ``report`` (tables, pages, the
``--opinfo`` options). A tool on top of the package, as ``tools.coverage``.
"""
from .report import (add_arguments, by_counter, main, modes_page, page, table, to_json, totals,  # noqa: F401
                     totals_line)
from .runner import STATUSES, OpResult, check_opinfo, run  # noqa: F401
from .sample import check_sample, compare  # noqa: F401
from .select import DTYPES, MODES, full_name, parse_mode, select  # noqa: F401
