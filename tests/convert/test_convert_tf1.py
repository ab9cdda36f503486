"""Original TF1 BERT / ALBERT checkpoints -> bertzoo presets, against NumPy."""

import re
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
    # BERT's "gelu" is the exact (erf) GELU: Google's code computed it so when the released checkpoints were
    # trained, and Hugging Face loads them with it (this test pinned the tanh form before, which only ALBERT's
    # code uses: test_tf1_bert_and_albert_gelu_match_the_huggingface_reader).
    assert (backbone.activation, backbone.num_layers, backbone.embedding_dim) == ("gelu_exact", 3, None)
    assert any("exact (erf) GELU" in note for note in result.notes)
    inputs = make_bert_inputs(batch=3, length=11, vocabulary_size=40, lengths=[11, 7, 2])
    diff = ref.max_difference(backbone, model, inputs, "gelu_exact")
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


def cased_vocabulary(size):
    # [CLS] and the like are uppercase in every vocabulary: only ordinary tokens say whether it is cased.
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return specials + [f"Tok{i}" if i % 3 == 0 else f"tok{i}" for i in range(size - len(specials))]


@pytest.mark.parametrize(
    "directory, cased, lowercase, note",
    [
        # A cased checkpoint in a renamed directory: the vocabulary decides, and the summary says so.
        ("uncased_L-1_H-16_A-2", True, False, r"vocab\.txt has uppercase tokens.*says uncased"),
        ("my_bert", True, False, None),
        # The vocabulary cannot tell (no uppercase ordinary token): the directory name decides.
        ("my_bert", False, True, r"lowercase=True assumed"),
        ("cased_L-1_H-16_A-2", False, False, r"from the directory name.*no uppercase tokens"),
        ("uncased_L-1_H-16_A-2", False, True, None),
    ],
)
def test_tf1_casing_comes_from_the_vocabulary_before_the_directory_name(
    ref, rng, tmp_path, directory, cased, lowercase, note
):
    model = ref.random_model(rng, num_layers=1)
    vocabulary = cased_vocabulary(40) if cased else ref.tiny_vocabulary(40)
    source = ref.write_tf1(
        tmp_path / directory,
        ref.tf1_config(model),
        ref.tf1_arrays(model, heads=False, optimizer_slots=False),
        vocabulary=vocabulary,
    )
    read = read_checkpoint(source)
    assert read.preprocessor["lowercase"] is lowercase
    casing_notes = [n for n in read.notes if "lowercase" in n]
    if note is None:
        assert casing_notes == []
    else:
        assert len(casing_notes) == 1 and re.search(note, casing_notes[0])


def test_tf1_bert_and_albert_gelu_match_the_huggingface_reader(ref, rng, make_bert_inputs, tmp_path):
    # One BERT checkpoint gives the same model through either reader: Hugging Face's "gelu" is the exact GELU.
    model = ref.random_model(rng, num_layers=2)
    tf1 = ref.write_tf1(tmp_path / "tf1", ref.tf1_config(model), ref.tf1_arrays(model, optimizer_slots=False))
    hf = ref.write_hf(tmp_path / "hf", ref.hf_config(model), ref.hf_bert_arrays(model))
    assert read_checkpoint(tf1).config["activation"] == read_checkpoint(hf).config["activation"] == "gelu_exact"
    inputs = make_bert_inputs(batch=2, length=9, vocabulary_size=40, lengths=[9, 4])
    outputs = [
        bertzoo.BertBackbone.from_preset(bertzoo.convert_checkpoint(source, tmp_path / f"{source.name}_preset").path)(
            inputs
        )["sequence_output"]
        for source in (tf1, hf)
    ]
    np.testing.assert_allclose(np.asarray(outputs[0]), np.asarray(outputs[1]), atol=1e-6)
    # ALBERT's code computes "gelu" with tanh, Hugging Face's ALBERT configs say "gelu_new": the same.
    albert = ref.random_model(rng, num_layers=2, num_sets=1, embedding=8)
    albert_tf1 = ref.write_tf1(
        tmp_path / "albert",
        ref.tf1_config(albert, albert=True),
        ref.tf1_arrays(albert, albert=True, optimizer_slots=False),
        config_name="albert_config.json",
    )
    read = read_checkpoint(albert_tf1)
    assert read.config["activation"] == "gelu_tanh"
    assert not any("GELU" in note for note in read.notes)


@pytest.mark.parametrize("hidden_act, activation", [("GELU", "gelu_exact"), ("Relu", "relu"), ("TANH", "tanh")])
def test_tf1_hidden_act_is_read_case_insensitively(ref, rng, tmp_path, hidden_act, activation):
    # As google-research/bert's get_activation, which lowercases the name.
    model = ref.random_model(rng, num_layers=1)
    source = ref.write_tf1(
        tmp_path / "tf1",
        ref.tf1_config(model, hidden_act=hidden_act),
        ref.tf1_arrays(model, heads=False, optimizer_slots=False),
    )
    assert read_checkpoint(source).config["activation"] == activation


@pytest.mark.parametrize("albert, segments", [(False, 16), (True, 2)], ids=["bert", "albert"])
def test_tf1_type_vocab_size_defaults_to_each_code_base(ref, rng, tmp_path, albert, segments):
    # BertConfig's default type_vocab_size is 16, AlbertConfig's 2.
    model = ref.random_model(rng, num_layers=1, segments=segments, num_sets=1, embedding=8 if albert else None)
    config = ref.tf1_config(model, albert=albert)
    del config["type_vocab_size"]
    source = ref.write_tf1(
        tmp_path / "tf1",
        config,
        ref.tf1_arrays(model, albert=albert, heads=False, optimizer_slots=False),
        config_name="albert_config.json" if albert else "bert_config.json",
    )
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    assert result.config["num_segments"] == segments


def test_tf1_albert_grouping_that_float_rounding_moves_is_refused(ref, rng, tmp_path):
    # Google's ALBERT runs layer i through group int(i / L * G): with L = G = 22, layer 15 through group 14, not 15.
    model = ref.random_model(rng, num_layers=1, num_sets=1, embedding=8)
    source = ref.write_tf1(
        tmp_path / "albert",
        ref.tf1_config(model, albert=True, num_hidden_layers=22, num_hidden_groups=22),
        ref.tf1_arrays(model, albert=True, heads=False, optimizer_slots=False),
        config_name="albert_config.json",
    )
    with pytest.raises(
        ConversionError,
        match=r"num_hidden_layers=22 and num_hidden_groups=22, Google's ALBERT code assigns layer 15 to group "
        r"int\(15 / 22 \* 22\) = 14(.|\n)*grouping is not supported",
    ):
        read_checkpoint(source)


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
