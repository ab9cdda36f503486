"""BertMultipleChoice: pairing contexts with choices, logits, loss, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

COLOURS = ["red", "blue", "green", "black"]
THINGS = ["car", "house", "boat", "door"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "is", "it", "was", "painted", "."] + COLOURS + THINGS


def tiny_model(num_choices=3, sequence_length=12):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        max_sequence_length=32,
    )
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=sequence_length)
    return bertzoo.BertMultipleChoice(backbone, num_choices, preprocessor)


CONTEXTS = ["the car is red .", "it was painted blue"]
CHOICES = [["the car is red", "the car is blue", "the boat is red"], ["it is blue", "it is green", "red"]]


def test_each_context_is_paired_with_each_choice():
    model = tiny_model()
    x, _ = model._raw_to_tensors((CONTEXTS, CHOICES), None)
    features = model.preprocess(x)  # The tf.data step, run eagerly.
    assert features["token_ids"].shape == (2, 3, 12)
    for b, context in enumerate(CONTEXTS):
        for c, choice in enumerate(CHOICES[b]):
            pair = model.preprocessor((tf.constant([context]), tf.constant([choice])))
            for key in ("token_ids", "segment_ids", "padding_mask"):
                np.testing.assert_array_equal(features[key][b, c], pair[key][0])


def test_logits_and_loss_against_numpy():
    model = tiny_model()
    model.compile(jit_compile=False)
    x, _ = model._raw_to_tensors((CONTEXTS, CHOICES), None)
    features = {k: np.asarray(v) for k, v in model.preprocess(x).items()}
    logits = np.asarray(model(features, training=False))
    assert logits.shape == (2, 3)
    kernel = np.asarray(model.output_dense.kernel, "float64")
    bias = np.asarray(model.output_dense.bias, "float64")
    expected = np.zeros((2, 3))
    for c in range(3):  # Each choice on its own through the backbone.
        pooled = model.backbone({k: v[:, c] for k, v in features.items()})["pooled_output"]
        expected[:, c] = (np.asarray(pooled, "float64") @ kernel + bias)[:, 0]
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    labels = np.array([0, 2])
    z = expected - expected.max(1, keepdims=True)
    nll = np.log(np.exp(z).sum(1)) - z[np.arange(2), labels]
    loss = model.compute_loss(x=features, y=labels, y_pred=model(features, training=False))
    assert float(loss) == pytest.approx(nll.mean(), rel=1e-5)


def synthetic_choices(n, seed):
    """The right choice names a colour, the two others a thing; their order is random."""
    rng = np.random.default_rng(seed)
    contexts, choices, labels = [], [], []
    for _ in range(n):
        colour, thing = rng.choice(COLOURS), rng.choice(THINGS)
        others = [t for t in THINGS if t != thing]
        options = [f"the {thing} is {colour}"] + [f"the {thing} is {t}" for t in rng.choice(others, 2, replace=False)]
        order = rng.permutation(3)
        contexts.append(f"it was painted {colour} .")
        choices.append([options[i] for i in order])
        labels.append(int(np.flatnonzero(order == 0)[0]))
    return (contexts, choices), np.array(labels)


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    model = tiny_model()
    model.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=False)
    x, labels = synthetic_choices(96, seed=0)
    history = model.fit(x, labels, batch_size=16, epochs=4, verbose=0).history
    return model, history


def test_training_lowers_the_loss(trained):
    _, history = trained
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["accuracy"][-1] > 0.9


def test_preset_round_trip(trained, tmp_path):
    model, _ = trained
    model.save_to_preset(tmp_path / "mc")
    again = bertzoo.BertMultipleChoice.from_preset(tmp_path / "mc")
    assert again.num_choices == 3
    x, _ = model._raw_to_tensors((CONTEXTS, CHOICES), None)
    features = {k: np.asarray(v) for k, v in model.preprocess(x).items()}
    np.testing.assert_array_equal(again(features, training=False), model(features, training=False))


def test_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="Example 1 has 2 choices"):
        model.predict((CONTEXTS, [CHOICES[0], ["a", "b"]]), verbose=0)
    with pytest.raises(ValueError, match=r"Example 0 has a choice that is not a string: None \(NoneType\)"):
        model.predict((CONTEXTS, [["the car is red", None, "red"], CHOICES[1]]), verbose=0)
    with pytest.raises(ValueError, match="2 contexts but 1 choice lists"):
        model.predict((CONTEXTS, CHOICES[:1]), verbose=0)
    with pytest.raises(ValueError, match="tuple \\(contexts, choices\\)"):
        model.predict(CONTEXTS, verbose=0)
    with pytest.raises(ValueError, match="num_choices"):
        tiny_model(num_choices=1)
    # A missing context reads as what is missing, with the fix (TensorFlow said "mixed types").
    for missing, shown in ((None, r"None \(NoneType\) \(missing text\? fill it"), (3, r"3 \(int\)\.")):
        with pytest.raises(ValueError, match=rf"BertMultipleChoice's contexts expects strings, but entry 1 is {shown}"):
            model.predict(([CONTEXTS[0], missing], CHOICES), verbose=0)


def test_one_example_is_a_context_and_its_list_of_choices():
    model = tiny_model()
    expected = model.predict(([CONTEXTS[0]], [CHOICES[0]]), verbose=0)
    np.testing.assert_array_equal(model.predict((CONTEXTS[0], CHOICES[0]), verbose=0), expected)
    with pytest.raises(ValueError, match=r"1 contexts but 2 choice lists: give one list of 3 choices per context"):
        model.predict((CONTEXTS[0], CHOICES), verbose=0)


def test_one_hot_labels_and_datasets_of_another_choice_count_are_refused_with_the_fix():
    model = tiny_model()
    model.compile(jit_compile=False)
    one_hot = np.eye(3, dtype="int32")[[0, 1]]
    fix = r"Labels of shape \((2|None), 3\) look one-hot.*one choice index per example: pass `labels.argmax\(-1\)`"
    with pytest.raises(ValueError, match=fix):  # 0/1 are valid indices: Keras failed on the rank.
        model.fit((CONTEXTS, CHOICES), one_hot, verbose=0)
    with pytest.raises(ValueError, match=fix):
        model.fit(tf.data.Dataset.from_tensor_slices(((CONTEXTS, CHOICES), one_hot)).batch(2), verbose=0)
    two = [choices[:2] for choices in CHOICES]
    wrong = r"have 2 choices each, but this model takes exactly num_choices=3"
    with pytest.raises(ValueError, match=wrong):  # Known from the dataset's shapes, before anything runs.
        model.fit(tf.data.Dataset.from_tensor_slices(((CONTEXTS, two), [0, 1])).batch(2), verbose=0)

    def examples():
        yield (CONTEXTS[0], CHOICES[0]), 0
        yield (CONTEXTS[1], two[1]), 1

    spec = ((tf.TensorSpec([], tf.string), tf.TensorSpec([None], tf.string)), tf.TensorSpec([], tf.int32))
    streamed = tf.data.Dataset.from_generator(examples, output_signature=spec).padded_batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"batch have the number of choices below(.|\n)*\[2\]"):
        model.fit(streamed, verbose=0)


def test_labels_are_checked_whatever_the_loss_and_a_column_of_labels_is_one_per_example():
    model = tiny_model()

    def own_loss(y, logits):  # The sparse cross-entropy, as a function: labels are still choice indices.
        return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)

    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=own_loss, jit_compile=False)
    with pytest.raises(ValueError, match=r"Labels \[3\] are outside"):  # Under XLA: NaN weights, no error.
        model.fit((CONTEXTS, CHOICES), [0, 3], verbose=0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)
    answers = tf.data.Dataset.from_tensor_slices(((CONTEXTS, CHOICES), ["the car is red", "it is blue"])).batch(2)
    with pytest.raises(ValueError, match=r"index of the right choice \(0 to 2\), got strings in a tf.data dataset"):
        model.fit(answers, verbose=0)
    with pytest.raises(ValueError, match=r"one sample weight per example \(shape \(n,\)\), got shape \(2, 3\)"):
        model.fit((CONTEXTS, CHOICES), [0, 1], sample_weight=np.ones((2, 3)), verbose=0)
    # (n, 1) labels come back as (n,): a later fit with (n,) labels failed ("unknown rank") in Keras's retrace.
    model.fit((CONTEXTS, CHOICES), np.array([[0], [1]]), verbose=0)
    model.fit((CONTEXTS, CHOICES), np.array([0, 1]), verbose=0)
    assert np.isfinite(model.evaluate((CONTEXTS, CHOICES), np.array([[0], [1]]), verbose=0)).all()

    def column_loss(y, logits):  # A loss of your own gets the labels as given.
        return own_loss(y[:, 0], logits)

    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=column_loss, metrics=[], jit_compile=False)
    assert np.isfinite(model.fit((CONTEXTS, CHOICES), np.array([[0], [1]]), verbose=0).history["loss"]).all()


def test_a_string_where_a_list_of_choices_belongs_is_refused_not_split_into_letters():
    model = tiny_model(num_choices=2)
    with pytest.raises(ValueError, match=r"Example 1's choices are one string, 'ok': give each example a list of 2"):
        model.predict((CONTEXTS, [["red", "blue"], "ok"]), verbose=0)
    with pytest.raises(ValueError, match=r"The choices are one string, 'no': give a list of 2 strings"):
        model.predict((CONTEXTS[0], "no"), verbose=0)


def test_one_context_as_a_scalar_tensor_array_or_bytes():
    model = tiny_model()
    expected = model.predict(([CONTEXTS[0]], [CHOICES[0]]), verbose=0)
    for context in (tf.constant(CONTEXTS[0]), np.array(CONTEXTS[0]), CONTEXTS[0].encode()):
        np.testing.assert_array_equal(model.predict((context, CHOICES[0]), verbose=0), expected)


def test_a_choice_that_is_not_utf8_is_the_one_named():
    model = tiny_model()
    choices = tf.constant([[b"red", b"\xff\xfe bad", b"blue"], [c.encode() for c in CHOICES[1]]])
    with pytest.raises(ValueError, match=r"Example 0 has a choice that is not UTF-8 text: b'\\xff\\xfe bad'"):
        model.predict((tf.constant(CONTEXTS), choices), verbose=0)
    utf8 = tf.constant([[c.encode() for c in row] for row in CHOICES])  # Decoded, as text.
    np.testing.assert_array_equal(
        model.predict((CONTEXTS, utf8), verbose=0), model.predict((CONTEXTS, CHOICES), verbose=0)
    )


def test_raw_text_in_a_batch_method_names_the_call_that_tokenizes_it():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"pass predict_on_batch model\.preprocess\(inputs\)"):
        model.predict_on_batch((CONTEXTS, CHOICES))
    np.testing.assert_allclose(  # The way it names.
        model.predict_on_batch(model.preprocess((CONTEXTS, CHOICES))),
        model.predict((CONTEXTS, CHOICES), verbose=0),
        atol=1e-6,
    )
