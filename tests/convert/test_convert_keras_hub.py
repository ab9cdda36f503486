"""bertzoo <-> keras-hub BertBackbone / AlbertBackbone, both directions."""

import keras_hub
import numpy as np
import pytest

import bertzoo
from bertzoo.convert import to_keras_hub
from bertzoo.saving.preset import Preset

TINY = dict(vocabulary_size=40, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32, max_sequence_length=16)


def randomize(backbone, seed=0):
    """Non-trivial weights everywhere (initial LayerNorms and biases are 1s and 0s)."""
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        variable.assign(rng.normal(0, 0.3, variable.shape).astype(variable.dtype))
    return backbone


def max_output_difference(a, b, inputs):
    out_a, out_b = a(inputs), b(inputs)
    return max(
        float(np.abs(np.asarray(out_a[k]) - np.asarray(out_b[k])).max()) for k in ("sequence_output", "pooled_output")
    )


@pytest.mark.parametrize(
    "extra, keras_hub_class",
    [({}, "BertBackbone"), ({"embedding_dim": 8, "num_groups": 1}, "AlbertBackbone")],
)
def test_round_trip_through_keras_hub(make_bert_inputs, tmp_path, extra, keras_hub_class):
    ours = randomize(bertzoo.BertBackbone(**TINY, activation="gelu_tanh", **extra))
    theirs = to_keras_hub(ours)
    assert type(theirs).__name__ == keras_hub_class
    inputs = make_bert_inputs(batch=2, length=9, vocabulary_size=40, lengths=[9, 4])
    forward = max_output_difference(ours, theirs, inputs)

    result = bertzoo.convert_checkpoint(theirs, tmp_path / "back")
    back = bertzoo.BertBackbone.from_preset(result.path)
    backward = max_output_difference(ours, back, inputs)
    print(f"{keras_hub_class}: bertzoo -> keras-hub {forward:.2e}, keras-hub -> bertzoo {backward:.2e}")
    assert forward < 1e-5 and backward < 1e-5
    for a, b in zip(ours.weights, back.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert Preset.resolve(result.path).metadata["source"] == {
        "format": "keras_hub",
        "path": None,
        "converted": Preset.resolve(result.path).metadata["source"]["converted"],
    }


def test_keras_hub_preset_directory_with_its_vocabulary(make_bert_inputs, tmp_path):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    kh = randomize(
        keras_hub.models.BertBackbone(
            vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16
        )
    )
    kh.save_to_preset(str(tmp_path / "kh"))
    keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True).save_to_preset(str(tmp_path / "kh"))
    result = bertzoo.convert_checkpoint(tmp_path / "kh", tmp_path / "preset")
    preset = Preset.resolve(result.path)
    assert preset.vocabulary() == vocabulary and preset.metadata["source"]["format"] == "keras_hub"
    inputs = make_bert_inputs(batch=2, length=8, vocabulary_size=40, lengths=[8, 3])
    assert max_output_difference(kh, bertzoo.BertBackbone.from_preset(result.path), inputs) < 1e-5


@pytest.mark.parametrize("as_directory", [False, True])
def test_a_keras_hub_task_converts_its_encoder_and_says_the_head_is_left(make_bert_inputs, tmp_path, as_directory):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    kh = randomize(keras_hub.models.BertBackbone(**TINY))
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=12)
    task = keras_hub.models.BertTextClassifier(kh, num_classes=2, preprocessor=preprocessor)
    source = task
    if as_directory:
        task.save_to_preset(str(tmp_path / "kh"))
        source = tmp_path / "kh"
    result = bertzoo.convert_checkpoint(source, tmp_path / "preset")
    preset = Preset.resolve(result.path)
    notes = preset.metadata["conversion"]["notes"]
    assert any("keras-hub BertTextClassifier head is not converted" in note for note in notes), notes
    assert preset.build_preprocessor().sequence_length == 12  # The keras-hub preprocessor's length.
    inputs = make_bert_inputs(batch=2, length=8, vocabulary_size=40, lengths=[8, 3])
    assert max_output_difference(kh, bertzoo.BertBackbone.from_preset(result.path), inputs) < 1e-5


def test_keras_hub_albert_preset_carries_its_sentencepiece_tokenizer(ref, tmp_path):
    albert = keras_hub.models.AlbertBackbone(
        vocabulary_size=40, num_layers=2, num_heads=2, embedding_dim=8, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=16,
    )  # fmt: skip
    albert.save_to_preset(str(tmp_path / "kh"))
    theirs = keras_hub.tokenizers.AlbertTokenizer(proto=ref.sentencepiece_model(40))
    theirs.save_to_preset(str(tmp_path / "kh"))

    result = bertzoo.convert_checkpoint(tmp_path / "kh", tmp_path / "preset")
    classifier = bertzoo.BertClassifier.from_preset(result.path, num_classes=2)  # Raw text in.
    ours = classifier.preprocessor.tokenizer
    texts = ["The quick fox runs.", "A lazy DOG sat over the mat", "blue sky"]

    def as_lists(ids):
        return [[int(i) for i in row] for row in (ids.to_list() if hasattr(ids, "to_list") else ids)]

    assert as_lists(ours(texts)) == as_lists(theirs(texts))
    assert len(as_lists(ours(texts))[1]) > 5  # Several pieces: the ids were compared, not empty rows.
    assert np.asarray(classifier.predict(texts, verbose=0)).shape == (3, 2)


@pytest.mark.parametrize(
    "config, match",
    [
        ({"activation": "gelu_exact"}, r"activation='gelu_exact'.*allow_gelu_approximation=True"),
        ({"activation": "relu"}, r"activation='relu'"),
        ({"layer_norm_epsilon": 1e-6}, r"layer_norm_epsilon=1e-06"),
        ({"num_heads": [2, 1]}, r"per-layer num_heads=\[2, 1\]"),
        ({"num_groups": 1, "shared_sublayers": "attention", "embedding_dim": 8}, r"shared_sublayers='attention'"),
        ({"num_groups": 1}, r"shared layers without factorized embeddings"),
        ({"head_dim": 4}, r"head_dim=4 x num_heads=2 != hidden_dim=16"),
    ],
)
def test_to_keras_hub_refuses_what_keras_hub_cannot_express(config, match):
    backbone = bertzoo.BertBackbone(**{**TINY, "activation": "gelu_tanh", **config})
    with pytest.raises(ValueError, match=match):
        to_keras_hub(backbone)


def test_to_keras_hub_can_approximate_the_exact_gelu(make_bert_inputs):
    ours = randomize(bertzoo.BertBackbone(**TINY, activation="gelu_exact"))
    with pytest.warns(UserWarning, match="tanh approximation"):
        theirs = to_keras_hub(ours, allow_gelu_approximation=True)
    inputs = make_bert_inputs(batch=1, length=6, vocabulary_size=40)
    assert 0 < max_output_difference(ours, theirs, inputs) < 0.1
