"""BERT's text normalization and pre-tokenization, as TensorFlow string ops.

`pretokenize` cleans, lower-cases, strips accents and splits text into words
the way BERT's `BasicTokenizer` does (see `bertzoo.text.tokenizer` for where
the references disagree), inside `tf.data` graphs and exported SavedModels.
Used by the WordPiece tokenizer and by `build_vocabulary`.
"""

import math

import numpy as np

from bertzoo.utils import private_api
from bertzoo.utils.optional import tf
from bertzoo.utils.optional import tf_text

# RE2 patterns. Whitespace is what BERT's `_is_whitespace` accepts (tab, newline,
# carriage return, category Zs) plus the line/paragraph separators, which BERT's
# later `str.split()` also splits on.
_WHITESPACE = r"[\t\n\r\p{Zs}\x{2028}\x{2029}]"
# BERT's `_clean_text` deletes control and format characters outright (it does
# not split at them). Private-use characters (Co) are deleted too, as HF
# `tokenizers` does; the reference BERT code would map their word to [UNK].
_DELETED = r"[\p{Cc}\p{Cf}\p{Co}\x{FFFD}]"
# BERT counts every non-alphanumeric printable ASCII character as punctuation,
# plus everything in the Unicode P* categories.
_PUNCTUATION = r"[!-/:-@\[-`{-~\p{P}]"
# The ideograph blocks of BERT's `_is_chinese_char`; each becomes its own word.
_CJK = (
    r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
    r"\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"
)
_ACCENTS = r"\p{Mn}"


def pretokenize(text, lowercase=True, strip_accents=None, split_on_cjk=True):
    """Normalizes and splits strings into words the way BERT does.

    Args:
        text: string tensor of any rank (rank 0 is treated as a batch of one).
        lowercase: lower-case the text.
        strip_accents: NFD-decompose and drop combining marks (category Mn).
            `None` follows `lowercase`, like BERT uncased.
        split_on_cjk: make every CJK ideograph a word of its own.

    Returns:
        A `tf.RaggedTensor` of words with one more dimension than `text`.
    """
    text = tf.convert_to_tensor(text)
    if text.shape.rank == 0:
        text = tf.expand_dims(text, 0)
    return split_words(normalize(valid_utf8(text), lowercase, strip_accents), split_on_cjk)


def valid_utf8(text):
    """`text` with invalid UTF-8 replaced by U+FFFD (which `normalize`
    deletes), so raw byte input can never make the later Unicode ops fail."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


def normalize(text, lowercase=True, strip_accents=None):
    """BERT's cleaning of valid UTF-8 strings, elementwise: whitespace becomes
    " ", control and format characters are deleted, then (optionally)
    lower-casing and accent stripping.

    Every step maps characters one by one (without context), so normalizing
    each character alone and joining the results gives the normalized string:
    `BertTokenizer.tokenize_with_offsets` relies on this to map tokens back to
    characters of the original text.
    """
    if strip_accents is None:
        strip_accents = lowercase
    # Order matters: tab/newline/CR are control characters too, so they must
    # become spaces before control characters are deleted.
    text = tf.strings.regex_replace(text, _WHITESPACE, " ")
    text = tf.strings.regex_replace(text, _DELETED, "")
    if lowercase:
        # Per-character lower-casing as in HF `tokenizers`: ICU (like Python's
        # `str.lower()`) would turn a word-final capital sigma into final "ς",
        # HF always gives "σ", so map it first. Not `tf_text.case_fold_utf8`:
        # that is NFKC case folding ("ß" -> "ss", "ﬁ" -> "fi", re-composes
        # Hangul jamo).
        text = tf.strings.regex_replace(text, "\u03a3", "\u03c3")
        text = tf.strings.lower(text, encoding="utf-8")
    if strip_accents:
        text = tf_text.normalize_utf8(text, "NFD")
        text = tf.strings.regex_replace(text, _ACCENTS, "")
    return text


def split_words(text, split_on_cjk=True, with_offsets=False):
    """Normalized strings -> words (a ragged tensor with one more dimension):
    split at spaces, punctuation and (with `split_on_cjk`) CJK ideographs,
    which are words of their own. `with_offsets`: also the words' byte
    offsets `(starts, ends)` in `text`."""
    keep = f"{_PUNCTUATION}|{_CJK}" if split_on_cjk else _PUNCTUATION
    return regex_split(text, f" |{keep}", keep, with_offsets)


def regex_split(text, delim_regex_pattern, keep_delim_regex_pattern="", with_offsets=False):
    """tf-text's `regex_split` (`with_offsets`: `regex_split_with_offsets`)
    without its ragged-tensor validation: the op's row splits are valid by
    construction, and each check is a graph branch that every `tf.data`
    iterator instantiates again (most of a new raw-text pipeline's start-up).

    Example:
    ```python
    regex_split(tf.constant(["a b", ""]), " ")  # <tf.RaggedTensor [[b"a", b"b"], []]>
    ```
    """
    op = private_api.tf_text_regex_split_op()
    if not isinstance(text, tf.RaggedTensor):
        text = tf.convert_to_tensor(text, tf.string)
    if op is None or isinstance(text, tf.RaggedTensor) or text.shape.rank != 1:
        pieces = tf_text.regex_split_with_offsets(text, delim_regex_pattern, keep_delim_regex_pattern)
    else:
        # tf-text's wrapper groups each pattern the same way.
        outputs = op(text, f"({delim_regex_pattern})".encode(), f"({keep_delim_regex_pattern})".encode())
        pieces = tuple(tf.RaggedTensor.from_row_splits(v, outputs[3], validate=False) for v in outputs[:3])
    return pieces if with_offsets else pieces[0]


def merge_inner_dims(pieces):
    """`pieces.merge_dims(-2, -1)` without the ragged-tensor validation
    (see `regex_split`): `[batch, words, (pieces)]` -> `[batch, (pieces)]`."""
    if pieces.ragged_rank < 2:  # A dense inner dimension: no row splits to gather.
        return pieces.merge_dims(-2, -1)
    if pieces.ragged_rank > 2:
        return pieces.with_values(merge_inner_dims(pieces.values))
    splits = tf.gather(pieces.values.row_splits, pieces.row_splits)  # One splits dtype throughout.
    return tf.RaggedTensor.from_row_splits(pieces.flat_values, splits, validate=False)


def first_non_text(values):
    """`(index, value)` of the first entry of a flat sequence of `values`
    that is neither `str` nor `bytes` (as pandas' NaN or None for missing
    text), else None."""
    for i, value in enumerate(np.asarray(values, dtype=object).reshape(-1)):
        if not isinstance(value, (str, bytes, np.str_, np.bytes_)):
            return i, value
    return None


def non_text_message(what, values):
    """The error for texts that do not convert to a string tensor: names the
    first entry that is no text, with the fix for missing values."""
    found = first_non_text(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    if found is None:
        return None
    index, value = found
    hint = (
        " (missing text? fill it, e.g. `df[col].fillna('')`, or drop those rows)"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else ""
    )
    return f"{what} expects strings, but entry {index} is {value!r} ({type(value).__name__}){hint}."


def to_string_tensor(value, what):
    """`value` as a dense string tensor; ValueError naming `what` if it is not
    text or is ragged."""
    if isinstance(value, tf.RaggedTensor):
        raise ValueError(
            f"{what} expects a dense string tensor or a list of strings, got a RaggedTensor. "
            "Pass `x.flat_values` and rebuild the ragged structure, or join the pieces into "
            "strings first."
        )
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return tf.constant([], dtype=tf.string)
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        message = non_text_message(what, value)
        raise ValueError(message or f"{what} expects strings, got {type(value).__name__}: {e}") from None
    if tensor.dtype != tf.string:
        raise ValueError(
            f"{what} expects strings, got a {tensor.dtype.name} tensor. Pass raw text; "
            "to turn token ids back into text use BertTokenizer.detokenize."
        )
    return tensor


class CharacterAlignment:
    """Normalized text built one character at a time, and the way back from
    its bytes to the characters of the original strings (see
    `normalize_characters`)."""

    def __init__(self, chars, sizes):
        self.chars = chars  # RaggedTensor [batch, characters] of the original strings.
        self.sizes = sizes  # Bytes each character became (0: deleted).
        ends = tf.cumsum(sizes)
        self.byte_starts = ends - sizes  # In all normalized strings laid end to end.
        self.row_bytes = tf.gather(tf.concat([[0], ends], 0), chars.row_starts())

    def characters(self, rows, byte_starts, byte_ends):
        """Character spans `(starts, ends)` (int64, end exclusive, per row)
        of the original strings for byte spans of the normalized strings of
        `rows`. Characters that produce bytes count: the one whose bytes hold
        the span's first byte starts it, the next one after its last byte
        (or the string's end) ends it, so dropped characters (combining
        accents, format characters) belong to the span before them."""
        first_byte = tf.gather(self.row_bytes, rows) + byte_starts
        last_byte = tf.gather(self.row_bytes, rows) + byte_ends
        count = tf.size(self.sizes, out_type=tf.int64)
        kept = self.sizes > 0
        kept_starts = tf.boolean_mask(self.byte_starts, kept)
        kept_index = tf.boolean_mask(tf.range(count), kept)
        first = tf.gather(kept_index, tf.maximum(tf.searchsorted(kept_starts, first_byte, side="right") - 1, 0))
        after = tf.gather(tf.concat([kept_index, [count]], 0), tf.searchsorted(kept_starts, last_byte, side="left"))
        row_chars = tf.gather(self.chars.row_starts(), rows)
        ends = tf.minimum(after, tf.gather(self.chars.row_limits(), rows)) - row_chars
        return first - row_chars, tf.maximum(ends, first - row_chars)


def normalize_characters(strings, normalize_fn):
    """`(normalized strings, CharacterAlignment)` for a 1-D batch: each
    character is normalized on its own by `normalize_fn` (an elementwise
    string op), so every byte of the result maps back to one character of
    the input (invalid UTF-8 bytes count as one character each)."""
    chars = tf.strings.unicode_split(valid_utf8(strings), "UTF-8")
    normalized = normalize_fn(chars.flat_values)
    sizes = tf.cast(tf.strings.length(normalized), tf.int64)
    text = tf.strings.reduce_join(chars.with_flat_values(normalized), axis=1)
    return text, CharacterAlignment(chars, sizes)


# A character no text holds in practice (Unicode's last private-use code point).
_NUL_STAND_IN = "\U0010fffd"


def without_nul(op, strings):
    """`op(strings)` for string ops that stop at a NUL byte
    (`tf.strings.lower`, tf-text's `regex_split`), which would drop the rest
    of the text: each NUL passes through them as a stand-in. Returns what
    `op` does (a tensor, or a ragged tensor of pieces).

    Example:
    ```python
    without_nul(tf.strings.lower, tf.constant(["A\x00B"]))  # [b"a\x00b"], not [b"a"]
    ```
    """

    def restore(text):
        return tf.strings.regex_replace(text, _NUL_STAND_IN, "\x00")

    result = op(tf.strings.regex_replace(strings, r"\x00", _NUL_STAND_IN))
    return (
        result.with_flat_values(restore(result.flat_values)) if isinstance(result, tf.RaggedTensor) else restore(result)
    )
