"""benchmarks.text_pipeline: one tiny run records the three settings, the
same features from each, and how often each traced its tokenization."""

import json

import pytest

from benchmarks import harness
from benchmarks import text_pipeline


@pytest.mark.parametrize("task", text_pipeline.TASKS)
def test_a_tiny_run_records_the_three_settings(tmp_path, task):
    results = tmp_path / "results.jsonl"
    arguments = ["--task", task, "--repeats", "1", "--runs", "1", "--texts", "8", "--batch-size", "4"]
    arguments += ["--results", results]
    done = harness.run_module("benchmarks.text_pipeline", arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [row["setting"] for row in rows] == ["tokenized_eagerly", "traced_once", "traced_per_pipeline"]
    for row in rows:
        assert row["benchmark"] == "text_pipeline" and row["pipelines_per_process"] == 4 and row["task"] == task
        assert row["first_pipeline_s"] > 0 and row["later_pipeline_s"] > 0 and row["next_epoch_s"] > 0
        assert row["same_features_in_all_settings"] is True
    # Four pipelines a process: no trace of the tokenization (eager), one, or one per pipeline.
    assert [row["tokenization_traces_per_process"] for row in rows] == [[0], [1], [4]]


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="must be positive"):
        text_pipeline.main(["--runs", "0"])
