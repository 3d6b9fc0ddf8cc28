"""Ranks on one node, as torchrun starts them: four processes with RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE set, reading one shard-shuffled epoch from the S3 server
through one shared disk cache. Each rank reads its own samples, every sample once; the node
fetches each byte about once (the ranks take turns in the same window of shards, so their
blocks overlap: without the cache's fetch leases each would fetch most of them itself)."""

import json
import os
import subprocess
import sys

from conftest import N

RANK = r"""
import json, sys
import stoker

loader = stoker.Loader(sys.argv[1], batch_size=4, shuffle="shards", shuffle_window=2, seed=7)
before = loader.stats()["remote_bytes"]
print("ready", flush=True)
sys.stdin.readline()  # the parent's word: every rank starts the epoch together, as at a barrier
seen = [j for b in loader for j in b["__index__"]]
s = loader.stats()
print(json.dumps({"seen": seen, "fetched": s["remote_bytes"] - before, "lease_waits": s["lease_waits"]}))
"""


def test_four_ranks_on_a_node_fetch_each_byte_about_once(s3, data, tmp_path):
    world = 4
    uri = s3("tar") + f"&disk_cache_dir={tmp_path / 'cache'}&cache_block=4096"
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world))
        p = subprocess.Popen(
            [sys.executable, "-c", RANK, uri], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        line = p.stdout.readline()
        assert p.wait(timeout=120) == 0
        out.append(json.loads(line))
    seen = [j for o in out for j in o["seen"]]
    assert sorted(seen) == list(range(N)), "the ranks together read every sample once"
    size = sum(f.stat().st_size for f in (data / "bucket" / "tar").iterdir())
    fetched = sum(o["fetched"] for o in out)
    assert fetched <= 1.1 * size, f"the node fetched {fetched} bytes of {size} ({[o['fetched'] for o in out]})"
