"""BertPreprocessor: packing, truncation, tf.data use, errors, config."""

import json
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text import builtin_vocabulary

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB += ["the", "quick", "fox", "jump", "##s", "lazy", "dog", "."]  # ids 5-12
VOCAB += list("abcdefg") + list("xyz")  # a-g: 13-19, x-z: 20-22
THE, QUICK, FOX, JUMP, S, LAZY, DOG, DOT = range(5, 13)
A, B, C, D, E, F, G = range(13, 20)
X, Y, Z = range(20, 23)


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer(VOCAB)


def _run(preprocessor, x, graph):
    """Calls the layer eagerly, or inside a tf.data map (graph mode)."""
    if not graph:
        return {k: v.numpy().tolist() for k, v in preprocessor(x).items()}
    dataset = tf.data.Dataset.from_tensors(x).map(lambda *args: preprocessor(args if len(args) > 1 else args[0]))
    return {k: v.numpy().tolist() for k, v in next(iter(dataset)).items()}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_single_segment(tokenizer, graph):
    out = _run(BertPreprocessor(tokenizer, sequence_length=10), "The quick fox jumps.", graph)
    assert out["token_ids"] == [CLS, THE, QUICK, FOX, JUMP, S, DOT, SEP, PAD, PAD]
    assert out["segment_ids"] == [0] * 10
    assert out["padding_mask"] == [True] * 8 + [False] * 2


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_pair(tokenizer, graph):
    out = _run(BertPreprocessor(tokenizer, sequence_length=10), ("The fox", "lazy dog"), graph)
    assert out["token_ids"] == [CLS, THE, FOX, SEP, LAZY, DOG, SEP, PAD, PAD, PAD]
    assert out["segment_ids"] == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert out["padding_mask"] == [True] * 7 + [False] * 3


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_literal_pad_in_the_text_is_a_real_token(graph):
    tokenizer = BertTokenizer(VOCAB, special_tokens_in_strings=True)
    out = _run(BertPreprocessor(tokenizer, sequence_length=9), tf.constant(["the [PAD] fox", "[PAD]"]), graph)
    assert out["token_ids"] == [[CLS, THE, PAD, FOX, SEP, PAD, PAD, PAD, PAD], [CLS, PAD, SEP] + [PAD] * 6]
    assert out["padding_mask"] == [[True] * 5 + [False] * 4, [True] * 3 + [False] * 6]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_batch_of_pairs(tokenizer, graph):
    x = (tf.constant(["the fox", "dog"]), tf.constant(["a", "x y z"]))
    out = _run(BertPreprocessor(tokenizer, sequence_length=8), x, graph)
    assert out["token_ids"] == [
        [CLS, THE, FOX, SEP, A, SEP, PAD, PAD],
        [CLS, DOG, SEP, X, Y, Z, SEP, PAD],
    ]
    assert out["segment_ids"] == [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0]]
    assert np.array(out["padding_mask"]).sum(axis=1).tolist() == [6, 7]


# Hand-computed truncations at sequence_length=8: 5 slots after [CLS] and two
# [SEP]s. round_robin hands out one token per segment in turn until the budget
# is used; waterfall fills the first segment before the second gets anything.
TRUNCATION_ROWS = [
    # (first, second, round_robin ids, waterfall ids)
    # 7 + 3 tokens: round robin a,x,b,y,c -> 3 + 2; waterfall 5 + 0
    ("a b c d e f g", "x y z", [CLS, A, B, C, SEP, X, Y, SEP], [CLS, A, B, C, D, E, SEP, SEP]),
    # 7 + 1: the short segment keeps its token under round robin
    ("a b c d e f g", "x", [CLS, A, B, C, D, SEP, X, SEP], [CLS, A, B, C, D, E, SEP, SEP]),
    # 1 + 7: once the first is used up, the second takes the rest (both modes)
    ("a", "x y z g f e d", [CLS, A, SEP, X, Y, Z, G, SEP], [CLS, A, SEP, X, Y, Z, G, SEP]),
    # 4 + 4: round robin 3 + 2, waterfall 4 + 1
    ("a b c d", "x y z g", [CLS, A, B, C, SEP, X, Y, SEP], [CLS, A, B, C, D, SEP, X, SEP]),
    # 3 + 2 fits exactly; 2 + 2 is padded
    ("a b c", "x y", [CLS, A, B, C, SEP, X, Y, SEP], [CLS, A, B, C, SEP, X, Y, SEP]),
    ("a b", "x y", [CLS, A, B, SEP, X, Y, SEP, PAD], [CLS, A, B, SEP, X, Y, SEP, PAD]),
]


def _expected_segment_ids(ids):
    first_sep = ids.index(SEP)
    last_sep = len(ids) - 1 - ids[::-1].index(SEP)
    return [0] * (first_sep + 1) + [1] * (last_sep - first_sep) + [0] * (len(ids) - last_sep - 1)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("mode", ["round_robin", "waterfall"])
def test_truncation_matches_hand_computation(tokenizer, mode, graph):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=8, truncate=mode)
    x = (
        tf.constant([row[0] for row in TRUNCATION_ROWS]),
        tf.constant([row[1] for row in TRUNCATION_ROWS]),
    )
    expected = [row[2] if mode == "round_robin" else row[3] for row in TRUNCATION_ROWS]
    out = _run(preprocessor, x, graph)
    assert out["token_ids"] == expected
    assert out["segment_ids"] == [_expected_segment_ids(ids) for ids in expected]
    assert out["padding_mask"] == [[i != PAD for i in ids] for ids in expected]


@pytest.mark.parametrize(
    "length, mode, expected",
    [
        # budget 9 for 7 + 3 tokens: round robin gives the first segment 6
        (12, "round_robin", [CLS, A, B, C, D, E, F, SEP, X, Y, Z, SEP]),
        (12, "waterfall", [CLS, A, B, C, D, E, F, G, SEP, X, Y, SEP]),
        # the minimum length: only the special tokens fit
        (3, "round_robin", [CLS, SEP, SEP]),
        (3, "waterfall", [CLS, SEP, SEP]),
    ],
)
def test_truncation_other_lengths(tokenizer, length, mode, expected):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=length, truncate=mode)
    out = preprocessor(("a b c d e f g", "x y z"))
    assert out["token_ids"].numpy().tolist() == expected
    assert out["segment_ids"].numpy().tolist() == _expected_segment_ids(expected)


@pytest.mark.parametrize("mode", ["round_robin", "waterfall"])
def test_single_segment_truncation(tokenizer, mode):
    out = BertPreprocessor(tokenizer, sequence_length=5, truncate=mode)("a b c d e f g")
    assert out["token_ids"].numpy().tolist() == [CLS, A, B, C, SEP]


def test_eager_equals_tf_data_on_real_text():
    tokenizer = BertTokenizer(builtin_vocabulary())
    first = [
        "The quick brown fox jumps over the lazy dog. " * 4,
        "",
        "Café, naïve — 東京 & 😀!",
        "Short.",
    ]
    second = ["A second segment that is fairly long as well, " * 3, "x", "", "Привет мир"]
    labels = [0, 1, 1, 0]
    pair = (tf.constant(first), tf.constant(second))
    # (Single segments in graph mode: see test_single_segment.)
    for mode, x in (("round_robin", pair), ("waterfall", pair)):
        preprocessor = BertPreprocessor(tokenizer, sequence_length=48, truncate=mode)
        eager = preprocessor(x)
        assert eager["padding_mask"].numpy()[0].all()  # the long rows really are truncated
        dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(3).map(preprocessor)
        batches = list(dataset)
        for key in ("token_ids", "segment_ids", "padding_mask"):
            graph = np.concatenate([features[key].numpy() for features, _ in batches])
            np.testing.assert_array_equal(graph, eager[key].numpy())
        assert np.concatenate([y.numpy() for _, y in batches]).tolist() == labels


def test_dataset_of_labelled_examples(tokenizer):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=6)
    texts, labels, weights = ["the fox", "dog"], [1, 0], [0.5, 2.0]
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(2).map(preprocessor)
    features, y = next(iter(dataset))
    assert features["token_ids"].shape == (2, 6) and features["token_ids"].dtype == tf.int32
    assert features["segment_ids"].dtype == tf.int32 and features["padding_mask"].dtype == tf.bool
    assert features["token_ids"].numpy()[1].tolist() == [CLS, DOG, SEP, PAD, PAD, PAD]
    assert y.numpy().tolist() == labels

    # Pairs, with labels and sample weights.
    elements = ((texts, ["a", "b"]), labels, weights)
    pairs = tf.data.Dataset.from_tensor_slices(elements).batch(2).map(preprocessor)
    features, y, sample_weight = next(iter(pairs))
    assert features["token_ids"].numpy()[0].tolist() == [CLS, THE, FOX, SEP, A, SEP]
    assert features["segment_ids"].numpy()[0].tolist() == [0, 0, 0, 0, 1, 1]
    assert y.numpy().tolist() == labels
    assert sample_weight.numpy().tolist() == weights

    # Unlabelled pairs: tf.data would pass the second segment as `y`.
    unlabelled = tf.data.Dataset.from_tensor_slices((texts, ["a", "b"])).batch(2)
    features = next(iter(unlabelled.map(lambda a, b: preprocessor((a, b)))))
    assert features["segment_ids"].numpy()[1].tolist() == [0, 0, 0, 1, 1, 0]


def test_new_pipelines_reuse_one_traced_tokenization():
    # Each fit or evaluate on raw text builds a new tf.data pipeline; the
    # tokenizing and packing inside is traced once per input shape, not per
    # pipeline, and gives the same ids every time.
    import gc

    from bertzoo.text import preprocessor as preprocessor_module

    # A tokenizer of its own: the test changes one of its settings.
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=6)
    texts = tf.data.Dataset.from_tensor_slices(["the fox", "dog"]).batch(2)
    pairs = tf.data.Dataset.from_tensor_slices((["the fox", "dog"], ["a", "b"])).batch(2)
    ids = [next(iter(texts.map(preprocessor)))["token_ids"].numpy().tolist() for _ in range(3)]
    assert ids == [[[CLS, THE, FOX, SEP, PAD, PAD], [CLS, DOG, SEP, PAD, PAD, PAD]]] * 3
    traced = preprocessor_module._GRAPH_FEATURES[preprocessor][1]
    assert traced.experimental_get_tracing_count() == 1
    for _ in range(2):
        next(iter(pairs.map(lambda a, b, packer=preprocessor: packer((a, b)))))
    assert traced.experimental_get_tracing_count() == 2  # One more input shape: pairs.
    # A changed setting is followed, as eager calls follow it.
    shouting = tf.data.Dataset.from_tensor_slices(["THE FOX"]).batch(1)
    assert next(iter(shouting.map(preprocessor)))["token_ids"].numpy()[0, 1:3].tolist() == [THE, FOX]
    preprocessor.tokenizer.lowercase = False
    eager = preprocessor(["THE FOX"])["token_ids"].numpy().tolist()
    assert eager[0][1:3] == [UNK, UNK]
    assert next(iter(shouting.map(preprocessor)))["token_ids"].numpy().tolist() == eager
    # So are its own settings: the packer packs to the new length and truncation (a new length once
    # gave 2 rows of 4 for one text of 8).
    preprocessor.sequence_length, preprocessor.truncate = 4, "waterfall"
    assert preprocessor.get_config()["sequence_length"] == 4 and preprocessor.get_config()["truncate"] == "waterfall"
    pair = (tf.constant(["the quick fox"]), tf.constant(["dog"]))
    eager = preprocessor(pair)["token_ids"].numpy().tolist()
    assert eager == [[CLS, THE, SEP, SEP]]  # Waterfall: the first segment takes the budget first.
    both = tf.data.Dataset.from_tensor_slices(pair).batch(1)
    assert next(iter(both.map(lambda a, b, packer=preprocessor: packer((a, b)))))["token_ids"].numpy().tolist() == eager
    with pytest.raises(ValueError, match=r"`sequence_length` must be an integer >= 3"):
        preprocessor.sequence_length = 2
    with pytest.raises(ValueError, match=r"Unknown `truncate` mode"):
        preprocessor.truncate = "longest_first"
    assert (preprocessor.sequence_length, preprocessor.truncate) == (4, "waterfall")
    # The cache does not keep its preprocessor alive.
    alive = weakref.ref(preprocessor)
    del preprocessor, traced
    gc.collect()
    assert alive() is None


def test_direct_call_with_labels(tokenizer):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=6)
    features, y = preprocessor(["the", "fox"], y=tf.constant([3, 4]))
    assert features["token_ids"].shape == (2, 6)
    assert y.numpy().tolist() == [3, 4]
    features, y, w = preprocessor("fox", np.array(1), np.array(0.5))
    assert features["token_ids"].numpy().tolist() == [CLS, FOX, SEP, PAD, PAD, PAD]
    assert (int(y), float(w)) == (1, 0.5)


def test_input_forms(tokenizer):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=6)
    single = preprocessor("the fox")
    assert single["token_ids"].shape == (6,)
    assert preprocessor(("the fox",))["token_ids"].numpy().tolist() == single["token_ids"].numpy().tolist()
    batch = preprocessor(np.array(["the fox", "dog"]))
    assert batch["token_ids"].shape == (2, 6)
    assert batch["token_ids"].numpy()[0].tolist() == single["token_ids"].numpy().tolist()
    assert preprocessor([])["token_ids"].shape == (0, 6)


def test_errors(tokenizer):
    for bad in (2, 0, -5, 128.0, True, "128", None):
        with pytest.raises(ValueError, match=r"`sequence_length` must be an integer >= 3.*sequence_length=128"):
            BertPreprocessor(tokenizer, sequence_length=bad)
    with pytest.raises(ValueError, match=r"Unknown `truncate` mode 'longest_first'.*'round_robin'.*'waterfall'"):
        BertPreprocessor(tokenizer, truncate="longest_first")
    with pytest.raises(ValueError, match="must be a bertzoo BertTokenizer"):
        BertPreprocessor(VOCAB)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=8)
    with pytest.raises(ValueError, match="one segment or a pair.*got 3 segments.*Join"):
        preprocessor(("a", "b", "c"))
    with pytest.raises(ValueError, match="expects strings.*int32"):
        preprocessor(tf.constant([[1, 2, 3]]))
    with pytest.raises(ValueError, match=r"segment 1\).*RaggedTensor"):
        preprocessor((tf.constant(["a", "b"]), tf.ragged.constant([["b"], ["c", "d"]])))
    with pytest.raises(ValueError, match=r"shape \(2, 2\).*tuple \(first_texts, second_texts\)"):
        preprocessor([["a", "b"], ["c", "d"]])
    with pytest.raises(ValueError, match="same shape"):
        preprocessor(("a", ["b", "c"]))


def test_a_new_tokenizer_brings_its_own_special_token_ids():
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=6)
    assert preprocessor("the")["token_ids"].numpy().tolist() == [CLS, THE, SEP, PAD, PAD, PAD]
    # The same words, with [CLS], [SEP] and [PAD] at other ids.
    moved = ["the", "[SEP]", "[UNK]", "[MASK]", "[CLS]", "x", "[PAD]"]
    preprocessor.tokenizer = BertTokenizer(moved)
    out = preprocessor("the")
    assert out["token_ids"].numpy().tolist() == [4, 0, 1, 6, 6, 6]
    assert out["padding_mask"].numpy().tolist() == [True, True, True, False, False, False]
    assert (preprocessor.sequence_length, preprocessor.truncate) == (6, "round_robin")
    with pytest.raises(ValueError, match="`tokenizer` must be a bertzoo BertTokenizer"):
        preprocessor.tokenizer = moved


def test_config_round_trip(tokenizer):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=9, truncate="waterfall", name="prep")
    config = preprocessor.get_config()
    assert config["sequence_length"] == 9 and config["truncate"] == "waterfall"
    assert config["tokenizer"]["config"]["vocabulary"] == VOCAB
    restored = BertPreprocessor.from_config(json.loads(json.dumps(config)))
    assert isinstance(restored.tokenizer, BertTokenizer)
    assert restored.get_config() == config
    x = (["a b c d e f g", "the fox"], ["x y z", "dog"])
    for key, value in preprocessor(x).items():
        np.testing.assert_array_equal(restored(x)[key].numpy(), value.numpy())

    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(preprocessor)))
    assert serialized["registered_name"] == "bertzoo>BertPreprocessor"
    revived = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(revived, BertPreprocessor) and revived.truncate == "waterfall"
    np.testing.assert_array_equal(revived(x)["token_ids"].numpy(), preprocessor(x)["token_ids"].numpy())
