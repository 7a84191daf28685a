"""Beyond one process (issue 13): real processes on the loopback, launched by
lazyxla.distributed.spawn and by torchrun, joined through JAX's distributed runtime. A
data-parallel MLP (half the batch each, gradients averaged by optimizer_step) ends where one
process trained on the whole batch ends; the collectives give the same numbers everywhere;
a lost process and bad launches are clear errors, never a hang (every launch has a timeout)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mp_job  # noqa: E402


def _launch(cmd, out, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("CPU_NUM_DEVICES", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    results = []
    for rank in range(2):
        path = f"{out}.{rank}.json"
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    return r, results


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("spawn") / "out")
    r, results = _launch([sys.executable, "mp_job.py", "spawn", out], out)
    assert r.returncode == 0 and all(results), r.stderr[-4000:]
    return results


def _check_data_parallel(results):
    ref = mp_job.reference()
    for res in results:
        assert res["world"] == 2
        err = max((torch.tensor(a) - torch.tensor(b)).abs().max().item() for a, b in zip(res["params"], ref))
        assert err < 1e-5, err
    assert results[0]["params"] == results[1]["params"]
    assert results[0]["hashes"] == results[1]["hashes"]  # the same program in every process
    for res in results:
        assert res["compiles"][-1] == res["compiles"][1], res["compiles"]  # once after momentum appears


def test_spawned_processes_train_data_parallel_like_one_process_on_the_whole_batch(spawned):
    _check_data_parallel(spawned)
    assert [r["rank"] for r in spawned] == [0, 1] and [r["local"] for r in spawned] == [0, 1]


def test_a_captured_data_parallel_step_replays_in_every_process_like_one_on_the_whole_batch(tmp_path):
    out = str(tmp_path / "out")
    r, results = _launch([sys.executable, "mp_job.py", "replay", out], out)
    assert r.returncode == 0 and all(results), r.stderr[-4000:]
    ref = mp_job.reference()
    for res in results:
        err = max((torch.tensor(a) - torch.tensor(b)).abs().max().item() for a, b in zip(res["params"], ref))
        assert err < 1e-5, err
        assert res["replays"] == 4 and res["executions"] == 4  # the all-reduce runs inside the replayed program
    assert results[0]["hash"] == results[1]["hash"]


def test_collectives_give_every_process_the_same_numbers(spawned):
    for res in spawned:  # process r holds [r + 1] * 4
        assert res["sum"] == [1.5] * 4  # (1 + 2) * 0.5
        assert res["max"] == [2.0] * 4 and res["min"] == [1.0] * 4
        assert res["gather"] == [1.0, 1.0, 2.0, 2.0]
        assert res["scatter"] == [3.0, 3.0]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchrun_launches_the_same_job_and_torch_distributed_and_ddp_work_on_lazy_tensors(tmp_path):
    out = str(tmp_path / "out")
    r, results = _launch(["torchrun", "--standalone", "--nproc_per_node=2", "mp_job.py", "torchrun", out], out)
    assert r.returncode == 0 and all(results), r.stderr[-4000:]
    _check_data_parallel(results)
    ddp = [json.load(open(f"{out}.ddp.{rank}.json")) for rank in range(2)]
    for rank, res in enumerate(ddp):  # torch.distributed's collectives on lazy tensors (process r holds [r + 1] * 2)
        assert res["dist"] == {"sum": [3.0, 3.0], "avg": [1.5, 1.5], "broadcast": [2.0, 2.0],
                               "gather": [[1.0, 1.0], [2.0, 2.0]], "gather_into": [1.0, 1.0, 2.0, 2.0],
                               "reduce_scatter": [3.0],
                               "reduce_scatter_list": [3.0 * (rank + 1)] * 2}  # sum over processes of block r
    ref = mp_job.reference()
    for res in ddp:  # DistributedDataParallel: like one process on the whole batch
        d = res["ddp"]
        err = max((torch.tensor(a) - torch.tensor(b)).abs().max().item() for a, b in zip(d["params"], ref))
        assert err < 1e-5, err
        # DDP rebuilds its buckets after its first step; then one program per step, compiled once
        assert d["compiles"][-1] == d["compiles"][2], d["compiles"]
        assert [b - a for a, b in zip(d["executions"][2:], d["executions"][3:])] == [1, 1]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchruns_multi_node_form_with_a_rendezvous_endpoint(tmp_path):
    from lazyxla.distributed.world import free_port
    out = str(tmp_path / "out")
    r, results = _launch(["torchrun", "--nnodes=1", "--node_rank=0", "--nproc_per_node=2", "--rdzv_backend=c10d",
                          f"--rdzv_endpoint=127.0.0.1:{free_port()}", "mp_job.py", "ranks", out], out)
    assert r.returncode == 0 and all(results), r.stderr[-4000:]
    assert [(x["rank"], x["world"], x["local"], x["sum"]) for x in results] == [(0, 2, 0, 3.0), (1, 2, 1, 3.0)]


def test_spmd_spans_the_processes_devices_each_feeding_its_part_of_the_batch(tmp_path):
    out = str(tmp_path / "out")
    r, results = _launch([sys.executable, "mp_job.py", "spmd", out], out)
    assert r.returncode == 0 and all(results), r.stderr[-4000:]
    _check_data_parallel(results)
    for res in results:
        assert res["devices"] == 4 and res["batch_shape"] == [16, 12]  # each process gave 8 of the 16 rows
        assert res["specs"][0] == "{devices=[4,1]<=[4]}"  # the first weight's rows over all 4 devices
    assert results[0]["losses"] == results[1]["losses"]


def test_a_lost_process_stops_the_others_with_an_error_naming_it(tmp_path):
    out = str(tmp_path / "out")
    env_before = os.environ.get("LAZYXLA_HEARTBEAT_TIMEOUT")
    os.environ["LAZYXLA_HEARTBEAT_TIMEOUT"] = "5"
    try:
        r, results = _launch([sys.executable, "mp_job.py", "die", out], out, timeout=120)
    finally:
        if env_before is None:
            os.environ.pop("LAZYXLA_HEARTBEAT_TIMEOUT")
        else:
            os.environ["LAZYXLA_HEARTBEAT_TIMEOUT"] = env_before
    survivor = results[0]
    assert survivor is not None, r.stderr[-4000:]
    assert "process 1 stopped answering and is lost" in survivor["error"], survivor["error"]
    assert survivor["seconds"] < 60
    spawn_error = json.loads(r.stdout.strip().splitlines()[-1])["spawn_error"]
    assert "process 1 exited with code 9" in spawn_error


def test_a_busy_coordinator_port_is_a_clear_error_at_init():
    from lazyxla.distributed import init
    from lazyxla.distributed.world import free_port
    from lazyxla import LazyXlaError
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port + 1))
        s.listen()
        with pytest.raises(LazyXlaError, match=f"coordinator port 127.0.0.1:{port + 1} is in use"):
            init(rank=0, world_size=2, master_addr="127.0.0.1", master_port=port)


def test_processes_started_with_different_world_sizes_are_told_so(tmp_path):
    from lazyxla.distributed.world import free_port
    port = free_port()
    code = ("import sys, lazyxla.distributed as xd\n"
            "try:\n"
            "    xd.init(rank=int(sys.argv[1]), world_size=int(sys.argv[2]), master_addr='127.0.0.1', "
            f"master_port={port}, timeout=30)\n"
            "except Exception as e:\n"
            "    print('ERROR', e)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(world)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for rank, world in ((0, 2), (1, 3))]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert "process 1 was started with WORLD_SIZE=3, this process (rank 0) with 2" in outs[0], outs
    assert "process 1 was started with WORLD_SIZE=3, but the job has 2 processes" in outs[1], outs


def test_a_missing_launch_environment_is_a_clear_error(monkeypatch):
    from lazyxla.distributed import init
    from lazyxla import LazyXlaError
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(LazyXlaError, match="RANK is not set; launch with torchrun"):
        init()


def test_init_after_tensors_are_on_the_device_is_a_clear_error():
    import lazyxla
    from lazyxla import LazyXlaError
    from lazyxla.distributed import init
    from lazyxla.distributed.world import free_port
    (torch.ones(2, device=lazyxla.device()) + 1).cpu()  # JAX's runtime starts for this process alone
    with pytest.raises(LazyXlaError, match="call it before any tensor is on the device"):
        init(rank=1, world_size=2, master_addr="127.0.0.1", master_port=free_port())
