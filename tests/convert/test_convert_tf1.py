"""Original TF1 BERT / ALBERT checkpoints -> bertzoo presets, against NumPy."""

import shutil

import numpy as np
import pytest

import bertzoo
from bertzoo.convert import ConversionError
from bertzoo.convert import read_checkpoint
from bertzoo.saving.preset import Preset


def test_tf1_bert_matches_numpy_and_keeps_the_pretraining_heads(ref, rng, make_bert_inputs, tmp_path):
    model = ref.random_model(rng, num_layers=3, segments=2)
    vocabulary = ref.tiny_vocabulary(40)
    source = ref.write_tf1(
        tmp_path / "uncased_L-3_H-16_A-2", ref.tf1_config(model), ref.tf1_arrays(model), vocabulary=vocabulary
    )
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    # Google's TF1 "gelu" is the tanh approximation.
    assert (backbone.activation, backbone.num_layers, backbone.embedding_dim) == ("gelu_tanh", 3, None)
    inputs = make_bert_inputs(batch=3, length=11, vocabulary_size=40, lengths=[11, 7, 2])
    diff = ref.max_difference(backbone, model, inputs, "gelu_tanh")
    print(f"TF1 BERT vs NumPy max abs diff: {diff:.2e}")
    assert diff < 1e-5

    preset = Preset.resolve(result.path)
    assert preset.vocabulary() == vocabulary
    preprocessor = preset.build_preprocessor()
    assert (preprocessor.sequence_length, preprocessor.tokenizer.lowercase) == (16, True)
    assert preset.metadata["source"]["format"] == "tf1"
    heads = preset.load_arrays()
    assert sorted(heads) == sorted(
        [
            "mlm/transform/kernel",
            "mlm/transform/bias",
            "mlm/layer_norm/gamma",
            "mlm/layer_norm/beta",
            "mlm/output_bias",
            "nsp/kernel",
            "nsp/bias",
        ]
    )
    np.testing.assert_array_equal(heads["nsp/kernel"], model["heads"]["nsp"][0])  # [H, 2]
    np.testing.assert_array_equal(heads["mlm/layer_norm/gamma"], model["heads"]["transform_norm"][0])
    assert preset.metadata["conversion"]["pretraining_heads"]["nsp/kernel"] == "cls/seq_relationship/output_weights"
    # Optimizer slots are skipped, and the summary says so.
    (skipped,) = result.skipped
    assert "optimizer variables" in skipped and "optimizer variables" in str(result)


def test_tf1_albert_matches_numpy(ref, rng, make_bert_inputs, tmp_path):
    # ALBERT-base layout in miniature: one group shared by all 3 layers, E=8 < H=16.
    model = ref.random_model(rng, num_layers=3, num_sets=1, embedding=8)
    source = ref.write_tf1(
        tmp_path / "albert_tiny",
        ref.tf1_config(model, albert=True),
        ref.tf1_arrays(model, albert=True),
        config_name="albert_config.json",
        prefix="model.ckpt-best",
    )
    (source / "30k-clean.model").write_bytes(ref.sentencepiece_model(40))
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    backbone = bertzoo.BertBackbone.from_preset(result.path)
    assert (backbone.num_layers, backbone.num_groups, backbone.embedding_dim) == (3, 1, 8)
    assert len(backbone.attention_blocks) == 1 and len(backbone.feedforward_blocks) == 1
    inputs = make_bert_inputs(batch=2, length=12, vocabulary_size=40, lengths=[12, 5])
    diff = ref.max_difference(backbone, model, inputs, "gelu_tanh")
    print(f"TF1 ALBERT vs NumPy max abs diff: {diff:.2e}")
    assert diff < 1e-5
    heads = Preset.resolve(result.path).load_arrays()
    assert heads["mlm/transform/kernel"].shape == (16, 8)
    assert result.has_vocabulary  # ALBERT's SentencePiece model travels with the preset.
    classifier = bertzoo.BertClassifier.from_preset(result.path)
    assert isinstance(classifier.preprocessor.tokenizer, bertzoo.text.SentencePieceTokenizer)
    assert classifier.preprocessor.tokenizer.lowercase is True  # Google's ALBERT is uncased.
    assert classifier.predict(["The quick brown fox"], verbose=0).shape == (1, 2)


def test_tf1_cased_directory_keeps_case(ref, rng, tmp_path):
    model = ref.random_model(rng, num_layers=1)
    source = ref.write_tf1(
        tmp_path / "cased_L-1_H-16_A-2",
        ref.tf1_config(model),
        ref.tf1_arrays(model, heads=False, optimizer_slots=False),
        vocabulary=ref.tiny_vocabulary(40),
    )
    assert read_checkpoint(source).preprocessor["lowercase"] is False


# --- A `checkpoint` file naming the prefix (TF's Saver writes an absolute path) --


def saved_with_saver(ref, model, directory):
    """A TF1 BERT directory whose `checkpoint` file names its prefix by absolute path, as a Saver writes it."""
    source = ref.write_tf1(directory, ref.tf1_config(model), ref.tf1_arrays(model, heads=False, optimizer_slots=False))
    prefix = source.resolve() / "bert_model.ckpt"
    (source / "checkpoint").write_text(f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
    return source


def test_tf1_copied_directory_converts_its_own_checkpoint(ref, rng, tmp_path):
    first = ref.random_model(rng, num_layers=1)
    original = saved_with_saver(ref, first, tmp_path / "original")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    # The copy's weights then change (same names); its `checkpoint` file still names the original.
    second = ref.random_model(rng, num_layers=1)
    ref.write_tf1(copy, ref.tf1_config(second), ref.tf1_arrays(second, heads=False, optimizer_slots=False))
    assert str(original.resolve()) in (copy / "checkpoint").read_text()

    model = read_checkpoint(copy)
    np.testing.assert_array_equal(model.tensors["bert/embeddings/word_embeddings"], second["word"])
    assert model.path == str(copy.resolve())
    # The original still reads its own.
    np.testing.assert_array_equal(read_checkpoint(original).tensors["bert/embeddings/word_embeddings"], first["word"])


def test_tf1_copy_without_its_checkpoint_files_is_refused(ref, rng, tmp_path):
    original = saved_with_saver(ref, ref.random_model(rng, num_layers=1), tmp_path / "original")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    for file in copy.glob("bert_model.ckpt.*"):
        file.unlink()
    with pytest.raises(ConversionError) as error:
        read_checkpoint(copy)
    message = str(error.value)
    # Both paths, and what to do.
    assert (
        f"{copy / 'checkpoint'} names the checkpoint {original.resolve() / 'bert_model.ckpt'}, outside {copy}"
        in message
    )
    assert f"{copy} has no bert_model.ckpt.index of its own" in message
    assert "Checkpoints in" in message and ": none." in message
    assert "Put the checkpoint's .index and .data-* files in" in message and "correct or delete" in message


def test_tf1_checkpoint_file_naming_a_missing_prefix_is_refused(ref, rng, tmp_path):
    source = saved_with_saver(ref, ref.random_model(rng, num_layers=1), tmp_path / "tf1")
    (source / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-500"\n')
    with pytest.raises(
        ConversionError,
        match=r"names the checkpoint .*model\.ckpt-500, but .*model\.ckpt-500\.index does not exist\. "
        r"Checkpoints in .*: bert_model\.ckpt\.index\.",
    ):
        read_checkpoint(source)


def test_tf1_unreadable_checkpoint_file_is_refused(ref, rng, tmp_path):
    source = saved_with_saver(ref, ref.random_model(rng, num_layers=1), tmp_path / "tf1")
    (source / "checkpoint").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(
        ConversionError, match=r"tf1/checkpoint is not a TF checkpoint state file .*Correct it, or delete it"
    ):
        read_checkpoint(source)


@pytest.mark.parametrize("damage", ["index", "data"])
def test_tf1_damaged_checkpoint_names_its_files(ref, rng, tmp_path, damage):
    source = saved_with_saver(ref, ref.random_model(rng, num_layers=1), tmp_path / "tf1")
    if damage == "index":
        (source / "bert_model.ckpt.index").write_bytes(b"garbage" * 10)
        found = r"bert_model\.ckpt\.index, bert_model\.ckpt\.data-00000-of-00001\): not an sstable"
    else:
        (source / "bert_model.ckpt.data-00000-of-00001").unlink()
        found = r"bert_model\.ckpt\.index, no \.data-\* shard\)"
    with pytest.raises(
        ConversionError,
        match=rf"Cannot read the TF checkpoint .*tf1/bert_model\.ckpt \({found}(.|\n)*damaged or incomplete",
    ):
        bertzoo.convert_checkpoint(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
