"""benchmarks.pruning: the pruned and dense training steps side by side."""

import numpy as np
import pytest

from benchmarks import pruning
from benchmarks.peers import backbone_config


def test_row_times_both_steps_and_the_pruned_one_prunes():
    row = pruning.measure("tiny", batch=2, length=8, xla=False, frequency=1, runs=2)
    assert row["preset"] == "tiny" and row["frequency"] == 1 and row["runs"] == 2
    for name in ("dense", "pruned"):
        assert row[f"{name}_first_call_s"] > 0 and row[f"{name}_step_ms"] > 0
    assert row["step_ratio"] == pytest.approx(row["pruned_step_ms"] / row["dense_step_ms"], abs=1e-3)
    assert row["first_call_ratio"] == pytest.approx(row["pruned_first_call_s"] / row["dense_first_call_s"], abs=0.01)
    # One warm-up and two timed steps, the masks recomputed on each (last at
    # step 2: the schedule's sparsity there is about 0.54%).
    assert row["steps"] == 3
    assert 0.0 < row["sparsity"] < 0.01


def test_both_models_start_from_the_same_weights():
    config = backbone_config("tiny")
    dense, _ = pruning.build(config, xla=False)
    pruned, pruner = pruning.build(config, xla=False, frequency=1)
    state = {id(v) for v in pruner.state.variables}  # Masks and step counters.
    pruned_weights = [v for v in pruned.weights if id(v) not in state]
    assert len(pruned_weights) == len(dense.weights)
    for a, b in zip(dense.weights, pruned_weights):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
