"""BertQuestionAnswerer: span labels, masked logits, loss, decoding, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.compression.distiller import PREDICTIONS_ONLY
from bertzoo.export import read_export_metadata
from bertzoo.models.bert_question_answerer import DEFAULT_STRIDE
from bertzoo.models.bert_question_answerer import answer_windows
from bertzoo.models.bert_question_answerer import context_positions
from bertzoo.models.bert_question_answerer import decode_spans
from bertzoo.models.bert_question_answerer import max_context_positions
from bertzoo.models.bert_question_answerer import question_windows
from bertzoo.models.bert_question_answerer import window_stride
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

FILLER = ["the", "tower", "was", "finished", "in", "a", "river", "near", "old", "town", "red", "house"]
VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "when",
    "where",
    "is",
    "1889",
    ".",
    "?",
    "gold",
    "##en",
    "key",
] + FILLER
QUESTION = "When was the tower finished?"
CONTEXT = "The tower was finished in 1889."


def tiny_model(sequence_length=16, mask_question=True):
    backbone = bertzoo.BertBackbone(
        vocabulary_size=len(VOCAB),
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        max_sequence_length=32,
    )
    preprocessor = BertPreprocessor(BertTokenizer(VOCAB), sequence_length=sequence_length)  # round_robin
    return bertzoo.BertQuestionAnswerer(backbone, preprocessor, mask_question=mask_question)


def labelled_batch(model, questions, contexts, spans):
    """What `fit` feeds the model for one batch (the same `tf.data` step, run eagerly)."""
    x, y = model._raw_to_tensors((questions, contexts), spans)
    features, positions = model.preprocess(x, tf.constant(y))
    return {k: v.numpy() for k, v in features.items()}, positions.numpy()


def test_character_spans_become_token_positions():
    model = tiny_model()
    assert model.preprocessor.truncate == "waterfall"
    start = CONTEXT.index("1889")
    features, positions = labelled_batch(
        model,
        [QUESTION] * 3,
        [CONTEXT] * 3,
        [(start, start + 4), (CONTEXT.index("finished"), start + 4), (0, 9)],
    )
    # [CLS] when was the tower finished ? [SEP] the tower was finished in 1889 . [SEP]
    #   0    1    2   3    4      5      6   7    8    9    10    11     12  13  14  15
    assert features["token_ids"][0].tolist() == [2, 5, 16, 14, 15, 17, 10, 3, 14, 15, 16, 17, 18, 8, 9, 3]
    assert positions.tolist() == [[13, 13], [11, 13], [8, 9]]


def test_spans_inside_words_take_the_pieces_that_hold_their_characters():
    model = tiny_model()
    context = "The golden key."
    # [CLS] when was the tower finished ? [SEP] the gold ##en key . [SEP]
    #   0    1    2   3    4      5      6   7    8    9    10   11  12  13
    spans = [(5, 8), (8, 10), (4, 10), (6, 12), (3, 4), (4, 14), (14, 15)]
    features, positions = labelled_batch(model, [QUESTION] * len(spans), [context] * len(spans), spans)
    assert features["token_ids"][0][8:14].tolist() == [14, VOCAB.index("gold"), VOCAB.index("##en"), 13, 9, 3]
    # "old" -> gold; "en" -> ##en; "golden"; "lden k" -> gold ##en key; " " (no token) -> [CLS]; "golden key"; "."
    assert positions.tolist() == [[9, 9], [10, 10], [9, 10], [9, 11], [0, 0], [9, 11], [12, 12]]
    # A tokenizer whose offsets tokenize otherwise (special tokens read from the text): the
    # labels count the features' own tokens.
    model.preprocessor = BertPreprocessor(
        BertTokenizer(VOCAB, special_tokens_in_strings=True), sequence_length=16, truncate="waterfall"
    )
    context = "the [SEP] tower was finished in 1889."
    start = context.index("1889")
    features, positions = labelled_batch(model, ["when?"], [context], [(start, start + 4)])
    assert features["token_ids"][0][positions[0][0]] == VOCAB.index("1889") and positions[0][0] == positions[0][1]


def test_new_dataset_pipelines_reuse_one_traced_preprocessing():
    # Each fit, evaluate or predict on a dataset builds a new tf.data pipeline; the task's
    # preprocessing inside it (spans to token positions) is traced once per input
    # signature, not per pipeline, and follows a changed setting.
    import gc
    import weakref

    from bertzoo.models import task as task_module

    model = tiny_model()
    dataset = tf.data.Dataset.from_tensor_slices((([QUESTION] * 2, [CONTEXT] * 2), [[26, 30], [0, 3]])).batch(2)
    features, functions = [], []
    for stop in (False, True, False):  # Keras's own attributes (`stop_training`, ...) are not settings.
        model.stop_training = stop
        features.append(model._as_dataset(dataset))
        functions.append(task_module._GRAPH_PREPROCESS[model][model.trims_padding][1])
    traced = functions[0]
    assert all(function is traced for function in functions)
    assert traced.experimental_get_tracing_count() == 1
    first = next(iter(features[0]))
    for other in features[1:]:
        batch = next(iter(other))
        for key in first[0]:
            np.testing.assert_array_equal(batch[0][key], first[0][key])
        np.testing.assert_array_equal(batch[1], first[1])
    expected = labelled_batch(model, [QUESTION] * 2, [CONTEXT] * 2, [[26, 30], [0, 3]])[1]
    np.testing.assert_array_equal(first[1], expected)
    # A new sequence length (and a question cut to fit it) is followed, as eager calls follow it.
    model.preprocessor.sequence_length = 10
    shorter = next(iter(model._as_dataset(dataset)))
    np.testing.assert_array_equal(
        shorter[1], labelled_batch(model, [QUESTION] * 2, [CONTEXT] * 2, [[26, 30], [0, 3]])[1]
    )
    assert shorter[0]["token_ids"].shape[1] <= 10
    # The traced function does not keep the model alive.
    gone = weakref.ref(model)
    del model, features, other, traced, functions  # (A pipeline refers to its model: `other` too.)
    gc.collect()
    assert gone() is None


def test_truncation_keeps_the_question_and_drops_lost_answers():
    model = tiny_model(sequence_length=12)
    start = CONTEXT.index("1889")
    features, positions = labelled_batch(
        model, [QUESTION] * 2, [CONTEXT] * 2, [(start, start + 4), (CONTEXT.index("tower"), CONTEXT.index("tower") + 5)]
    )
    # Budget 9: the 6 question tokens stay whole, the context keeps "the tower was".
    assert features["token_ids"][0].tolist() == [2, 5, 16, 14, 15, 17, 10, 3, 14, 15, 16, 3]
    assert positions.tolist() == [[0, 0], [9, 9]]  # 1889 was cut off: the label points at [CLS].


def test_unanswered_questions_train_on_cls_from_raw_text():
    model = tiny_model()
    start = CONTEXT.index("1889")
    _, positions = labelled_batch(model, [QUESTION] * 3, [CONTEXT] * 3, [(start, start + 4), None, (-1, -1)])
    assert positions.tolist() == [[13, 13], [0, 0], [0, 0]]  # SQuAD 2.0: no answer is [CLS] (the BERT paper).
    # A dataset's spans are checked in the graph: (-1, -1) passes, other negative spans do not.
    # One dataset (one traced pipeline): a good batch, then a bad one.
    data = tf.data.Dataset.from_tensor_slices(
        (([QUESTION] * 3, [CONTEXT] * 3), [[-1, -1], [start, start + 4], [-1, 4]])
    )
    batches = iter(model._as_dataset(data.batch(2)))
    _, labels = next(batches)
    assert labels.numpy().tolist() == [[0, 0], [13, 13]]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"or \(-1, -1\) for no answer"):
        next(batches)
    model.compile(jit_compile=False)
    model.fit(([QUESTION] * 2, [CONTEXT] * 2), [None, (start, start + 4)], verbose=0)


@pytest.mark.parametrize("mask_question", [True, False])
def test_logits_are_dense_scores_with_masked_positions(mask_question):
    model = tiny_model(mask_question=mask_question)
    features = model.preprocessor((np.array([QUESTION, "where is it?"]), np.array([CONTEXT, "in a town."])))
    features = {k: np.asarray(v) for k, v in features.items()}
    logits = np.asarray(model(features, training=False))
    assert logits.shape == (2, 2, 16)
    sequence = np.asarray(model.backbone(features)["sequence_output"], "float64")
    scores = sequence @ np.asarray(model.span_dense.kernel, "float64") + np.asarray(model.span_dense.bias)
    real = features["padding_mask"].astype(bool)
    if mask_question:
        last = real.sum(1) - 1
        allowed = (features["segment_ids"] == 1) & (np.arange(16)[None] != last[:, None])
        allowed[:, 0] = True
    else:
        allowed = real
    expected = np.where(allowed[:, None, :], scores.transpose(0, 2, 1), -1e9)
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    if mask_question:  # Row 1: [CLS] where is [UNK] ? [SEP] in a town . [SEP] -> context is positions 6-9.
        assert np.flatnonzero(allowed[1]).tolist() == [0, 6, 7, 8, 9]


def test_loss_is_the_mean_of_start_and_end_cross_entropy():
    model = tiny_model()
    model.compile(jit_compile=False)
    start = CONTEXT.index("1889")
    features, positions = labelled_batch(
        model, [QUESTION] * 2, [CONTEXT] * 2, [(start, start + 4), (CONTEXT.index("tower"), start)]
    )
    logits = np.asarray(model(features, training=False), "float64")
    loss = model.compute_loss(x=features, y=positions, y_pred=model(features, training=False))

    def cross_entropy(z, label):
        z = z - z.max()
        return np.log(np.exp(z).sum()) - z[label]

    start_loss = np.mean([cross_entropy(logits[b, 0], positions[b, 0]) for b in range(2)])
    end_loss = np.mean([cross_entropy(logits[b, 1], positions[b, 1]) for b in range(2)])
    assert float(loss) == pytest.approx((start_loss + end_loss) / 2, rel=1e-5)


@pytest.mark.parametrize("max_answer_length", [1, 3, 40])
@pytest.mark.parametrize("ties", [False, True])
def test_decode_spans_matches_brute_force(rng, max_answer_length, ties):
    logits = rng.integers(-2, 3, (6, 2, 12)).astype("float64") if ties else rng.normal(0, 2, (6, 2, 12))
    logits[:, :, 9:] = -1e9  # Padding.
    logits[2, :, 1:] = -1e9  # Nothing but [CLS] allowed.
    starts, ends, scores = decode_spans(logits, max_answer_length=max_answer_length)
    for b in range(6):
        best = (-np.inf, 0, 0)  # On ties the earliest start, then the shortest span.
        for i in range(1, 12):
            for j in range(i, min(i + max_answer_length, 12)):
                if logits[b, 0, i] > -1e8 and logits[b, 1, j] > -1e8 and logits[b, 0, i] + logits[b, 1, j] > best[0]:
                    best = (logits[b, 0, i] + logits[b, 1, j], i, j)
        assert (
            (scores[b], starts[b], ends[b]) == pytest.approx(best)
            if np.isfinite(best[0])
            else (starts[b] == ends[b] == 0 and scores[b] == -np.inf)
        )
    with pytest.raises(ValueError, match="max_answer_length"):
        decode_spans(logits, max_answer_length=0)


def test_one_weight_per_example_weighs_its_start_and_end_loss():
    model = tiny_model(sequence_length=20)
    (questions, contexts), spans = synthetic_qa(3, seed=1)
    weights = np.array([1.0, 0.0, 2.0])
    # Each example's own loss, worked out from the logits (an independent reference,
    # without a `tf.data` pipeline per example): the mean of its start and end cross entropy.
    features, positions = labelled_batch(model, questions, contexts, spans)
    logits = np.asarray(model(features, training=False), "float64")

    def cross_entropy(z, label):
        z = z - z.max()
        return np.log(np.exp(z).sum()) - z[label]

    each = [np.mean([cross_entropy(logits[b, k], positions[b, k]) for k in (0, 1)]) for b in range(3)]
    expected = np.mean(weights * np.array(each))  # Keras averages the weighted (start, end) losses.
    weighted = model.evaluate((questions, contexts), spans, sample_weight=weights, verbose=0, return_dict=True)
    assert weighted["loss"] == pytest.approx(expected, rel=1e-5)
    tokenized = model.evaluate(
        {k: np.asarray(v) for k, v in features.items()}, np.asarray(positions), sample_weight=weights, verbose=0
    )
    assert tokenized[0] == pytest.approx(expected, rel=1e-5)
    # A trainer that calls the loss itself weighs the same way.
    distiller = bertzoo.Distiller(tiny_model(sequence_length=20), model, alpha=0.5, **PREDICTIONS_ONLY)
    distilled = distiller.evaluate((questions, contexts), spans, sample_weight=weights, verbose=0, return_dict=True)
    assert distilled["student_loss"] == pytest.approx(expected, rel=1e-5)
    model.fit((questions, contexts), spans, sample_weight=weights, epochs=1, verbose=0)


def synthetic_qa(n, seed):
    """The answer is "gold", "golden key" or "key", somewhere in a filler context."""
    rng = np.random.default_rng(seed)
    questions, contexts, spans = [], [], []
    for _ in range(n):
        answer = str(rng.choice(["gold", "golden key", "key"]))
        words = list(rng.choice(FILLER, size=rng.integers(3, 7)))
        position = rng.integers(0, len(words) + 1)
        before = " ".join(words[:position])
        context = " ".join(filter(None, [before, answer, " ".join(words[position:])])) + "."
        start = len(before) + (1 if before else 0)
        questions.append("where is the gold?")
        contexts.append(context)
        spans.append((start, start + len(answer)))
    return (questions, contexts), np.array(spans)


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    model = tiny_model(sequence_length=20)
    model.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=False)
    x, spans = synthetic_qa(128, seed=0)
    # 2 epochs of 16 steps (each epoch builds its `tf.data` iterator again): the loss
    # ratio test_training_finds_the_answers reads is about 0.2 here (it must be < 0.3).
    history = model.fit(x, spans, batch_size=8, epochs=2, verbose=0).history
    return model, history


def test_training_finds_the_answers(trained):
    model, history = trained
    print(f"loss ratio {history['loss'][-1] / history['loss'][0]:.3f} (< 0.3)")
    assert history["loss"][-1] < 0.3 * history["loss"][0]
    (questions, contexts), spans = synthetic_qa(24, seed=1)
    answers = model.predict_spans(questions, contexts)
    expected = [c[s:e].lower() for c, (s, e) in zip(contexts, spans)]
    accuracy = np.mean([a["text"] == e for a, e in zip(answers, expected)])
    print(f"exact answers {accuracy:.3f} (> 0.8)")
    assert accuracy > 0.8
    assert all(a["start"] <= a["end"] for a in answers)


def test_preset_round_trip(trained, tmp_path):
    model, _ = trained
    model.save_to_preset(tmp_path / "qa")
    again = bertzoo.BertQuestionAnswerer.from_preset(tmp_path / "qa")
    assert again.preprocessor.truncate == "waterfall" and again.mask_question
    features = {k: np.asarray(v) for k, v in model.preprocessor(([QUESTION], [CONTEXT])).items()}
    np.testing.assert_array_equal(again(features, training=False), model(features, training=False))


def test_errors():
    model = tiny_model()
    model.compile(jit_compile=False)
    with pytest.raises(ValueError, match=r"not inside its context.*or None / \(-1, -1\) for a question"):
        model.fit(([QUESTION], [CONTEXT]), [(3, 99)], verbose=0)
    with pytest.raises(ValueError, match="shape \\(1, 2\\)"):
        model.fit(([QUESTION], [CONTEXT]), [3], verbose=0)
    with pytest.raises(ValueError, match="tuple \\(questions, contexts\\)"):
        model.fit([QUESTION], [(0, 3)], verbose=0)
    with pytest.raises(ValueError, match="does not take `class_weight`: its labels are \\(start, end\\) positions"):
        model.fit(([QUESTION], [CONTEXT]), [(0, 3)], class_weight={0: 1.0}, verbose=0)


def test_answer_positions_need_waterfall_packing_and_integer_spans():
    model = tiny_model()
    model.compile(jit_compile=False)
    # Swapped in after construction: round-robin packing would cut the question and shift every position.
    model.preprocessor = BertPreprocessor(model.preprocessor.tokenizer, sequence_length=16)
    with pytest.raises(ValueError, match=r"truncate='waterfall'.*packs with truncate='round_robin'.*waterfall"):
        model.fit(([QUESTION], [CONTEXT]), [(4, 9)], verbose=0)
    model.preprocessor.truncate = "waterfall"
    model.fit(([QUESTION], [CONTEXT]), [(4, 9)], verbose=0)
    spans = tf.data.Dataset.from_tensors(((tf.constant([QUESTION]), tf.constant([CONTEXT])), tf.constant([[4.5, 9.0]])))
    with pytest.raises(ValueError, match=r"integer character offsets.*these are float32.*tf\.cast"):
        model.fit(spans, verbose=0)


def test_an_answer_starting_inside_a_word_has_no_wordpiece_markup():
    model = tiny_model()
    # [CLS] when [SEP] gold ##en [SEP]: the best span is the continuation piece alone.
    features = {k: np.asarray(v) for k, v in model.preprocessor((["when"], ["golden"])).items()}
    assert features["token_ids"][0, :6].tolist() == [2, 5, 3, 11, 12, 3]
    logits = np.full((1, 2, 16), -10.0, "float32")
    logits[0, :, 4] = 5.0
    decoded = model.decode_answers(logits, features)
    assert (int(decoded["start"][0]), int(decoded["end"][0])) == (4, 4)
    assert decoded["answer"].numpy().tolist() == [b"en"]


# --- Long contexts, character offsets, null answers (doc-stride windows) ---

HADAMARD = np.array([[1, 1], [1, -1]])
for _ in range(2):
    HADAMARD = np.kron(HADAMARD, np.array([[1, 1], [1, -1]]))  # 8 x 8, orthogonal rows of mean 0 (but the first).
GOLD, KEY, CLS_SCORE = 3.0, 1.0, 2.0  # Start and end logit of "gold", "key" and [CLS]; other tokens 0.


def controlled_model(sequence_length=16):
    """A QA model whose logits are set by hand: each token's start and end
    logit depend on the token alone (GOLD, KEY, CLS_SCORE, else 0).

    Position and segment embeddings are zero and the attention and
    feed-forward outputs are zeroed, so the sequence output is the
    LayerNorm of the token embedding; token embeddings are rows of a
    Hadamard matrix (already normalized), the span head reads them off.
    """
    model = tiny_model(sequence_length)
    model.preprocessor = BertPreprocessor(model.preprocessor.tokenizer, sequence_length=sequence_length)
    backbone = model.backbone
    table = np.tile(np.repeat(HADAMARD[1], 4), (len(VOCAB), 1)).astype("float32")  # 32-wide rows.
    rows = {"gold": 2, "key": 3, "[CLS]": 4}
    for token, row in rows.items():
        table[VOCAB.index(token)] = np.repeat(HADAMARD[row], 4)
    for weight in backbone.weights:
        path = weight.path
        if path.endswith("token_embedding/embeddings"):
            weight.assign(table)
        elif any(part in path for part in ("position_embedding", "segment_embedding", "/output/")):
            weight.assign(np.zeros(weight.shape, "float32"))
    kernel = np.zeros((32, 2), "float32")
    for token, score in (("gold", GOLD), ("key", KEY), ("[CLS]", CLS_SCORE)):
        kernel += np.repeat(HADAMARD[rows[token]], 4)[:, None] * score / 32
    model.span_dense.kernel.assign(kernel)
    model.span_dense.bias.assign(np.zeros(2, "float32"))
    return model


@pytest.fixture(scope="module")
def controlled():
    return controlled_model()


def long_context(answer="Gold", key_first=True):
    """~80 filler tokens, "key" near the start, `answer` near the end."""
    words = [FILLER[i % len(FILLER)] for i in range(80)]
    if key_first:
        words[3] = "key"
    words[70] = answer
    return " ".join(words) + "."


def test_controlled_logits(controlled):
    features = {k: np.asarray(v) for k, v in controlled.preprocessor(([QUESTION], ["the gold key."])).items()}
    logits = np.asarray(controlled(features, training=False))[0]
    # [CLS] when was the tower finished ? [SEP] the gold key . [SEP]
    np.testing.assert_allclose(logits[:, 0], [CLS_SCORE, CLS_SCORE], atol=1e-4)
    np.testing.assert_allclose(logits[:, 9], [GOLD, GOLD], atol=1e-4)
    np.testing.assert_allclose(logits[:, 10], [KEY, KEY], atol=1e-4)
    np.testing.assert_allclose(logits[:, 8], [0, 0], atol=1e-4)


def test_windows_cover_the_context_stride_apart(controlled):
    tokenizer = controlled.preprocessor.tokenizer
    context = long_context()
    features, windows = question_windows(
        tokenizer, tf.constant(["where is the gold?", QUESTION]), tf.constant([context, CONTEXT]), 16, 4
    )
    token_ids = features["token_ids"].numpy()
    context_ids = tokenizer.tokenize(context).numpy().tolist()
    # 81 context tokens, 8 per window (16 - 3 - 5 question tokens): 1 + ceil(73 / 4) = 20 windows, then 1.
    assert len(context_ids) == 81
    assert windows["example"].numpy().tolist() == [0] * 20 + [1]
    for k in range(19):
        row = token_ids[k]
        assert row[:7].tolist() == [2] + tokenizer.tokenize("where is the gold?").numpy().tolist() + [3]
        assert row[7:].tolist() == context_ids[4 * k : 4 * k + 8] + [3]
        assert features["segment_ids"].numpy()[k].tolist() == [0] * 7 + [1] * 9
        assert windows["offset"].numpy()[k] == 4 * k - 7
    assert token_ids[19][7:].tolist() == context_ids[76:] + [3] + [0] * 3  # The last window reaches the end.
    # A context that fits: one window, exactly what the preprocessor packs.
    packed = controlled.preprocess((tf.constant([QUESTION]), tf.constant([CONTEXT])))
    for name in ("token_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(features[name].numpy()[20], packed[name].numpy()[0])
    # Where the context needs several windows the question is cut to 16 - 3 - stride
    # tokens; a pair that fits keeps it whole, as training packs it.
    features, windows = question_windows(
        tokenizer, tf.constant([QUESTION, QUESTION]), tf.constant([CONTEXT, context]), 16, 10
    )
    rows = features["token_ids"].numpy()
    assert windows["example"].numpy().tolist()[:2] == [0, 1]
    np.testing.assert_array_equal(rows[0], packed["token_ids"].numpy()[0])
    assert rows[1][:5].tolist() == [2, 5, 16, 14, 3]


def test_the_answer_in_a_late_window_wins(controlled):
    question = "where is the gold?"
    context = long_context("GÓLD")
    features = {k: np.asarray(v) for k, v in controlled.preprocessor(([question], [context])).items()}
    truncated_context = features["token_ids"][0][features["segment_ids"][0] == 1]
    assert VOCAB.index("gold") not in truncated_context  # Truncated to one window, the answer is lost.
    for stride in (None, 1, 4, 8):
        (answer,) = controlled.predict_spans([question], [context], stride=stride)
        start = context.index("GÓLD")
        assert answer["text"] == "GÓLD" and (answer["start"], answer["end"]) == (start, start + 4)
        assert answer["text"] == context[answer["start"] : answer["end"]]
        assert answer["score"] == pytest.approx(2 * GOLD, abs=1e-3)  # Not "key" (2 * KEY), early in the context.
        assert answer["null_score"] == pytest.approx(2 * CLS_SCORE, abs=1e-3)


def is_max_context(spans, index, position):
    """BERT's `_check_is_max_context` (run_squad.py), written out: `spans`
    are `(start, length)` of each window's context tokens."""
    best_score, best_index = None, None
    for span_index, (start, length) in enumerate(spans):
        if not start <= position <= start + length - 1:
            continue
        score = min(position - start, start + length - 1 - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, span_index
    return best_index == index


@pytest.mark.parametrize("stride", [1, 3, 4, 5])
def test_starts_are_allowed_where_the_window_gives_most_context(controlled, stride):
    tokenizer = controlled.preprocessor.tokenizer
    questions = ["where is the gold?", QUESTION, "?"]
    contexts = [long_context(), CONTEXT, " ".join(FILLER * 3)]
    features, windows = question_windows(tokenizer, tf.constant(questions), tf.constant(contexts), 16, stride)
    allowed = context_positions(features["padding_mask"], features["segment_ids"])
    mask = max_context_positions(allowed, windows).numpy()
    example, offset, context = windows["example"].numpy(), windows["offset"].numpy(), allowed.numpy()
    for e in range(len(questions)):
        rows = np.flatnonzero(example == e)
        # Each window's context tokens: (first token, how many).
        spans = [(np.argmax(context[w]) + offset[w], context[w].sum()) for w in rows]
        seen = {}
        for index, w in enumerate(rows):
            for position in np.flatnonzero(allowed.numpy()[w]):
                token = position + offset[w]
                assert mask[w, position] == is_max_context(spans, index, token), (e, w, position)
                seen[token] = seen.get(token, 0) + int(mask[w, position])
        assert sorted(seen) == list(range(max(seen) + 1)) and set(seen.values()) == {1}  # One window per token.
    assert not mask[~allowed.numpy()].any()


def test_a_span_starts_in_the_window_that_gives_its_start_most_context(controlled):
    """The same token near the edge of one window and in the middle of the
    next: a higher score at the edge does not win (BERT's SQuAD rule)."""
    tokenizer = controlled.preprocessor.tokenizer
    features, windows = question_windows(
        tokenizer, tf.constant(["where is the gold?"]), tf.constant([long_context()]), 16, 4
    )
    offset = windows["offset"].numpy()
    logits = np.zeros((len(offset), 2, 16), "float32")
    logits[:, :, 0] = -10.0
    # Context token 10 sits at position 7 + 2 of window 2 (two tokens of context to its
    # left) and at 7 + 6 of window 1 (one token to its right); token 9 at 7 + 5 of window 1.
    assert offset[1] + 13 == 10 and offset[2] + 9 == 10 and offset[1] + 12 == 9
    logits[1, :, 13] = 5.0  # Token 10 in window 1: one token of right context, the best scores.
    logits[2, :, 9] = 4.0  # Token 10 in window 2: its max-context window.
    answers = answer_windows(tf.constant(logits), features, windows, max_answer_length=1)
    token_start = windows["char_starts"].flat_values.numpy()[10]
    assert int(answers["start"][0]) == token_start
    assert float(answers["score"][0]) == pytest.approx(8.0)  # Window 2's span, not window 1's 10.0.


def test_no_questions_get_no_answers(controlled):
    assert controlled.predict_spans([], []) == []


def test_answers_are_exact_substrings_of_the_context(controlled):
    contexts = [
        "The Tower, in  Paris: Gold!",
        "naïve café Go\u0301ld\u00ad résumé",  # A combining accent and a soft hyphen stay in the answer.
        "The key was GOLD-plated",
        "Gold",
    ]
    answers = controlled.predict_spans(["where is the gold?"] * 4, contexts, max_answer_length=1)
    assert [a["text"] for a in answers] == ["Gold", "Go\u0301ld\u00ad", "GOLD", "Gold"]
    for answer, context in zip(answers, contexts):
        assert context[answer["start"] : answer["end"]] == answer["text"]
    # Longer answers: "key" (1) then "gold" (3) -> the span "key was GOLD" scores 1 + 3 < 3 + 3.
    (answer,) = controlled.predict_spans(["?"], ["a Key, then GOLD."], max_answer_length=30)
    assert answer["text"] == "GOLD"


def test_tokenize_with_offsets_maps_tokens_to_original_characters():
    from bertzoo.text.vocabulary import builtin_vocabulary

    texts = ["Café au LAIT!", "", "naïve cafe\u0301 co\u00adop", "İstanbul x" + "y" * 120, "北京 Σ \x00 end"]
    for lowercase in (True, False):
        tokenizer = BertTokenizer(builtin_vocabulary(1200), lowercase=lowercase)
        ids, starts, ends = tokenizer.tokenize_with_offsets(texts)
        assert ids.to_list() == tokenizer.tokenize(texts).to_list()
        for text, row, s, e in zip(texts, ids.to_list(), starts.to_list(), ends.to_list()):
            pieces = [text[a:b] for a, b in zip(s, e)]
            assert all(pieces) and s == sorted(s) and all(b <= a for a, b in zip(s[1:], e))
            if lowercase:  # The pieces, normalized, are the tokens.
                tokens = [tokenizer.id_to_token(i).removeprefix("##") for i in row]
                joined = [p for p, t in zip(pieces, tokens) if t != "[UNK]"]
                assert [tokenizer.tokenize(p).numpy().size > 0 for p in joined] == [True] * len(joined)
    tokenizer = BertTokenizer(builtin_vocabulary(1200))
    _, starts, ends = tokenizer.tokenize_with_offsets(["Café au LAIT!"])
    assert list(zip(starts[0].numpy(), ends[0].numpy()))[-1] == (12, 13)
    assert "".join("Café au LAIT!"[a:b] for a, b in zip(starts[0].numpy(), ends[0].numpy())) == "CaféauLAIT!"
    graph = tf.function(tokenizer.tokenize_with_offsets, input_signature=[tf.TensorSpec([None], tf.string)])
    assert graph(tf.constant(texts))[2].to_list() == tokenizer.tokenize_with_offsets(texts)[2].to_list()


def test_null_answers_with_a_threshold(controlled):
    questions = ["where is the gold?"] * 2
    contexts = [long_context(), "the old red house near the river."]  # The second has neither gold nor key.
    # SQuAD 1.1 (no threshold): always a span; the second context's best is a filler span of score 0.
    answers = controlled.predict_spans(questions, contexts, stride=4)
    assert answers[0]["text"] == "Gold" and answers[1]["text"] != ""
    assert answers[1]["score"] == pytest.approx(0, abs=1e-3)
    # s_null = 4: null when 4 > score + tau.
    for tau, expected in (
        (0.0, ["Gold", ""]),
        (-1.0, ["Gold", ""]),
        (-2.5, ["", ""]),
        (-5.0, ["", ""]),
        (4.5, ["Gold", "the"]),
    ):
        answers = controlled.predict_spans(questions, contexts, stride=4, null_score_threshold=tau)
        texts = [a["text"] for a in answers]
        assert texts[0] == expected[0] and (texts[1] == "") == (expected[1] == ""), (tau, texts)
        for answer in answers:
            if answer["text"] == "":
                assert answer["start"] == answer["end"] == -1
            assert answer["null_score"] == pytest.approx(2 * CLS_SCORE, abs=1e-3)


def test_the_exported_signature_answers_as_predict_spans(controlled, tmp_path):
    # NumPy scalars are accepted and recorded in the JSON metadata as the numbers they hold.
    path = controlled.export(tmp_path / "qa", stride=np.int64(4), null_score_threshold=np.float32(-1.0))
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    questions = ["where is the gold?", "where is the gold?", "where?", "?"]
    contexts = [long_context("Go\u0301ld"), "the old red house.", "naïve GÓLD key", ""]
    outputs = {k: v.numpy() for k, v in served(question=tf.constant(questions), context=tf.constant(contexts)).items()}
    expected = controlled.predict_spans(questions, contexts, stride=4, null_score_threshold=-1.0)
    assert [a.decode() for a in outputs["answer"]] == [e["text"] for e in expected] == ["Go\u0301ld", "", "GÓLD", ""]
    assert outputs["start"].tolist() == [e["start"] for e in expected]
    assert outputs["end"].tolist() == [e["end"] for e in expected]
    np.testing.assert_allclose(outputs["score"], [e["score"] for e in expected], rtol=1e-5)
    np.testing.assert_allclose(outputs["null_score"], [e["null_score"] for e in expected], rtol=1e-5)
    assert read_export_metadata(path)["serving_options"] == {"stride": 4, "null_score_threshold": -1.0}
    with pytest.raises(ValueError, match="Unknown export option\\(s\\) strides.*null_score_threshold, stride"):
        controlled.export(tmp_path / "typo", strides=4)
    with pytest.raises(ValueError, match="stride=16 leaves no room"):
        controlled.export(tmp_path / "bad", stride=16)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stride": 0}, "`stride` must be a positive integer"),
        ({"stride": -4}, "`stride` must be a positive integer"),
        ({"stride": 2.5}, "`stride` must be a positive integer"),
        ({"stride": True}, "`stride` must be a positive integer"),
        ({"stride": 16}, "stride=16 leaves no room for the question.*Use stride <= 12"),
        ({"stride": 13}, "stride=13 leaves no room"),
        ({"max_answer_length": 0}, "`max_answer_length` must be a positive integer"),
        ({"max_answer_length": 2.0}, "`max_answer_length` must be a positive integer"),
        ({"null_score_threshold": "0"}, "`null_score_threshold` must be a finite number"),
        ({"null_score_threshold": float("nan")}, "`null_score_threshold` must be a finite number"),
        ({"null_score_threshold": True}, "`null_score_threshold` must be a finite number"),
    ],
)
def test_bad_window_arguments(controlled, kwargs, message):
    with pytest.raises(ValueError, match=message):
        controlled.predict_spans([QUESTION], [CONTEXT], **kwargs)


def test_numpy_integers_are_integers(controlled):
    plain = controlled.predict_spans([QUESTION], [CONTEXT], stride=4, max_answer_length=3)
    numpy = controlled.predict_spans([QUESTION], [CONTEXT], stride=np.int64(4), max_answer_length=np.int32(3))
    assert numpy == plain
    assert window_stride(16, np.int64(12)) == 12 and type(window_stride(16, np.int64(12))) is int
    with pytest.raises(ValueError, match="`stride` must be a positive integer"):
        window_stride(16, np.bool_(True))


def test_window_stride_default_and_limits():
    assert window_stride(384) == DEFAULT_STRIDE == 128  # BERT's SQuAD setting: 384 tokens, doc stride 128.
    assert window_stride(128) == 62 and window_stride(16) == 6 and window_stride(16, 12) == 12
    with pytest.raises(ValueError, match="too short for context windows"):
        window_stride(4)
    with pytest.raises(ValueError, match="Got 2 questions but 1 contexts"):
        controlled_model().predict_spans([QUESTION, QUESTION], [CONTEXT])
