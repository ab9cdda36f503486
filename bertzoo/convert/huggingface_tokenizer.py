"""The tokenizer of a Hugging Face BERT / ALBERT directory, in bertzoo terms.

The vocabulary comes from `vocab.txt` or `spiece.model`, else from the
WordPiece model of `tokenizer.json` (transformers 5 saves only that). The
settings follow what transformers' `AutoTokenizer` does with the folder:
BERT's tokenizer classes rebuild their normalizer from `tokenizer_config.json`
(defaults: lowercase, accents stripped with it, CJK characters split), while
the generic classes run `tokenizer.json` as written. Where bertzoo's
tokenizer would give other ids than the checkpoint's own (another tokenizer
class, other special tokens), the vocabulary is left out with a note: ids
that differ without an error are worse than none.
"""

import dataclasses
from pathlib import Path

from bertzoo.convert.common import ConversionError
from bertzoo.convert.common import check_vocabulary_size
from bertzoo.convert.common import read_json_object
from bertzoo.text import BertTokenizer
from bertzoo.text import albert_tokenizer_options
from bertzoo.text import load_vocabulary
from bertzoo.text.normalization import normalize
from bertzoo.text.tokenizer import SPECIAL_TOKENS

# Tokenizer classes whose splitting bertzoo's WordPiece tokenizer reproduces:
# BERT's and its copies in transformers. Another class over a WordPiece
# vocabulary (e.g. BertJapaneseTokenizer, which splits words with MeCab or
# into single characters) gives other ids.
WORDPIECE_CLASSES = tuple(
    f"{name}Tokenizer{fast}"
    for name in ("Bert", "DistilBert", "Electra", "MobileBert", "SqueezeBert", "LayoutLM")
    for fast in ("", "Fast")
)
# transformers' classes that run whatever `tokenizer.json` describes.
GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
# `tokenizer_config.json`'s special-token entries and bertzoo's names for them.
SPECIAL_TOKEN_ENTRIES = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS))
_NO_VOCABULARY = "the weights are converted without it (pass tokenized inputs, preprocessor=None)"


@dataclasses.dataclass
class HuggingFaceTokenizer:
    """What `read_tokenizer` found: a WordPiece vocabulary or a SentencePiece
    model (or neither), preprocessor settings and notes for the user."""

    vocabulary: list = None
    sentencepiece: Path = None
    sentencepiece_options: dict = dataclasses.field(default_factory=dict)
    settings: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)


def read_tokenizer(path, model_config, config, origin):
    """The tokenizer of the Hugging Face directory `path`.

    `model_config` is its `config.json` (which may name the tokenizer
    class), `config` the bertzoo backbone config (for the vocabulary size)
    and `origin` what error messages name.
    """
    path = Path(path)
    result = HuggingFaceTokenizer()
    tokenizer_config = {}
    if (path / "tokenizer_config.json").is_file():
        tokenizer_config = read_json_object(path / "tokenizer_config.json")
    # transformers reads the class from tokenizer_config.json, then from config.json.
    tokenizer_class = tokenizer_config.get("tokenizer_class") or model_config.get("tokenizer_class")
    vocab_txt, spiece = path / "vocab.txt", path / "spiece.model"
    fast = _tokenizer_json(
        path / "tokenizer.json", required=not (vocab_txt.is_file() or spiece.is_file()), notes=result.notes
    )
    generic = tokenizer_class in GENERIC_CLASSES and _is_bert_tokenizer_json(fast)
    if generic:
        normalizer = fast["normalizer"]
        lowercase, strip_accents = normalizer.get("lowercase", True), normalizer.get("strip_accents")
        split_on_cjk = normalizer.get("handle_chinese_chars", True)
    else:
        lowercase, strip_accents = tokenizer_config.get("do_lower_case", True), tokenizer_config.get("strip_accents")
        split_on_cjk = tokenizer_config.get("tokenize_chinese_chars")
    result.settings["lowercase"] = bool(lowercase)
    if strip_accents is not None:
        result.settings["strip_accents"] = bool(strip_accents)

    if spiece.is_file() and not vocab_txt.is_file():
        result.sentencepiece = spiece
        result.sentencepiece_options = albert_tokenizer_options(
            bool(lowercase), bool(tokenizer_config.get("keep_accents", False))
        )
        return result
    if vocab_txt.is_file():
        source, vocabulary = vocab_txt, load_vocabulary(vocab_txt)
    elif fast:
        source, vocabulary = path / "tokenizer.json", _wordpiece_vocabulary(fast, path / "tokenizer.json", result.notes)
        if vocabulary is None:
            return result
    else:
        return result
    if tokenizer_class is not None and tokenizer_class not in WORDPIECE_CLASSES and not generic:
        named_in = "tokenizer_config.json" if tokenizer_config.get("tokenizer_class") else "config.json"
        result.notes.append(
            f"{path / named_in} names tokenizer_class {tokenizer_class!r}, which splits text unlike BertTokenizer "
            f"(the tokenizer bertzoo reproduces), so {source.name} would give other ids: {_NO_VOCABULARY}"
        )
        return result
    if split_on_cjk is not None:
        result.settings["split_on_cjk"] = bool(split_on_cjk)
    problem = _special_token_problem(tokenizer_config, vocabulary)
    if problem:
        result.notes.append(
            f"{source}: {problem}: {_NO_VOCABULARY}. To convert the vocabulary too, give the checkpoint's own "
            f"special tokens the names {', '.join(SPECIAL_TOKENS)} without changing their ids (in "
            f"{source.name} and tokenizer_config.json)."
        )
        return result
    check_vocabulary_size(vocabulary, config, origin)
    added = _added_tokens(path, fast, vocabulary, result.notes)
    result.vocabulary = _with_added_tokens(vocabulary, added, source, result.settings, config, result.notes)
    return result


def _tokenizer_json(file, required, notes):
    """`tokenizer.json` as a dict ({} when absent). When another file holds
    the vocabulary, one that cannot be read (a Git LFS pointer, a cut
    download) is passed over with a note instead of failing the conversion."""
    if not file.is_file():
        return {}
    try:
        return read_json_object(file)
    except ConversionError as error:
        if required:
            raise
        notes.append(f"{error} It is not used: the vocabulary comes from the folder's other files")
        return {}


def _is_bert_tokenizer_json(fast):
    """Whether `tokenizer.json` describes BERT's tokenizer: its normalizer,
    pre-tokenizer and WordPiece model."""
    parts = [
        fast.get(key) if isinstance(fast.get(key), dict) else {} for key in ("normalizer", "pre_tokenizer", "model")
    ]
    return [part.get("type") for part in parts] == ["BertNormalizer", "BertPreTokenizer", "WordPiece"]


def _wordpiece_vocabulary(fast, source, notes):
    """The vocabulary of `tokenizer.json`'s WordPiece model, in id order, or
    None (with a note) for another model or a vocabulary with gaps."""
    model = fast.get("model") if isinstance(fast.get("model"), dict) else {}
    if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
        kind = model.get("type") if isinstance(model.get("type"), str) else None
        hint = " (ALBERT's SentencePiece model is read from spiece.model: copy it beside config.json)"
        notes.append(
            f"{source} holds {f'a {kind}' if kind else 'no known'} tokenizer model, not BERT's WordPiece with "
            f"'##' continuations{hint if kind == 'Unigram' else ''}: {_NO_VOCABULARY}"
        )
        return None
    vocab = model.get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    if not ids or not all(_is_id(i) for i in ids) or sorted(ids) != list(range(len(ids))):
        notes.append(f"{source}: the WordPiece vocabulary's ids are not 0, 1, ..., n-1 without gaps: {_NO_VOCABULARY}")
        return None
    return sorted(vocab, key=vocab.get)


def _is_id(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _special_token_problem(tokenizer_config, vocabulary):
    """Why bertzoo's special tokens are not the checkpoint's, or None."""
    renamed = []
    for entry, name in SPECIAL_TOKEN_ENTRIES.items():
        value = tokenizer_config.get(entry)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value != name:
            renamed.append(f"{entry} {value!r} (bertzoo uses {name})")
    if renamed:
        return f"tokenizer_config.json names other special tokens: {', '.join(renamed)}"
    present = set(vocabulary)
    missing = [token for token in SPECIAL_TOKENS if token not in present]
    if missing:
        return f"it lacks {', '.join(missing)}, which bertzoo's WordPiece tokenizer needs"
    return None


def _added_tokens(path, fast, vocabulary, notes):
    """`{token: id}` of the tokens Hugging Face added beyond the vocabulary
    (`added_tokens.json`, or `tokenizer.json`'s added_tokens); the special
    tokens it lists with their vocabulary ids are not new."""
    file = path / "added_tokens.json"
    if file.is_file():
        try:
            added = read_json_object(file)
        except ConversionError as error:
            notes.append(f"{error} Its tokens are not added")
            return {}
    else:
        entries = fast.get("added_tokens") if isinstance(fast.get("added_tokens"), list) else []
        added = {}
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                added[entry["content"]] = entry.get("id")
    size = len(vocabulary)
    return {
        token: i
        for token, i in added.items()
        if isinstance(token, str) and not (_is_id(i) and 0 <= i < size and vocabulary[i] == token)
    }


def _with_added_tokens(vocabulary, added, source, settings, config, notes):
    """`vocabulary` with the `added` tokens appended when their ids continue
    it inside the embedding table. Each is stored as the tokenizer normalises
    text (lowercased for an uncased vocabulary), so that it can match; the
    note names those bertzoo never produces (split at punctuation)."""
    if not added:
        return vocabulary
    size, count = len(vocabulary), len(added)
    shown = ", ".join(repr(t) for t in list(added)[:5]) + (", ..." if count > 5 else "")
    ids = sorted(i for i in added.values() if _is_id(i))
    if ids != list(range(size, size + count)):
        notes.append(
            f"the added tokens ({shown}) are not converted: their ids are not the ones after {source.name}'s last "
            f"({size - 1}), so bertzoo tokenizes them as ordinary text"
        )
        return vocabulary
    span = f"id {size}" if count == 1 else f"ids {size}-{size + count - 1}"
    if size + count > config["vocabulary_size"]:
        notes.append(
            f"the added tokens ({shown}) are not converted: their {span} lie outside the "
            f"embedding table's {config['vocabulary_size']} rows (resize_token_embeddings was not saved?), so "
            "bertzoo tokenizes them as ordinary text"
        )
        return vocabulary
    index = {token: i for i, token in enumerate(vocabulary)}
    taken = set(index)
    appended = []
    ordered = sorted(added, key=added.get)
    # As the tokenizer normalises text (the tokenizer's own function).
    lowercase, strip_accents = settings["lowercase"], settings.get("strip_accents")
    normalised_tokens = [t.decode("utf-8") for t in normalize(ordered, lowercase, strip_accents).numpy()]
    for token, normalised in zip(ordered, normalised_tokens):
        if token in taken and normalised in taken:
            at = index.get(token, index.get(normalised))
            notes.append(
                f"the added tokens ({shown}) are not converted: {token!r} is in {source.name} already"
                + (f" (id {at})" if at is not None else "")
                + f" but added as id {added[token]}, which one vocabulary cannot hold"
            )
            return vocabulary
        appended.append(normalised if normalised not in taken else token)
        taken.add(appended[-1])
    extended = vocabulary + appended
    tokenizer = BertTokenizer(
        extended,
        lowercase=settings["lowercase"],
        strip_accents=settings.get("strip_accents"),
        split_on_cjk=settings.get("split_on_cjk", True),
    )
    pieces = tokenizer.tokenize(appended).to_list()
    unreachable = [token for token, i, ids in zip(ordered, range(size, size + count), pieces) if ids != [i]]
    note = (
        f"the added tokens ({shown}) take {span} after {source.name}'s: bertzoo matches them as whole words of "
        "the normalised text, where Hugging Face matches them anywhere in the raw text"
    )
    if unreachable:
        listed = ", ".join(repr(t) for t in unreachable[:5]) + (", ..." if len(unreachable) > 5 else "")
        note += f"; bertzoo never produces {listed} (it splits text at punctuation and spaces)"
    notes.append(note)
    return extended
