"""Vocabulary files, the built-in vocabulary and vocabulary training."""

import hashlib

import pytest
import tensorflow as tf

from bertzoo.text import BertTokenizer
from bertzoo.text import build_vocabulary
from bertzoo.text import builtin_vocabulary
from bertzoo.text import load_vocabulary
from bertzoo.text import save_vocabulary

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# --- load / save ------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    tokens = SPECIALS + ["hello", "##ing", "café", "中", "😀", "a b"]
    path = save_vocabulary(tokens, tmp_path / "nested" / "vocab.txt")
    assert path.read_text(encoding="utf-8") == "\n".join(tokens) + "\n"
    assert load_vocabulary(path) == tokens
    assert load_vocabulary(str(path)) == tokens


def test_load_tolerates_bom_crlf_and_trailing_blank_lines(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\ufeff[PAD]\r\n[UNK]\r\nfoo\r\n\r\n\n".encode())
    assert load_vocabulary(path) == ["[PAD]", "[UNK]", "foo"]
    path.write_bytes(b"[PAD]\r")
    assert load_vocabulary(path) == ["[PAD]"]


def test_carriage_returns_alone_are_named_with_the_fix(tmp_path):
    # Split on "\n" alone, such a file read as one token holding every line.
    path = tmp_path / "mac.txt"
    path.write_bytes(b"[PAD]\r[UNK]\rfoo\r")
    with pytest.raises(ValueError, match=r"mac.txt' separates its lines with carriage returns alone .* tr '\\r' '\\n'"):
        load_vocabulary(path)
    path.write_bytes(b"[PAD]\r[UNK]\rfoo\n")  # A last line break of another kind.
    with pytest.raises(ValueError, match=r"carriage returns alone"):
        load_vocabulary(path)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt' does not exist"):
        load_vocabulary(tmp_path / "nope.txt")
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(FileNotFoundError, match="is a directory.*vocab.txt"):
        load_vocabulary(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.txt' is empty"):
        load_vocabulary(empty)
    duplicated = tmp_path / "dup.txt"
    duplicated.write_text("[PAD]\nfoo\nbar\nfoo\n")
    with pytest.raises(
        ValueError, match=r"dup.txt' has the duplicate token 'foo' at indices 1 and 3.*Replace one of them.*\[unusedN\]"
    ):
        load_vocabulary(duplicated)
    gap = tmp_path / "gap.txt"
    gap.write_text("[PAD]\n\nfoo\n")
    with pytest.raises(ValueError, match="blank line at line 2"):
        load_vocabulary(gap)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("[PAD]\nfoo\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt' is not UTF-8 text \(line 3, .*Save it as UTF-8"):
        load_vocabulary(latin1)


def test_save_rejects_tokens_that_cannot_round_trip(tmp_path):
    with pytest.raises(ValueError, match="duplicate token 'x'"):
        save_vocabulary(["x", "y", "x"], tmp_path / "v.txt")
    with pytest.raises(ValueError, match="line breaks"):
        save_vocabulary(["x", "two\nlines"], tmp_path / "v.txt")
    with pytest.raises(ValueError, match="must be a string"):
        save_vocabulary(["x", 3], tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


# --- builtin_vocabulary ----------------------------------------------------

# Presets built on the built-in vocabulary store only its size, so any change to
# the generated tokens silently changes their ids. Update this digest only with
# a deliberate, documented vocabulary change.
BUILTIN_30522_SHA256 = "43c560602b00ba424b06a1ef7c89fdc4502c1c9c2647d86335b568fdc392fb43"


@pytest.fixture(scope="module")
def builtin():
    return builtin_vocabulary()


def test_builtin_layout(builtin):
    assert len(builtin) == 30522
    assert len(set(builtin)) == len(builtin)
    assert builtin[0] == "[PAD]"
    assert builtin[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert builtin[1] == "[unused0]" and builtin[99] == "[unused98]"
    assert builtin[104] == "[unused99]" and builtin[998] == "[unused993]"
    assert builtin[999] == "!"  # characters start where BERT uncased's do
    assert builtin[-1] == "[unused994]"  # padding continues the numbering
    tokenizer = BertTokenizer(builtin)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id) == (0, 100, 101)
    assert (tokenizer.sep_token_id, tokenizer.mask_token_id) == (102, 103)


def test_builtin_is_deterministic(builtin):
    assert builtin_vocabulary() == builtin
    digest = hashlib.sha256("\n".join(builtin).encode("utf-8")).hexdigest()
    assert digest == BUILTIN_30522_SHA256


def test_builtin_contents(builtin):
    tokens = set(builtin)
    for char in "aZ09éÉßñøłşțđ€£¥©°±×÷αΩжЖ—“”•…→∑√∞≠★♥✓あアㄱ😀👍":
        assert char in tokens and "##" + char in tokens, char
    assert "!" in tokens and "##!" not in tokens  # ASCII punctuation never continues a word
    cjk = [chr(c) for c in range(0x4E00, 0xA000)]
    assert all(c in tokens for c in cjk)
    assert "##中" not in tokens  # ideographs are always split off


@pytest.mark.parametrize("size", [30000, 5000, 1155])
def test_builtin_other_sizes(size, builtin):
    vocab = builtin_vocabulary(size)
    assert len(vocab) == size and len(set(vocab)) == size
    real = [t for t in vocab if not t.startswith("[unused")]
    assert real == [t for t in builtin if not t.startswith("[unused")][: len(real)]
    if size == 30000:  # the ALBERT size keeps the whole CJK block too
        assert "\u9fff" in vocab and "\u4e00" in vocab


@pytest.mark.parametrize("size", [1154, 0, 30522.0, True, "30522"])
def test_builtin_bad_size(size):
    with pytest.raises(ValueError, match="`size` must be an integer >= 1155"):
        builtin_vocabulary(size)


def test_builtin_tokenizes_mixed_scripts(builtin):
    text = (
        "Hello, World! Naïve café — “quotes” 3.14 €5 ½ x² ∑√∞ → ok ✓ "
        "Привет, мир! Γειά σου κόσμε. Ελλάδα. Straße øre Łódź Việt Nam "
        "你好，世界。東京は晴れ。こんにちは カタカナ 안녕하세요 ㅋㅋ "
        "שלום مرحبا नमस्ते สวัสดี 😀👍🤔❤️"
    )
    uncased = BertTokenizer(builtin)
    cased = BertTokenizer(builtin, lowercase=False)
    for tokenizer in (uncased, cased):
        ids = tokenizer(text).numpy().tolist()
        assert len(ids) > 100
        # Hangul syllables are covered through their jamo, i.e. only when
        # accents are stripped (NFD); cased, the Korean word is the one [UNK].
        expected_unk = 0 if tokenizer is uncased else 1
        assert ids.count(tokenizer.unk_token_id) == expected_unk, tokenizer.detokenize(ids).numpy().decode()
    # Outside the covered blocks a word becomes [UNK], never an error.
    rare = uncased("𓀀 hieroglyph").numpy().tolist()
    assert rare[0] == uncased.unk_token_id and len(rare) > 1


# --- build_vocabulary --------------------------------------------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A quick brown dog outpaces a lazy fox!",
    "Foxes and dogs are running, jumping and playing.",
    "The café serves naïve tourists crème brûlée.",
    "Running quickly, the fox jumped; the dogs kept playing.",
    "Tokenizers split words into pieces: token, tokens, tokenizing.",
] * 15


@pytest.fixture(scope="module")
def trained():
    return build_vocabulary(CORPUS, vocabulary_size=120)


def test_build_vocabulary_reserved_and_size(trained):
    assert trained[:5] == SPECIALS
    assert 5 < len(trained) <= 120
    assert len(set(trained)) == len(trained)
    assert "##" not in trained
    # Lower-cased and accent-stripped like the tokenizer will see it.
    assert "the" in trained and "The" not in trained
    assert "é" not in trained and "##e" in trained


def test_build_vocabulary_tokenizer_round_trips_words(trained):
    tokenizer = BertTokenizer(trained)
    words = ["the", "quick", "fox", "dogs", "running", "tokenizing", "cafe", "brulee", "outpaces"]
    ids = tokenizer(words)
    assert tokenizer.unk_token_id not in ids.flat_values.numpy().tolist()
    assert tokenizer.detokenize(ids).numpy().tolist() == [w.encode() for w in words]
    assert len(tokenizer("the").numpy()) == 1  # frequent words are whole tokens
    text = "The quick brown fox jumps over the lazy dog."
    assert tokenizer.detokenize(tokenizer(text)).numpy() == b"the quick brown fox jumps over the lazy dog ."


def test_build_vocabulary_from_dataset_matches_list(trained):
    dataset = tf.data.Dataset.from_tensor_slices(CORPUS).batch(7)
    assert build_vocabulary(dataset, vocabulary_size=120) == trained
    # A dataset of sentence pairs learns from both sides: (CORPUS[0], CORPUS[1]), ... reads as CORPUS.
    pairs = tf.data.Dataset.from_tensor_slices((CORPUS[0::2], CORPUS[1::2]))
    assert build_vocabulary(pairs, vocabulary_size=120) == trained
    assert sorted(build_vocabulary(pairs.batch(5), vocabulary_size=120)) == sorted(trained)


def test_build_vocabulary_options():
    vocab = build_vocabulary(
        CORPUS,
        150,
        lowercase=False,
        reserved_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<x>"),
    )
    assert vocab[:6] == SPECIALS + ["<x>"]
    assert "The" in vocab and "é" in vocab  # cased: accents kept, strip_accents follows lowercase


def test_build_vocabulary_errors():
    with pytest.raises(ValueError, match="single string"):
        build_vocabulary("just one text", 100)
    with pytest.raises(ValueError, match="larger than the number of reserved tokens"):
        build_vocabulary(CORPUS, 5)
    with pytest.raises(ValueError, match="no words"):
        build_vocabulary(["", "  ", "\n"], 100)
    with pytest.raises(ValueError, match="only strings"):
        build_vocabulary(["ok", 3], 100)
    with pytest.raises(ValueError, match="duplicate token"):
        build_vocabulary(CORPUS, 100, reserved_tokens=("[PAD]", "[PAD]"))
    with pytest.raises(ValueError, match="string tensors"):
        build_vocabulary(tf.data.Dataset.from_tensor_slices([1, 2]), 100)


def test_build_vocabulary_keeps_every_character_of_a_corpus_with_many():
    # tf-text's learner keeps its 1000 most frequent characters unless told otherwise: [UNK] for the rest.
    characters = [chr(0x4E00 + i) for i in range(1100)]
    texts = ["".join(characters[(20 * line + k) % 1100] for k in range(20)) for line in range(110)]
    vocabulary = build_vocabulary(texts, vocabulary_size=2400)
    tokenizer = BertTokenizer(vocabulary)
    ids = tokenizer(texts).flat_values.numpy()
    assert len(ids) == 2200 and tokenizer.unk_token_id not in ids
    assert set(characters) <= set(vocabulary)


def test_build_vocabulary_min_frequency_decides_which_pieces_enter():
    counted = build_vocabulary(CORPUS[:6], vocabulary_size=400, min_frequency=1)
    frequent = build_vocabulary(CORPUS[:6], vocabulary_size=400, min_frequency=3)
    assert "tokenizers" in counted and "tokenizers" not in frequent  # Once in the six sentences.
    assert "the" in frequent  # Six times.
    with pytest.raises(ValueError, match="`min_frequency` must be a positive integer, got 0"):
        build_vocabulary(CORPUS, 100, min_frequency=0)
