"""benchmarks.pruning: the pruned and dense training steps side by side."""

import pytest

from benchmarks import pruning


def test_row_times_both_steps_and_the_pruned_one_prunes():
    row = pruning.measure("tiny", batch=2, length=8, xla=False, frequency=1, runs=2)
    assert row["preset"] == "tiny" and row["frequency"] == 1 and row["runs"] == 2
    for name in ("dense", "pruned"):
        assert row[f"{name}_first_call_s"] > 0 and row[f"{name}_step_ms"] > 0
    assert row["step_ratio"] == pytest.approx(row["pruned_step_ms"] / row["dense_step_ms"], abs=1e-3)
    assert row["first_call_ratio"] == pytest.approx(row["pruned_first_call_s"] / row["dense_first_call_s"], abs=0.01)
    # One warm-up and two timed steps, the masks recomputed on each: the
    # schedule's sparsity after three of its 1000 steps (about 0.27%).
    assert row["steps"] == 3
    assert 0.0 < row["sparsity"] < 0.01
