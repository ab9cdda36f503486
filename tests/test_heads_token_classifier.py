"""BertTokenClassifier and word-label alignment."""

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.head_utils import MaskedAccuracy
from bertzoo.models.raw_inputs import holds_text
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

SHARED_VOCAB = Path(__file__).resolve().parents[1] / ".." / "shared" / "models" / "all-MiniLM-L6-v2" / "vocab.txt"

PEOPLE = ["anna", "john", "maria", "olaf"]
PLACES = ["oslo", "paris", "reykjavik", "lima"]
FILLER = ["met", "in", "visited", "near", "the", "and", "from"]
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "anna",
    "john",
    "mar",
    "##ia",
    "ol",
    "##af",
    "os",
    "##lo",
    "paris",
    "rey",
    "##kja",
    "##vik",
    "lima",
    "met",
    "in",
    "visited",
    "near",
    "the",
    "and",
    "from",
    ".",
]
CLASSES = ["O", "PER", "LOC"]


def test_alignment_hand_example():
    tokenizer = BertTokenizer(VOCAB)
    features, labels = bertzoo.align_word_labels(
        tokenizer, [["Maria", "visited", "Reykjavik", "."], ["Olaf"]], [[1, 0, 2, 0], [1]], sequence_length=10
    )
    # [CLS] mar ##ia visited rey ##kja ##vik . [SEP] [PAD]
    assert features["token_ids"].tolist() == [[2, 7, 8, 20, 14, 15, 16, 25, 3, 0], [2, 9, 10, 3, 0, 0, 0, 0, 0, 0]]
    assert labels.tolist() == [
        [-100, 1, -100, 0, 2, -100, -100, 0, -100, -100],
        [-100, 1, -100, -100, -100, -100, -100, -100, -100, -100],
    ]
    assert features["padding_mask"].tolist()[1] == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert not features["segment_ids"].any()
    # Cut at sequence_length: the last words lose their labels, [SEP] stays.
    features, labels = bertzoo.align_word_labels(
        tokenizer, [["Maria", "visited", "Reykjavik"]], [[1, 0, 2]], sequence_length=6
    )
    assert features["token_ids"].tolist() == [[2, 7, 8, 20, 14, 3]]
    assert labels.tolist() == [[-100, 1, -100, 0, 2, -100]]


def test_alignment_matches_hugging_face_word_ids_on_the_real_vocabulary():
    if not SHARED_VOCAB.is_file():
        pytest.skip(f"{SHARED_VOCAB} is absent (the shared MiniLM checkpoint is not on this machine)")
    from tokenizers import BertWordPieceTokenizer

    sentences = [
        ["Reykjavík", "isn't", "in", "the", "U.S.", "(", "obviously", ")"],
        ["COVID-19", "hit", "naïve", "unbelievably", "", "fast", "!"],
        ["Zoë", "e-mailed", "Dr.", "Ångström", "at", "3:45pm"],
    ]
    labels = [[(7 * i + j) % 5 for j in range(len(s))] for i, s in enumerate(sentences)]
    reference = BertWordPieceTokenizer(str(SHARED_VOCAB), lowercase=True)
    tokenizer = BertTokenizer(str(SHARED_VOCAB))
    for length in (64, 9):
        features, aligned = bertzoo.align_word_labels(tokenizer, sentences, labels, sequence_length=length)
        for row, (words, word_labels) in enumerate(zip(sentences, labels)):
            encoding = reference.encode(words, is_pretokenized=True, add_special_tokens=False)
            ids, word_ids = encoding.ids[: length - 2], encoding.word_ids[: length - 2]
            expected_labels = [
                word_labels[w] if i == 0 or word_ids[i - 1] != w else -100 for i, w in enumerate(word_ids)
            ]
            pad = length - len(ids) - 2
            assert (
                features["token_ids"][row].tolist()
                == [reference.token_to_id("[CLS]")] + ids + [reference.token_to_id("[SEP]")] + [0] * pad
            )
            assert aligned[row].tolist() == [-100] + expected_labels + [-100] * (pad + 1)


def tiny_model(num_classes=3, class_names=CLASSES, sequence_length=12):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        max_sequence_length=32,
    )
    return bertzoo.BertTokenClassifier(
        backbone,
        num_classes,
        BertPreprocessor(BertTokenizer(VOCAB), sequence_length=sequence_length),
        class_names=class_names,
    )


def test_logits_loss_and_accuracy_against_numpy(rng):
    model = tiny_model()
    model.compile(jit_compile=False)
    features, labels = bertzoo.align_word_labels(
        model.preprocessor.tokenizer,
        [["Maria", "visited", "Reykjavik", "."], ["Olaf", "met", "Anna"]],
        [[1, 0, 2, 0], [1, 0, 1]],
        sequence_length=12,
    )
    logits = model(features, training=False)
    assert logits.shape == (2, 12, 3)
    sequence = np.asarray(model.backbone(features)["sequence_output"], "float64")
    dense = model.output_dense
    expected = sequence @ np.asarray(dense.kernel, "float64") + np.asarray(dense.bias, "float64")
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    valid = labels != -100
    z = expected - expected.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, np.where(valid, labels, 0)[..., None], -1)[..., 0]
    loss = model.compute_loss(x=features, y=labels, y_pred=logits)
    assert float(loss) == pytest.approx(nll[valid].mean(), rel=1e-5)
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    assert float(metric.result()) == pytest.approx((expected.argmax(-1) == labels)[valid].mean())


def test_per_word_and_per_sentence_weights_weigh_the_right_tokens():
    import tensorflow as tf

    model = tiny_model()
    model.compile(jit_compile=False)
    sentences = [["Maria", "visited", "Reykjavik", "."], ["Olaf", "met", "Anna"]]
    labels = [[1, 0, 2, 0], [1, 0, 1]]
    features, token_labels = bertzoo.align_word_labels(model.preprocessor.tokenizer, sentences, labels, 12)
    logits = np.asarray(model(features, training=False), "float64")
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    valid = token_labels != -100
    nll = -np.take_along_axis(log_probs, np.where(valid, token_labels, 0)[..., None], -1)[..., 0] * valid
    count = valid.sum()  # Keras divides the weighted sum by the labelled tokens.
    # "Reykjavik" (word 2 of sentence 0) starts at token 4: [CLS] mar ##ia visited rey ##kja ##vik .
    assert token_labels[0, 4] == 2 and token_labels[0, 5] == -100
    assert token_labels[1, 3] == 0 and token_labels[1, 2] == -100  # "met": [CLS] ol ##af met anna [SEP]
    word_weights = [[0.0, 0.0, 3.0, 0.0], [0.0, 1.0, 0.0]]
    expected = (3.0 * nll[0, 4] + nll[1, 3]) / count
    in_memory = model.evaluate(sentences, labels, sample_weight=word_weights, batch_size=2, verbose=0)[0]
    assert in_memory == pytest.approx(expected, rel=1e-4)
    padded_words = [s + [""] * (4 - len(s)) for s in sentences]
    padded_labels = [row + [-100] * (4 - len(row)) for row in labels]
    padded_weights = [row + [0.0] * (4 - len(row)) for row in word_weights]
    dataset = tf.data.Dataset.from_tensor_slices((padded_words, padded_labels, padded_weights)).batch(2)
    assert model.evaluate(dataset, verbose=0)[0] == pytest.approx(expected, rel=1e-4)
    # One weight per sentence: on each of its tokens.
    per_sentence = model.evaluate(sentences, labels, sample_weight=np.array([2.0, 0.0]), batch_size=2, verbose=0)[0]
    assert per_sentence == pytest.approx(2.0 * nll[0].sum() / count, rel=1e-4)
    with pytest.raises(ValueError, match="Sentence 1 has 3 words but 2 weights"):
        model.evaluate(sentences, labels, sample_weight=[[1.0] * 4, [1.0, 1.0]], verbose=0)
    # An empty word (no pieces) takes a label and a weight like any other, and changes nothing.
    with_empty = [sentences[0][:1] + [""] + sentences[0][1:]]
    empty_labels = [labels[0][:1] + [0] + labels[0][1:]]
    weighted = model.evaluate(with_empty, empty_labels, sample_weight=[[1.0, 5.0, 1.0, 3.0, 1.0]], verbose=0)[0]
    without = model.evaluate(sentences[:1], labels[:1], sample_weight=[[1.0, 1.0, 3.0, 1.0]], verbose=0)[0]
    assert weighted == pytest.approx(without, rel=1e-6)
    with pytest.raises(ValueError, match="Sentence 1 has 3 words but 4 weights"):  # Too many, within the padding.
        model.evaluate(sentences, labels, sample_weight=[[1.0] * 4, [1.0] * 4], verbose=0)


def synthetic_sentences(n, seed):
    rng = np.random.default_rng(seed)
    words, labels = [], []
    for _ in range(n):
        sentence, tags = [], []
        for _ in range(rng.integers(3, 6)):
            kind = rng.choice(3, p=[0.5, 0.25, 0.25])
            sentence.append(str(rng.choice([FILLER, PEOPLE, PLACES][kind])).capitalize())
            tags.append(int(kind))
        words.append(sentence)
        labels.append(tags)
    return words, labels


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    model = tiny_model()
    model.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=False)
    words, labels = synthetic_sentences(96, seed=0)
    history = model.fit(words, labels, batch_size=16, epochs=4, verbose=0).history
    return model, history


def test_training_from_words_learns_the_tags(trained):
    model, history = trained
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    words, labels = synthetic_sentences(32, seed=1)
    predicted = model.predict_words(words)
    flat_true = [CLASSES[t] for row in labels for t in row]
    flat_predicted = [p for row in predicted for p in row]
    assert np.mean(np.array(flat_true) == np.array(flat_predicted)) > 0.9
    assert model.predict_words([]) == []  # No sentences, no labels (not Keras's error on zero rows).


def test_preset_round_trip(trained, tmp_path):
    model, _ = trained
    features, _ = bertzoo.align_word_labels(
        model.preprocessor.tokenizer, [["Anna", "met", "Olaf", "in", "Oslo"]], sequence_length=12
    )
    model.save_to_preset(tmp_path / "tagger")
    again = bertzoo.BertTokenClassifier.from_preset(tmp_path / "tagger")
    assert again.class_names == CLASSES and again.preprocessor.sequence_length == 12
    np.testing.assert_array_equal(again(features, training=False), model(features, training=False))


def test_words_split_by_tensorflow_into_a_ragged_tensor_are_read_as_lists():
    model = tiny_model()
    model.compile(jit_compile=False)
    lists = [["anna", "visited", "oslo"], ["olaf", "met", "maria", "in", "lima"]]
    ragged = tf.strings.split(tf.constant([" ".join(words) for words in lists]))
    assert model.predict_words(ragged) == model.predict_words(lists)
    labels = [[1, 0, 2], [1, 0, 1, 0, 2]]
    expected = model.evaluate(lists, labels, verbose=0)
    assert model.evaluate(ragged, labels, verbose=0) == expected
    assert model.evaluate(ragged, tf.ragged.constant(labels), verbose=0) == expected


def test_a_dataset_of_ragged_word_batches_reads_as_padded_batches():
    model = tiny_model()
    model.compile(jit_compile=False)
    lists = [["anna", "visited", "oslo"], ["olaf", "met", "maria", "in", "lima"], [], ["paris"]]
    labels = [[1, 0, 2], [1, 0, 1, 0, 2], [], [2]]
    padded = tf.data.Dataset.from_generator(
        lambda: iter(zip(lists, labels)),
        output_signature=(tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32)),
    ).padded_batch(2, padding_values=("", -100))
    texts = tf.data.Dataset.from_tensor_slices(([" ".join(w) for w in lists], tf.ragged.constant(labels)))
    split = texts.batch(2).map(lambda text, tags: (tf.strings.split(text), tags))  # The error messages' hint, batched.
    ragged = tf.data.Dataset.from_tensor_slices((tf.ragged.constant(lists), tf.ragged.constant(labels))).ragged_batch(2)
    expected = model.evaluate(padded, verbose=0)
    assert model.evaluate(split, verbose=0) == expected
    assert model.evaluate(ragged, verbose=0) == expected
    np.testing.assert_array_equal(
        model.predict(ragged.map(lambda w, _: w), verbose=0), model.predict(padded.map(lambda w, _: w), verbose=0)
    )
    # A sentence with fewer labels than words is refused, as in memory, not hidden by the batch's padding.
    short = tf.ragged.constant([[1], [1, 0]])
    mismatched = tf.data.Dataset.from_tensor_slices((tf.ragged.constant([["anna", "met"], ["olaf"]]), short))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"these \(words, labels\) counts differ"):
        model.fit(mismatched.ragged_batch(2), verbose=0)


def test_a_sparse_cross_entropy_that_reads_minus_100_as_a_class_is_refused():
    model = tiny_model()
    for loss in (
        "sparse_categorical_crossentropy",
        keras.losses.sparse_categorical_crossentropy,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    ):
        with pytest.raises(ValueError, match=r"labels hold -100.*ignore_class=-100"):
            model.compile(loss=loss)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-100))


def test_empty_first_sentences_and_bytes_of_another_encoding():
    model = tiny_model()
    model.compile(jit_compile=False)
    history = model.fit([[], [], ["anna", "met"], ["olaf"]], [[], [], [1, 0], [1]], validation_split=0.5, verbose=0)
    assert "val_loss" in history.history  # Held out by bertzoo, not refused by Keras as a dataset.
    # Sentences as an object array, and a list of 0-d string arrays (texts), are read as raw text too.
    sentences = np.empty(4, dtype=object)
    sentences[:] = [[], [], ["anna", "met"], ["olaf"]]
    assert "val_loss" in model.fit(sentences, [[], [], [1, 0], [1]], validation_split=0.5, verbose=0).history
    assert holds_text([np.array("anna met")])
    with pytest.raises(ValueError, match=r"Sentence 1 holds bytes that are not UTF-8.*decode\('latin-1'\)"):
        model.predict_words([b"anna met", "caf\xe9".encode("latin-1")])


def test_errors():
    tokenizer = BertTokenizer(VOCAB)
    with pytest.raises(ValueError, match="Sentence 0 has 2 words but 3 labels"):
        bertzoo.align_word_labels(tokenizer, [["anna", "met"]], [[1, 0, 0]])
    with pytest.raises(ValueError, match="non-string word"):
        bertzoo.align_word_labels(tokenizer, [["anna", 3]])
    with pytest.raises(ValueError, match=r"Sentence 0's labels must be whole-number class ids, got \['PER', 'O'\]"):
        bertzoo.align_word_labels(tokenizer, [["anna", "met"]], [["PER", "O"]])
    with pytest.raises(ValueError, match=r"whole-number class ids, got \[1.0, 0.5\]"):
        bertzoo.align_word_labels(tokenizer, [["anna", "met"]], [[1, 0.5]])
    model = tiny_model(num_classes=3)
    model.compile(jit_compile=False)
    features, token_labels = bertzoo.align_word_labels(tokenizer, [["anna", "met"]], [[1, 0]], sequence_length=12)
    for labels in ([[1, 0]], token_labels[:, :8]):  # Per-word labels; token labels of another length.
        with pytest.raises(
            ValueError, match=r"Token labels of shape \(1, [28]\) do not match .* \(1, 12\).*align_word"
        ):
            model.fit(features, np.asarray(labels), verbose=0)
    with pytest.raises(ValueError, match="does not take `class_weight`.*per word with `sample_weight`"):
        model.fit([["anna", "met"]], [[1, 0]], class_weight={0: 1.0, 1: 2.0, 2: 3.0}, verbose=0)
    with pytest.raises(ValueError, match="class_names"):
        tiny_model(num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        tiny_model(num_classes=0, class_names=None)
