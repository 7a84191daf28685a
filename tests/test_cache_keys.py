"""The persistent cache finds a program by its key (R7: one file per key, named by it), so a key
that changes without its graph changing loses every program users have on disk. The keys of
``cache_keys_job.py``'s workloads (SGD, AdamW over stacked parameters, batch norm and dropout,
torch.compile, scan_layers, a padded twin, donation, a small GPT-2) were recorded in
``data/cache_keys.json`` by the tree named in its ``recorded_by``, before the package's modules
moved into subpackages; a fresh process of this tree must fold the same ingredients into the
same keys and write the same entries.

Record again (``python tests/cache_keys_job.py --record REV``) only where a change means to
give programs new keys (a new ingredient, a node's hash on purpose), and say so in its commit.
Where the compile environment differs from the recording's (other versions, another platform),
every other merge is still compared; the keys then differ and are not."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def recorded():
    with open(os.path.join(HERE, "data", "cache_keys.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def now(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    cache = d / "cache"
    cache.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XLA_", "LAZYXLA_", "PT_XLA_", "CPU_NUM_DEVICES", "JAX_"))}
    env.update(XLA_PERSISTENT_CACHE_PATH=str(cache), JAX_PLATFORMS="cpu", LAZYXLA_CACHE_HMAC_KEY_FILE=str(d / "key"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "cache_keys_job.py")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _environment(run):
    return {m[1] for p in run["programs"] for m in p["merges"] if m[0] == "environment"}


def test_every_merge_but_the_environment_is_the_recorded_one(recorded, now):
    assert len(now["programs"]) == len(recorded["programs"])
    for i, (got, want) in enumerate(zip(now["programs"], recorded["programs"])):
        g = [m for m in got["merges"] if m[0] != "environment"]
        w = [m for m in want["merges"] if m[0] != "environment"]
        assert g == w, f"program {i} (recorded key {want['key']}) folds other ingredients now"


def test_the_keys_and_the_entries_on_disk_are_the_recorded_ones(recorded, now):
    if _environment(now) != _environment(recorded):
        pytest.skip("the compile environment differs from the recording's (versions or platform): "
                    "the keys fold it, so only the other merges are compared")
    assert [p["key"] for p in now["programs"]] == [p["key"] for p in recorded["programs"]]
    assert now["entries"] == recorded["entries"]
    assert len(now["entries"]) >= 8
