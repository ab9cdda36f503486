"""WordPiece vocabularies: load, save, train, and a built-in fallback.

Real pretrained vocabularies (the `vocab.txt` of a BERT checkpoint) come with
converted checkpoints and are stored as `vocabulary.txt` in a preset
directory. `builtin_vocabulary()` exists so that built-in presets, which have
no checkpoint, can tokenize raw text offline on a fresh install: it is
generated in code, character level, and not meant to match any pretrained
model's ids beyond the special tokens.
"""

import numbers
import re
from pathlib import Path

from bertzoo.text.normalization import pretokenize
from bertzoo.utils.optional import is_tf_dataset
from bertzoo.utils.optional import tf

DEFAULT_RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def check_vocabulary(tokens, source="vocabulary"):
    """Raises ValueError unless `tokens` is a non-empty list of unique strings."""
    if not tokens:
        raise ValueError(f"The {source} is empty: a vocabulary needs at least the special tokens.")
    seen = {}
    for i, token in enumerate(tokens):
        if not isinstance(token, str):
            raise ValueError(
                f"The {source} holds a {type(token).__name__} at index {i} ({token!r}); every token must be a string."
            )
        if token == "" or "\n" in token or "\r" in token:
            raise ValueError(
                f"The {source} has an invalid token {token!r} at index {i}: tokens must be "
                "non-empty and hold no line breaks (one token per line in vocab.txt)."
            )
        if token in seen:
            raise ValueError(
                f"The {source} has the duplicate token {token!r} at indices {seen[token]} "
                f"and {i}; every token must map to one id. Replace one of them with a token of its own (e.g. "
                "an unused `[unusedN]`): deleting its line would shift every later id away from the embedding "
                "rows the model learned for them."
            )
        seen[token] = i


def load_vocabulary(path):
    """Reads a vocabulary file (one token per line, UTF-8) into a list.

    Line `i` (counting from 0) is the token with id `i`. A UTF-8 byte-order mark
    and trailing blank lines are ignored.

    Raises:
        FileNotFoundError: `path` does not exist or is a directory.
        ValueError: the file is empty, has a blank line in the middle, or holds
            the same token twice.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Vocabulary file '{path}' does not exist.")
    if path.is_dir():
        candidates = [p.name for p in (path / "vocab.txt", path / "vocabulary.txt") if p.is_file()]
        hint = f" It contains {candidates[0]}: pass that file." if candidates else ""
        raise FileNotFoundError(f"Vocabulary path '{path}' is a directory, expected a text file.{hint}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as file:
            text = file.read()
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise ValueError(
            f"Vocabulary file '{path}' is not UTF-8 text (line {line}, byte {error.start}: {error.reason}). "
            "Save it as UTF-8, one token per line (e.g. iconv -f latin1 -t utf-8)."
        ) from None
    lone = len(re.findall("\r(?!\n)", text.rstrip("\r\n")))
    if lone and lone >= text.count("\n"):  # Split on "\n", its lines would run together into one token.
        raise ValueError(
            f"Vocabulary file '{path}' separates its lines with carriage returns alone (\\r, classic Mac OS "
            "line endings). Save it with \\n line endings, one token per line (e.g. tr '\\r' '\\n')."
        )
    lines = text.split("\n")
    # One line break per token; tolerate Windows line endings.
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ValueError(f"Vocabulary file '{path}' is empty.")
    for i, line in enumerate(lines):
        if line == "":
            raise ValueError(
                f"Vocabulary file '{path}' has a blank line at line {i + 1}; every line "
                "must hold one token (the line number is the token id + 1)."
            )
    check_vocabulary(lines, f"vocabulary file '{path}'")
    return lines


def save_vocabulary(tokens, path):
    """Writes `tokens` to `path`, one per line (UTF-8). Returns the path.

    Raises ValueError for duplicate, empty or multi-line tokens, which could not
    be read back with the same ids.
    """
    tokens = list(tokens)
    check_vocabulary(tokens, "vocabulary to save")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as file:
        file.write("".join(token + "\n" for token in tokens))
    return path


def build_vocabulary(
    texts_or_dataset,
    vocabulary_size,
    lowercase=True,
    strip_accents=None,
    reserved_tokens=DEFAULT_RESERVED_TOKENS,
    min_frequency=2,
):
    """Trains a WordPiece vocabulary on your own corpus.

    Text is normalized and split exactly like `BertTokenizer` does with the
    same `lowercase` / `strip_accents`, then word counts go to tf-text's
    WordPiece learner. Every character of the corpus (and its `##`
    continuation) is in the vocabulary when `vocabulary_size` holds them, so
    the corpus tokenizes without `[UNK]`. Build the tokenizer with the same
    settings.

    Args:
        texts_or_dataset: a list (or other iterable) of strings, or a
            `tf.data.Dataset` of string tensors (scalars or batches).
        vocabulary_size: the maximum vocabulary size. The result is smaller
            when the corpus has fewer pieces that occur `min_frequency`
            times.
        lowercase, strip_accents: as for `BertTokenizer`.
        reserved_tokens: tokens placed first, in order (so the default gives
            `[PAD]`=0, `[UNK]`=1, `[CLS]`=2, `[SEP]`=3, `[MASK]`=4).
            `BertTokenizer` needs all five defaults.
        min_frequency: the fewest occurrences of a piece (other than a
            single character) that earn it a place, as Hugging Face's
            `BertWordPieceTokenizer(min_frequency=2)`.

    Returns:
        A list of token strings.

    Example:

    ```python
    corpus = ["the quick brown fox", "the lazy dog"] * 20
    vocab = build_vocabulary(corpus, vocabulary_size=200)
    vocab[:5]
    # ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    tokenizer = BertTokenizer(vocab)
    ```
    """
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

    reserved_tokens = list(reserved_tokens)
    check_vocabulary(reserved_tokens, "reserved_tokens")
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, int)
        or vocabulary_size <= len(reserved_tokens)
    ):
        raise ValueError(
            "`vocabulary_size` must be an integer larger than the number of reserved "
            f"tokens ({len(reserved_tokens)}), got {vocabulary_size!r}."
        )
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, numbers.Integral) or min_frequency < 1:
        raise ValueError(f"`min_frequency` must be a positive integer, got {min_frequency!r}.")
    if is_tf_dataset(texts_or_dataset):
        dataset = texts_or_dataset
        if not all(spec.dtype == tf.string for spec in tf.nest.flatten(dataset.element_spec)):
            raise ValueError(
                "`texts_or_dataset` must yield string tensors, got a dataset with "
                f"element_spec={dataset.element_spec}. Map it to the text field first."
            )
        if not isinstance(dataset.element_spec, tf.TensorSpec):  # Pairs (or dicts) of texts: every field.
            dataset = dataset.map(
                lambda *element: tf.concat([tf.reshape(t, [-1]) for t in tf.nest.flatten(element)], axis=0)
            )
    else:
        if isinstance(texts_or_dataset, (str, bytes)):
            raise ValueError(
                "`texts_or_dataset` must be a list of strings or a tf.data.Dataset, got a "
                "single string. Wrap it in a list (or read your corpus into one)."
            )
        texts = list(texts_or_dataset)
        bad = [t for t in texts if not isinstance(t, (str, bytes))]
        if bad:
            raise ValueError(f"`texts_or_dataset` must contain only strings, found {type(bad[0]).__name__}.")
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(texts, dtype=tf.string)).batch(1024)
    words = dataset.map(
        lambda text: pretokenize(text, lowercase, strip_accents).flat_values,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    try:
        word_counts = learner.count_words(words)
    except StopIteration:  # It reads its first word to decode the rest.
        word_counts = {}
    if not word_counts:
        raise ValueError("The corpus has no words: cannot learn a vocabulary from it.")
    # The learner keeps only its `max_unique_chars` most frequent characters
    # (1000 by default: a Chinese corpus then lost half its text to [UNK]).
    characters = {character for word in word_counts for character in word}
    vocabulary = learner.learn(
        word_counts,
        vocab_size=vocabulary_size,
        reserved_tokens=reserved_tokens,
        lower_thresh=int(min_frequency),
        max_unique_chars=len(characters),
        include_joiner_token=True,
        joiner="##",
    )
    # The learner appends a bare "##", which never matches anything (tf-text
    # warns about it); drop it and any repeat of a reserved token.
    result, seen = [], set()
    for token in vocabulary:
        if token in seen or (token == "##" and token not in reserved_tokens):
            continue
        seen.add(token)
        result.append(token)
    return result[:vocabulary_size]


# --- Built-in character-level vocabulary -------------------------------------

_BERT_RESERVED_SIZE = 999  # [PAD], [unused0-98], [UNK], [CLS], [SEP], [MASK], [unused99-993]
_ASCII_PUNCTUATION = "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
_ASCII_ALNUM = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c).isalnum())

# Blocks of characters that can occur inside a word, in priority order; each
# gets a word-initial token and a `##` continuation. Plain code point ranges,
# not Unicode-database lookups, so the vocabulary is identical on every Python
# version. The core blocks plus the whole CJK block fit in 30000 entries.
_CORE_BLOCKS = (
    (0x00A1, 0x00AC),  # Latin-1 symbols (U+00AD soft hyphen is deleted by the tokenizer)
    (0x00AE, 0x00FF),  # Latin-1 letters
    (0x0100, 0x017F),  # Latin Extended-A
    (0x0180, 0x024F),  # Latin Extended-B
    (0x0300, 0x036F),  # combining diacritics (kept when accents are not stripped)
    (0x0370, 0x03FF),  # Greek
    (0x0400, 0x04FF),  # Cyrillic
    (0x2010, 0x2027),  # general punctuation (dashes, quotes, bullets)
    (0x2030, 0x205E),
    (0x2070, 0x209C),  # superscripts and subscripts
    (0x20A0, 0x20C0),  # currency symbols
    (0x2100, 0x214F),  # letterlike symbols
    (0x2150, 0x218B),  # number forms
    (0x2190, 0x21FF),  # arrows
    (0x2200, 0x22FF),  # mathematical operators
    (0x25A0, 0x25FF),  # geometric shapes
    (0x2600, 0x26FF),  # miscellaneous symbols
    (0x2700, 0x27BF),  # dingbats
    (0x05B0, 0x05F4),  # Hebrew
    (0x0600, 0x06FF),  # Arabic
    (0x0900, 0x097F),  # Devanagari
    (0x0E01, 0x0E5B),  # Thai
    # Modern conjoining Hangul jamo: accent stripping (NFD) decomposes Hangul
    # syllables into these.
    (0x1100, 0x1112),
    (0x1161, 0x1175),
    (0x11A8, 0x11C2),
    (0x1E00, 0x1EFF),  # Latin Extended Additional (Vietnamese)
    (0x3001, 0x303F),  # CJK symbols and punctuation
    (0x3041, 0x309F),  # Hiragana
    (0x30A0, 0x30FF),  # Katakana
    (0x3131, 0x318E),  # Hangul compatibility jamo
    (0xFF01, 0xFF65),  # fullwidth ASCII, halfwidth CJK punctuation
    (0xFE00, 0xFE0F),  # variation selectors (emoji presentation)
    (0x1F600, 0x1F64F),  # emoticons
    (0x1F900, 0x1F9FF),  # supplemental symbols and pictographs
    (0x1F440, 0x1F4AF),  # gestures, hearts
)
# CJK ideographs are always words of their own, so they need no `##` form.
_CJK_BLOCK = (0x4E00, 0x9FFF)
# Used, in order, only when `size` leaves room after the CJK block.
_EXTRA_BLOCKS = (
    (0x1F3FB, 0x1F3FF),  # skin tone modifiers
    (0x1F4B0, 0x1F5FF),
    (0x1F300, 0x1F3FA),
    (0x1F400, 0x1F43F),
    (0x1F680, 0x1F6FF),  # transport and map symbols
    (0x2B00, 0x2BFF),  # miscellaneous symbols and arrows
    (0x2300, 0x23FF),  # miscellaneous technical
    (0x2460, 0x24FF),  # enclosed alphanumerics
    (0x2500, 0x259F),  # box drawing, block elements
    (0x0250, 0x02FF),  # IPA, spacing modifier letters
    (0x0500, 0x052F),  # Cyrillic supplement
    (0x0531, 0x058A),  # Armenian
    (0x10A0, 0x10FF),  # Georgian
    (0x1F00, 0x1FFF),  # Greek extended
    (0x0980, 0x09FF),  # Bengali
    (0x0B80, 0x0BFF),  # Tamil
    (0xAC00, 0xD7A3),  # Hangul syllables (used when accents are not stripped)
)


def _builtin_entries():
    """Yields token groups in priority order; a group is never split up."""
    for char in _ASCII_PUNCTUATION:
        yield (char,)
    for char in _ASCII_ALNUM:
        yield (char, "##" + char)
    for first, last in _CORE_BLOCKS:
        for code in range(first, last + 1):
            yield (chr(code), "##" + chr(code))
    for code in range(_CJK_BLOCK[0], _CJK_BLOCK[1] + 1):
        yield (chr(code),)
    for first, last in _EXTRA_BLOCKS:
        for code in range(first, last + 1):
            yield (chr(code), "##" + chr(code))


def _builtin_reserved():
    tokens = ["[PAD]"]
    tokens += [f"[unused{i}]" for i in range(99)]
    tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"[unused{i}]" for i in range(99, _BERT_RESERVED_SIZE - 5)]
    return tokens


_MIN_BUILTIN_SIZE = _BERT_RESERVED_SIZE + len(_ASCII_PUNCTUATION) + 2 * len(_ASCII_ALNUM)


def builtin_vocabulary(size=30522):
    """A deterministic character-level WordPiece vocabulary, generated in code.

    Layout: ids 0-998 follow BERT uncased (`[PAD]`=0, `[unused0]`-`[unused98]`,
    `[UNK]`=100, `[CLS]`=101, `[SEP]`=102, `[MASK]`=103, `[unused99]`-
    `[unused993]`). Then single characters, each with its `##` continuation:
    printable ASCII, Latin (with accented letters), Greek, Cyrillic, common
    punctuation and symbols, Hebrew, Arabic, Devanagari, Thai, Hangul jamo,
    kana, emoji; then the CJK Unified Ideographs block (no `##` forms: the
    tokenizer splits every ideograph off) as far as `size` allows; then more
    blocks if room remains; then `[unusedN]` padding to exactly `size`.

    Every string tokenizes; characters outside the vocabulary give `[UNK]` for
    their word. Hangul is covered through its jamo, which accent stripping
    (the default with `lowercase=True`) decomposes syllables into. It carries
    no subword statistics, so it is meant for built-in presets trained from
    scratch and for tests. Pretrained models need the vocabulary they were
    trained with: it comes with converted checkpoints.

    A smaller `size` gives a prefix of the same character list (at least
    1155 entries: the BERT reserved block and printable ASCII).

    ```python
    vocab = builtin_vocabulary()
    len(vocab), vocab[0], vocab[100:104]
    # (30522, '[PAD]', ['[UNK]', '[CLS]', '[SEP]', '[MASK]'])
    ```
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < _MIN_BUILTIN_SIZE:
        raise ValueError(
            f"`size` must be an integer >= {_MIN_BUILTIN_SIZE} (999 BERT reserved slots "
            f"plus printable ASCII), got {size!r}."
        )
    tokens = _builtin_reserved()
    for group in _builtin_entries():
        if len(tokens) + len(group) > size:
            break
        tokens.extend(group)
    next_unused = _BERT_RESERVED_SIZE - 5
    while len(tokens) < size:
        tokens.append(f"[unused{next_unused}]")
        next_unused += 1
    return tokens
