"""Small text-classification datasets for examples, benchmarks and tests."""

from bertzoo.datasets.files import label_ids
from bertzoo.datasets.files import load_labelled_texts
from bertzoo.datasets.files import load_texts
from bertzoo.datasets.files import threshold_labels
from bertzoo.datasets.sentiment import find_shared
from bertzoo.datasets.sentiment import find_shared_sentiment
from bertzoo.datasets.sentiment import load_rated_sentences
from bertzoo.datasets.sentiment import shared_folders
from bertzoo.datasets.sentiment import split
from bertzoo.datasets.sentiment import synthetic_sentiment
