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

import stoker
from test_formats import ROOT, writers_python


def test_ray_read_on_two_nodes_gives_stokers_bytes_and_tensors(tmp_path):
    # Only this build's package on the path: .venv-peers keeps its own numpy and pyarrow.
    path = tmp_path / "path"
    path.mkdir()
    (path / "stoker").symlink_to(Path(stoker.__file__).parent)
    env = {**os.environ, "PYTHONPATH": str(path), "RAY_USAGE_STATS_ENABLED": "0"}
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


def test_without_ray_the_error_names_the_extra():
    code = "import sys\nsys.modules['ray'] = None\ntry:\n    import stoker.ray\nexcept ImportError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'stoker[ray]'" in out.stdout, out.stdout + out.stderr
