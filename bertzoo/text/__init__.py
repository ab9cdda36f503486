"""Text pipeline: WordPiece vocabularies, the BERT tokenizer and preprocessor."""

from bertzoo.text.preprocessor import BertPreprocessor
from bertzoo.text.tokenizer import BertTokenizer
from bertzoo.text.vocabulary import build_vocabulary
from bertzoo.text.vocabulary import builtin_vocabulary
from bertzoo.text.vocabulary import load_vocabulary
from bertzoo.text.vocabulary import save_vocabulary

__all__ = [
    "BertPreprocessor",
    "BertTokenizer",
    "build_vocabulary",
    "builtin_vocabulary",
    "load_vocabulary",
    "save_vocabulary",
]
