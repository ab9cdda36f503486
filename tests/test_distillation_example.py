"""Smoke test of examples/distill_to_small.py: its main() end to end, tiny settings."""

import re
from pathlib import Path

import numpy as np
import pytest

import bertzoo
from bertzoo.datasets import synthetic_sentiment
from examples import distill_to_small


def small_teacher(word_classifier, directory):
    """A 2-layer classifier preset with a word vocabulary of the generated data."""
    texts, _ = synthetic_sentiment(400, seed=0)
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    word_classifier(words, sequence_length=24, max_sequence_length=32).save_to_preset(directory)
    return directory


def test_example_runs_end_to_end(tmp_path, capsys, word_classifier):
    result = distill_to_small.main(
        [
            "--data",
            "synthetic",
            "--train-size",
            "48",
            "--test-size",
            "16",
            "--teacher",
            str(small_teacher(word_classifier, tmp_path / "teacher_in")),
            "--student-layers",
            "1",
            "--epochs",
            "1",
            "--sequence-length",
            "24",
            "--batch-size",
            "16",
            "--latency-runs",
            "1",
            "--jit-compile",
            "false",
            "--output",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert "Data: generated sentiment sentences" in out
    assert "a fine-tuned classifier, used as is" in out
    assert "latency b32 ms" in out and "| student" in out and "| teacher" in out
    assert "agreement" in out
    teacher, student = result["teacher"], result["student"]
    assert student["parameters"] < teacher["parameters"]
    assert student["non_embedding"] < teacher["non_embedding"]
    assert 0.0 <= result["agreement"] <= 1.0
    assert 0.0 <= student["accuracy"] <= 1.0 and student["latency_b1_ms"] > 0
    # The saved student is an ordinary classifier preset with one layer.
    saved = bertzoo.BertClassifier.from_preset(result["student_preset"])
    assert saved.backbone.num_layers == 1
    assert saved.predict(["a fine film"], verbose=0).shape == (1, 2)
    assert np.isclose(
        student["preset_mb"] * 1e6,
        sum(f.stat().st_size for f in Path(result["student_preset"]).rglob("*") if f.is_file()),
    )
    if not hasattr(bertzoo, "export_saved_model"):
        assert "not available yet" in result["saved_model"]


def test_a_mistyped_preset_fails_before_any_training(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(distill_to_small, "build_teacher", lambda *args: trained.append(args))
    for flag in ("--student", "--teacher"):
        with pytest.raises(SystemExit, match="Did you mean 'base'"):
            distill_to_small.main(["--data", "synthetic", flag, "bsae", "--output", str(tmp_path / "out")])
    assert trained == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--latency-runs", "0"], "--latency-runs` must be a positive integer"),  # Was a crash after all the work.
        (["--epochs", "0"], "--epochs` must be a positive integer"),  # Was silently the default.
        (["--student-layers", "-1"], "--student-layers` must be a positive integer"),
        (["--student-layers", "2", "--student", "tiny"], "give one of them"),
        (["--test-size", "-5"], "--test-size` must be an integer >= 0"),
        (["--learning-rate=-1e-4"], "--learning-rate` must be a finite positive number"),
        (["--temperature", "inf"], "`temperature` must be a finite number > 0"),  # Was NaN losses.
        (["--alpha", "1.5"], "`alpha` must be in \\[0, 1\\]"),
        # These failed only after the teacher's fine-tuning.
        (["--student-layers", "9"], "--student-layers 9 is more than the teacher's \\d+ layers"),
        (["--sequence-length", "1000"], "--sequence-length 1000 is longer than the teacher's \\d+ positions"),
        (["--sequence-length", "2"], "--sequence-length must be at least 3"),
    ],
)
def test_bad_settings_are_refused_before_any_work(tmp_path, monkeypatch, flags, match):
    trained = []
    monkeypatch.setattr(distill_to_small, "build_teacher", lambda *args: trained.append(args))
    output = tmp_path / "out"
    argv = ["--data", "synthetic", "--output", str(output), *flags]
    with pytest.raises(SystemExit, match=match):
        distill_to_small.main(argv)
    with pytest.raises(ValueError, match=match):  # `run()` checks the same.
        distill_to_small.run(**vars(distill_to_small.parse_args(argv)))
    assert trained == [] and not output.exists()


def test_an_output_that_is_a_file_is_refused_before_training(tmp_path):
    output = tmp_path / "out"
    output.write_text("not a folder")
    with pytest.raises(SystemExit, match="exists and is not a directory"):
        distill_to_small.main(["--data", "synthetic", "--output", str(output)])


def test_a_pretrained_student_without_a_tokenizer_is_refused_before_training(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(distill_to_small, "build_teacher", lambda *args: trained.append(args))
    bertzoo.BertBackbone.from_preset("tiny", load_weights=False).save_to_preset(tmp_path / "bare")
    argv = ["--data", "synthetic", "--student", str(tmp_path / "bare"), "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"saved without a tokenizer, so it cannot read the texts"):
        distill_to_small.main(argv)
    assert trained == [] and not (tmp_path / "out").exists()
