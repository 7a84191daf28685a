"""Bad input: failed programs surface at the next wait or read, naming the graph; the process
stays usable. Mixed devices and shape errors name the op and the user's line."""
import gc
import inspect
import os

import jax
import numpy as np
import pytest
import torch

import lazyxla
from lazyxla import lowering

DEV = lazyxla.device()

_lib = torch.library.Library("lazyxla_test", "DEF")
_lib.define("boom(Tensor x) -> Tensor")


@torch.library.register_fake("lazyxla_test::boom")
def _boom_fake(x):
    return torch.empty_like(x)


def _explode(x):
    raise ValueError("the device program hit a bad value")


@lowering.register(torch.ops.lazyxla_test.boom.default)
def _boom_lowering(sig, x):
    return jax.pure_callback(_explode, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_failed_execution_raises_at_wait_with_graph_hash_then_process_is_usable():
    x = torch.ones(3).to(DEV)
    y = torch.ops.lazyxla_test.boom(x) + 1
    key = lazyxla.graph_hash([y])
    lazyxla.sync()  # scheduled; the failure is not raised here
    with pytest.raises(lazyxla.ExecutionError) as ei:
        lazyxla.wait_device_ops()
    msg = str(ei.value)
    assert key in msg and "bad value" in msg
    lazyxla.wait_device_ops()  # the error was reported once
    with pytest.raises(lazyxla.ExecutionError, match=key):
        y.cpu()  # y's value never came: reading it names the graph that failed
    del y
    z = torch.arange(4, device=DEV) * 2
    assert z.tolist() == [0, 2, 4, 6]


def test_failure_carried_into_the_next_step_raises_and_process_is_usable():
    # step 2 updates in place (and is donated) the buffer step 1 failed to compute: whichever
    # program the failure surfaces in, the wait and the read raise, and nothing hangs
    p = torch.ones(3).to(DEV)
    p.add_(torch.ops.lazyxla_test.boom(p))
    lazyxla.sync()
    p.mul_(2)
    lazyxla.sync()
    with pytest.raises(lazyxla.ExecutionError, match="graph [0-9a-f]{32}"):
        lazyxla.wait_device_ops()
    with pytest.raises(lazyxla.ExecutionError):
        p.cpu()
    del p
    gc.collect()
    assert (torch.arange(4, device=DEV) * 2).tolist() == [0, 2, 4, 6]


def test_failed_execution_raises_at_value_read():
    x = torch.ones(2).to(DEV)
    y = torch.ops.lazyxla_test.boom(x)
    with pytest.raises(lazyxla.ExecutionError, match="bad value"):
        y.cpu()
    # y is still pending (a read keeps IR): a sync would run its failing graph again
    del y
    gc.collect()  # the exception's traceback frames referenced y
    assert (torch.ones(2).to(DEV) + 1).cpu().tolist() == [2.0, 2.0]


def test_mixed_devices_name_both_devices_and_the_line():
    a = torch.ones(2, 3).to(DEV)
    b = torch.ones(2, 3)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError) as ei:
        a + b
    msg = str(ei.value)
    assert "lazyxla:0" in msg and "cpu" in msg and "aten::add" in msg
    assert f"{os.path.basename(__file__)}:{line}" in msg


def test_zero_dim_cpu_tensor_mixes_in():
    a = torch.ones(2, 3).to(DEV)
    assert (a * torch.tensor(3.0)).cpu().tolist() == [[3.0] * 3] * 2


def test_shape_error_raises_at_the_recording_line():
    a = torch.ones(2, 3).to(DEV)
    b = torch.ones(4, 5).to(DEV)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError) as ei:
        torch.mm(a, b)
    msg = str(ei.value)
    assert "aten::mm" in msg and "[2, 3]" in msg and "[4, 5]" in msg
    assert f"{os.path.basename(__file__)}:{line}" in msg
