"""stoker.ray on a real two-node local Ray cluster (integration/py/ray_read.py), run with the
venv that has Ray Data (.venv-peers, as the format writers: Ray pins what this venv cannot
take) and this build of stoker on its path: every sample exactly once with stoker.open's bytes,
decoded tensors equal to stoker.Loader's for the same (seed, epoch, index), read tasks on both
nodes. And without Ray, a clear error naming the extra."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stoker
from test_formats import ROOT, writers_python


def peers_env(tmp_path, extra=()):
    """The environment of a .venv-peers process that imports this build of stoker (and only
    it: .venv-peers keeps its own numpy and pyarrow), and the directories ``extra``."""
    path = tmp_path / "path"
    path.mkdir(exist_ok=True)
    if not (path / "stoker").exists():
        (path / "stoker").symlink_to(Path(stoker.__file__).parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), *map(str, extra)]), "RAY_USAGE_STATS_ENABLED": "0"}


def test_ray_read_on_two_nodes_gives_stokers_bytes_and_tensors(tmp_path):
    env = peers_env(tmp_path)
    script = ROOT / "integration/py/ray_read.py"
    out = subprocess.run(
        [writers_python(), str(script), str(tmp_path / "shards")], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["nodes"] == 2, got
    assert got["split_partitions"] and got["split_whole_shards"] and got["split_even"], got
    assert got["rows"] == 60 and got["indices"] and got["bytes_equal"], got
    assert got["decoded_rows"] == 60 and got["decoded_equal"] and got["seed_matters"], got
    assert got["png_shape"] == [32, 32, 3], got
    assert got["read_nodes"] == 2, f"the read tasks ran on {got['read_nodes']} of the 2 nodes"


@pytest.mark.parametrize("mode", ["ray-data", "loader"])
def test_ray_train_example_trains_on_every_sample_each_epoch(tmp_path, mode):
    # The shards ray_read.py writes: 3 x 20 samples, a PNG and a class each.
    env = peers_env(tmp_path, [ROOT / "integration/py"])
    shards = tmp_path / "shards"
    make = f"import ray_read; ray_read.write_shards({str(shards)!r})"
    subprocess.run([writers_python(), "-c", make], check=True, env=env, timeout=120)
    out = subprocess.run(
        [writers_python(), str(ROOT / "examples/ray_train.py"), str(shards), "--mode", mode, "--cpus", "4"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    lines = (out.stdout + out.stderr).splitlines()
    done = [json.loads(line) for line in lines if line.startswith('{"done"')]
    assert done == [{"done": True, "error": None}], lines[-20:]
    ranks = {}
    for line in lines:
        # Ray prefixes a worker's lines with its name (and colour codes); a warning may quote
        # the print's source line, which is not JSON.
        at = line.find('{"rank": ')
        try:
            r = json.loads(line[at:]) if at >= 0 else None
        except ValueError:
            continue
        if r is not None:
            ranks[r["rank"]] = r
    assert sorted(ranks) == [0, 1] and all(r["world"] == 2 for r in ranks.values()), ranks
    # Two epochs, the 60 samples split between the two workers in each.
    assert [sum(r["seen"][e] for r in ranks.values()) for e in range(2)] == [60, 60], ranks


def test_without_ray_the_error_names_the_extra():
    code = "import sys\nsys.modules['ray'] = None\ntry:\n    import stoker.ray\nexcept ImportError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'stoker[ray]'" in out.stdout, out.stdout + out.stderr
