"""Rolling (on a cache miss, after the graph hash and before lowering): a post-order whose
repeated subgraphs become loops.

A model that runs identical layers in a Python loop records the same subgraph once per layer
(other parameters, the same ops). Lowered as recorded, JAX traces and XLA compiles every copy:
compile time grows with depth. This stage finds the repetition in the IR and hands lowering a
``Loop`` in place of its copies: one body, traced once, run as one XLA while loop
(``lowering.rolled``). It runs after the graph hash and the cache lookup, on a cache miss only:
keys, explanations and the walk see the graph as recorded.

How a loop is found (every step checks; any doubt leaves the graph as it is):

| step | rule |
|---|---|
| carries | nodes alike in what uses them (a hash over their users, ``_ROUNDS`` deep, leaves by shape and dtype; a user with more than ``_WIDE`` operands alike at every position) that form a chain, each depending on the one before: values handed from one iteration to the next (``h_k``). The largest such class (of ``MIN_ITERATIONS - _EDGES`` or more: the first and last layers' may hash apart), earliest first; all its members, then every other one (a pre-norm layer's two norms look alike to that depth, half a layer apart). |
| template | iteration 0: every node that depends on ``h_0`` and not on ``h_1``, with ``h_1`` (in post-order: the roles), and the leaf-only ops they read (a weight's transpose: computed inside the body from the stacked leaves), unless iteration 1 has no leaf-only op in its place (the embedding the first layer reads): then it is read from outside. |
| iterations | from ``h_k``, each role is found among the users of its operands' counterparts: same signature, same operand positions, operands the carry, a role of the same iteration, a role of the iteration before (one more carry, the same in every iteration) or a value that does not depend on the loop (same shapes and dtypes). Until one role has no counterpart; then iterations before the first, each from its output (``h_0``) back through operands. |
| cut | the roles at which the loop could be cut instead, as few values crossing from one iteration to the next as now or fewer, fewest first (``_cuts``, counted on two copies of the template; a leaf-only op crosses nothing); up to ``_CANDIDATES`` are built and the loop with the most iterations, then the fewest carries, is taken: a layer's boundary, where only the hidden state crosses (a cut inside a layer where one value crosses too leaves half a layer unrolled at each end). |
| inputs | a value outside the loop that an iteration reads: the same node in every iteration is one input; other nodes, one row each of a stacked input (a layer's weights; a weight that is a row of a stack, ``select`` of device data (``param_stacks``), stays outside the body, so the rows are one strided slice of that stack; an earlier loop's rows are taken as that loop's stacked output, and a loop that reads them last row first runs from its last row). |
| outputs | a role whose value is used outside the loop (by later nodes or as a root) is stacked; the rows replace the copies' values. |
| worth it | at least ``MIN_ITERATIONS`` iterations (``LAZYXLA_ROLL_MIN``), a template with ``MIN_BODY`` ops or more, and an iteration's estimated work (``work``) at least the platform's floor (``settings.MIN_WORK``, ``LAZYXLA_ROLL_MIN_WORK``): a loop costs something per iteration besides its body (~13 us on XLA:CPU), which a body of a few thousand multiply-adds does not pay back. |

After a loop is taken, its nodes are out of the search and the next loop is looked for (a
training step's forward pass, then its backward pass). ``LAZYXLA_ROLL_LAYERS=0`` turns it off.

May touch: nothing; reads the IR, counts ``RolledLoops`` and ``RolledIterations``.

Modules: ``order`` (the entry: ``roll``, which finds the loops and orders them with the rest), ``find`` (the steps above: carries, template, cut,
inputs and outputs), ``iterations`` (one iteration's nodes, role by role), ``work`` (an iteration's estimated operations), ``loop`` (``Loop``:
what lowering receives; ``lowering.rolled`` lowers it as one ``lax.scan``), ``settings`` (the
knobs, read at every roll).

May import: ``lowering`` (``rolled``, ``program``, ``is_view``), ``ir``, ``xla`` and the
shared modules. Imported by ``compiler`` (a miss rolls before it lowers), ``optim``
(``param_stacks``: stacks as deep as a loop) and ``debug``.
"""
from .find import last_report  # noqa: F401
from .loop import Loop  # noqa: F401
from .order import roll  # noqa: F401
