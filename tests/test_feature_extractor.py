"""FeatureExtractor: the BERT paper's feature-based approach as a frozen layer."""

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.models.feature_extractor import COMBINE_MODES
from bertzoo.models.feature_extractor import FeatureExtractor

NAMES = ("token_ids", "segment_ids", "padding_mask")


def tiny_backbone(num_layers=4, seed=0):
    keras.utils.set_random_seed(seed)
    return bertzoo.BertBackbone(
        vocabulary_size=40,
        num_layers=num_layers,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        max_sequence_length=12,
        dropout=0.0,
    )


def batch(n=6, length=10, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, 40, (n, length)).astype("int32"),
        "segment_ids": np.zeros((n, length), "int32"),
        "padding_mask": np.ones((n, length), "int32"),
    }


@pytest.mark.parametrize("combine", list(COMBINE_MODES))
def test_each_combination_matches_the_hidden_states(combine):
    backbone = tiny_backbone()
    x = batch()
    states = [keras.ops.convert_to_numpy(s) for s in backbone.compute_features(x)["hidden_states"]]
    extractor = FeatureExtractor(backbone, combine=combine)
    out = keras.ops.convert_to_numpy(extractor(x))
    expected = {
        "embeddings": states[0],
        "last_hidden": states[-1],
        "second_to_last_hidden": states[-2],
        "concat_last_four": np.concatenate(states[-4:], axis=-1),
        # Mixing weights start at zero: softmax gives the plain mean, scale 1.
        "weighted_sum_last_four": np.mean(states[-4:], axis=0),
        "weighted_sum_all": np.mean(states, axis=0),
    }[combine]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    trainable = [w.name for w in extractor.trainable_weights]
    assert trainable == (["layer_weights", "scale"] if combine.startswith("weighted") else [])


def test_weighted_sum_follows_the_mixing_weights():
    backbone = tiny_backbone()
    x = batch()
    states = [keras.ops.convert_to_numpy(s) for s in backbone.compute_features(x)["hidden_states"]]
    extractor = FeatureExtractor(backbone, combine="weighted_sum_last_four")
    extractor(x)
    extractor.layer_weights.assign([0.0, 0.0, 0.0, 50.0])  # All weight on the last layer.
    extractor.scale.assign(2.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(extractor(x)), 2 * states[-1], rtol=1e-4, atol=1e-4)


def test_a_bilstm_tagger_on_frozen_features_trains():
    backbone = tiny_backbone(seed=1)
    inputs = {name: keras.Input((None,), dtype="int32", name=name) for name in NAMES}
    features = FeatureExtractor(backbone, combine="weighted_sum_all")(inputs)
    hidden = keras.layers.Bidirectional(keras.layers.LSTM(16, return_sequences=True))(features)
    tagger = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    tagger.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    x = batch(n=64, seed=2)
    y = (x["token_ids"] >= 20).astype("int32")  # Tag: is the token in the upper half of the vocabulary?
    frozen = [w.copy() for w in backbone.get_weights()]
    history = tagger.fit(x, y, batch_size=16, epochs=15, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert history.history["accuracy"][-1] > 0.9
    for before, after in zip(frozen, backbone.get_weights()):
        np.testing.assert_array_equal(before, after)  # The backbone stayed frozen.


def test_config_round_trip_and_serialization():
    extractor = FeatureExtractor(tiny_backbone(), combine="second_to_last_hidden", name="features")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(extractor))
    assert isinstance(restored, FeatureExtractor) and restored.combine == "second_to_last_hidden"
    assert restored.backbone.num_layers == 4


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="Unknown `combine` 'sum_last_four'.*'weighted_sum_last_four'"):
        FeatureExtractor(tiny_backbone(), combine="sum_last_four")
    with pytest.raises(ValueError, match="at least 4 encoder layers.*has 2"):
        FeatureExtractor(tiny_backbone(num_layers=2), combine="concat_last_four")
    with pytest.raises(ValueError, match="must be a bertzoo BertBackbone"):
        FeatureExtractor(keras.layers.Dense(3))
