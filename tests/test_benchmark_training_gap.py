"""benchmarks.training_gap: one tiny run on JAX records the measures it is asked for."""

import importlib.util
import json

import pytest

from benchmarks import harness


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX (pip install jax)")
def test_a_tiny_run_records_each_measure_and_what_the_gradients_compiled_to(tmp_path):
    results = tmp_path / "results.jsonl"
    arguments = ["--preset", "tiny", "--batch", "2", "--length", "8", "--dtype", "float32"]
    arguments += ["--libraries", "bertzoo", "--measures", "train_on_batch,gradients,gradients_no_dropout"]
    arguments += ["--runs", "1", "--warmup", "1", "--results", results]
    done = harness.run_module("benchmarks.training_gap", arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["measure"]: row for row in map(json.loads, results.read_text().splitlines())}
    assert set(rows) == {"train_on_batch", "gradients", "gradients_no_dropout"}  # The measures asked for.
    assert all(row["benchmark"] == "training_gap" and row["median_ms"] > 0 for row in rows.values())
    # XLA's cost estimate of the gradient programs (on a CPU every op is
    # XLA's own): dropout adds element-wise work, its masks, to the program.
    assert rows["gradients"]["gflops"] > 0 and rows["gradients"]["fusions"] > 0
    assert rows["gradients"]["gb_accessed"] > rows["gradients_no_dropout"]["gb_accessed"]
    assert "gflops" not in rows["train_on_batch"]


def test_bad_arguments_are_refused_with_the_choices():
    done = harness.run_module("benchmarks.training_gap", ["--dtype", "int8"], timeout=120)
    assert done.returncode != 0 and "choose float32, bfloat16 or float16" in done.stderr
    done = harness.run_module("benchmarks.training_gap", ["--measures", "backward"], timeout=120)
    assert done.returncode != 0 and "--measures 'backward': choose from" in done.stderr
