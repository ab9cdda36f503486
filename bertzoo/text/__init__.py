"""Text pipeline: WordPiece vocabularies, the BERT (WordPiece) and ALBERT
(SentencePiece) tokenizers, and the preprocessor."""

from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.sentencepiece_tokenizer import SentencePieceTokenizer
from bertzoo.text.sentencepiece_tokenizer import albert_tokenizer_options
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.text.vocabulary import build_vocabulary
from bertzoo.text.vocabulary import builtin_vocabulary
from bertzoo.text.vocabulary import load_vocabulary
from bertzoo.text.vocabulary import save_vocabulary

__all__ = [
    "BertPreprocessor",
    "BertTokenizer",
    "SentencePieceTokenizer",
    "albert_tokenizer_options",
    "build_vocabulary",
    "builtin_vocabulary",
    "load_vocabulary",
    "save_vocabulary",
]
