"""Hostile files (the corpus integration/py/hostile.py writes) are a StokerError in Python,
never a dead interpreter: sizes no file can hold, decompression bombs, a tar size bomb."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stoker

HOSTILE = Path(__file__).resolve().parents[3] / "integration" / "py" / "hostile.py"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile")
    cases = json.loads(subprocess.run([sys.executable, str(HOSTILE), str(out)], check=True, capture_output=True, timeout=300).stdout)
    return out, cases


def test_every_hostile_file_is_a_stoker_error(corpus) -> None:
    out, cases = corpus
    assert len(cases) >= 6
    for case in cases:
        options = dict(kv.split("=", 1) for kv in case["options"].split("&") if kv)
        with pytest.raises(stoker.StokerError) as e:
            ds = stoker.open(str(out / case["path"]), **{k: int(v) for k, v in options.items()})
            for i in range(min(len(ds), 10)):
                ds[i]
        assert case["path"] in str(e.value), (case["name"], str(e.value))
        expected = {"corrupt": stoker.CorruptDataError, "invalid_input": stoker.InvalidInputError, "not_found": stoker.NotFoundError}[case["kind"]]
        assert isinstance(e.value, expected), (case["name"], repr(e.value))


def test_a_hostile_file_in_a_child_interpreter_does_not_kill_it(corpus) -> None:
    # The failure mode this guards against was an abort (exit 134) with no exception at all.
    # torch is hidden: the dataset is then the plain class, and each child does not spend
    # 1.5 s importing torch for a read that never reaches a tensor.
    out, cases = corpus
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import stoker\n"
        "try:\n"
        "    stoker.open(sys.argv[1])[0]\n"
        "except stoker.StokerError as e:\n"
        "    print('raised', type(e).__name__)\n"
    )
    for case in cases:
        if case["options"]:
            continue
        run = subprocess.run([sys.executable, "-c", code, str(out / case["path"])], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "raised" in run.stdout, (case["name"], run.returncode, run.stderr[-2000:])
