"""Pre-training data: BERT's masked-LM masking and sentence-pair labels.

Label conventions follow the original BERT / ALBERT code (and Hugging Face),
so converted pre-training heads keep their meaning: sentence label 0 means
"B really follows A" (next sentence / original order), 1 means "B is a random
sentence" (NSP) or "A and B were swapped" (SOP).
"""

import math
import numbers
import random

import keras
import numpy as np

from bertzoo.utils import private_api
from bertzoo.utils.optional import tf

SENTENCE_OBJECTIVES = ("nsp", "sop")
# Label of positions that carry no target (padding, [CLS]/[SEP], later
# sub-tokens of a word, unused masked-LM slots). The task losses skip it
# through `SparseCategoricalCrossentropy(ignore_class=IGNORE_LABEL)`.
IGNORE_LABEL = -100


def _check_rate(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"`{name}` must be a number in [0, 1], got {value!r}.")
    return float(value)


def check_masking(selection_rate, mask_token_rate, random_token_rate, max_selections, names=None):
    """Checks masked-LM settings, raising ValueError naming the bad one:
    rates in [0, 1] whose replacement shares sum to at most 1, and
    `max_selections` a positive integer (None allowed: the default). `names`
    maps the argument names to the caller's (e.g. `masking_rate`)."""
    names = {"selection_rate": "selection_rate", "max_selections": "max_selections", **(names or {})}
    _check_rate(names["selection_rate"], selection_rate)
    _check_rate("mask_token_rate", mask_token_rate)
    _check_rate("random_token_rate", random_token_rate)
    if mask_token_rate + random_token_rate > 1 + 1e-9:
        raise ValueError(
            f"`mask_token_rate` + `random_token_rate` = {mask_token_rate + random_token_rate} "
            "exceeds 1; the remainder is the share of chosen tokens left unchanged."
        )
    if max_selections is not None and (
        isinstance(max_selections, bool) or not isinstance(max_selections, numbers.Integral) or max_selections < 1
    ):
        raise ValueError(
            f"`{names['max_selections']}` must be a positive integer or None (the default), got {max_selections!r}."
        )


@keras.saving.register_keras_serializable(package="bertzoo")
class BertMaskGenerator(keras.layers.Layer):
    """Masks packed token ids for masked-LM training, by BERT's rule.

    In each sequence, `round(selection_rate * n)` of the `n` selectable tokens
    (at least one, at most `max_selections`) are chosen uniformly at random;
    tokens in `unselectable_token_ids` (padding, `[CLS]`, `[SEP]`) are never
    chosen. (BERT's `create_pretraining_data.py` counts `[CLS]` and `[SEP]` in
    `n`, so where `selection_rate * n` sits near a half it may choose one
    token more than this layer.) Of the chosen tokens, a fraction `mask_token_rate` becomes
    `[MASK]`, `random_token_rate` becomes a token drawn uniformly from the
    vocabulary, and the rest stay unchanged (80/10/10 by default).

    Why not `keras_hub.layers.MaskedLMMaskGenerator`: it selects
    `ceil(rate * n)` tokens (20% of a 10-token sentence instead of BERT's
    15%), and draws from unseeded random ops, so masks cannot be reproduced.
    This layer is vectorized over dense batches and, given `seed`, stateless.

    Args:
        vocabulary_size: random replacements are drawn from `[0, vocabulary_size)`.
        mask_token_id: id of `[MASK]`.
        unselectable_token_ids: ids never chosen for prediction.
        selection_rate: fraction of selectable tokens to predict.
        mask_token_rate: fraction of chosen tokens replaced by `[MASK]`.
        random_token_rate: fraction of chosen tokens replaced by a random token.
        max_selections: prediction slots per sequence (the padded length of
            `mask_positions`).
        seed: seed of the random stream used when `call` gets no `seed`.

    `call(token_ids, seed=None, max_selections=None)` takes int ids of shape
    `(batch, length)` (or one `(length,)` sequence; `max_selections` replaces
    the layer's for this call) and returns a dict: `token_ids` (masked),
    `mask_positions` (int32, `(batch, max_selections)`, ascending, 0 in unused
    slots) and `mask_labels` (the original ids there, `-100` in unused slots,
    which the masked-LM loss ignores). `seed`, a shape-`(2,)` int tensor,
    makes the result a pure function of the inputs.

    Example:
    ```python
    masker = BertMaskGenerator(vocabulary_size=100, mask_token_id=4,
                               unselectable_token_ids=[0, 2, 3], max_selections=4)
    out = masker([[2, 17, 25, 31, 3, 0]], seed=[1, 2])
    out["mask_positions"].shape
    # TensorShape([1, 4])
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        mask_token_id,
        unselectable_token_ids=(0,),
        selection_rate=0.15,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        max_selections=20,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        private_api.accept_raw_inputs(self)
        if (
            isinstance(vocabulary_size, bool)
            or not isinstance(vocabulary_size, numbers.Integral)
            or vocabulary_size < 1
        ):
            raise ValueError(f"`vocabulary_size` must be a positive integer, got {vocabulary_size!r}.")
        if not 0 <= int(mask_token_id) < vocabulary_size:
            raise ValueError(f"`mask_token_id`={mask_token_id} is outside [0, {vocabulary_size}).")
        if max_selections is None:
            raise ValueError("`max_selections` must be a positive integer, got None.")
        check_masking(selection_rate, mask_token_rate, random_token_rate, max_selections)
        self.selection_rate = float(selection_rate)
        self.mask_token_rate = float(mask_token_rate)
        self.random_token_rate = float(random_token_rate)
        self.vocabulary_size = int(vocabulary_size)  # NumPy integers are not JSON.
        self.mask_token_id = int(mask_token_id)
        self.unselectable_token_ids = sorted(int(i) for i in unselectable_token_ids)
        self.max_selections = int(max_selections)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"`seed` must be an integer or None, got {seed!r}.")
        self.seed = None if seed is None else int(seed)
        # Without an explicit seed, draw one from Python's `random`, which
        # `keras.utils.set_random_seed` seeds: runs stay reproducible.
        self._generator = tf.random.Generator.from_seed(self.seed if seed is not None else random.getrandbits(62))
        self.built = True

    def draw_seed(self):
        """The next seed of this layer's stream (`seed` at construction): a
        shape-(2,) int64 tensor for `call`."""
        return self._generator.make_seeds(1)[:, 0]

    def call(self, token_ids, seed=None, max_selections=None):
        if isinstance(token_ids, tf.RaggedTensor):
            raise ValueError(
                "BertMaskGenerator expects dense token ids of shape (batch, length), got a RaggedTensor: pad it "
                "first (e.g. `token_ids.to_tensor()`, or pack with BertPreprocessor)."
            )
        if max_selections is not None:
            check_masking(self.selection_rate, self.mask_token_rate, self.random_token_rate, max_selections)
        token_ids = tf.cast(tf.convert_to_tensor(token_ids), tf.int32)
        unbatched = token_ids.shape.rank == 1
        if unbatched:
            token_ids = token_ids[tf.newaxis]
        if token_ids.shape.rank != 2:
            raise ValueError(f"BertMaskGenerator expects token ids of shape (batch, length), got {token_ids.shape}.")
        if token_ids.shape[1] == 0:
            raise ValueError("BertMaskGenerator got sequences of length 0: there is nothing to mask.")
        if seed is None:
            seed = self.draw_seed()
        else:
            seed = tf.cast(seed, tf.int64)
            if not seed.shape.is_compatible_with([2]):
                raise ValueError(
                    f"`seed` must be a stateless seed of shape (2,), e.g. [7, 0], got shape {seed.shape.as_list()}. "
                    "(An integer seed of the layer's own stream goes to the constructor: seed=7.)"
                )
        select_seed, action_seed, token_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
        shape = tf.shape(token_ids)
        batch, length = shape[0], shape[1]
        slots = self.max_selections if max_selections is None else max_selections

        selectable = tf.reduce_all(
            tf.not_equal(token_ids[..., tf.newaxis], tf.constant(self.unselectable_token_ids or [-1])), axis=-1
        )
        available = tf.reduce_sum(tf.cast(selectable, tf.float64), axis=1)
        # BERT: max(1, round(n * rate)) capped at the slots (n: the selectable
        # tokens here); tf.round rounds half to even, as Python's round() does
        # in the reference code. In float64 as there: float32's 0.15 is a bit
        # more than 0.15, so n = 190 would give round(28.5000001) = 29, not 28.
        count = tf.maximum(tf.ones_like(available), tf.round(available * self.selection_rate))
        count = tf.where(available > 0, tf.minimum(count, tf.cast(slots, tf.float64)), tf.zeros_like(count))
        count = tf.cast(count, tf.int32)

        # A random order of the selectable positions (others sort last); the
        # first `count` of them are chosen.
        scores = tf.random.stateless_uniform(shape, select_seed)
        scores = tf.where(selectable, scores, 2.0)
        order = tf.argsort(scores, axis=1, stable=True)[:, :slots]
        order = tf.pad(order, [[0, 0], [0, slots - tf.shape(order)[1]]])
        used = tf.range(slots)[tf.newaxis, :] < count[:, tf.newaxis]
        positions = tf.sort(tf.where(used, order, length), axis=1)  # Chosen ones first, ascending.
        used = positions < length
        positions = tf.where(used, positions, 0)

        original = tf.gather(token_ids, positions, batch_dims=1)
        action = tf.random.stateless_uniform((batch, slots), action_seed)
        random_ids = tf.random.stateless_uniform(
            (batch, slots), token_seed, minval=0, maxval=self.vocabulary_size, dtype=tf.int32
        )
        replacement = tf.where(
            action < self.mask_token_rate,
            self.mask_token_id,
            tf.where(action < self.mask_token_rate + self.random_token_rate, random_ids, original),
        )
        # Write the replacements back: (batch, slots, length) one-hot of the
        # chosen positions, zero for unused slots.
        hit = tf.one_hot(positions, length, dtype=tf.int32) * tf.cast(used, tf.int32)[..., tf.newaxis]
        chosen = tf.reduce_max(hit, axis=1) > 0
        written = tf.reduce_sum(hit * replacement[..., tf.newaxis], axis=1)
        masked = tf.where(chosen, written, token_ids)
        out = {
            "token_ids": masked,
            "mask_positions": positions,
            "mask_labels": tf.where(used, original, IGNORE_LABEL),
        }
        if unbatched:
            out = {k: v[0] for k, v in out.items()}
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "mask_token_id": self.mask_token_id,
                "unselectable_token_ids": list(self.unselectable_token_ids),
                "selection_rate": self.selection_rate,
                "mask_token_rate": self.mask_token_rate,
                "random_token_rate": self.random_token_rate,
                "max_selections": self.max_selections,
                "seed": self.seed,
            }
        )
        return config


def default_max_selections(sequence_length, selection_rate=0.15):
    """Prediction slots that never cap BERT's count: `ceil(rate * length)`
    (20 for 128 tokens, as BERT used)."""
    return max(1, math.ceil(selection_rate * sequence_length))


def sentence_pairs(documents, objective="nsp", seed=None):
    """Builds sentence-pair examples for BERT's NSP or ALBERT's SOP objective.

    Every two consecutive sentences `(a, b)` of a document give one example.
    `"nsp"`: with probability 1/2 the pair is kept (label 0, "b is next"),
    otherwise `b` is replaced by a random sentence of another document
    (label 1). `"sop"`: with probability 1/2 the pair is kept (label 0),
    otherwise it is swapped to `(b, a)` (label 1).

    Args:
        documents: a list of documents, each a list of sentence strings.
        objective: `"nsp"` or `"sop"`.
        seed: seed of the NumPy generator (None: fresh randomness).

    Returns:
        `(first, second, labels)`: two lists of strings and an int32 array.

    Example:
    ```python
    docs = [["The cat sat.", "It purred.", "Then it slept."],
            ["Rain fell.", "The river rose."]]
    first, second, labels = sentence_pairs(docs, "sop", seed=0)
    labels.tolist()  # 1 where the pair was swapped.
    # [1, 0, 0]
    pretrainer.fit((first, second), labels)  # a BertPretrainer(sentence_objective="sop")
    ```
    """
    if objective not in SENTENCE_OBJECTIVES:
        raise ValueError(f"Unknown `objective` {objective!r}: use 'nsp' (next sentence) or 'sop' (sentence order).")
    if isinstance(documents, (str, bytes)) or not isinstance(documents, (list, tuple)):
        raise ValueError("`documents` must be a list of documents, each a list of sentence strings.")
    for i, document in enumerate(documents):
        if isinstance(document, (str, bytes)) or not isinstance(document, (list, tuple)):
            raise ValueError(
                f"Document {i} is a {type(document).__name__}, not a list of sentences. Pass "
                "documents=[[sentence, sentence, ...], ...] (split each document into sentences)."
            )
        for sentence in document:
            if not isinstance(sentence, str):
                raise ValueError(f"Document {i} holds a {type(sentence).__name__}; sentences must be strings.")
    if objective == "nsp" and sum(1 for d in documents if d) < 2:
        raise ValueError("NSP needs at least two non-empty documents: random next sentences come from another one.")
    rng = np.random.default_rng(seed)
    others = [i for i, d in enumerate(documents) if d]
    first, second, labels = [], [], []
    for index, document in enumerate(documents):
        for a, b in zip(document[:-1], document[1:]):
            if rng.random() < 0.5:
                first.append(a)
                second.append(b)
                labels.append(0)
            elif objective == "sop":
                first.append(b)
                second.append(a)
                labels.append(1)
            else:
                first.append(a)
                second.append(_random_sentence(documents, others, index, rng))
                labels.append(1)
    if not labels:
        raise ValueError("No document has two consecutive sentences, so there are no pairs to build.")
    return first, second, np.asarray(labels, dtype="int32")


def _random_sentence(documents, candidates, exclude, rng):
    """A uniformly random sentence of a random non-empty document other than `exclude`."""
    while True:  # `candidates` holds `exclude` and at least one other document.
        choice = candidates[rng.integers(len(candidates))]
        if choice != exclude:
            document = documents[choice]
            return document[rng.integers(len(document))]
