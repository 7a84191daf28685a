"""Profiling users can read: torch_xla's ``torch_xla.debug.profiler`` names on JAX's profiler
(``lazyxla.debug.profiler``), every device op's ``op_name`` naming the ATen op and the user's
line that recorded it, and ``lazyxla profile LOG_DIR`` printing a trace's device time per step
by the user's line, by op kind and by op. On the CPU the trace is XLA:CPU's; the TPU's layout
(a device process with ``XLA Modules`` and ``XLA Ops``) is read from a trace made here in its
form."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyxla
import lazyxla.debug.profiler as xp
from lazyxla import cli
from lazyxla.compiler.cache import computation_cache
from lazyxla.debug import profile

DEV = lazyxla.device()
HERE = os.path.basename(__file__)


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 4)).to(DEV)
    return m, torch.optim.SGD(m.parameters(), lr=0.1), torch.randn(256, 32).to(DEV)


def _line(marker):
    """The line of this file holding ``marker``."""
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if marker in text and "_line(" not in text)


def test_the_programs_ops_name_the_aten_op_and_the_users_line():
    m, _, x = _model()
    y = torch.nn.functional.gelu(m[0](x)).sum()  # GELU-LINE
    lazyxla.sync()
    texts = [p.executable.as_text() for p in computation_cache().values()]
    names = {n for t in texts for n in re.findall(r'op_name="([^"]+)"', t)}
    want = f"aten.gelu at {HERE}:{_line('GELU-LINE')}"
    assert any(want in n for n in names), sorted(names)[:20]
    del y


def test_a_traced_run_is_read_back_by_line_kind_and_op(tmp_path, capsys):
    m, opt, x = _model()

    def step():
        opt.zero_grad()
        loss = m(x).square().mean()  # FORWARD-LINE
        loss.backward()  # BACKWARD-LINE
        opt.step()

    for _ in range(2):
        step()
        lazyxla.sync()
    xp.start_trace(str(tmp_path))
    for i in range(3):
        with xp.StepTrace("train", step_num=i):
            step()
    assert xp.stop_trace() == str(tmp_path)
    assert os.listdir(tmp_path / xp.PROGRAMS_DIR)  # each compiled program's text beside the trace
    p = profile.read(str(tmp_path))
    assert p.steps == 3 and p.ops
    lines = {line for (op, line), us in p.per_step(lambda r: p.where(r) or ("", "")) if us > 0}
    fwd, bwd = f"{HERE}:{_line('FORWARD-LINE')}", f"{HERE}:{_line('BACKWARD-LINE')}"
    assert fwd in lines and bwd in lines, lines
    named = sum(r.us for r in p.ops if p.where(r)) / sum(r.us for r in p.ops)
    assert named > 0.9, named  # nearly all of the device time has a user's line
    assert cli.main(["profile", str(tmp_path), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "3 step(s) traced" in out and fwd in out and "by op kind:" in out and "top ops:" in out


def test_a_tpu_trace_is_read_by_its_device_timeline(tmp_path):
    text = textwrap.dedent('''\
        HloModule jit_SyncTensorsGraph_abc, is_scheduled=true
        ENTRY %main {
          %fusion.1 = bf16[8,128]{1,0} fusion(%p0), kind=kOutput, calls=%f1, metadata={op_name="jit(SyncTensorsGraph_abc)/aten.mm at train.py:42/dot_general" stack_frame_id=3}
          %splash_mha_fwd_residuals.3 = (bf16[8,128]{1,0}) custom-call(%fusion.1), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
        "xprof_metadata":"{\\"block_q\\": 512}"
        }}, metadata={op_name="jit(SyncTensorsGraph_abc)/lazyxla.attention at model.py:7/jvp(vmap(static_sparsity_splash))/pallas_call" stack_frame_id=4}
          ROOT %copy.2 = f32[8,128]{0,1} copy(%fusion.1), metadata={op_name="jit(SyncTensorsGraph_abc)/aten._to_copy at train.py:43/convert_element_type"}
        }
        ''')
    dev, ops, mods = 3, 7, 6
    events = [{"ph": "M", "name": "process_name", "pid": dev, "args": {"name": "/device:TPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}},
              {"ph": "M", "name": "thread_name", "pid": dev, "tid": mods, "args": {"name": "XLA Modules"}},
              {"ph": "M", "name": "thread_name", "pid": dev, "tid": ops, "args": {"name": "XLA Ops"}}]
    for run in range(2):
        t0 = 1000.0 * run
        events.append({"ph": "X", "pid": dev, "tid": mods, "ts": t0, "dur": 500.0,
                       "name": "jit_SyncTensorsGraph_abc(1234)"})
        events.append({"ph": "X", "pid": dev, "tid": ops, "ts": t0 + 10, "dur": 300.0, "name": "fusion.1",
                       "args": {"hlo_category": "convolution fusion"}})
        events.append({"ph": "X", "pid": dev, "tid": ops, "ts": t0 + 320, "dur": 100.0, "name": "copy.2",
                       "args": {"hlo_category": "data formatting"}})
        # a Pallas kernel: its instruction's text spans lines (the kernel's metadata)
        events.append({"ph": "X", "pid": dev, "tid": ops, "ts": t0 + 430, "dur": 50.0,
                       "name": "splash_mha_fwd_residuals.3", "args": {"hlo_category": "custom-call"}})
    p = profile.parse(events, {"jit_SyncTensorsGraph_abc": text})
    assert p.device == "/device:TPU:0" and p.steps == 2
    assert p.programs == {"jit_SyncTensorsGraph_abc": [500.0, 500.0]}
    by_line = dict(p.per_step(lambda r: p.where(r)))
    assert by_line == {("aten.mm", "train.py:42"): 300.0, ("aten._to_copy", "train.py:43"): 100.0,
                       ("lazyxla.attention", "model.py:7"): 50.0}
    report = profile.report(p)
    assert "program jit_SyncTensorsGraph_abc: 2 run(s),     0.50 ms" in report
    assert re.search(r"0\.30 ms\s+train\.py:42\s+aten\.mm", report), report


def test_misuse_is_refused_and_a_missing_trace_is_said(tmp_path):
    with pytest.raises(RuntimeError, match="no trace was started"):
        xp.stop_trace()
    xp.start_trace(str(tmp_path / "a"))
    try:
        with pytest.raises(RuntimeError, match="being taken already"):
            xp.start_trace(str(tmp_path / "b"))
    finally:
        xp.stop_trace()
    assert cli.main(["profile", str(tmp_path / "empty")]) == 2


def test_torch_xla_profiler_names_under_lazyxla_run(tmp_path):
    script = tmp_path / "prof.py"
    script.write_text(textwrap.dedent(f"""
        import torch, torch_xla
        import torch_xla.debug.profiler as xp
        d = torch_xla.device()
        w = torch.randn(256, 256).to(d) / 16  # XLA:CPU times the ops of programs this large
        xp.start_trace({str(tmp_path / 'trace')!r})
        for i in range(2):
            with xp.StepTrace("step", step_num=i):
                with xp.Trace("matmul"):
                    w = torch.tanh(w @ w)
        xp.stop_trace()
        print("done", w.sum().item() == w.sum().item())
    """))
    r = subprocess.run([sys.executable, "-m", "lazyxla", "run", str(script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["done", "True"]
    r = subprocess.run([sys.executable, "-m", "lazyxla", "profile", str(tmp_path / "trace")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "prof.py:" in r.stdout, r.stdout + r.stderr
