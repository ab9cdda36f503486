"""The forms raw text may take in `fit`, `evaluate` and `predict`: one
pair of strings, datasets of pairs, a held-out share for validation."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.raw_inputs import split_for_validation


@pytest.fixture(scope="module")
def classifier():
    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    model.compile(jit_compile=False)
    return model


def test_two_strings_are_one_pair_not_two_lists_of_characters(classifier):
    one = classifier.predict(("good", "fine"), verbose=0)
    assert one.shape == (1, 2)
    np.testing.assert_allclose(one, classifier.predict((["good"], ["fine"]), verbose=0), atol=1e-6)
    with pytest.raises(ValueError, match="`x` has 1 examples but `y` has 2"):
        classifier.fit(("good", "fine"), [1, 0], verbose=0)


def test_predict_refuses_a_dataset_of_two_string_tensors_it_would_read_as_labels(classifier):
    first, second = ["good", "bad"], ["fine", "awful"]
    flat = tf.data.Dataset.from_tensor_slices((first, second)).batch(2)
    with pytest.raises(ValueError, match=r"read as \(texts, labels\)(.|\n)*dataset.map\(lambda a, b: \(\(a, b\),\)\)"):
        classifier.predict(flat, verbose=0)
    nested = flat.map(lambda a, b: ((a, b),))
    np.testing.assert_allclose(
        classifier.predict(nested, verbose=0), classifier.predict((first, second), verbose=0), atol=1e-6
    )
    labelled = tf.data.Dataset.from_tensor_slices((first, [1, 7])).batch(2)  # Labels are ignored, not checked.
    np.testing.assert_allclose(classifier.predict(labelled, verbose=0), classifier.predict(first, verbose=0), atol=1e-6)


def test_predict_without_inputs_says_so(classifier):
    with pytest.raises(ValueError, match=r"predict got no inputs \(x=None\)"):
        classifier.predict(None)


def test_validation_split_holds_out_the_last_examples_of_raw_text(classifier):
    texts = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
    labels = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    history = classifier.fit(texts, labels, validation_split=0.25, epochs=1, verbose=0)
    expected = classifier.evaluate(texts[6:], labels[6:], verbose=0, return_dict=True)
    assert history.history["val_loss"][0] == pytest.approx(expected["loss"], rel=1e-5)
    pairs = (texts, texts[::-1])
    assert "val_loss" in classifier.fit(pairs, labels, validation_split=0.5, verbose=0).history
    with pytest.raises(ValueError, match="validation_split=0.6 of 2 examples leaves no training examples"):
        classifier.fit(texts[:2], labels[:2], validation_split=0.6, verbose=0)


def test_split_for_validation_by_hand():
    x, y, weights, validation = split_for_validation(["a", "b", "c", "d"], [0, 1, 0, 1], None, 0.25)
    assert (x, y, weights) == (["a", "b", "c"], [0, 1, 0], None)
    assert validation == (["d"], [1])
    x, y, weights, validation = split_for_validation((["a", "b"], ["c", "d"]), np.array([0, 1]), [1.0, 2.0], 0.5)
    assert x == (["a"], ["c"]) and validation[0] == (["b"], ["d"]) and validation[2] == [2.0]
    with pytest.raises(ValueError, match=r"must be a fraction in \(0, 1\), got 1.5"):
        split_for_validation(["a", "b"], [0, 1], None, 1.5)


def test_trainers_refuse_an_empty_fit_clearly(classifier):
    student = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    distiller = bertzoo.Distiller(classifier, student)
    with pytest.raises(ValueError, match="`x` holds no examples: `fit` needs at least one"):
        distiller.fit([], verbose=0)


def test_validation_split_of_tokenized_inputs_works_under_resumable_training(classifier, tmp_path):
    features = {k: np.asarray(v) for k, v in classifier.preprocessor(["good", "bad", "fine", "awful"]).items()}
    resumable = bertzoo.ResumableTraining(tmp_path / "state")
    history = classifier.fit(features, np.array([1, 0, 1, 0]), validation_split=0.5, callbacks=[resumable], verbose=0)
    assert "val_loss" in history.history
