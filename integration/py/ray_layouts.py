"""stoker.ray.read of each layout on a real two-node local Ray cluster, against stoker.open of
the same URI: every sample exactly once (``__index__`` 0..n), with its key and the bytes of
every field stoker.open gives. Run by crates/stoker-py/tests/test_ray.py with .venv-peers'
Python and this build of stoker on its path:

    python integration/py/ray_layouts.py NAME=URI [NAME=URI ...]

Prints one JSON object: NAME -> [samples, read tasks, exactly once, keys and bytes equal],
or NAME -> "error: ..." for a read that failed.
"""

import json
import sys


def main():
    import stoker
    import stoker.ray
    from ray_cluster import two_nodes

    found = {}
    with two_nodes():
        for arg in sys.argv[1:]:
            name, uri = arg.split("=", 1)
            try:
                ds = stoker.open(uri)
                # Three tasks: a layout's runs cut inside and between its shards.
                rows = stoker.ray.read(uri, override_num_blocks=3).take_all()
                once = sorted(r["__index__"] for r in rows) == list(range(len(ds)))
                equal = True
                for r in rows:
                    want = ds[r["__index__"]]
                    fields = {k: v for k, v in want.items() if isinstance(v, bytes)}
                    equal = equal and r["__key__"] == want["__key__"] and bool(fields)
                    # A mix's source name is a string column in Ray (bytes from stoker.open).
                    equal = equal and all(
                        (r[k] == v.decode() if k == "__source__" else bytes(r[k]) == v) for k, v in fields.items()
                    )
                tasks = len(stoker.ray.StokerDatasource(uri).get_read_tasks(3))
                found[name] = [len(ds), tasks, once, equal]
            except Exception as e:  # noqa: BLE001 - reported per layout, the test names it
                found[name] = f"error: {type(e).__name__}: {e}"
    print(json.dumps(found))


if __name__ == "__main__":
    main()
