"""examples/finetune_classifier.py: its run() end to end on a tiny preset."""

import numpy as np
import pytest

from examples import finetune_classifier


def test_example_samples_at_random_and_fine_tunes_with_berts_optimizer(tmp_path, monkeypatch):
    # Rows grouped by label, as in real files: the first 48 rows are all negative.
    data = tmp_path / "rated.tsv"
    rows = [
        f"{i}\t{-1.5 if i < 48 else 2.0}\t{'dull slow film' if i < 48 else 'a great fun film'} {i}" for i in range(96)
    ]
    data.write_text("id\trating\ttext\n" + "\n".join(rows) + "\n")
    peaks, original_optimizer = [], finetune_classifier.bert_optimizer

    def recording_optimizer(peak):
        peaks.append(peak)
        return original_optimizer(peak)

    monkeypatch.setattr(finetune_classifier, "bert_optimizer", recording_optimizer)
    split_labels, original_split = [], finetune_classifier.split

    def recording_split(texts, labels, **kwargs):
        split_labels.append(np.asarray(labels))
        return original_split(texts, labels, **kwargs)

    monkeypatch.setattr(finetune_classifier, "split", recording_split)
    result = finetune_classifier.run(
        preset="tiny",
        data=str(data),
        max_examples=24,
        epochs=1,
        batch_size=8,
        sequence_length=16,
        output=str(tmp_path / "classifier"),
    )
    assert result["train_examples"] + result["test_examples"] == 24
    assert "a seeded sample of 24" in result["data"]
    assert peaks[0] == 1e-3  # A randomly initialized built-in: the from-scratch peak.
    assert 0.0 <= result["accuracy"] <= 1.0
    assert (tmp_path / "classifier" / "config.json").is_file()
    # Both labels are in the sample (the file's first 24 rows hold one), and which rows is seeded.
    assert set(split_labels[0].tolist()) == {0, 1}
    again = finetune_classifier.run(
        preset="tiny", data=str(data), max_examples=24, epochs=1, sequence_length=16, output=str(tmp_path / "again")
    )
    assert again["data"] == result["data"] and np.array_equal(split_labels[1], split_labels[0])


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--epochs", "0"], "--epochs` must be a positive integer"),  # Was "nan examples/s" and an untrained save.
        (["--batch-size", "-1"], "--batch-size` must be a positive integer"),
        (["--learning-rate", "nan"], "--learning-rate` must be a finite positive number"),
        (["--max-examples", "2"], "--max-examples must be an integer of at least 3"),
        (["--preset", "tinny"], "Did you mean 'tiny'"),
        # These failed with a traceback once the data and model were loading.
        (["--sequence-length", "2"], "--sequence-length must be at least 3"),
        (["--sequence-length", "1000"], r"--sequence-length 1000 is longer than the \w+ preset's \d+ positions"),
        (["--data", "/nonexistent/reviews.tsv"], "--data /nonexistent/reviews.tsv: no such file.*'synthetic'"),
    ],
)
def test_bad_settings_are_refused_before_any_work(tmp_path, monkeypatch, flags, match):
    loaded = []
    monkeypatch.setattr(finetune_classifier, "load_rated_sentences", lambda *args: loaded.append(args))
    argv = ["--output", str(tmp_path / "out"), *flags]
    with pytest.raises(SystemExit, match=match):
        finetune_classifier.main(argv)
    with pytest.raises(ValueError, match=match):  # `run()` checks the same.
        finetune_classifier.run(**vars(finetune_classifier.parse_args(argv)))
    assert loaded == [] and not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_is_refused_before_training(tmp_path):
    output = tmp_path / "classifier"
    output.write_text("not a preset")
    with pytest.raises(SystemExit, match="exists and is not a directory"):
        finetune_classifier.main(["--output", str(output)])
