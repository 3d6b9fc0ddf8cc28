"""`import stoker` imports neither torch nor numpy; the Loader picks its arrays by what is
installed and says what to install when nothing is. Each case runs in a fresh interpreter
(this one has imported torch), with torch and numpy hidden where a case says so
(``sys.modules[name] = None``: what an interpreter without them sees)."""

import json
import subprocess
import sys

import pytest

from conftest import N


def run(code: str, hide=()):
    """``code`` in a fresh interpreter with the modules ``hide`` made unimportable; its last
    line of output as JSON."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hide)
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_stoker_imports_neither_torch_nor_numpy():
    got = run("import json, stoker\nprint(json.dumps(['torch' in sys.modules, 'numpy' in sys.modules]))")
    assert got == [False, False]


def test_dataset_is_a_torch_dataset_made_at_first_use(data):
    got = run(
        "import json, pickle, stoker\n"
        "before = 'torch' in sys.modules\n"
        f"ds = stoker.open({str(data / 'bucket/tar')!r})\n"
        "import torch.utils.data\n"
        "again = pickle.loads(pickle.dumps(ds))\n"
        "print(json.dumps([before, isinstance(ds, torch.utils.data.Dataset), type(again) is stoker.Dataset, len(again)]))"
    )
    assert got == [False, True, True, N]


def test_numpy_loader_does_not_import_torch(data):
    got = run(
        "import json, stoker\n"
        f"loader = stoker.Loader({str(data / 'bucket/tar')!r}, batch_size=8, output='numpy')\n"
        "bins, offsets = next(iter(loader))['bin']\n"
        "print(json.dumps([type(bins).__module__, 'torch' in sys.modules]))"
    )
    assert got == ["numpy", False]


def test_without_torch_the_loader_gives_numpy_arrays_and_a_dataset_still_opens(data):
    got = run(
        "import json, stoker\n"
        f"loader = stoker.Loader({str(data / 'bucket/tar')!r}, batch_size=8)\n"
        "bins, offsets = next(iter(loader))['bin']\n"
        f"ds = stoker.open({str(data / 'bucket/tar')!r})\n"
        "try:\n"
        "    stoker.Loader(ds, batch_size=8, output='torch')\n"
        "    said = None\n"
        "except stoker.InvalidInputError as e:\n"
        "    said = str(e)\n"
        "print(json.dumps([loader.output, type(bins).__module__, len(ds), said]))",
        hide=("torch",),
    )
    assert got[:3] == ["numpy", "numpy", N]
    assert "stoker[torch]" in got[3] and "output='numpy'" in got[3], got[3]


@pytest.mark.parametrize("output", [None, "numpy"])
def test_without_torch_or_numpy_the_loader_names_the_extra(data, output):
    got = run(
        "import json, stoker\n"
        "try:\n"
        f"    stoker.Loader({str(data / 'bucket/tar')!r}, batch_size=8, output={output!r})\n"
        "    said = None\n"
        "except stoker.InvalidInputError as e:\n"
        "    said = str(e)\n"
        "print(json.dumps(said))",
        hide=("torch", "numpy"),
    )
    assert got is not None and "pip install 'stoker[numpy]'" in got and "output=" in got, got


def test_the_wheel_installs_into_a_fresh_venv_without_rust_and_works():
    from test_formats import ROOT

    out = subprocess.run(["bash", str(ROOT / "integration/wheel_smoke.sh")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert runs, out.stdout
    for got in runs:
        # The installed copy ran, not this source tree.
        assert got["module"].startswith(str(ROOT / "target/wheel-smoke/venv-")), got
        assert not got["torch"] and got["samples"] == 20 and got["bytes_ok"], got
        assert got["cls_type"] == "numpy" and got["loader_classes"], got
        assert got["lmdb"] == [20, 20] and got["index_checksums"], got
        assert "pip install 'stoker[torch]'" in got["torch_error"], got
