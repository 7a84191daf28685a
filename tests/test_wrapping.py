"""R11: parameter wrapping above XLA_PARAMETER_WRAPPING_THREADSHOLD parameters."""
import os
import subprocess
import sys
import textwrap


def run(threshold):
    code = """
        import torch, lazyxla
        from lazyxla.compiler.cache import computation_cache
        import lazyxla.debug.metrics as met
        d = lazyxla.device()
        ts = [torch.full((3,), float(i)).to(d) for i in range(12)]
        for t in ts:
            t.mul_(2)   # every parameter is also an output: all donated
        total = sum(ts[1:], ts[0] * 1)
        lazyxla.sync()
        prog = computation_cache().values()[-1]
        hlo = prog.executable.as_text()
        entry = [l for l in hlo.splitlines() if l.startswith("ENTRY")][0]
        print(entry.count("arg_tuple") > 0, prog.n_params, sorted(ts[5].cpu().tolist()), total.cpu().tolist()[0],
              met.metric_data("InputOutputAliasCount")[1], "input_output_alias" in hlo)
    """
    env = dict(os.environ, XLA_PARAMETER_WRAPPING_THREADSHOLD=str(threshold))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_wrapped_at_threshold_with_same_results_and_donation():
    flat = run(3200)
    n = int(flat[1])  # 12 tensors and the scalar 2
    assert n == 13
    wrapped = run(n)
    assert run(n + 1)[0] == "False"
    assert wrapped[0] == "True" and flat[0] == "False"
    assert wrapped[1:] == flat[1:]  # same results, same donation count
    assert wrapped[-2] == "12.0" and wrapped[-1] == "True"
