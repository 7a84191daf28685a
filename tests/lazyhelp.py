"""Small helpers the tests share: counter and metric readings that treat absent as 0, and a
small training loop on the CPU or the device."""
import pytest
import torch
import torch.nn as nn

import lazyxla
import lazyxla.debug.metrics as met


def in_a_child(what: str):
    """``cpu_only`` for a test whose work is a child process: on a TPU the child runs on XLA:CPU
    (one process holds the chip), so there the test checks host code only (``what``)."""
    return pytest.mark.cpu_only("its work runs in a child process, on XLA:CPU while this one holds the TPU: "
                                f"host code ({what})")


def on_the_cpu_here(float64=False, float32=False) -> set:
    """The fallback counters (``aten::<op>``) of the ops this device runs on the CPU by rule, as
    the registry's ``get`` rules them out: those whose lowering does not compile on its platform
    (``registry.PLATFORMS``: a TPU's ``linalg.eig``), and, where float64 is emulated,
    ``registry.NATIVE_FLOAT64``'s for calls of the widths asked (``float64``: a TPU's eigh;
    ``float32``: its special functions, computed in float64)."""
    import jax
    from lazyxla.lowering.registry import LOWERINGS, get
    from lazyxla.xla import widths
    platform = jax.local_devices()[0].platform
    asked = widths.emulated_widths([torch.float64] * float64 + [torch.float32] * float32)
    return {op._schema.name for op in LOWERINGS if get(op, platform, emulated_float64=asked) is None}


def needs_wide_int64(dt=torch.int64):
    """Skip the test where its int64 values cannot be held: the device holds int64 in 32 bits
    (a TPU's default: ``lazyxla.xla.widths``; ``XLA_USE_32BIT_LONG=0`` runs it there)."""
    import pytest
    from lazyxla.xla import widths
    if dt == torch.int64 and widths.narrow():
        pytest.skip("int64 values beyond int32's range; this device holds int64 in 32 bits (XLA_USE_32BIT_LONG)")


def cnt(name) -> int:
    """A counter's value, 0 when it was never incremented."""
    return met.counter_value(name) or 0


def samples(name) -> int:
    """How many samples a metric has, 0 when it has none."""
    d = met.metric_data(name)
    return d[0] if d else 0


def torch_config() -> dict:
    """Every setting of torch's config modules imported so far (``torch._dynamo.config``,
    ``torch._inductor.config``, ...), as ``{"module.name": value}``, read as torch code reads it:
    a setting that reading refuses (one deleted from its module) is ``"<missing: ...>"``."""
    import sys
    import warnings
    from torch.utils._config_module import ConfigModule

    seen = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # a deprecated setting warns when read
        for modname, mod in list(sys.modules.items()):
            if not isinstance(mod, ConfigModule):
                continue
            for key in mod.get_config_copy():
                try:
                    seen[f"{modname}.{key}"] = getattr(mod, key)
                except AttributeError as e:
                    seen[f"{modname}.{key}"] = f"<missing: {e}>"
    return seen


def config_changes(before: dict, after: dict) -> list[str]:
    """The settings that differ between two ``torch_config()`` readings (one imported later
    is not a change)."""
    return [f"{k}: {before[k]!r} -> {after[k]!r}" for k in before if k in after and after[k] != before[k]]


def json_runs(script: str, times: int = 1, timeout: int = 300, **env) -> list:
    """Run ``python -c script`` ``times`` times, each in a new process with ``env`` added to the
    environment; the JSON value each printed last."""
    import json
    import os
    import subprocess
    import sys
    out = []
    for _ in range(times):
        r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env), capture_output=True,
                           text=True, timeout=timeout)
        assert r.returncode == 0, r.stderr[-3000:]
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def json_here(script: str):
    """The JSON value ``script`` prints last, run in this process (its own namespace)."""
    import contextlib
    import io
    import json
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(script, "<script>", "exec"), {"__name__": "__main__"})  # noqa: S102 (the test's own script)
    return json.loads(printed.getvalue().strip().splitlines()[-1])


def json_here_and_in_a_process(script: str, timeout: int = 300) -> list:
    """The JSON value ``script`` prints last, run in this process and in a new one with another
    str-hash seed: what a key must not depend on. Where this process is not on XLA:CPU (a child
    runs there, beside a process on the device), in two new processes."""
    import os
    import jax
    if jax.default_backend() != "cpu":
        return json_runs(script, times=2, timeout=timeout)
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    return [json_here(script), json_runs(script, timeout=timeout, PYTHONHASHSEED=seed)[0]]


def train(make_opt, width, steps=3, dev=None):
    """``steps`` steps of a small MLP (``width`` inputs) with the optimizer ``make_opt`` makes, on
    ``dev`` (default: the lazy device, synced each step): the losses, the compile count after each
    step (lazy only), the model and the optimizer."""
    lazy = dev != "cpu"
    dev = lazyxla.device() if dev is None else dev
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 3))
    x, y = torch.randn(5, width), torch.randint(0, 3, (5,))
    model = model.to(dev)
    opt = make_opt(model.parameters())
    losses, compiles = [], []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if lazy:
            lazyxla.sync()
            compiles.append(cnt("UncachedCompile"))
        losses.append(float(loss))
    return losses, compiles, model, opt


def distinct_kernels(text: str) -> int:
    """The distinct fused computations of an optimized HLO module's text (XLA:CPU generates
    code for each distinct one once, and that is most of a compile)."""
    import re
    bodies = set()
    for comp in re.split(r"\n(?=%)", text.split("\nENTRY")[0]):
        head, _, body = comp.partition("\n")
        if "fused" in head or "wrapped" in head:
            body = re.sub(r", metadata=\{[^}]*\}", "", body)
            bodies.add(re.sub(r"%[\w.\-]+", "%x", body))
    return len(bodies)


def last_program_text() -> str:
    """The optimized HLO of the program compiled or run last."""
    from lazyxla.compiler.cache import computation_cache
    return computation_cache().values()[-1].executable.as_text()


def lazy_then_replayed(model, opt, x, lazy=2, replayed=4):
    """Train ``model`` on ``x`` (a squared-output loss) for ``lazy`` lazy steps, then
    ``replayed`` steps of the same step captured (``lazyxla.compile(step, replay=True)``)."""
    import lazyxla

    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(lazy):
        step(x)
        lazyxla.sync()
    run = lazyxla.compile(step, replay=True)
    for _ in range(replayed):
        run(x)
    lazyxla.sync()


def torch_compiled_losses(model, opt, x, steps=4):
    """The losses of ``steps`` training steps of ``model`` on ``x`` (a squared-output loss),
    the step run through ``torch.compile(backend="lazyxla")`` on the lazy device, as it is on
    the CPU (the reference)."""
    import lazyxla

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    lazy = x.device.type != "cpu"
    run = torch.compile(step, backend="lazyxla") if lazy else step
    losses = []
    for _ in range(steps):
        losses.append(float(run().detach()))
        if lazy:
            lazyxla.sync()
    return losses


def tiny_gpt2_counts(counters, steps=3):
    """A 2-layer HF GPT-2 (SDPA attention) trained ``steps`` AdamW steps on the CPU and lazily on
    the device from the same weights: asserts the lazy losses are eager's, and returns how much
    each of ``counters`` grew during the lazy run."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    ref = GPT2LMHeadModel(cfg)
    lazy = GPT2LMHeadModel(cfg)
    lazy.load_state_dict(ref.state_dict())
    dev = lazyxla.device()
    lazy = lazy.to(dev)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    losses, grew = {}, {}
    for name, model, d in (("eager", ref, "cpu"), ("lazy", lazy, dev)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        before = {c: cnt(c) for c in counters}
        out = []
        for _ in range(steps):
            opt.zero_grad()
            loss = model(input_ids=ids.to(d), labels=ids.to(d)).loss
            loss.backward()
            opt.step()
            if d != "cpu":
                lazyxla.sync()
            out.append(loss.item())
        losses[name] = out
        if d != "cpu":
            grew = {c: cnt(c) - before[c] for c in counters}
    torch.testing.assert_close(torch.tensor(losses["lazy"]), torch.tensor(losses["eager"]), rtol=1e-4, atol=1e-5)
    return grew
