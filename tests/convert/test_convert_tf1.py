"""Original TF1 BERT / ALBERT checkpoints -> bertzoo presets, against NumPy."""

import numpy as np

import bertzoo
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
