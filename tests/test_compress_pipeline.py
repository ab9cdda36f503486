"""`bertzoo.compress` / `bertzoo compress`: stages in order, per-stage presets
and SavedModels, the trade-off report and chart, input files and their errors."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo import cli
from bertzoo.compression import pipeline
from bertzoo.compression.pipeline import REPORT_KEYS
from bertzoo.compression.pipeline import student_layers
from bertzoo.datasets.files import label_ids
from bertzoo.datasets.files import load_labelled_texts
from bertzoo.datasets.files import threshold_labels
from bertzoo.export import export_model
from bertzoo.export import read_export_metadata
from bertzoo.models import serving
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.utils import private_api

POSITIVE = "good great fine nice superb".split()
NEGATIVE = "bad awful dull poor weak".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POSITIVE + NEGATIVE + "the film was a very".split()
PNG_HEADER = b"\x89PNG\r\n\x1a\n"


def sentiment(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = []
    for label in labels:
        words = list(rng.choice(POSITIVE if label else NEGATIVE, size=rng.integers(1, 3)))
        texts.append(" ".join(["the", "film", "was"][: rng.integers(0, 4)] + words))
    return texts, [int(x) for x in labels]


def write_tsv(path, texts, labels, text_column="text", label_column="label"):
    with open(path, "w", newline="") as f:
        f.write(f"{text_column}\t{label_column}\n")
        for text, label in zip(texts, labels):
            f.write(f"{text}\t{label}\n")
    return path


def write_csv(path, texts, labels):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "sentiment"])
        writer.writerows(zip(texts, labels))
    return path


def write_jsonl(path, texts, labels):
    with open(path, "w") as f:
        for text, label in zip(texts, labels):
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("compress")
    # The same teacher whichever tests ran before in this process: unseeded, one whose logits came out
    # near zero failed the weight-only stage's 5% tolerance once.
    keras.utils.set_random_seed(0)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=2,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        max_sequence_length=16,
    )
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=8)
    teacher = bertzoo.BertClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    texts, labels = sentiment(64, seed=0)
    teacher.fit(texts, np.asarray(labels, "int32"), epochs=2, batch_size=16, verbose=0)
    teacher.save_to_preset(root / "teacher")
    write_tsv(root / "train.tsv", texts, labels)
    test_texts, test_labels = sentiment(24, seed=1)
    write_jsonl(root / "test.jsonl", test_texts, test_labels)
    return root


@pytest.fixture(scope="module")
def run(workspace):
    out = workspace / "out"
    report = bertzoo.compress(
        workspace / "teacher",
        workspace / "train.tsv",
        workspace / "test.jsonl",
        out,
        stages=("distill", "prune", "int8"),
        epochs=1,
        batch_size=16,
        latency_repeats=2,
        verbose=0,
    )
    return out, report


@pytest.fixture
def quick_reports(monkeypatch):
    """For tests of what a run trains on and reports: latencies of 1 ms and
    SavedModels written as an empty `saved_model.pb`. `run` above measures
    and exports for real (and its tests check both); here they would only
    repeat its tracing and compiling, about 5 seconds a stage."""

    def export(model, path, **options):
        Path(path).mkdir(parents=True)
        (Path(path) / "saved_model.pb").write_bytes(b"")

    monkeypatch.setattr(serving, "_exporter", export)
    monkeypatch.setattr(bertzoo.compression.pipeline, "_latency_ms", lambda model, features, repeats: 1.0)


@pytest.fixture
def quick_accuracy(monkeypatch):
    """For tests that check no accuracy: every report row reads 0.5 instead
    of predicting the eval texts, a traced predict step per model (the
    teacher's too) on every run. `run` and the string-labels test measure it
    for real and check it. The stand-in still checks what it is handed: one
    label per text, each a class id of the model."""

    def accuracy(model, texts, labels, batch_size):
        assert len(texts) == len(labels) > 0 and batch_size > 0
        assert set(np.asarray(labels).tolist()) <= set(range(model.num_classes))
        return 0.5

    monkeypatch.setattr(bertzoo.compression.pipeline, "_accuracy", accuracy)


def test_each_stage_saves_a_loadable_preset_and_a_saved_model(run, workspace):
    out, report = run
    texts, _ = sentiment(4, seed=2)
    for index, stage in enumerate(("distill", "prune", "int8"), start=1):
        stage_dir = out / f"{index}_{stage}"
        model = bertzoo.BertClassifier.from_preset(stage_dir / "preset")
        assert model.predict(texts, verbose=0).shape == (4, 2)
        assert (stage_dir / "saved_model" / "saved_model.pb").is_file()
    distilled = bertzoo.BertClassifier.from_preset(out / "1_distill" / "preset")
    assert distilled.backbone.num_layers == 1  # Every 3rd of 2 layers: at least one.
    pruned = bertzoo.BertClassifier.from_preset(out / "2_prune" / "preset")
    assert bertzoo.sparsity_report(pruned).total_sparsity > 0.5
    quantized = bertzoo.BertClassifier.from_preset(out / "3_int8" / "preset")
    assert bertzoo.utils.quantization_mode(quantized) == "int8"
    # Post-training int8 smooths the Dense inputs by default (calibrated on the training texts).
    assert report["smoothing"] == 0.8 and quantized.backbone.pooler.input_scale is not None
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # No temporary leftovers.


def test_report_has_the_teacher_and_one_row_per_stage(run):
    out, report = run
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert [row["stage"] for row in saved["rows"]] == ["teacher", "distill", "prune", "int8"]
    for row in saved["rows"]:
        assert set(row) == set(REPORT_KEYS)
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["latency_b1_ms"] > 0 and row["latency_b32_ms"] > 0 and row["preset_mb"] > 0
    rows = {row["stage"]: row for row in saved["rows"]}
    assert rows["teacher"]["percent_of_teacher"] == pytest.approx(100.0)
    assert rows["distill"]["parameters"] < rows["teacher"]["parameters"]
    assert rows["prune"]["nonzero_parameters"] < rows["prune"]["parameters"]
    # The pruned zeros survive int8 (and weights that round to 0 join them).
    zeros = {stage: rows[stage]["parameters"] - rows[stage]["nonzero_parameters"] for stage in ("prune", "int8")}
    assert zeros["int8"] >= zeros["prune"] > 0
    # The int8 stage holds the pruned model's weights: its scales are not counted as parameters.
    assert rows["int8"]["parameters"] == rows["prune"]["parameters"]
    assert saved["sparsity"] == 0.9 and saved["batch_size"] == 16 and saved["sequence_length"] == 8
    # Not its preset MB against "prune"'s: at 16 hidden units HDF5's per-array overhead
    # outweighs the weights, and smoothing adds an array per Dense. The kernels are int8.
    quantized = bertzoo.BertClassifier.from_preset(out / "3_int8" / "preset")
    assert str(quantized.backbone.pooler._kernel.dtype) == "int8"
    assert str(quantized.backbone.feedforward_blocks[0].intermediate_dense._kernel.dtype) == "int8"
    assert saved["classes"] == [0, 1]
    table = (out / "report.md").read_text()
    assert "| int8 |" in table and "% of teacher" in table
    assert (out / "tradeoff.png").read_bytes()[:8] == PNG_HEADER


def test_cli_with_csv_and_string_labels(workspace, capsys, monkeypatch, quick_reports, quick_accuracy):
    texts, labels = sentiment(32, seed=3)
    names = ["neg" if y == 0 else "pos" for y in labels]
    train = write_csv(workspace / "train.csv", texts, names)
    test = write_csv(workspace / "test.csv", texts[:8], names[:8])
    out = workspace / "cli_out"
    argv = ["compress", str(workspace / "teacher"), "--train", str(train), "--eval", str(test), "--out", str(out)]
    argv += ["--stages", "int8", "--text-column", "sentence", "--label-column", "sentiment"]
    assert cli.main(argv) == 0
    assert "| int8 |" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["classes"] == ["neg", "pos"]
    assert [row["stage"] for row in report["rows"]] == ["teacher", "int8"]
    assert (out / "1_int8" / "saved_model").is_dir()  # The exporter was handed the stage's path.
    # The teacher has no names: the students take the file's, so they serve label_names (ids before).
    assert bertzoo.BertClassifier.from_preset(out / "1_int8" / "preset").class_names == ["neg", "pos"]
    # An existing DIR is refused (a message, exit status 1), replaced with --overwrite.
    assert cli.main(argv) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert report["qat_epochs"] == 0 and report["smoothing"] == 0.8 and report["input_ranges"] == "dynamic"
    assert report["weight_only"] is False
    assert cli.main(argv + ["--overwrite", "--smoothing", "none"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["smoothing"] is None
    assert bertzoo.BertClassifier.from_preset(out / "1_int8" / "preset").backbone.pooler.input_scale is None
    assert cli.main(argv + ["--overwrite", "--input-ranges", "static"]) == 0
    assert json.loads((out / "report.json").read_text())["input_ranges"] == "static"
    assert bertzoo.BertClassifier.from_preset(out / "1_int8" / "preset").backbone.pooler.input_range is not None
    # The rerun trains the int8 stage quantization-aware first, and exports it for real.
    monkeypatch.setattr(serving, "_exporter", export_model)
    assert cli.main(argv + ["--overwrite", "--qat-epochs", "1"]) == 0
    assert (out / "1_int8" / "saved_model" / "saved_model.pb").stat().st_size > 0  # Not quick_reports' stand-in.
    assert read_export_metadata(out / "1_int8" / "saved_model")["class_names"] == ["neg", "pos"]
    report = json.loads((out / "report.json").read_text())
    assert report["qat_epochs"] == 1 and [row["stage"] for row in report["rows"]] == ["teacher", "int8"]
    assert report["smoothing"] is None  # Quantization-aware training, not post-training smoothing.
    assert bertzoo.BertClassifier.from_preset(out / "1_int8" / "preset").backbone.pooler.quantization_mode == "int8"


def test_weight_only_int8_stage_quantizes_the_kernels_alone(workspace, capsys, quick_reports, quick_accuracy):
    out = workspace / "weight_only_out"
    argv = ["compress", str(workspace / "teacher"), "--train", str(workspace / "train.tsv")]
    argv += ["--eval", str(workspace / "test.jsonl"), "--out", str(out), "--stages", "int8", "--weight-only"]
    assert cli.main(argv + ["--smoothing", "0.5"]) == 1
    assert "smoothing=0.5 does not apply" in capsys.readouterr().err and not out.exists()
    assert cli.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["weight_only"] is True and report["smoothing"] is None and report["input_ranges"] is None
    assert "| int8 (weight-only) |" in (out / "report.md").read_text()  # Not taken for dynamic int8.
    assert "attention_0/query" in bertzoo.Preset.resolve(out / "1_int8" / "preset").quantization["weight_only_layers"]
    model = bertzoo.BertClassifier.from_preset(out / "1_int8" / "preset")
    pooler = model.backbone.pooler
    assert str(pooler._kernel.dtype) == "int8" and pooler.inputs_quantizer is None and pooler.input_scale is None
    # Float inputs times the dequantized kernels: close to the teacher's logits.
    teacher = bertzoo.BertClassifier.from_preset(workspace / "teacher")
    texts, _ = sentiment(8, seed=2)
    expected, logits = teacher.predict(texts, verbose=0), model.predict(texts, verbose=0)
    assert not np.allclose(logits, expected, atol=1e-6)  # Really quantized.
    assert np.abs(logits - expected).max() <= 0.05 * np.abs(expected).max()


def test_cli_with_ratings_a_label_threshold_and_a_transfer_file(workspace, capsys, quick_reports, quick_accuracy):
    texts, labels = sentiment(24, seed=5)
    ratings = [f"{(1.5 if y else -2.0) + 0.25 * i:.2f}" for i, y in enumerate(labels)]
    ratings[0] = "0.0"  # Exactly at the threshold: dropped.
    train = write_tsv(workspace / "rated.tsv", texts, ratings, label_column="rating")
    transfer = write_csv(workspace / "transfer.csv", *sentiment(16, seed=6))  # Its column: "sentence".
    out = workspace / "rated_out"
    argv = ["compress", str(workspace / "teacher"), "--train", str(train), "--eval", str(train), "--out", str(out)]
    argv += ["--stages", "distill", "--label-column", "rating", "--label-threshold", "0", "--recipe", "hinton"]
    with pytest.raises(SystemExit):  # argparse's usage error: float() alone would take "nan".
        cli.main(argv[:-6] + ["--label-threshold", "nan"])
    assert "expected a finite number, got 'nan'" in capsys.readouterr().err
    assert cli.main(argv + ["--transfer", str(transfer), "--transfer-column", "sentence", "--batch-size", "8"]) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert report["classes"] == [0, 1]
    assert report["train_size"] == 23 and report["eval_size"] == 23
    assert report["recipe"] == "hinton" and report["transfer_size"] == 16
    assert threshold_labels(["a", "b", "c"], ["-1", "0", "2.5"], 0.0) == (["a", "c"], [0, 1])
    with pytest.raises(ValueError, match=r"rated\.tsv: label 'pos' is not a number: a label threshold needs"):
        threshold_labels(["a"], ["pos"], 0.0, source=train)
    # 0/1 labels with a threshold of 0: every 0 is "at the threshold", one class is left.
    binary = write_tsv(workspace / "binary.tsv", *sentiment(12, seed=8))
    zeros = sum(1 for label in sentiment(12, seed=8)[1] if label == 0)
    with pytest.raises(
        ValueError,
        match=rf"binary\.tsv: with the label threshold 0 the training labels have fewer than two classes left \({zeros} of 12 "
        r"rows rated exactly 0 were dropped\).*leave out --label-threshold",
    ):
        bertzoo.compress(workspace / "teacher", binary, binary, workspace / "binary_out", label_threshold=0)
    assert not (workspace / "binary_out").exists()
    at_threshold = write_tsv(workspace / "at_threshold.tsv", texts[:3], ["0.0"] * 3, label_column="rating")
    with pytest.raises(ValueError, match=r"at_threshold\.tsv: no rows left to evaluate on with the label threshold 0"):
        bertzoo.compress(
            workspace / "teacher",
            train,
            at_threshold,
            workspace / "empty_eval",
            label_column="rating",
            label_threshold=0,
        )
    assert not (workspace / "empty_eval").exists()


def test_prune_stages_train_on_the_transfer_set_when_given(workspace, monkeypatch, quick_reports, quick_accuracy):
    distill_calls, prune_fits = [], []

    def recording_distill(teacher, student, *args, **kwargs):
        distill_calls.append((teacher.backbone.num_heads, student.backbone.num_heads, kwargs))
        return real_distill(teacher, student, *args, **kwargs)

    class RecordingPruner(pipeline.Pruner):
        def fit(self, *args, **kwargs):
            rate = private_api.learning_rate_schedule(self.model.optimizer).peak_learning_rate
            prune_fits.append((args, self.schedule, rate, self.scores))
            return super().fit(*args, **kwargs)

    real_distill = pipeline.distill
    monkeypatch.setattr(pipeline, "distill", recording_distill)
    monkeypatch.setattr(pipeline, "Pruner", RecordingPruner)
    train_texts = load_labelled_texts(workspace / "train.tsv")[0]
    transfer = sentiment(16, seed=7)[0]
    out = workspace / "prune_transfer_out"
    report = bertzoo.compress(
        workspace / "teacher",
        workspace / "train.tsv",
        workspace / "test.jsonl",
        out,
        stages="prune,prune_structured",
        heads_to_keep=1,
        ffn_keep_ratio=0.5,
        transfer=transfer,
        epochs=2,
        batch_size=16,
        latency_repeats=1,
        verbose=0,
    )
    # "prune": the training and transfer texts, unlabelled (soft targets),
    # the schedule spanning their steps, at the pruning learning rate, by
    # second-order scores.
    ((args, schedule, rate, scores),) = prune_fits
    assert rate == pipeline.PRUNING_LEARNING_RATE == 3e-4
    assert scores == pipeline.PRUNING_SCORES == "fisher"
    assert len(args) == 1 and sorted(args[0]) == sorted(train_texts + transfer)
    assert schedule == bertzoo.compression.ramp_schedule(2 * -(-(len(train_texts) + len(transfer)) // 16), 0.9)
    # "prune_structured": the hinton recipe on the transfer set.
    ((teacher_heads, student_heads, options),) = distill_calls
    assert (teacher_heads, student_heads) == (2, 1)
    assert options["recipe"] == "hinton" and options["transfer"] == transfer
    assert [row["stage"] for row in report["rows"]] == ["teacher", "prune", "prune_structured"]
    assert report["transfer_size"] == len(transfer)
    assert (report["heads_to_keep"], report["ffn_keep_ratio"]) == ([1, 1], 0.5)  # As used, one count per layer.
    pruned = bertzoo.BertClassifier.from_preset(out / "2_prune_structured" / "preset")
    assert pruned.backbone.intermediate_dim == 16
    # The structured stage trains the sparse model on, and keeps its zeros.
    encoder = re.compile(r"(attention|feedforward)_\d+/\w+/kernel")
    kernels = [np.asarray(w) for name, w in pruned.backbone.named_weights().items() if encoder.fullmatch(name)]
    zeros = sum(int(np.sum(k == 0)) for k in kernels) / sum(k.size for k in kernels)
    assert zeros >= 0.85, zeros


def test_augmented_copies_join_the_transfer_set_of_every_stage_that_uses_it(
    workspace, monkeypatch, quick_reports, quick_accuracy
):

    # Records what each stage is asked to train on, and trains nothing: the
    # stages' real training runs in `run` and the prune/transfer test above.
    distill_calls, prune_data, plain_fits = [], [], []

    class RecordingPruner(pipeline.Pruner):
        def fit(self, *args, **kwargs):
            prune_data.append(args)

    monkeypatch.setattr(pipeline, "distill", lambda teacher, student, *args, **kwargs: distill_calls.append(kwargs))
    monkeypatch.setattr(pipeline, "Pruner", RecordingPruner)
    monkeypatch.setattr(pipeline, "_fit_distilling", lambda *args: plain_fits.append(args[2]))
    train_texts = load_labelled_texts(workspace / "train.tsv")[0]
    argv = ["compress", str(workspace / "teacher"), "--train", str(workspace / "train.tsv")]
    argv += ["--eval", str(workspace / "test.jsonl"), "--out", str(workspace / "augment_out")]
    stages = "distill,prune,prune_structured"
    assert cli.main(argv + ["--stages", stages, "--augment", "2", "--batch-size", "16"]) == 0
    # The distill recipe gets the copies to make, and so does the hinton
    # recovery of prune_structured; the prune stage trains on the training
    # texts and their copies alone (no transfer file), unlabelled.
    (distill_options, structured_options) = distill_calls
    assert distill_options["augment"] == 2 and distill_options["transfer"] is None
    assert structured_options["augment"] == 2 and structured_options["recipe"] == "hinton"
    ((data,),) = prune_data
    copies = bertzoo.compression.augment_texts(train_texts, copies=2, seed=0)
    assert sorted(data) == sorted(train_texts + copies) and len(data) == 3 * len(train_texts)
    assert plain_fits == []
    report = json.loads((workspace / "augment_out" / "report.json").read_text())
    assert report["augment"] == 2 and report["transfer_size"] == 0
    # Without a recipe the distill stage trains on the labelled texts: copies would be ignored, so are refused.
    out = workspace / "augment_no_recipe_out"
    no_recipe = argv[:-1] + [str(out), "--stages", "distill", "--recipe", "none"]
    assert cli.main(no_recipe + ["--augment", "2"]) == 1
    assert not out.exists() and plain_fits == []
    assert cli.main(no_recipe) == 0
    assert distill_calls[2:] == [] and json.loads((out / "report.json").read_text())["augment"] == 0
    ((texts, labels),) = plain_fits
    assert texts == train_texts and len(labels) == len(train_texts)
    with pytest.raises(
        ValueError, match=r"`augment` must be an integer >= 0 \(perturbed copies of each text\), got -1"
    ):
        bertzoo.compress(
            workspace / "teacher", workspace / "train.tsv", workspace / "train.tsv", workspace / "bad", augment=-1
        )
    assert not (workspace / "bad").exists()  # Checked before anything is written.


def test_bad_inputs_give_clear_errors(workspace, tmp_path):
    teacher, train = workspace / "teacher", workspace / "train.tsv"
    texts, labels = sentiment(8, seed=4)
    wrong = write_tsv(tmp_path / "wrong.tsv", texts, labels, text_column="sentence")
    with pytest.raises(ValueError, match=r"wrong\.tsv: no text column 'text'; columns found: \['sentence', 'label'\]"):
        bertzoo.compress(teacher, wrong, train, tmp_path / "a", verbose=0)
    with pytest.raises(ValueError, match=r"no label column 'stars'"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", label_column="stars", verbose=0)
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(ValueError, match=r"empty\.tsv is empty"):
        bertzoo.compress(teacher, tmp_path / "empty.tsv", train, tmp_path / "a", verbose=0)
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match=r"header\.csv is empty: a header but no rows"):
        bertzoo.compress(teacher, train, tmp_path / "header.csv", tmp_path / "a", verbose=0)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl is empty"):
        load_labelled_texts(tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match=r"Unknown stage 'quantise'.*'int8'"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", stages="distill,quantise", verbose=0)
    with pytest.raises(
        ValueError, match=r"Unknown recipe 'distilbert'. Choose one of \['hinton', 'minilm', 'tinybert'\]"
    ):
        bertzoo.compress(teacher, train, train, tmp_path / "a", recipe="distilbert", verbose=0)
    with pytest.raises(ValueError, match=r"no text column 'text'.*--transfer-column \(Python: transfer_column=...\)"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", transfer=wrong, verbose=0)
    with pytest.raises(ValueError, match=r"no text column 'words'.*--transfer-column"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", transfer=wrong, transfer_column="words", verbose=0)
    with pytest.raises(ValueError, match=r"transfer_column \(--transfer-column\) names a column of a transfer file"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", transfer=["a text"], transfer_column="x", verbose=0)
    (tmp_path / "array.json").write_text('[\n  {"text": "good", "label": 1}\n]\n')
    with pytest.raises(ValueError, match=r"array\.json:1: not valid JSON .* read as JSON Lines: one object per line"):
        load_labelled_texts(tmp_path / "array.json")
    with pytest.raises(ValueError, match=r"`qat_epochs` must be an integer >= 0 \(0: post-training int8\), got -1"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", qat_epochs=-1, verbose=0)
    with pytest.raises(ValueError, match=r"`smoothing` must be a number in \[0, 1\] \(SmoothQuant's alpha\) or None"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", smoothing=2, verbose=0)
    with pytest.raises(ValueError, match=r"`input_ranges` must be one of \['dynamic', 'static'\], got 'fixed'"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", input_ranges="fixed", verbose=0)
    for settings in ({"smoothing": None}, {"qat_epochs": 1}, {"stages": "distill"}):
        with pytest.raises(ValueError, match=r"input_ranges=\"static\" is calibrated with the smoothing"):
            bertzoo.compress(teacher, train, train, tmp_path / "a", input_ranges="static", verbose=0, **settings)
    # Checked before the static-ranges hint, which would ask for the smoothing weight-only does not use.
    static = {"input_ranges": "static", "smoothing": None}
    for settings in ({"qat_epochs": 1}, {"input_ranges": "static"}, static, {"stages": "distill"}):
        with pytest.raises(ValueError, match=r"weight_only=True is post-training int8 of the kernels alone"):
            bertzoo.compress(teacher, train, train, tmp_path / "a", weight_only=True, verbose=0, **settings)
    # An explicit smoothing where nothing is smoothed (the default "auto" is taken as 0.8 or nothing).
    for settings in ({"weight_only": True}, {"qat_epochs": 1}, {"stages": "distill"}):
        for smoothing in (0.5, None):
            with pytest.raises(ValueError, match=rf"smoothing={smoothing} does not apply: .*Leave `smoothing` out"):
                bertzoo.compress(teacher, train, train, tmp_path / "a", smoothing=smoothing, verbose=0, **settings)
    with pytest.raises(ValueError, match=r"`weight_only` must be True or False, got 'yes'"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", weight_only="yes", verbose=0)
    with pytest.raises(ValueError, match=r"`sparsity` must be a sparsity in \[0, 1\).*got 1.5"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", stages="distill,prune", sparsity=1.5, verbose=0)
    with pytest.raises(ValueError, match=r"'int8' must be the last stage"):
        bertzoo.compress(teacher, train, train, tmp_path / "a", stages=("int8", "prune"), verbose=0)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"taken already exists and is not empty.*--overwrite"):
        bertzoo.compress(teacher, train, train, tmp_path / "taken", verbose=0)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match=r"not among the training classes"):
        bertzoo.compress(teacher, train, write_tsv(tmp_path / "three.tsv", ["x"], [2]), tmp_path / "a", verbose=0)
    assert cli.main(["compress", str(teacher), "--train", str(wrong), "--eval", str(train), "--out", "x"]) == 1
    assert not (tmp_path / "a").exists()  # Input errors come before any output.
    # A teacher that does not fit the data is refused before a previous run's outputs are removed.
    previous = tmp_path / "previous"
    (previous / "1_int8").mkdir(parents=True)
    (previous / "report.json").write_text("{}")
    three = write_tsv(tmp_path / "three.tsv", ["a", "b", "c"], [0, 1, 2])
    with pytest.raises(ValueError, match=r"The teacher classifies 2 classes, but the training file has 3"):
        bertzoo.compress(teacher, three, three, previous, overwrite=True, verbose=0)
    assert sorted(p.name for p in previous.iterdir()) == ["1_int8", "report.json"]
    with pytest.raises(ValueError, match=r"The teacher classifies 2 classes"):
        bertzoo.compress(teacher, three, three, tmp_path / "new", verbose=0)
    assert not (tmp_path / "new").exists()


def test_labels_map_by_sorted_order_and_student_depth_follows_the_speedup():
    assert label_ids([10, -1, 10, 3]) == ([2, 0, 2, 1], [-1, 3, 10])
    assert label_ids(["pos", "neg"]) == ([1, 0], ["neg", "pos"])
    assert student_layers(6) == [3, 6]
    assert student_layers(12) == [3, 6, 9, 12]
    assert student_layers(6, target_speedup=2) == [2, 4, 6]
    assert student_layers(12, target_speedup=5) == [6, 12]
    assert student_layers(2, target_speedup=10) == [2]
    with pytest.raises(ValueError, match="target_speedup"):
        student_layers(6, target_speedup=0.5)
    # Each student layer starts from the teacher layer the "uniform" map
    # distills it from: ceil(i * L / count), not Python's round-half-even.
    assert student_layers(12, target_speedup=2.4) == [3, 5, 8, 10, 12]
    assert student_layers(10) == [4, 7, 10]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`target_speedup` \(CLI: --target-speedup\) must be a finite number"):
            student_layers(6, target_speedup=bad)


def test_a_speedup_beyond_one_layer_keeps_one_and_says_so(
    workspace, monkeypatch, caplog, quick_reports, quick_accuracy
):
    monkeypatch.setattr(pipeline, "distill", lambda *args, **kwargs: None)  # Trains nothing: only the depth matters.
    out = workspace / "deep_speedup_out"
    files = (workspace / "teacher", workspace / "train.tsv", workspace / "test.jsonl", out)
    with caplog.at_level("WARNING", logger="bertzoo"):
        report = bertzoo.compress(*files, stages="distill", target_speedup=5, verbose=0)
    assert "target_speedup=5 asks for fewer than one of the model's 2 layers: the student keeps 1 layer" in caplog.text
    assert "about 2x by depth" in caplog.text
    assert bertzoo.BertClassifier.from_preset(out / "1_distill" / "preset").backbone.num_layers == 1
    assert report["target_speedup"] == 5
    caplog.clear()
    with caplog.at_level("WARNING", logger="bertzoo"):  # 2 / 2 = 1 layer: what was asked, nothing to say.
        bertzoo.compress(*files, stages="distill", target_speedup=2, overwrite=True, verbose=0)
    assert "target_speedup" not in caplog.text


def test_settings_a_run_would_ignore_or_lose_work_on_are_refused_first(workspace, tmp_path):
    teacher, train = workspace / "teacher", workspace / "train.tsv"

    def refused(match, **settings):
        options = {"verbose": 0, **settings}
        with pytest.raises(ValueError, match=match):
            bertzoo.compress(
                options.pop("teacher", teacher), options.pop("train", train), train, tmp_path / "a", **options
            )

    refused(r"Stage\(s\) \['int8'\] appear more than once", stages="int8,int8")
    refused(r"Stage\(s\) \['prune'\] appear more than once", stages="distill,prune,prune")
    refused(
        r"target_speedup \(--target-speedup\) sizes the distill stage's student", stages="prune,int8", target_speedup=3
    )
    refused(r"qat_epochs=1 \(--qat-epochs\) sets the int8 stage, which is not among", stages="distill", qat_epochs=1)
    refused(r"heads_to_keep and ffn_keep_ratio set the prune_structured stage", stages="distill", ffn_keep_ratio=0.5)
    refused(r"transfer texts and augment copies train .* stages \['int8'\] use neither", stages="int8", augment=2)
    refused(r"with recipe None use neither", stages="distill,int8", recipe=None, transfer=["some text"])
    refused(r"`latency_repeats` must be a positive integer, got 0", latency_repeats=0)
    refused(r"`teacher_epochs` must be a positive integer, got 0", teacher_epochs=0)
    one_class = write_tsv(tmp_path / "one_class.tsv", ["good", "great"], [1, 1])
    refused(r"one_class\.tsv: every training row has the label 1 \(column 'label'\)", train=one_class)
    quantized = bertzoo.quantize(bertzoo.BertClassifier.from_preset(teacher), "int8")
    quantized.save_to_preset(tmp_path / "int8_teacher")
    refused(r"The teacher is quantized \(int8\).*Pass the float model's preset", teacher=tmp_path / "int8_teacher")
    # A setting whose stage is absent, or out of range there, is refused rather than ignored.
    refused(r"sparsity=0.5 \(--sparsity\) sets the prune stage, which is not among", stages="distill", sparsity=0.5)
    # Given at the default value too (it was accepted and ignored).
    refused(r"sparsity=0.9 \(--sparsity\) sets the prune stage, which is not among", stages="distill", sparsity=0.9)
    refused(r"recipe='tinybert' \(--recipe\) sets how the distill stage trains", stages="int8", recipe="tinybert")
    refused(r"qat_epochs=0 \(--qat-epochs\) sets the int8 stage, which is not among", stages="distill", qat_epochs=0)
    refused(r"`sparsity` must be a sparsity in \[0, 1\)", stages="prune", sparsity=5)
    refused(r"sequence_length \(--sequence-length\) must be an integer >= 3.*got 1", sequence_length=1)
    # Checked against the model the stage gets, before the distill stage trains (it keeps 2 heads).
    refused(
        r"heads_to_keep=3 for layer 0, which has only 2 heads: keep at most 2 \(--heads-to-keep",
        stages="distill,prune_structured",
        heads_to_keep=3,
    )
    refused(
        r"heads_to_keep=0 would leave a layer with zero attention heads", stages="prune_structured", heads_to_keep=0
    )
    refused(
        r"`ffn_keep_ratio` must be in \(0, 1\].*got 1.5 for layer 1",
        stages="prune_structured",
        ffn_keep_ratio=[0.5, 1.5],
    )
    refused(r"recipe='minilm' \(--recipe\) sets how the distill stage trains", stages="int8", recipe="minilm")
    refused(r"teacher_epochs \(--teacher-epochs\) fine-tunes the new head of a backbone", teacher_epochs=2)
    # Backbone presets get the classifier's checks, before anything is written.
    float_teacher = bertzoo.BertClassifier.from_preset(teacher)
    float_teacher.backbone.save_to_preset(tmp_path / "no_vocabulary")
    refused(r"needs a preprocessor \(tokenizer\).*saved with its vocabulary", teacher=tmp_path / "no_vocabulary")
    bertzoo.quantize(float_teacher.backbone, "int8").save_to_preset(
        tmp_path / "int8_backbone", tokenizer=float_teacher.preprocessor.tokenizer
    )
    refused(r"The teacher is quantized \(int8\)", teacher=tmp_path / "int8_backbone")
    assert not (tmp_path / "a").exists()
    # The CLI's --sparsity reaches compress, and is refused the same way.
    for value in ("0.5", "0.9"):
        code = cli.main(
            ["compress", str(teacher), "--train", str(train), "--eval", str(train), "--out", "x", "--stages", "int8"]
            + ["--sparsity", value]
        )
        assert code == 1 and not Path("x").exists()


def test_overwrite_keeps_the_users_files_and_refuses_to_remove_its_own_inputs(
    workspace, tmp_path, quick_reports, quick_accuracy
):
    previous = tmp_path / "previous"
    bertzoo.BertClassifier.from_preset(workspace / "teacher").save_to_preset(previous / "1_distill" / "preset")
    (previous / "2024_notes").mkdir()  # Digits and an underscore, but no stage of a run.
    (previous / "report.json").write_text("{}")
    train = workspace / "train.tsv"
    with pytest.raises(ValueError, match=r"1_distill/preset lies inside .*1_distill, which --overwrite"):
        bertzoo.compress(previous / "1_distill" / "preset", train, train, previous, overwrite=True, verbose=0)
    assert (previous / "1_distill" / "preset" / "config.json").is_file()
    assert (previous / "report.json").read_text() == "{}"
    # A stage half-written by a killed run goes; one a live process is writing stays.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (previous / f".3_prune_structured.tmp-{dead.pid}-x1" / "preset").mkdir(parents=True)
    (previous / f".2_prune.tmp-{os.getpid()}-x2").mkdir()
    bertzoo.compress(workspace / "teacher", train, train, previous, stages="int8", overwrite=True, verbose=0)
    assert sorted(p.name for p in previous.iterdir()) == [
        f".2_prune.tmp-{os.getpid()}-x2",
        "1_int8",
        "2024_notes",
        "report.json",
        "report.md",
        "tradeoff.png",
    ]


def test_an_output_inside_a_preset_is_refused_before_training_and_sizes_count_the_presets_own_files(
    workspace, tmp_path, capsys
):
    teacher = tmp_path / "teacher"
    shutil.copytree(workspace / "teacher", teacher)
    train = workspace / "train.tsv"
    # Accepted before: every later size report counted the stages inside the teacher, which could not be re-saved.
    for out in (teacher / "compressed", teacher):
        with pytest.raises(FileExistsError, match=rf"--out {out} lies inside the preset {teacher}"):
            bertzoo.compress(teacher, train, train, out, stages="int8", verbose=0)
    assert not (teacher / "compressed").exists()
    own = bertzoo.compression.gzip_size(teacher, recursive=False)
    (teacher / "notes").mkdir()
    (teacher / "notes" / "big.bin").write_bytes(os.urandom(200_000))
    assert bertzoo.compression.gzip_size(teacher, recursive=False) == own
    assert bertzoo.compression.gzip_size(teacher) > own + 190_000
    with pytest.raises(FileExistsError, match=r"lies inside the preset .*teacher.*Save to a directory outside it"):
        bertzoo.BertClassifier.from_preset(teacher).save_to_preset(teacher / "notes" / "int8")
    assert not (teacher / "notes" / "int8").exists()
    assert cli.main(["quantize", str(teacher), str(tmp_path / "int8")]) == 0
    was = float(re.search(r"was ([0-9.]+) MB", capsys.readouterr().out).group(1))
    assert was == pytest.approx(own / 1e6, abs=0.051)


def test_the_chart_leaves_the_callers_matplotlib_alone(run, tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from bertzoo.compression.pipeline import tradeoff_chart

    backend = matplotlib.get_backend()
    matplotlib.use("svg")  # A notebook's backend stands in: switching it closes every open figure.
    try:
        mine = plt.figure()
        assert tradeoff_chart(run[1], tmp_path / "chart.png").read_bytes().startswith(PNG_HEADER)
        assert matplotlib.get_backend() == "svg"
        assert plt.fignum_exists(mine.number)
    finally:
        plt.close("all")
        matplotlib.use(backend)


def test_string_labels_take_the_ids_of_the_teachers_class_names(workspace, quick_reports):
    # A teacher whose names are not in sorted order: "pos" is id 0. Mapping
    # the file's labels by sorted order would invert them.
    teacher = bertzoo.BertClassifier.from_preset(workspace / "teacher")
    named = bertzoo.BertClassifier(teacher.backbone, num_classes=2, preprocessor=teacher.preprocessor)
    named.set_weights(teacher.get_weights())
    named.class_names = ["pos", "neg"]
    named.save_to_preset(workspace / "named_teacher")
    texts, labels = sentiment(24, seed=4)
    names = ["pos" if y == 0 else "neg" for y in labels]  # The teacher's own ids, as names.
    train = write_tsv(workspace / "named_train.tsv", texts, names)
    report = bertzoo.compress(
        workspace / "named_teacher", train, train, workspace / "named_out", stages=("int8",), verbose=0
    )
    assert report["classes"] == ["pos", "neg"]
    teacher_row = next(row for row in report["rows"] if row["stage"] == "teacher")
    expected = float(np.mean(np.argmax(named.predict(texts, verbose=0), axis=-1) == np.asarray(labels)))
    assert teacher_row["accuracy"] == pytest.approx(expected)
    write_tsv(workspace / "named_bad.tsv", texts[:2], ["pos", "meh"])
    with pytest.raises(ValueError, match=r"labels \['meh'\] are not among the teacher's class_names \['pos', 'neg'\]"):
        bertzoo.compress(workspace / "named_teacher", workspace / "named_bad.tsv", train, workspace / "bad_out")
    assert not (workspace / "bad_out").exists()


def test_cli_options_are_not_abbreviated(capsys):
    # `--teacher` once parsed as `--teacher-epochs` and failed with "invalid int value: 'teacher'".
    argv = ["compress", "--teacher", "teacher", "--train", "a.tsv", "--eval", "b.tsv", "--out", "out"]
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert "unrecognized arguments: --teacher" in capsys.readouterr().err


def test_a_structured_setting_left_out_follows_the_other():
    # Given one, the other kept everything: --heads-to-keep 1 kept all neurons.
    settings = pipeline._structured_settings
    assert settings(1, None, [2, 4], None, ["prune_structured"]) == ([1, 1], [0.5, 0.25])
    assert settings(None, 0.25, [2, 4], None, ["prune_structured"]) == ([1, 2], 0.25)
    assert settings(None, None, [2, 4], None, ["prune_structured"]) == ([1, 2], 0.5)
    assert settings(None, None, [4, 4], 4, ["prune_structured"]) == ([1, 1], 0.25)  # 1 / target_speedup.
    assert settings(None, None, [4, 4], 4, ["distill", "prune_structured"]) == ([2, 2], 0.5)  # The student's share.
    with pytest.raises(ValueError, match=r"`heads_to_keep` has 3 entries but the model has 2 layers.*--heads-to-keep"):
        settings([1, 1, 1], None, [2, 2], None, ["prune_structured"])
