"""BERT masking (BertMaskGenerator) and NSP / SOP pair building (sentence_pairs)."""

import numpy as np
import pytest
import tensorflow as tf

import bertzoo
from bertzoo.text.pretraining import default_max_selections

PAD, CLS, SEP, MASK = 0, 2, 3, 4
VOCAB = 1000


def packed_batch(rng, batch=2000, length=64):
    """Random `[CLS] a [SEP] b [SEP] pad...` rows with varied lengths."""
    ids = rng.integers(5, VOCAB, (batch, length)).astype("int32")
    for row in ids:
        real = rng.integers(4, length + 1)
        split = rng.integers(1, real - 2)
        row[0] = CLS
        row[split] = SEP
        row[real - 1] = SEP
        row[real:] = PAD
    return ids


@pytest.fixture(scope="module")
def masked():
    rng = np.random.default_rng(7)
    ids = packed_batch(rng)
    masker = bertzoo.BertMaskGenerator(
        vocabulary_size=VOCAB, mask_token_id=MASK, unselectable_token_ids=[PAD, CLS, SEP, MASK], max_selections=12
    )
    out = {k: v.numpy() for k, v in masker(ids, seed=[3, 4]).items()}
    return masker, ids, out


def test_selection_count_follows_bert_rule(masked):
    _, ids, out = masked
    eligible = ~np.isin(ids, [PAD, CLS, SEP, MASK])
    n = eligible.sum(1)
    expected = np.minimum(12, np.maximum(1, np.round(n * 0.15))).astype(
        int
    )  # np.round: half to even, as BERT's round()
    used = out["mask_labels"] != -100
    np.testing.assert_array_equal(used.sum(1), expected)
    # Over all sequences the share of selectable tokens chosen is ~15%.
    assert abs(used.sum() / n.sum() - 0.15) < 0.01


def test_specials_never_chosen_and_positions_are_consistent(masked):
    _, ids, out = masked
    used = out["mask_labels"] != -100
    positions = out["mask_positions"]
    rows = np.arange(len(ids))[:, None]
    chosen_original = ids[rows, positions]
    assert not np.isin(chosen_original[used], [PAD, CLS, SEP, MASK]).any()
    np.testing.assert_array_equal(out["mask_labels"][used], chosen_original[used])
    assert (positions[~used] == 0).all()
    for row_positions, row_used in zip(positions, used):
        real = row_positions[row_used]
        assert (np.diff(real) > 0).all()  # Unique and ascending.
    # Tokens outside the chosen positions are untouched.
    changed = out["token_ids"] != ids
    chosen = np.zeros_like(changed)
    chosen[np.nonzero(used)[0], positions[used]] = True
    assert not (changed & ~chosen).any()


def test_replacements_are_80_10_10(masked):
    _, ids, out = masked
    used = out["mask_labels"] != -100
    rows = np.arange(len(ids))[:, None]
    after = out["token_ids"][rows, out["mask_positions"]][used]
    before = out["mask_labels"][used]
    total = used.sum()
    assert total > 9000  # Tolerances below are > 3 standard deviations.
    to_mask = np.mean(after == MASK)
    kept = np.mean(after == before)
    to_random = np.mean((after != MASK) & (after != before))
    # Random draws hit the original token (or [MASK]) with probability 2/VOCAB.
    assert abs(to_mask - 0.8) < 0.015
    assert abs(to_random - 0.1) < 0.01
    assert abs(kept - 0.1) < 0.01
    # Random replacements are spread over the vocabulary.
    assert len(np.unique(after[(after != MASK) & (after != before)])) > 500


def test_seeded_masks_are_reproducible(masked):
    masker, ids, out = masked
    again = masker(ids, seed=[3, 4])
    np.testing.assert_array_equal(again["token_ids"].numpy(), out["token_ids"])
    other = masker(ids, seed=[3, 5])
    assert (other["token_ids"].numpy() != out["token_ids"]).any()
    # Without a seed, successive calls draw fresh masks.
    first, second = masker(ids[:50]), masker(ids[:50])
    assert (first["mask_positions"].numpy() != second["mask_positions"].numpy()).any()


def test_short_sequences_and_single_rows():
    masker = bertzoo.BertMaskGenerator(
        vocabulary_size=50,
        mask_token_id=MASK,
        unselectable_token_ids=[PAD, CLS, SEP],
        max_selections=5,
        mask_token_rate=1.0,
        random_token_rate=0.0,
    )
    out = masker([CLS, 17, SEP, PAD], seed=[0, 1])  # One selectable token: it is always chosen.
    assert out["token_ids"].numpy().tolist() == [CLS, MASK, SEP, PAD]
    assert out["mask_positions"].numpy().tolist() == [1, 0, 0, 0, 0]
    assert out["mask_labels"].numpy().tolist() == [17, -100, -100, -100, -100]
    nothing = masker([[CLS, SEP, PAD]], seed=[0, 1])  # Nothing selectable, slots wider than the row.
    assert nothing["mask_labels"].numpy().tolist() == [[-100] * 5]
    assert default_max_selections(128) == 20


@pytest.mark.parametrize("selectable", [20, 190, 350, 670])
def test_masker_selects_round_of_the_rate_times_the_selectable_tokens_as_python_does(selectable):
    # 0.15 * 190 = 28.499999999999996 in Python (BERT's reference code): 28. In float32 it read as 28.5000001: 29.
    masker = bertzoo.BertMaskGenerator(
        vocabulary_size=50, mask_token_id=MASK, unselectable_token_ids=[PAD], max_selections=200, seed=3
    )
    out = masker([[17] * selectable + [PAD] * 4])
    assert int((out["mask_labels"].numpy() != -100).sum()) == max(1, round(selectable * 0.15))


def test_masker_runs_in_tf_data():
    masker = bertzoo.BertMaskGenerator(
        vocabulary_size=VOCAB, mask_token_id=MASK, unselectable_token_ids=[PAD, CLS, SEP], max_selections=4, seed=1
    )
    ids = packed_batch(np.random.default_rng(0), batch=8, length=16)
    dataset = tf.data.Dataset.from_tensor_slices(ids).batch(4).map(lambda x: masker(x))
    batches = list(dataset)
    assert batches[0]["mask_positions"].shape == (4, 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mask_token_rate": 0.8, "random_token_rate": 0.3}, "exceeds 1"),
        ({"selection_rate": 1.5}, "selection_rate"),
        ({"mask_token_id": 99}, "outside"),
        ({"max_selections": 0}, "max_selections"),
        ({"seed": "7"}, "`seed` must be an integer or None, got '7'"),
        ({"seed": 1.5}, "`seed` must be an integer"),
    ],
)
def test_masker_rejects_bad_settings(kwargs, message):
    settings = dict(vocabulary_size=50, mask_token_id=MASK)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=message):
        bertzoo.BertMaskGenerator(**settings)


def test_masker_takes_numpy_integers_and_keeps_a_json_config():
    import json

    masker = bertzoo.BertMaskGenerator(np.int64(50), MASK, max_selections=np.int32(3), seed=np.int64(4))
    config = json.loads(json.dumps(masker.get_config()))
    assert (config["vocabulary_size"], config["max_selections"], config["seed"]) == (50, 3, 4)


DOCUMENTS = [[f"doc{d} sentence{s}" for s in range(n)] for d, n in enumerate([5, 1, 8, 0, 4, 6])]


def locate(sentence):
    d, s = sentence.split()
    return int(d[3:]), int(s[8:])


def test_nsp_pairs_are_labelled_by_construction():
    first, second, labels = bertzoo.sentence_pairs(DOCUMENTS, "nsp", seed=0)
    assert len(first) == len(second) == len(labels) == sum(max(len(d) - 1, 0) for d in DOCUMENTS)
    for a, b, label in zip(first, second, labels):
        (da, sa), (db, sb) = locate(a), locate(b)
        if label == 0:
            assert (db, sb) == (da, sa + 1)
        else:
            assert db != da  # A sentence from another document.
    many = bertzoo.sentence_pairs(DOCUMENTS * 50, "nsp", seed=1)[2]
    assert abs(many.mean() - 0.5) < 0.05
    # Every original pair appears once, in order, as the first sentence.
    assert [locate(a) for a in first] == [(d, s) for d, doc in enumerate(DOCUMENTS) for s in range(len(doc) - 1)]


def test_sop_pairs_are_labelled_by_construction():
    first, second, labels = bertzoo.sentence_pairs(DOCUMENTS, "sop", seed=0)
    assert set(labels.tolist()) == {0, 1}
    for a, b, label in zip(first, second, labels):
        (da, sa), (db, sb) = locate(a), locate(b)
        assert da == db
        assert sb == (sa + 1 if label == 0 else sa - 1)
    again = bertzoo.sentence_pairs(DOCUMENTS, "sop", seed=0)
    assert again[0] == first and (again[2] == labels).all()


@pytest.mark.parametrize(
    "documents, objective, message",
    [
        (["one sentence. another one."], "nsp", "not a list of sentences"),
        ([["a", "b", "c"]], "nsp", "at least two non-empty documents"),
        ([["a"], ["b"]], "sop", "no pairs"),
        ([["a", "b"]], "mlm", "Unknown `objective`"),
        ([["a", 3]], "sop", "must be strings"),
    ],
)
def test_sentence_pairs_errors(documents, objective, message):
    with pytest.raises(ValueError, match=message):
        bertzoo.sentence_pairs(documents, objective)


def test_masker_refuses_ragged_and_empty_sequences_and_takes_slots_per_call():
    masker = bertzoo.BertMaskGenerator(
        vocabulary_size=VOCAB, mask_token_id=MASK, unselectable_token_ids=[PAD, CLS, SEP], max_selections=4, seed=1
    )
    with pytest.raises(ValueError, match=r"got a RaggedTensor: pad it first \(e\.g\. `token_ids\.to_tensor\(\)`"):
        masker(tf.ragged.constant([[CLS, 17, SEP], [CLS, SEP]]))
    with pytest.raises(ValueError, match="length 0: there is nothing to mask"):
        masker(tf.zeros((2, 0), tf.int32))
    ids = [[CLS] + list(range(10, 40)) + [SEP]]
    out = masker(ids, seed=[0, 1], max_selections=9)
    assert out["mask_positions"].shape == (1, 9)
    assert int(np.sum(out["mask_labels"].numpy() != -100)) == round(0.15 * 30)  # 4 with the layer's 4 slots.
    with pytest.raises(ValueError, match="max_selections"):
        masker(ids, max_selections=0)
