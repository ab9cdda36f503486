"""The forms raw text may take in `fit`, `evaluate` and `predict`: one
pair of strings, datasets of pairs, a held-out share for validation."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.raw_inputs import split_for_validation
from bertzoo.models.raw_inputs import validation_parts


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


class CountValidationBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_test_batch_end(self, batch, logs=None):
        self.batches += 1


def validation_batches(model, *args, **kwargs):
    counter = CountValidationBatches()
    callbacks = kwargs.pop("callbacks", []) + [counter]
    model.fit(*args, epochs=1, verbose=0, callbacks=callbacks, **kwargs)
    return counter.batches


def test_raw_validation_data_is_batched_as_keras_batches_it(classifier, tmp_path):
    # Raw validation data went in batches of 32 whatever `batch_size` or `validation_batch_size` said.
    texts = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
    labels = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    validation = (texts, labels)
    assert validation_batches(classifier, texts, labels, batch_size=4, validation_data=validation) == 2
    assert (
        validation_batches(classifier, texts, labels, batch_size=4, validation_batch_size=2, validation_data=validation)
        == 4
    )
    # A held-out share is batched the same way (4 of 8 examples, in batches of 1).
    assert validation_batches(classifier, texts, labels, validation_split=0.5, validation_batch_size=1) == 4
    resumable = bertzoo.ResumableTraining(tmp_path / "state")
    assert (
        validation_batches(classifier, texts, labels, batch_size=4, validation_data=validation, callbacks=[resumable])
        == 2
    )


def test_validation_data_may_be_a_list_as_in_keras(classifier):
    texts, labels = ["good", "bad", "fine", "awful"], np.array([1, 0, 1, 0])
    history = classifier.fit(texts, labels, validation_data=[texts, labels], verbose=0)
    expected = classifier.evaluate(texts, labels, verbose=0, return_dict=True)
    assert history.history["val_loss"][0] == pytest.approx(expected["loss"], rel=1e-5)
    with pytest.raises(ValueError, match=r"`validation_data` must be \(x, y\) or \(x, y, sample_weight\), got a tuple"):
        classifier.fit(texts, labels, validation_data=(texts, labels, None, None), verbose=0)


def test_bytes_are_one_text_like_str(classifier):
    one = classifier.predict(["good"], verbose=0)
    # A scalar string tensor's `numpy()` is bytes, a 0-d array has no length: both crashed.
    for text in (b"good", tf.constant("good"), np.array("good"), np.array(b"good")):
        np.testing.assert_allclose(classifier.predict(text, verbose=0), one, atol=1e-6)
    np.testing.assert_allclose(
        classifier.predict((b"good", b"fine"), verbose=0), classifier.predict(("good", "fine"), verbose=0), atol=1e-6
    )


def test_fit_on_a_dataset_without_labels_says_so(classifier):
    # Keras failed deep in the loss: "None values not supported".
    texts = ["good", "bad", "fine", "awful"]
    for unlabelled in (
        tf.data.Dataset.from_tensor_slices(texts).batch(2),
        tf.data.Dataset.from_tensor_slices((texts,)).batch(2),
    ):
        with pytest.raises(ValueError, match=r"BertClassifier.fit got no labels: pass `y` \(or a tf.data.Dataset"):
            classifier.fit(unlabelled, verbose=0)
        with pytest.raises(ValueError, match=r"BertClassifier.evaluate got no labels"):
            classifier.evaluate(unlabelled, verbose=0)
    labelled = tf.data.Dataset.from_tensor_slices((texts, [1, 0, 1, 0])).batch(2)
    assert "loss" in classifier.fit(labelled, verbose=0).history


def test_validation_split_of_a_string_tensor(classifier):
    # Keras got the tf.data stream made of the tensor and refused "a _PrefetchDataset".
    texts = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull"]
    labels = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    history = classifier.fit(tf.constant(texts), tf.constant(labels), validation_split=0.25, verbose=0)
    expected = classifier.evaluate(texts[6:], labels[6:], verbose=0, return_dict=True)
    assert history.history["val_loss"][0] == pytest.approx(expected["loss"], rel=1e-5)
    with pytest.raises(
        ValueError, match=r"`validation_split` cannot split raw text given as str(.|\n)*validation_data="
    ):
        classifier.fit("good", [1], validation_split=0.5, verbose=0)


def test_an_empty_string_tensor_holds_no_examples(classifier):
    # Keras ended in an UnboundLocalError.
    empty = tf.constant([], tf.string)
    assert classifier.predict(empty, verbose=0).shape == (0, 2)
    with pytest.raises(ValueError, match="`x` holds no examples: `fit` needs at least one"):
        classifier.fit(empty, np.zeros((0,), "int32"), verbose=0)


@pytest.mark.parametrize(
    "texts, shown",
    [
        (np.array(["a fine film", np.nan, "dull"], dtype=object), "entry 1 is nan (float)"),
        (["a fine film", "dull", None], "entry 2 is None (NoneType)"),
        ((["a fine film", "dull", "ok"], ["yes", None, "no"]), "entry 1 is None (NoneType)"),
    ],
)
def test_missing_text_is_named_with_its_index_and_the_fix(classifier, texts, shown):
    for run in (lambda: classifier.fit(texts, [1, 0, 1], verbose=0), lambda: classifier.predict(texts, verbose=0)):
        with pytest.raises(ValueError, match=rf"text input expects strings, but {re.escape(shown)}.*fillna"):
            run()
    with pytest.raises(ValueError, match=r"entry 1 is nan \(float\).*fillna"):
        classifier.preprocessor(np.array(["a", np.nan], dtype=object))


def test_a_text_column_as_an_object_array_trains(classifier):
    texts = np.array(["a fine film", "dull"], dtype=object)  # pandas' `df["text"].values`.
    classifier.fit(texts, [1, 0], verbose=0)
    np.testing.assert_allclose(
        classifier.predict(texts, verbose=0), classifier.predict(["a fine film", "dull"], verbose=0), atol=1e-6
    )


def test_a_tuple_that_is_not_a_pair_is_named(classifier):
    with pytest.raises(
        ValueError, match=r"sentence pairs as a tuple of two lists .*got a tuple of 3\. Pass single texts"
    ):
        classifier.fit(("a", "b", "c"), [0, 1, 1], verbose=0)
    assert classifier.predict((["a film", "dull"],), verbose=0).shape == (2, 2)  # `(texts,)` is the texts.


def _examples_for(task_name):
    """A task built small, and (x, y, sample_weight) of five raw examples it
    trains on: one long enough that its batch keeps more columns than the
    others (trimmed in steps of 16)."""
    build = dict(load_weights=False, sequence_length=48)
    long = " ".join(["word"] * 20)
    if task_name == "classifier_pairs":
        model = bertzoo.BertClassifier.from_preset("tiny", **build)
        x = (["good film", "bad", "fine", long, "great"], ["yes", "no", "so so", "no", "yes indeed"])
        return model, x, [1, 0, 1, 0, 1], [1.0, 0.5, 1.0, 2.0, 1.0]
    if task_name == "tagger":
        model = bertzoo.BertTokenClassifier.from_preset("tiny", num_classes=3, **build)
        words = [["Anna", "went", "home"], ["Oslo"], ["a", "b", "c", "d"], long.split(), ["Olaf", "left", "Bergen"]]
        return model, words, [[1, 0, 0], [2], [0, 0, 0, 0], [0] * 20, [1, 0, 2]], None
    if task_name == "question_answerer":
        model = bertzoo.BertQuestionAnswerer.from_preset("tiny", **build)
        contexts = ["anna went home", "olaf left", "it rained all day", long, "bergen is wet"]
        x = (["who went?", "who left?", "what?", "why?", "where?"], contexts)
        return model, x, [[0, 4], [0, 4], [3, 9], [-1, -1], [0, 6]], None
    model = bertzoo.BertMultipleChoice.from_preset("tiny", num_choices=2, **build)
    contexts = ["the cat", "a dog", "rain", long, "snow"]
    choices = [["sat", "flew"], ["barked", "sang"], ["falls", "rises"], ["shines", "barks"], ["melts", "talks"]]
    return model, (contexts, choices), [0, 0, 0, 1, 0], None


@pytest.mark.parametrize("task_name", ["classifier_pairs", "tagger", "question_answerer", "multiple_choice"])
def test_short_inputs_are_tokenized_once_into_the_batches_a_stream_makes(task_name, monkeypatch):
    # Up to EAGER_PREPROCESS_LIMIT examples, `fit`/`evaluate` tokenize all of
    # them in one eager call, not in a tf.data map traced per dataset and
    # instantiated per epoch: the batches must be the ones the map makes.
    import bertzoo.models.task as task_lib
    from bertzoo.models.resumable import EpochOrder

    model, x, y, sample_weight = _examples_for(task_name)
    calls = []
    preprocess = model.preprocess

    def spy(*args, **kwargs):
        calls.append((tf.executing_eagerly(), int(tf.nest.flatten(args[0])[0].shape[0] or 0)))
        return preprocess(*args, **kwargs)

    monkeypatch.setattr(model, "preprocess", spy)

    def batches(order=False, labelled=True):
        keras.utils.set_random_seed(7)  # The same shuffle for both.
        data = model._as_dataset(x, *((y, sample_weight) if labelled else ()), batch_size=2, shuffle=order)
        return [tf.nest.map_structure(np.asarray, b) for b in data]

    def ways():
        resumed = EpochOrder(seed=3, shuffle=True, first=0, last=2, skip=1)
        return batches(), batches(True), batches(labelled=False), batches(resumed), _fingerprint_of(model, x, y)

    eager = ways()
    assert calls == [(True, 5)] * 5, "five examples should be tokenized once per dataset, eagerly"
    calls.clear()
    monkeypatch.setattr(task_lib, "EAGER_PREPROCESS_LIMIT", 4)  # Five examples: over the limit, streamed.
    streamed = ways()
    assert calls and not any(eagerly for eagerly, _ in calls)
    # Where the task trims columns, batch by batch (in steps of 16): the long
    # text's batch keeps more than another. Taggers and answerers keep all 48.
    widths = [b[0]["token_ids"].shape[-1] for b in eager[0]]
    assert min(widths) < widths[1] if model.trims_padding else widths == [48] * 3
    assert len(eager[3]) == 5
    tf.nest.map_structure(np.testing.assert_array_equal, eager, streamed)
    # A subclass's own `preprocess` is mapped batch by batch unless marked deterministic.
    monkeypatch.setattr(task_lib, "EAGER_PREPROCESS_LIMIT", 4096)
    calls.clear()

    class OwnPreprocess(type(model)):
        def preprocess(self, *args, **kwargs):
            return super().preprocess(*args, **kwargs)

    monkeypatch.setattr(model, "__class__", OwnPreprocess)
    assert len(batches()) == 3
    assert calls and not any(eagerly for eagerly, _ in calls)


def _fingerprint_of(model, x, y):
    """`ResumableTraining`'s fingerprint of the data: the raw examples'
    either way, so a checkpoint resumes across the two."""
    from bertzoo.models.resumable import EpochOrder

    order = EpochOrder(seed=0, shuffle=False, first=0, last=1)
    model._as_dataset(x, y, None, 2, shuffle=order)
    return order.fingerprint


@pytest.mark.parametrize("task_name", ["classifier_pairs", "tagger", "question_answerer", "multiple_choice"])
def test_string_tensors_read_as_the_lists_they_hold(task_name):
    # A tuple of string tensors (pairs, questions and contexts, contexts and
    # choices) or a tagger's tensor of sentences was read with list(): scalar
    # tensors, refused as "not a string" or "Scalar tensor has no len()".
    model, x, y, sample_weight = _examples_for(task_name)
    if task_name == "tagger":
        x = [" ".join(words) for words in x]  # One string per sentence, split on whitespace.
    tensors = tuple(tf.constant(part) for part in x) if isinstance(x, tuple) else tf.constant(x)

    def batches(inputs):
        keras.utils.set_random_seed(7)
        return [tf.nest.map_structure(np.asarray, b) for b in model._as_dataset(inputs, y, sample_weight, 2)]

    tf.nest.map_structure(np.testing.assert_array_equal, batches(tensors), batches(x))
    tf.nest.map_structure(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
        model.predict(tensors, verbose=0),
        model.predict(x, verbose=0),
    )
    if task_name == "tagger":
        assert model.predict_words(tensors) == model.predict_words(x)
    if task_name == "question_answerer":
        assert model.predict_spans(*tensors) == model.predict_spans(*x)


def test_validation_data_as_a_list_is_x_and_labels_unless_it_is_a_list_of_texts():
    texts, labels = ["good film", "bad film"], [1, 0]
    assert validation_parts([texts, labels]) == (texts, labels)  # As Keras reads a list.
    assert validation_parts((texts, labels, [1.0, 2.0])) == (texts, labels, [1.0, 2.0])
    # Two (or three) texts are texts: they were read as x="good film", y="bad film".
    assert validation_parts(texts) == (texts,)
    assert validation_parts(["a", "b", "c"]) == (["a", "b", "c"],)


def test_python_generators_and_py_datasets_of_features_train_and_of_raw_text_are_refused(word_classifier):
    # Both read `x.shape` of the generator ("'generator' object has no attribute 'shape'").
    model = word_classifier(["good", "bad", "film"], sequence_length=8)
    model.compile(optimizer="sgd", jit_compile=False)
    texts, labels = ["good film", "bad film"], np.array([1, 0])
    features = {k: np.asarray(v) for k, v in model.preprocessor(texts).items()}
    batches = []

    def tokenized():
        for _ in range(3):
            batches.append(1)
            yield features, labels

    class Raw(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return texts, labels

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(batch)

    steps = []
    history = model.fit(tokenized(), epochs=1, verbose=0, callbacks=[Steps()]).history
    assert steps == [0, 1, 2] and np.isfinite(history["loss"][0])  # The batch read to tell is trained on too.
    with pytest.raises(ValueError, match=r"fit \(validation_data\) got a generator of raw text"):
        model.fit(tokenized(), validation_data=(b for b in [(texts, labels)]), verbose=0)
    with pytest.raises(ValueError, match="ResumableTraining counts, orders and skips batches"):
        model.fit(tokenized(), verbose=0, callbacks=[bertzoo.ResumableTraining("never_written")])
    for method in ("fit", "evaluate", "predict"):
        for stream, kind in (((b for b in [(texts, labels)]), "generator"), (Raw(), "Raw")):
            with pytest.raises(ValueError, match=rf"\.{method} got a {kind} of raw text(.|\n)*from_generator"):
                getattr(model, method)(stream, verbose=0)


def test_validation_texts_without_labels_are_refused_before_training(word_classifier):
    # A list of texts is texts (above): a labelled task refuses it before its first epoch, not after.
    model = word_classifier(["good", "bad", "film"], sequence_length=8)
    model.compile(optimizer="sgd", jit_compile=False)
    before = [w.copy() for w in model.get_weights()]
    for validation in (["good film", "bad film"], (["good film", "bad film"],)):
        with pytest.raises(ValueError, match=r"fit got `validation_data` without labels: pass validation_data=\(texts"):
            model.fit(["good film", "bad film"], [1, 0], validation_data=validation, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
