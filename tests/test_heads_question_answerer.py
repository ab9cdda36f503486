"""BertQuestionAnswerer: span labels, masked logits, loss, decoding, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.models.bert_question_answerer import decode_spans
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer

FILLER = ["the", "tower", "was", "finished", "in", "a", "river", "near", "old", "town", "red", "house"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "when", "where", "is", "1889", ".", "?", "gold", "##en",
         "key"] + FILLER
QUESTION = "When was the tower finished?"
CONTEXT = "The tower was finished in 1889."


def tiny_model(sequence_length=16, mask_question=True):
    backbone = bertzoo.BertBackbone(vocabulary_size=len(VOCAB), num_layers=2, hidden_dim=32, num_heads=2,
                                    intermediate_dim=64, max_sequence_length=32)
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
        model, [QUESTION] * 3, [CONTEXT] * 3,
        [(start, start + 4), (CONTEXT.index("finished"), start + 4), (0, 9)],
    )
    # [CLS] when was the tower finished ? [SEP] the tower was finished in 1889 . [SEP]
    #   0    1    2   3    4      5      6   7    8    9    10    11     12  13  14  15
    assert features["token_ids"][0].tolist() == [2, 5, 16, 14, 15, 17, 10, 3, 14, 15, 16, 17, 18, 8, 9, 3]
    assert positions.tolist() == [[13, 13], [11, 13], [8, 9]]


def test_truncation_keeps_the_question_and_drops_lost_answers():
    model = tiny_model(sequence_length=12)
    start = CONTEXT.index("1889")
    features, positions = labelled_batch(model, [QUESTION] * 2, [CONTEXT] * 2,
                                         [(start, start + 4), (CONTEXT.index("tower"), CONTEXT.index("tower") + 5)])
    # Budget 9: the 6 question tokens stay whole, the context keeps "the tower was".
    assert features["token_ids"][0].tolist() == [2, 5, 16, 14, 15, 17, 10, 3, 14, 15, 16, 3]
    assert positions.tolist() == [[0, 0], [9, 9]]  # 1889 was cut off: the label points at [CLS].


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
    features, positions = labelled_batch(model, [QUESTION] * 2, [CONTEXT] * 2,
                                         [(start, start + 4), (CONTEXT.index("tower"), start)])
    logits = np.asarray(model(features, training=False), "float64")
    loss = model.compute_loss(x=features, y=positions, y_pred=model(features, training=False))

    def cross_entropy(z, label):
        z = z - z.max()
        return np.log(np.exp(z).sum()) - z[label]

    start_loss = np.mean([cross_entropy(logits[b, 0], positions[b, 0]) for b in range(2)])
    end_loss = np.mean([cross_entropy(logits[b, 1], positions[b, 1]) for b in range(2)])
    assert float(loss) == pytest.approx((start_loss + end_loss) / 2, rel=1e-5)


def test_decode_spans_matches_brute_force(rng):
    logits = rng.normal(0, 2, (6, 2, 12))
    logits[:, :, 9:] = -1e9  # Padding.
    logits[2, :, 1:] = -1e9  # Nothing but [CLS] allowed.
    starts, ends, scores = decode_spans(logits, max_answer_length=3)
    for b in range(6):
        best = (-np.inf, 0, 0)
        for i in range(1, 12):
            for j in range(i, min(i + 3, 12)):
                if logits[b, 0, i] > -1e8 and logits[b, 1, j] > -1e8:
                    best = max(best, (logits[b, 0, i] + logits[b, 1, j], i, j))
        assert (scores[b], starts[b], ends[b]) == pytest.approx(best) if np.isfinite(best[0]) else (
            starts[b] == ends[b] == 0 and scores[b] == -np.inf)
    with pytest.raises(ValueError, match="max_answer_length"):
        decode_spans(logits, max_answer_length=0)


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
    history = model.fit(x, spans, batch_size=16, epochs=4, verbose=0).history
    return model, history


def test_training_finds_the_answers(trained):
    model, history = trained
    assert history["loss"][-1] < 0.3 * history["loss"][0]
    (questions, contexts), spans = synthetic_qa(24, seed=1)
    answers = model.predict_spans(questions, contexts)
    expected = [c[s:e].lower() for c, (s, e) in zip(contexts, spans)]
    assert np.mean([a["text"] == e for a, e in zip(answers, expected)]) > 0.8
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
    with pytest.raises(ValueError, match="not inside its context"):
        model.fit(([QUESTION], [CONTEXT]), [(3, 99)], verbose=0)
    with pytest.raises(ValueError, match="shape \\(1, 2\\)"):
        model.fit(([QUESTION], [CONTEXT]), [3], verbose=0)
    with pytest.raises(ValueError, match="tuple \\(questions, contexts\\)"):
        model.fit([QUESTION], [(0, 3)], verbose=0)
