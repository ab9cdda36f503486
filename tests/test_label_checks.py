"""Labels are checked before a raw-text `fit` or `evaluate` starts: class ids
outside the head's classes would otherwise turn the loss and every weight
into NaN under XLA, without an error."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.bert_question_answerer import context_positions
from bertzoo.models.head_utils import check_class_ids


@pytest.fixture(scope="module")
def classifier():
    keras.utils.set_random_seed(0)
    return bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)


def weights(model):
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize(
    "labels, message",
    [
        ([1, 5], r"Labels \[5\] are outside this model's 2 classes: ids run from 0 to 1"),
        ([-1, 0], r"Labels \[-1\] are outside"),
        ([1.0, 0.5], r"whole-number class ids; got \[0.5\]"),
        ([1.0, np.nan], r"whole-number class ids; got \[nan\]"),
    ],
)
def test_bad_class_ids_are_refused_before_any_step(classifier, labels, message):
    before = weights(classifier)
    with pytest.raises(ValueError, match=message):
        classifier.fit(["good", "bad"], labels, verbose=0)
    with pytest.raises(ValueError, match=message):
        classifier.evaluate(["good", "bad"], labels, verbose=0)
    for a, b in zip(before, weights(classifier)):
        np.testing.assert_array_equal(a, b)


def test_whole_number_ids_in_range_train(classifier):
    history = classifier.fit(["good", "bad"], np.array([1.0, 0.0]), verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_examples_and_labels_must_pair_up(classifier):
    with pytest.raises(ValueError, match="`x` has 3 examples but `y` has 2: give one per example"):
        classifier.fit(["a", "b", "c"], [1, 0], verbose=0)
    with pytest.raises(ValueError, match="`x` has 2 examples but `sample_weight` has 1"):
        classifier.fit(["a", "b"], [1, 0], sample_weight=[1.0], verbose=0)
    for shuffle in (True, False):
        with pytest.raises(ValueError, match="`x` holds no examples: `fit` needs at least one"):
            classifier.fit([], [], shuffle=shuffle, verbose=0)
    with pytest.raises(ValueError, match="`y` must hold one entry per example, got the single value 1"):
        classifier.fit("good", 1, verbose=0)
    with pytest.raises(ValueError, match=r"the two texts of each pair\) have different lengths \[2, 1\]"):
        classifier.fit((["a", "b"], ["c"]), [1, 0], verbose=0)


def test_a_one_class_head_may_regress_and_multi_hot_targets_pass():
    keras.utils.set_random_seed(0)
    regressor = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, num_classes=1, sequence_length=16)
    regressor.compile(optimizer="sgd", loss="mse", metrics=[], jit_compile=False)
    assert np.isfinite(regressor.fit(["a", "b"], [0.25, 3.5], verbose=0).history["loss"]).all()
    tagger_like = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, num_classes=3, activation="sigmoid", sequence_length=16
    )
    tagger_like.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[], jit_compile=False)
    multi_hot = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert np.isfinite(tagger_like.fit(["a", "b"], multi_hot, verbose=0).history["loss"]).all()


def test_the_tagger_takes_word_label_names_and_refuses_bad_ids():
    tagger = bertzoo.BertTokenClassifier.from_preset(
        "tiny", load_weights=False, num_classes=3, class_names=["O", "PER", "LOC"], sequence_length=16
    )
    sentence = [["Anna", "visited", "Oslo"]]
    by_name = tagger._raw_to_tensors(sentence, [["PER", "O", "LOC"]])[1]
    by_id = tagger._raw_to_tensors(sentence, [[1, 0, 2]])[1]
    # "" is no label, as -100 among ids (and as padding in a dataset's batches).
    unnamed = tagger._raw_to_tensors(sentence, [["PER", "", "LOC"]])[1]
    np.testing.assert_array_equal(unnamed, tagger._raw_to_tensors(sentence, [[1, -100, 2]])[1])
    np.testing.assert_array_equal(by_name, by_id)
    assert np.isfinite(tagger.fit(sentence, [["PER", "O", "LOC"]], verbose=0).history["loss"]).all()
    with pytest.raises(ValueError, match=r"Labels \[9\] are outside this model's 3 classes"):
        tagger.fit(sentence, [[1, 0, 9]], verbose=0)
    with pytest.raises(ValueError, match=r"whole-number class ids; got \[1.5\]"):  # Not rounded down to 1.
        tagger.fit(sentence, [[1.5, 0, 2]], verbose=0)
    with pytest.raises(ValueError, match=r"Word labels \['X'\] are not among the tagger's class_names"):
        tagger.fit(sentence, [["PER", "X", "O"]], verbose=0)
    nameless = bertzoo.BertTokenClassifier.from_preset("tiny", load_weights=False, num_classes=3, sequence_length=16)
    with pytest.raises(ValueError, match="this tagger has no `class_names`"):
        nameless.fit(sentence, [["PER", "O", "LOC"]], verbose=0)


def test_a_taggers_dataset_of_sentences_is_padded_named_and_checked():
    tagger = bertzoo.BertTokenClassifier.from_preset(
        "tiny", load_weights=False, num_classes=3, class_names=["O", "PER", "LOC"], sequence_length=16
    )
    tagger.compile(jit_compile=False)
    sentences = [["Anna", "visited", "Oslo"], ["Olaf", "left"]]

    def one_sentence_each(labels):
        return tf.data.Dataset.from_generator(
            lambda: zip(sentences, labels),
            output_signature=(
                tf.TensorSpec([None], tf.string),
                tf.TensorSpec([None], tf.string if isinstance(labels[0][0], str) else tf.int32),
            ),
        )

    # Unbatched sentences of different lengths are padded into batches; the
    # padded words and labels get no weight: the same step as in-memory lists.
    weights = {}
    for name, data in (
        ("names", one_sentence_each([["PER", "O", "LOC"], ["PER", "O"]])),
        ("ids", one_sentence_each([[1, 0, 2], [1, 0]])),
        ("lists", None),
    ):
        keras.utils.set_random_seed(0)
        model = bertzoo.BertTokenClassifier.from_config(tagger.get_config())
        model.set_weights(tagger.get_weights())
        model.compile(optimizer="sgd", jit_compile=False)
        if data is None:
            model.fit(sentences, [[1, 0, 2], [1, 0]], batch_size=2, shuffle=False, verbose=0)
        else:
            model.fit(data, batch_size=2, verbose=0)
        weights[name] = model.get_weights()
    for name in ("names", "ids"):
        for a, b in zip(weights[name], weights["lists"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"batch are outside this model.{1,2}s 3 classes(.|\n)*7"):
        tagger.fit(one_sentence_each([[1, 0, 7], [1, 0]]), verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Word labels in this tf.data batch are not among"):
        tagger.fit(one_sentence_each([["PER", "X", "LOC"], ["PER", "O"]]), verbose=0)
    texts = tf.data.Dataset.from_tensor_slices((["Anna visited Oslo"], [[1, 0, 2]]))
    with pytest.raises(ValueError, match=r"A tagger's tf.data.Dataset gives words(.|\n)*tf.strings.split"):
        tagger.fit(texts, verbose=0)
    # A sentence with a label too few or too many: refused as in memory, alone or padded next to a longer one
    # (which silently dropped a label, or left a word without one).
    for labels in ([[1, 0], [1, 0]], [[1, 0, 2], [1, 0, 0]]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"needs one of the labels(.|\n)*\] \[(3 2|2 3)\]"):
            tagger.evaluate(one_sentence_each(labels), verbose=0)
    padded = tf.constant([["Anna", "visited", "Oslo"], ["Olaf", "left", ""]])
    batched = tf.data.Dataset.from_tensor_slices((padded, tf.constant([[1, 0], [1, 0]]))).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"needs one of the labels(.|\n)*\[2 3 2 2\]"):
        tagger.evaluate(batched, verbose=0)
    # Labels whose rank is not the words': refused before anything runs, with what to do.
    sentences_batched = texts.batch(1)  # Whole sentences, one label list each.
    with pytest.raises(ValueError, match=r"labels of the words' shape, got words of shape \(None,\)(.|\n)*split"):
        tagger.evaluate(sentences_batched, verbose=0)
    one_per_sentence = tf.data.Dataset.from_tensor_slices((padded, tf.constant([1, 0]))).batch(2)
    with pytest.raises(ValueError, match=r"labels of shape \(None,\). A label per sentence is a classifier's"):
        tagger.evaluate(one_per_sentence, verbose=0)
    weights = tf.data.Dataset.from_tensor_slices((padded, tf.constant([[1, 0, 2], [1, 0, -100]]), tf.ones([2, 3, 1])))
    with pytest.raises(ValueError, match=r"one per word \(the words' shape\) or one per sentence"):
        tagger.evaluate(weights.batch(2), verbose=0)


def test_tokenized_answer_labels_must_point_where_an_answer_can_be():
    qa = bertzoo.BertQuestionAnswerer.from_preset("tiny", load_weights=False, sequence_length=32)
    qa.compile(jit_compile=False)
    features = {k: np.asarray(v) for k, v in qa.preprocessor((["who?"], ["anna went home"])).items()}
    context = np.flatnonzero(np.asarray(context_positions(features["padding_mask"], features["segment_ids"]))[0])
    padding = int(np.flatnonzero(features["padding_mask"][0] == 0)[0])
    assert np.isfinite(qa.fit(features, np.array([[context[0], context[-1]]]), verbose=0).history["loss"]).all()
    assert np.isfinite(qa.fit(features, np.array([[0, 0]]), verbose=0).history["loss"]).all()  # No answer.
    for start, end in ((context[0], padding), (1, context[0])):  # Padding; the question.
        with pytest.raises(ValueError, match=r"Answer labels of examples \[0\] .*point at positions the model masks"):
            qa.fit(features, np.array([[start, end]]), verbose=0)
    unmasked = bertzoo.BertQuestionAnswerer.from_preset(
        "tiny", load_weights=False, sequence_length=32, mask_question=False
    )
    unmasked.compile(jit_compile=False)
    assert np.isfinite(unmasked.fit(features, np.array([[1, context[0]]]), verbose=0).history["loss"]).all()
    with pytest.raises(ValueError, match=r"each of start and end must be a real token \(not padding\)"):
        unmasked.fit(features, np.array([[1, padding]]), verbose=0)


def test_multiple_choice_answers_must_be_one_of_the_choices():
    model = bertzoo.BertMultipleChoice.from_preset("tiny", load_weights=False, num_choices=2, sequence_length=16)
    with pytest.raises(ValueError, match=r"Labels \[2\] are outside this model's 2 choices"):
        model.fit((["q"], [["a", "b"]]), [2], verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices(((["q"], [["a", "b"]]), [2])).batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"batch are outside this model.{1,2}s 2 choices"):
        model.fit(dataset, verbose=0)


def test_check_class_ids_by_hand():
    check_class_ids([0, 1, 2], 3)
    check_class_ids([0, -100, 2], 3, ignore=-100)  # Unlabelled tokens.
    check_class_ids(["pos", "neg"], 2)  # Not numbers: the name mapping checks those.
    check_class_ids([], 2)
    with pytest.raises(ValueError, match=r"Labels \[-100\] are outside"):
        check_class_ids([0, -100], 3)
    with pytest.raises(ValueError, match=r"Labels \[3, 7\]"):
        check_class_ids(np.array([[0, 3], [7, 3]]), 3)


def test_a_fit_without_labels_says_how_to_learn_from_unlabelled_texts(classifier):
    message = "BertClassifier.fit got no labels: pass `y`(.|\\n)*`Pruner.fit\\(texts, teacher=...\\)`"
    with pytest.raises(ValueError, match=message):
        classifier.fit(["good", "bad"], verbose=0)
    with pytest.raises(ValueError, match="BertClassifier.evaluate got no labels"):
        classifier.evaluate(["good", "bad"], verbose=0)
    pruned = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, sequence_length=16)
    pruner = bertzoo.Pruner(pruned, bertzoo.PolynomialDecay(0.0, 0.5, begin_step=0, end_step=2))
    with pytest.raises(ValueError, match=message):
        pruner.fit(["good", "bad"], verbose=0)
    # The masked LM makes its own labels.
    model = bertzoo.BertPretrainer.from_preset("tiny", load_weights=False, sentence_objective=None, sequence_length=16)
    assert np.isfinite(model.fit(["the cat sat", "a dog ran"], verbose=0).history["loss"]).all()


def test_a_later_fit_may_give_its_labels_as_a_column(classifier):
    # Keras retraces the step for a new label rank with one of unknown rank,
    # which its loss cannot take: one label per example is always flat.
    classifier.fit(["good", "bad"], np.array([1, 0]), verbose=0)
    history = classifier.fit(["good", "bad"], np.array([[1], [0]]), verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert classifier.label_ids(np.array([[1], [0]])).shape == (2,)
    named = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, class_names=["neg", "pos"])
    np.testing.assert_array_equal(named.label_ids(np.array([["pos"], ["neg"]])), [1, 0])


def test_a_datasets_bad_labels_stop_fit_at_their_batch(classifier):
    good = tf.data.Dataset.from_tensor_slices((["good", "bad"], [1, 0])).batch(2)
    assert np.isfinite(classifier.fit(good, verbose=0).history["loss"]).all()
    before = weights(classifier)
    bad = tf.data.Dataset.from_tensor_slices((["good", "bad"], [1, 5])).batch(2)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"batch are outside this model.{1,2}s 2 classes(.|\n)*\[5\]"
    ):
        classifier.fit(bad, verbose=0)
    for a, b in zip(before, weights(classifier)):
        np.testing.assert_array_equal(a, b)
    fractional = tf.data.Dataset.from_tensor_slices((["good", "bad"], [1.0, 0.5])).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"whole-number class ids(.|\n)*0\.5"):
        classifier.evaluate(fractional, verbose=0)


def test_pretraining_pair_labels_are_checked_in_memory_and_in_datasets():
    model = bertzoo.BertPretrainer.from_preset("tiny", load_weights=False, sentence_objective="nsp", sequence_length=16)
    model.compile(jit_compile=False)
    pairs = (["the cat sat", "a dog ran"], ["on the mat", "in the park"])
    before = weights(model)
    with pytest.raises(ValueError, match=r"Labels \[2\] are outside this model's 2 sentence-pair classes"):
        model.fit(pairs, [1, 2], verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((pairs, [1, -1])).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"batch are outside(.|\n)*\[-1\]"):
        model.fit(dataset, verbose=0)
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(model.fit(pairs, [1, 0], verbose=0).history["loss"]).all()


def test_labels_of_tokenized_inputs_are_checked_too(classifier):
    features = classifier.preprocessor(["good", "bad"])
    with pytest.raises(ValueError, match=r"Labels \[3\] are outside this model's 2 classes"):
        classifier.fit(features, np.array([3, 0]), verbose=0)
    with pytest.raises(ValueError, match=r"Labels of shape \(2, 2\) look one-hot(.|\n)*labels.argmax\(-1\)"):
        classifier.fit(features, np.eye(2), verbose=0)
    qa = bertzoo.BertQuestionAnswerer.from_preset("tiny", load_weights=False, sequence_length=16)
    tokens = qa.preprocessor((["who?"], ["anna went home"]))
    with pytest.raises(ValueError, match=r"\(start, end\) token positions in \[0, 16\)"):
        qa.fit(tokens, np.array([[4, 16]]), verbose=0)
    tagger = bertzoo.BertTokenClassifier.from_preset("tiny", load_weights=False, num_classes=3, sequence_length=16)
    token_labels = np.full((1, 16), -100)
    token_labels[0, 1] = 7
    with pytest.raises(ValueError, match=r"Labels \[7\] are outside this model's 3 classes"):
        tagger.fit(tagger.preprocessor(["anna"]), token_labels, verbose=0)


def test_a_datasets_string_labels_take_the_ids_of_the_class_names():
    named = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, class_names=["neg", "pos"], sequence_length=16
    )
    named.compile(jit_compile=False)
    texts = ["good", "bad", "fine", "awful"]
    by_name = tf.data.Dataset.from_tensor_slices((texts, ["pos", "neg", "pos", "neg"])).batch(2)
    by_id = tf.data.Dataset.from_tensor_slices((texts, [1, 0, 1, 0])).batch(2)
    np.testing.assert_allclose(named.evaluate(by_name, verbose=0), named.evaluate(by_id, verbose=0), rtol=1e-6)
    unknown = tf.data.Dataset.from_tensor_slices((texts, ["pos", "meh", "pos", "neg"])).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"not among the classifier.{1,2}s class_names"):
        named.evaluate(unknown, verbose=0)


def test_multiple_choice_labels_are_indices_not_answer_texts():
    model = bertzoo.BertMultipleChoice.from_preset("tiny", load_weights=False, num_choices=2, sequence_length=16)
    with pytest.raises(ValueError, match=r"index of the right choice \(0 to 1\), got \['red'\]"):
        model.fit((["sky?"], [["red", "blue"]]), ["red"], verbose=0)


def test_answer_spans_in_a_dataset_must_lie_inside_their_context():
    qa = bertzoo.BertQuestionAnswerer.from_preset("tiny", load_weights=False, sequence_length=16)
    qa.compile(jit_compile=False)  # XLA compiles are tested elsewhere.
    dataset = tf.data.Dataset.from_tensor_slices(((["who?"], ["anna went home"]), [[-3, 2]])).batch(1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"0 <= start < end <= len\(context\)(.|\n)*-3 2"):
        qa.fit(dataset, verbose=0)
    fine = tf.data.Dataset.from_tensor_slices(((["who?"], ["anna went home"]), [[0, 4]])).batch(1)
    assert np.isfinite(qa.fit(fine, verbose=0).history["loss"]).all()


@pytest.mark.parametrize(
    "num_classes, activation, loss, metric",
    [
        (2, None, "SparseCategoricalCrossentropy", "SparseCategoricalAccuracy"),
        (3, "softmax", "SparseCategoricalCrossentropy", "SparseCategoricalAccuracy"),
        (3, tf.nn.softmax, "SparseCategoricalCrossentropy", "SparseCategoricalAccuracy"),
        (3, "tanh", "SparseCategoricalCrossentropy", "SparseCategoricalAccuracy"),
        (3, "sigmoid", "BinaryCrossentropy", "BinaryAccuracy"),
        (1, "sigmoid", "BinaryCrossentropy", "BinaryAccuracy"),
        (1, None, "MeanSquaredError", "MeanAbsoluteError"),
        (1, "tanh", "MeanSquaredError", "MeanAbsoluteError"),
    ],
)
def test_the_default_loss_follows_the_head(num_classes, activation, loss, metric):
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, num_classes=num_classes, activation=activation, sequence_length=16
    )
    assert type(model.default_loss()).__name__ == loss
    assert [type(m).__name__ for m in model.default_metrics()] == [metric]
    if loss == "SparseCategoricalCrossentropy":
        assert model.default_loss().get_config()["from_logits"] == (activation in (None, "tanh"))
        model.compile(optimizer="sgd", jit_compile=False)
        assert np.isfinite(model.fit(["a", "b"], [2 % num_classes, 0], verbose=0).history["loss"]).all()


def test_a_sigmoid_head_of_several_classes_takes_multi_hot_rows():
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, num_classes=3, activation="sigmoid", sequence_length=16
    )
    model.compile(jit_compile=False)
    with pytest.raises(ValueError, match=r"0/1 rows of shape \(n, 3\) \(multi-hot\), got shape \(2,\)"):
        model.fit(["a", "b"], [2, 0], verbose=0)
    assert np.isfinite(model.fit(["a", "b"], np.eye(3)[[2, 0]], verbose=0).history["loss"]).all()
    binary = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, num_classes=1, activation="sigmoid", sequence_length=16
    )
    binary.compile(jit_compile=False)
    assert np.isfinite(binary.fit(["a", "b"], [1, 0], verbose=0).history["loss"]).all()


def test_labels_in_a_mapping_like_array_are_still_checked(classifier):
    class Series(np.ndarray):  # pandas.Series has .keys() too.
        def keys(self):
            return range(len(self))

    with pytest.raises(ValueError, match=r"Labels \[5\] are outside"):
        classifier.fit(["good", "bad"], np.array([1, 5]).view(Series), verbose=0)


def test_soft_targets_under_a_loss_of_your_own_are_not_checked_as_ids():
    tagger = bertzoo.BertTokenClassifier.from_preset("tiny", load_weights=False, num_classes=3, sequence_length=16)
    tagger.compile(
        optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True), metrics=[], jit_compile=False
    )
    features = tagger.preprocessor(["anna went home"])
    soft = np.full((1, 16, 3), 1 / 3, "float32")
    assert np.isfinite(tagger.fit(features, soft, verbose=0).history["loss"]).all()


def test_a_regression_head_learns_its_targets_by_default():
    keras.utils.set_random_seed(0)
    model = bertzoo.BertClassifier.from_preset("tiny", load_weights=False, num_classes=1, sequence_length=16)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False)
    history = model.fit(["good", "bad"] * 8, [0.9, 0.1] * 8, epochs=5, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert losses[0] > 0.0 and losses[-1] < losses[0]


def test_class_names_given_twice_are_refused():
    # A repeated name would map to one id in memory and another in tf.data.
    from bertzoo.models.head_utils import check_classes

    with pytest.raises(ValueError, match=r"`class_names` names \['neg'\] more than once"):
        check_classes(3, ["neg", "pos", "neg"])
    backbone = bertzoo.BertBackbone(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32)
    with pytest.raises(ValueError, match="more than once"):
        bertzoo.BertClassifier(backbone, class_names=["a", "b", "a"])
    with pytest.raises(ValueError, match="more than once"):
        bertzoo.BertTokenClassifier(backbone, 3, class_names=["O", "B-PER", "O"])


def test_two_segment_inputs_on_a_one_segment_backbone_are_refused_by_name():
    from bertzoo.text import BertPreprocessor
    from bertzoo.text import BertTokenizer

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "who", "paris"]
    preprocessor = BertPreprocessor(BertTokenizer(vocabulary), sequence_length=8)
    single = bertzoo.BertBackbone(
        vocabulary_size=len(vocabulary), num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32, num_segments=1
    )
    classifier = bertzoo.BertClassifier(single, 2, preprocessor=preprocessor)
    assert classifier.predict(["good"], verbose=0).shape == (1, 2)  # Single texts are fine.
    with pytest.raises(ValueError, match=r"Sentence pairs are packed as two segments .* num_segments=1"):
        classifier.predict((["good"], ["bad"]), verbose=0)
    with pytest.raises(ValueError, match="A question and its context are packed as two segments"):
        bertzoo.BertQuestionAnswerer(single, preprocessor=preprocessor)
    with pytest.raises(ValueError, match="A context and each choice are packed as two segments"):
        bertzoo.BertMultipleChoice(single, 2, preprocessor=preprocessor)
    with pytest.raises(ValueError, match="sentence_objective='nsp'"):
        bertzoo.BertPretrainer(single, preprocessor)
    assert bertzoo.BertPretrainer(single, preprocessor, sentence_objective=None).sentence_head is None


def test_one_hot_labels_in_a_dataset_get_the_in_memory_message(classifier):
    # Keras said "Argument 'output' must have rank (ndim) 'target.ndim - 1'".
    dataset = tf.data.Dataset.from_tensor_slices((["good", "bad"], np.eye(2, dtype="float32"))).batch(2)
    with pytest.raises(ValueError, match=r"^Labels of shape \(None, 2\) look one-hot(.|\n)*tf.argmax\(y, -1\)"):
        classifier.fit(dataset, verbose=0)


def test_class_weight_may_be_keyed_by_class_name():
    model = bertzoo.BertClassifier.from_preset(
        "tiny", load_weights=False, sequence_length=16, class_names=["neg", "pos"]
    )
    model.compile(optimizer="sgd", jit_compile=False)
    texts, labels = ["dull", "awful"], ["neg", "neg"]
    # Every example is "neg": weighted 0 the loss is 0, weighted 1 it is not.
    assert model.fit(texts, labels, class_weight={"neg": 0.0, "pos": 1.0}, verbose=0).history["loss"] == [0.0]
    assert model.fit(texts, labels, class_weight={b"neg": 1.0, "pos": 0.0}, verbose=0).history["loss"][0] > 0.1
    with pytest.raises(ValueError, match=r"Class_weight keys \['neutral'\] are not among the classifier's class_names"):
        model.fit(texts, labels, class_weight={"neutral": 1.0, "pos": 1.0}, verbose=0)
    with pytest.raises(ValueError, match=r"keys must all be class ids or all class names"):
        model.fit(texts, labels, class_weight={"neg": 1.0, 1: 1.0}, verbose=0)


def test_empty_inputs_evaluate_nothing_and_an_empty_dataset_predicts_nothing(classifier):
    with pytest.raises(ValueError, match="`x` holds no examples: `evaluate` needs at least one"):
        classifier.evaluate([], [], verbose=0)  # Keras returned [] with a warning.
    empty = tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string)).batch(2)
    assert classifier.predict(empty, verbose=0).shape == (0, 2)  # Keras: UnboundLocalError.
    labelled = tf.data.Dataset.from_tensor_slices((tf.constant([], tf.string), tf.constant([], tf.int32)))
    with pytest.raises(ValueError, match="`x` holds no examples: `fit` needs at least one"):
        classifier.fit(labelled.batch(2), verbose=0)
