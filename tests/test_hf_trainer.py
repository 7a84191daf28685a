"""HuggingFace Trainer and accelerate scripts, unchanged, under ``lazyxla run`` (issue 24): each runs in
a new process, eager (``python``) and on lazyxla, and the numbers are compared. The scripts are in
``tests/hf_scripts``: a tiny GPT-2 built from a config, synthetic tokens, nothing XLA-specific."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import lazyxla

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_scripts")
TRAINER = os.path.join(HERE, "trainer_script.py")
ACCELERATE = os.path.join(HERE, "accelerate_script.py")


def _run(cmd, out, timeout=600, **env):
    """(RESULT dict or None, the process) of one script run; ``out`` is its output directory."""
    os.makedirs(out, exist_ok=True)
    e = dict(os.environ, TOKENIZERS_PARALLELISM="false", **{k: str(v) for k, v in env.items()})
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if k not in env:
            e.pop(k, None)
    p = subprocess.run(cmd + [out], capture_output=True, text=True, timeout=timeout, env=e)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return (json.loads(lines[-1][len("RESULT "):]) if lines else None), p


def eager(script, out, **env):
    r, p = _run([sys.executable, script], out, **env)
    assert r is not None, p.stderr[-3000:]
    return r


def lazy(script, out, **env):
    r, p = _run([sys.executable, "-m", "lazyxla", "run", script], out, **env)
    assert r is not None, p.stderr[-3000:]
    return r, p


def same(got, want, rtol):
    """Per step: the values equal within ``rtol`` relative, for the same steps."""
    assert set(got) == set(want), (got, want)
    for k in want:
        assert abs(got[k] - want[k]) <= rtol * abs(want[k]), (k, got[k], want[k])


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    """The Trainer script eager and on lazyxla, then lazyxla's resumed from its checkpoint at step
    6 (compared with eager's uninterrupted run: a resumed run's steps are the run's own)."""
    d = tmp_path_factory.mktemp("trainer")
    runs = {"eager": eager(TRAINER, str(d / "eager"))}
    runs["lazy"], runs["lazy_process"] = lazy(TRAINER, str(d / "lazy"))
    shutil.copytree(d / "lazy" / "checkpoint-6", d / "lazy-resumed" / "checkpoint-6")
    runs["lazy_resumed"], _ = lazy(TRAINER, str(d / "lazy-resumed"), RESUME=d / "lazy-resumed" / "checkpoint-6")
    runs["dir"] = d
    return runs


def test_the_trainer_finds_the_device_and_trains_like_eager_with_its_defaults(trainer_runs):
    e, lz = trainer_runs["eager"], trainer_runs["lazy"]
    assert lz["device"] == "lazyxla:0" and e["device"] == "cpu"
    assert lz["optim"] == e["optim"] == "OptimizerNames.ADAMW_TORCH_FUSED"  # transformers' default
    assert len(lz["losses"]) == 12
    same(lz["losses"], e["losses"], 1e-4)
    same(lz["eval"], e["eval"], 1e-4)
    # compiles stop growing once every kind of step (train, evaluation, saving) has been seen
    c = lz["compiles"]
    assert c[6:] == [c[6]] * 6, c


def test_the_trainer_logs_shows_its_progress_and_writes_checkpoints(trainer_runs):
    p = trainer_runs["lazy_process"]
    assert "'loss':" in p.stdout + p.stderr and "'eval_loss':" in p.stdout + p.stderr
    assert "12/12" in p.stderr  # the progress bar
    for step in (6, 12):
        ck = trainer_runs["dir"] / "lazy" / f"checkpoint-{step}"
        for f in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
            assert (ck / f).stat().st_size > 0, (ck, f)
        state = json.loads((ck / "trainer_state.json").read_text())
        assert state["global_step"] == step


def test_the_trainer_resumes_where_eager_resumes(trainer_runs):
    lz = trainer_runs["lazy_resumed"]
    after = {k: v for k, v in lz["losses"].items() if int(k) > 6}
    assert len(after) == 6
    same(after, {k: v for k, v in trainer_runs["eager"]["losses"].items() if int(k) > 6}, 1e-4)
    assert lz["compiles"][1:] == [lz["compiles"][1]] * 5, lz["compiles"]


@pytest.fixture(scope="module")
def accelerate_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("accelerate")
    runs = {"eager": eager(ACCELERATE, str(d / "eager"))}
    runs["lazy"], _ = lazy(ACCELERATE, str(d / "lazy"))
    runs["lazy_resumed"], _ = lazy(ACCELERATE, str(d / "lazy"), RESUME=d / "lazy" / "state-6")
    runs["dir"] = d
    return runs


def test_an_accelerate_loop_trains_evaluates_and_resumes_like_eager(accelerate_runs):
    e, lz = accelerate_runs["eager"], accelerate_runs["lazy"]
    assert lz["device"] == "lazyxla:0" and lz["world"] == 1
    same(lz["losses"], e["losses"], 1e-4)
    same(lz["eval"], e["eval"], 1e-4)
    c = lz["compiles"]
    assert c[6:] == [c[6]] * 6, c
    state = accelerate_runs["dir"] / "lazy" / "state-6"
    assert (state / "model.safetensors").stat().st_size > 0 and (state / "optimizer.bin").stat().st_size > 0
    same(accelerate_runs["lazy_resumed"]["losses"], {k: v for k, v in e["losses"].items() if int(k) > 6}, 1e-4)


def test_two_processes_under_torchrun_train_data_parallel_like_one_on_the_whole_batch(trainer_runs, tmp_path):
    from lazyxla.distributed.world import free_port
    one = trainer_runs["lazy"]  # batch 4 in one process
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "lazyxla", "run", TRAINER]
    r, p = _run(cmd, str(tmp_path / "two"), BATCH=2, timeout=900)
    assert r is not None, p.stderr[-3000:]
    assert r["world"] == 2
    same(r["losses"], one["losses"], 1e-5)
    same(r["eval"], one["eval"], 1e-5)


@pytest.mark.parametrize("extra, module", [
    ({"optim": "adamw_torch_xla"}, "torch_xla.amp.syncfree"),
    ({"fsdp": "full_shard", "fsdp_config": {"xla": True}}, "torch_xla.distributed.fsdp"),
], ids=["syncfree", "fsdp-v1"])
def test_what_is_not_offered_fails_at_start_naming_the_alternative(tmp_path, extra, module):
    r, p = _run([sys.executable, "-m", "lazyxla", "run", TRAINER], str(tmp_path / "out"),
                EXTRA_ARGS=json.dumps(extra))
    assert p.returncode != 0 and r is None
    assert f"{module} is not offered by lazyxla (nearest lazyxla alternative: " in p.stderr
    assert "'loss':" not in p.stdout + p.stderr and not list((tmp_path / "out").glob("checkpoint-*"))


# ---------------------------------------------------------------------------------------------
# What accelerate and the Trainer call, in this process: lazyxla's own behaviour behind each name.
@pytest.fixture()
def xla():
    from lazyxla import compat
    was = compat.installed()
    compat.install()
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.runtime as xr
    yield torch_xla, xm, pl, xr
    if not was:
        import sys as _sys
        _sys.meta_path.remove(compat._FINDER)


def test_the_version_names_the_torch_xla_api_lazyxla_follows(xla):
    torch_xla = xla[0]
    from packaging.version import Version
    v = Version(torch_xla.__version__)
    assert v.public == "2.9.0" and v.local == f"lazyxla.{lazyxla.__version__}"


def test_set_replication_checks_the_device(xla):
    xm = xla[1]
    xm.set_replication(lazyxla.device(), xm.get_xla_supported_devices())  # a world of one: nothing to join
    with pytest.raises(lazyxla.LazyXlaError, match="cpu is not this process's device lazyxla:0"):
        xm.set_replication(torch.device("cpu"), [])


def test_moving_data_and_fetching_gradients(xla):
    xm = xla[1]
    state = {"step": torch.tensor(3.0), "m": [torch.ones(2)], "lr": 0.1}
    moved = xm.send_cpu_data_to_device(state, lazyxla.device())
    assert state["step"].device.type == "cpu"  # not changed in place
    assert moved["step"].device.type == "lazyxla" and moved["m"][0].device.type == "lazyxla" and moved["lr"] == 0.1
    one = xm.send_cpu_data_to_device(torch.arange(3), lazyxla.device())
    assert isinstance(one, list) and one[0].tolist() == [0, 1, 2]  # a lone tensor comes back in a list
    back = xm._maybe_convert_to_cpu(moved)
    assert back["m"][0].device.type == "cpu" and back["m"][0].tolist() == [1.0, 1.0]
    assert xm._maybe_convert_to_cpu(moved, convert=False) is moved
    w = torch.arange(6.0).to(lazyxla.device())
    tied = xm._maybe_convert_to_cpu({"a": w, "b": w.detach(), "c": w.view(2, 3), "d": w.clone()})
    assert tied["a"] is tied["b"]  # one value under two names stays one tensor, as in eager's state dict
    assert tied["c"] is not tied["a"] and tied["d"] is not tied["a"] and tied["c"].shape == (2, 3)
    assert tied["a"].tolist() == tied["d"].tolist() == list(range(6))
    p = torch.nn.Parameter(torch.ones(2).to(lazyxla.device()))
    q = torch.nn.Parameter(torch.ones(2).to(lazyxla.device()))
    opt = torch.optim.SGD([p, q], lr=0.1)
    p.grad = torch.full((2,), 2.0).to(lazyxla.device())
    grads = xm._fetch_gradients(opt)
    assert len(grads) == 1 and grads[0] is p.grad
    xm.all_reduce(xm.REDUCE_SUM, grads, scale=0.5)  # what accelerate does before clipping
    assert p.grad.tolist() == [1.0, 1.0]
    t = [torch.arange(3.0).to(lazyxla.device())]
    xm.collective_broadcast(t)  # a world of one: its own value
    assert t[0].tolist() == [0.0, 1.0, 2.0]


def test_the_device_loader_keeps_torch_xlas_attributes_and_syncs_per_batch(xla):
    pl = xla[2]
    from lazyhelp import cnt
    loader = torch.utils.data.DataLoader(torch.arange(12.0).reshape(6, 2), batch_size=2)

    class Wrapper(pl.MpDeviceLoader):  # as accelerate's MpDeviceLoaderWrapper
        @property
        def dataloader(self):
            return self._loader

    w = Wrapper(loader, lazyxla.device())
    assert w.dataloader is loader and w._device == lazyxla.device() and len(w) == 3
    assert w.dataset is loader.dataset and w.batch_size == 2  # the loader's own attributes show through
    before = cnt("MarkStep")
    seen = [b.sum().item() for b in w]
    assert seen == [6.0, 22.0, 38.0]
    assert cnt("MarkStep") - before >= 3


def test_the_runtime_counts_come_from_the_launcher(xla):
    xr = xla[3]
    assert xr.world_size() == 1 and xr.global_ordinal() == 0 and xr.host_index() == 0
    assert xr.local_process_count() == 1 and xr.addressable_device_count() == 1
