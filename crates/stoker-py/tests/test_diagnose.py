"""stoker.diagnose from Python: the ladder with a Python training step as the consumer."""

from __future__ import annotations

import time

import pytest

import stoker


def test_a_slow_python_step_is_named_as_the_bottleneck(data) -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.05)  # the planted slow consumer: far slower than reading a local batch

    report = stoker.diagnose(data / "bucket" / "tar", batch_size=8, step=step, samples=64, seconds=5)
    assert report["verdict"]["step"] == "consumer", report["text"]
    assert [s["step"] for s in report["steps"]][0] == "consumer"
    assert len(report["steps"]) == 5
    assert calls, "the step was never called"
    assert "bottleneck" in report["text"]


def test_input_side_alone_and_bad_settings(data) -> None:
    report = stoker.diagnose(data / "lmdb", batch_size=16, samples=64, seconds=5)
    assert report["setup"]["layout"] == "lmdb"
    assert all(s["samples_per_s"] > 0 for s in report["steps"]), report["text"]
    with pytest.raises(stoker.InvalidInputError, match="batch_size"):
        stoker.diagnose(data / "lmdb", batch_size=0)
    with pytest.raises(stoker.InvalidInputError, match="seconds"):
        stoker.diagnose(data / "lmdb", seconds=0)
    with pytest.raises(stoker.NotFoundError):
        stoker.diagnose(data / "missing")


def test_a_step_that_raises_names_the_step(data) -> None:
    def step() -> None:
        raise RuntimeError("out of memory in my model")

    with pytest.raises(stoker.StokerError, match="out of memory in my model"):
        stoker.diagnose(data / "bucket" / "tar", batch_size=8, step=step, samples=16, seconds=5)


def test_decoding_is_measured_as_the_loader_runs_it(data) -> None:
    # The tar fixture's labels are integer text: decoded, the setup says so and every step runs.
    report = stoker.diagnose(data / "bucket" / "tar", batch_size=8, samples=32, seconds=5, decode={"cls": stoker.Int()})
    assert report["setup"]["decode"] is True and report["setup"]["transform"] is True
    assert all(s["samples_per_s"] > 0 for s in report["steps"]), report["text"]
    # Its payloads are not integers: the error names the field and a sample.
    with pytest.raises(stoker.DecodeError, match="`bin`"):
        stoker.diagnose(data / "bucket" / "tar", batch_size=8, samples=16, seconds=5, decode={"bin": stoker.Int()})
