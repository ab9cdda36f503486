"""The `bertzoo` commands' refusals: a checkpoint given where a preset is
expected (export, quantize, sparsity), an output path no save could replace
(refused before the slow work), an output that appears while `quantize`
works, and options that do not apply; and `export --help` matching what
export does."""

import json
import os
import shutil

import numpy as np
import pytest

# tests/convert's writers of tiny checkpoints in each source layout (its conftest; tests/ is on sys.path).
from convert.conftest import hf_bert_arrays
from convert.conftest import hf_config
from convert.conftest import random_model
from convert.conftest import tf1_arrays
from convert.conftest import tf1_config
from convert.conftest import tiny_vocabulary
from convert.conftest import write_hf
from convert.conftest import write_tf1

import bertzoo
from bertzoo import cli
from bertzoo.convert import checkpoint
from bertzoo.saving.preset import Preset
from bertzoo.saving.preset import PresetError


def run(capsys, *argv):
    """`(exit status, stdout, stderr)` of `bertzoo ARGV`."""
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def float_preset(tmp_path_factory, word_classifier):
    """A float classifier preset of one layer, with a vocabulary."""
    path = tmp_path_factory.mktemp("float") / "classifier"
    word_classifier(["good", "bad", "film"], num_layers=1).save_to_preset(path)
    return path


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A tiny Hugging Face BERT checkpoint folder (config.json, model.safetensors, vocab.txt)."""
    model = random_model(np.random.default_rng(0), num_layers=1)
    directory = tmp_path_factory.mktemp("hf") / "bert"
    return write_hf(directory, hf_config(model), hf_bert_arrays(model), vocabulary=tiny_vocabulary(40))


def work_refused(*args, **kwargs):
    raise AssertionError("the slow work ran before the refusal")


# --- A checkpoint where a preset is expected: convert it first -------------------


@pytest.mark.parametrize("command", ["sparsity", "export", "quantize"])
def test_a_hugging_face_checkpoint_given_for_a_preset_names_the_conversion(command, hf_checkpoint, tmp_path, capsys):
    argv = [command, hf_checkpoint] + ([] if command == "sparsity" else [tmp_path / "out"])
    status, _, err = run(capsys, *argv)
    assert status == 1
    assert f"{hf_checkpoint} is a Hugging Face checkpoint, not a bertzoo preset" in err
    assert f"`bertzoo convert {hf_checkpoint} DEST`" in err and "bertzoo.convert_checkpoint(" in err
    assert "damaged" not in err
    assert not (tmp_path / "out").exists()


def test_the_named_conversion_gives_a_preset_and_python_says_the_same(hf_checkpoint, tmp_path, capsys):
    with pytest.raises(PresetError, match=r"is a Hugging Face checkpoint, not a bertzoo preset: convert it"):
        bertzoo.BertBackbone.from_preset(hf_checkpoint)
    assert run(capsys, "convert", hf_checkpoint, tmp_path / "preset")[0] == 0
    status, out, _ = run(capsys, "sparsity", tmp_path / "preset")
    assert status == 0 and "gzip" in out


def test_keras_hub_presets_and_tf1_checkpoints_name_the_conversion_too(tmp_path, capsys):
    model = random_model(np.random.default_rng(0), num_layers=1)
    tf1 = write_tf1(tmp_path / "tf1", tf1_config(model), tf1_arrays(model), vocabulary=tiny_vocabulary(40))
    status, _, err = run(capsys, "sparsity", tf1)
    assert status == 1 and "is an original TF1 checkpoint (bert_config.json), not a bertzoo preset" in err
    assert f"`bertzoo convert {tf1} DEST`" in err

    keras_hub = pytest.importorskip("keras_hub")
    tiny = dict(vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32)
    keras_hub.models.BertBackbone(**tiny, max_sequence_length=16).save_to_preset(str(tmp_path / "kh"))
    status, _, err = run(capsys, "quantize", tmp_path / "kh", tmp_path / "out")
    assert status == 1 and f"{tmp_path / 'kh'} is a keras-hub preset, not a bertzoo preset" in err
    assert "`bertzoo convert" in err and "damaged" not in err


def test_a_preset_missing_its_backbone_is_still_called_damaged(float_preset, tmp_path):
    shutil.copytree(float_preset, tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    del config["backbone"]
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PresetError, match=r"has no 'backbone' entry; the preset is damaged"):
        Preset.resolve(tmp_path / "p")


# --- Output paths ------------------------------------------------------------------


def test_quantize_refuses_an_output_that_appears_while_it_quantizes(float_preset, tmp_path, capsys, monkeypatch):
    out = tmp_path / "int8"
    real = cli.quantize

    def meanwhile(*args, **kwargs):
        quantized = real(*args, **kwargs)
        shutil.copytree(float_preset, out, dirs_exist_ok=True)  # Another run writes OUT in the meantime.
        return quantized

    monkeypatch.setattr(cli, "quantize", meanwhile)
    status, _, err = run(capsys, "quantize", float_preset, out)
    assert status == 1 and f"{out} already exists" in err and "--overwrite" in err
    assert (out / "config.json").read_text() == (float_preset / "config.json").read_text()  # The other run's.
    assert Preset.resolve(out).quantization is None
    assert sorted(os.listdir(tmp_path)) == ["int8"]  # No temporary directory left.
    # With --overwrite the quantized preset replaces it.
    assert run(capsys, "quantize", float_preset, out, "--overwrite")[0] == 0
    assert Preset.resolve(out).quantization["mode"] == "int8"


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(float_preset, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "save_preset", interrupted)  # Mid-save: a full traceback before.
    status, _, err = run(capsys, "quantize", float_preset, tmp_path / "int8")
    assert (status, err.strip()) == (130, "bertzoo quantize: interrupted")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["quantize", "convert"])
@pytest.mark.parametrize("target", ["file", "directory", "link"])
def test_an_output_no_save_could_replace_is_refused_before_the_work(
    command, target, float_preset, hf_checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(cli, "quantize", work_refused)
    monkeypatch.setattr(checkpoint, "read_checkpoint", work_refused)
    out = tmp_path / "out"
    if target == "file":
        out.write_text("notes")
        expected = "exists and is not a directory"
    elif target == "directory":
        out.mkdir()
        (out / "data.csv").write_text("keep me")
        expected = "is not a bertzoo preset"
    else:
        shutil.copytree(float_preset, tmp_path / "preset")
        out.symlink_to(tmp_path / "preset")
        expected = "is a symbolic link"
    source = float_preset if command == "quantize" else hf_checkpoint
    status, _, err = run(capsys, command, source, out, "--overwrite")
    assert status == 1 and expected in err
    if target == "file":
        assert out.read_text() == "notes"
    elif target == "directory":
        assert os.listdir(out) == ["data.csv"]
    else:
        assert out.is_symlink() and Preset.resolve(out).quantization is None


# --- Options ---------------------------------------------------------------------


def test_quantize_refuses_text_column_without_calibration(float_preset, tmp_path, capsys, monkeypatch):
    (tmp_path / "texts.tsv").write_text("id\treview\n1\tgood film\n2\tbad film\n")
    argv = ["quantize", float_preset, tmp_path / "smoothed", "--calibration", tmp_path / "texts.tsv"]
    assert run(capsys, *argv, "--text-column", "review")[0] == 0  # The column calibration reads.

    monkeypatch.setattr(cli, "quantize", work_refused)
    status, _, err = run(capsys, "quantize", float_preset, tmp_path / "q", "--text-column", "review")
    assert status == 1
    assert "--text-column names the text column of the --calibration file: pass --calibration FILE too" in err
    status, _, err = run(capsys, "quantize", float_preset, tmp_path / "q", "--weight-only", "--text-column", "review")
    assert status == 1 and "--weight-only quantizes no inputs" in err and "--text-column" in err
    assert not (tmp_path / "q").exists()


def test_export_help_says_what_sequence_length_does_per_format(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # No wrapping to match across.
    with pytest.raises(SystemExit) as exit:
        cli.main(["export", "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert "Export a task or backbone preset for serving" in text
    assert "task or backbone preset directory" in text
    assert "tf_saved_model: raw texts are packed to this many tokens" in text
    assert "refused for a preset without a vocabulary" in text
    assert "onnx/litert: fixes the token axis to this length (default: any length" in text
    assert "tokens per text (default: the preset's sequence_length)" not in text


def test_export_of_a_backbone_without_vocabulary_refuses_sequence_length(tmp_path, capsys):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=40, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16
    )
    backbone.save_to_preset(tmp_path / "backbone")
    status, _, err = run(capsys, "export", tmp_path / "backbone", tmp_path / "out", "--sequence-length", "8")
    assert status == 1 and "`sequence_length` sets how raw text is packed, but the model has no preprocessor" in err
    assert not (tmp_path / "out").exists()
