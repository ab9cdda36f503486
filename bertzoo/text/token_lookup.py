"""Vocabulary look-ups shared by bertzoo's tokenizers."""

import types

import keras

from bertzoo.utils.optional import tf


class TokenLookupMixin:
    """Id <-> token look-ups and the special-token ids of a tokenizer that
    keeps its vocabulary in `self._vocabulary` (a tuple, in id order) and
    `self._token_to_id` (a mapping); the class names its special tokens
    (`PAD_TOKEN`, `UNK_TOKEN`, `CLS_TOKEN`, `SEP_TOKEN`, `MASK_TOKEN`)."""

    PAD_TOKEN = UNK_TOKEN = CLS_TOKEN = SEP_TOKEN = MASK_TOKEN = None

    def _store_vocabulary(self, vocabulary, token_to_id):
        """Keeps `vocabulary` (tokens in id order) and `token_to_id` as
        immutable containers. Set past Keras's and TensorFlow's attribute
        tracking: they hold strings only, and tracking walks every element
        (about 80 ms per tokenizer of BERT's 30,522 tokens, paid by every
        `from_preset`)."""
        object.__setattr__(self, "_vocabulary", tuple(vocabulary))
        object.__setattr__(self, "_token_to_id", types.MappingProxyType(dict(token_to_id)))

    def call(self, inputs):
        return self.tokenize(inputs)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(tuple(inputs.shape) + (None,), dtype="int32", ragged=True)

    def vocabulary_size(self):
        """Number of tokens in the vocabulary."""
        return len(self._vocabulary)

    def get_vocabulary(self):
        """The vocabulary as a list of strings (a copy), in id order."""
        return list(self._vocabulary)

    def token_to_id(self, token):
        """Id of `token`; ValueError if it is not in the vocabulary."""
        try:
            return self._token_to_id[token]
        except (KeyError, TypeError):
            raise ValueError(f"Token {token!r} is not in the vocabulary.") from None

    def id_to_token(self, id):
        """Token string for integer `id`; ValueError if out of range."""
        if isinstance(id, bool) or not hasattr(id, "__index__"):
            raise ValueError(f"`id` must be an integer, got {id!r}.")
        id = int(id)
        if not 0 <= id < len(self._vocabulary):
            raise ValueError(f"`id` must be in [0, {len(self._vocabulary) - 1}], got {id}.")
        return self._vocabulary[id]

    @property
    def pad_token_id(self):
        return self._token_to_id[self.PAD_TOKEN]

    @property
    def unk_token_id(self):
        return self._token_to_id[self.UNK_TOKEN]

    @property
    def cls_token_id(self):
        return self._token_to_id[self.CLS_TOKEN]

    @property
    def sep_token_id(self):
        return self._token_to_id[self.SEP_TOKEN]

    @property
    def mask_token_id(self):
        return self._token_to_id[self.MASK_TOKEN]

    @staticmethod
    def _check_text_options(strip_accents, **flags):
        """The constructor checks of the True/False options and `strip_accents`."""
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False, got {value!r}.")
        if strip_accents is not None and not isinstance(strip_accents, bool):
            raise ValueError(
                f"`strip_accents` must be True, False or None (follow `lowercase`), got {strip_accents!r}."
            )

    def _checked_ids(self, ids):
        """`ids` for `detokenize`: an int32 tensor (ragged for a nested
        list) of rank >= 1, with every id in the vocabulary (checked when
        running eagerly)."""
        if not isinstance(ids, (tf.Tensor, tf.RaggedTensor)):
            if isinstance(ids, (list, tuple)) and any(isinstance(x, (list, tuple)) for x in ids):
                ids = tf.ragged.constant(ids, dtype=tf.int64)
            elif isinstance(ids, (list, tuple)) and not ids:
                ids = tf.zeros((0,), tf.int32)  # An empty sequence: "" (its dtype would default to float).
            else:
                ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ValueError(f"`detokenize` expects integer token ids, got {ids.dtype.name}.")
        if ids.shape.rank == 0:
            raise ValueError("`detokenize` expects a sequence of ids, got a scalar.")
        # Checked before the cast to int32, which would wrap large ids into range.
        flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        size = len(self._vocabulary)
        if tf.executing_eagerly():
            if tf.size(flat) > 0:
                low, high = int(tf.reduce_min(flat)), int(tf.reduce_max(flat))
                if low < 0 or high >= size:
                    raise ValueError(f"Token ids must be in [0, {size - 1}], got values in [{low}, {high}].")
        else:
            # In a graph (a tf.data map, an exported signature) the detokenizer
            # ops would read past their table: a segmentation fault, not an error.
            wide = tf.cast(flat, tf.int64)
            message = f"Token ids must be in [0, {size - 1}]"
            checks = [
                tf.debugging.assert_non_negative(wide, message=message),
                tf.debugging.assert_less(wide, tf.constant(size, tf.int64), message=message),
            ]
            with tf.control_dependencies(checks):
                flat = tf.identity(flat)
            ids = ids.with_flat_values(flat) if isinstance(ids, tf.RaggedTensor) else flat
        return tf.cast(ids, tf.int32)
