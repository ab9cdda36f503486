"""benchmarks.text_pipeline: one tiny run records both settings, the same
features from each, and how often each traced its tokenization."""

import json

import pytest

from benchmarks import harness
from benchmarks import text_pipeline


def test_a_tiny_run_records_both_settings(tmp_path):
    results = tmp_path / "results.jsonl"
    arguments = ["--repeats", "1", "--runs", "1", "--texts", "8", "--batch-size", "4", "--results", results]
    done = harness.run_module("benchmarks.text_pipeline", arguments, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [row["setting"] for row in rows] == ["traced_once", "traced_per_pipeline"]
    for row in rows:
        assert row["benchmark"] == "text_pipeline" and row["pipelines_per_process"] == 3
        assert row["first_pipeline_s"] > 0 and row["later_pipeline_s"] > 0
        assert row["same_features_in_both_settings"] is True
    # Three pipelines a process: one trace of the tokenization, against one per pipeline.
    assert [row["tokenization_traces_per_process"] for row in rows] == [[1], [3]]


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="must be positive"):
        text_pipeline.main(["--runs", "0"])
