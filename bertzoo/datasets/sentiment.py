"""Binary sentiment data: human-rated sentences on disk, or a generated set.

`load_rated_sentences` reads tab-separated `id<TAB>rating<TAB>text` files with
one header line (the layout of the VADER ground-truth files), labelling
`rating > 0` as positive and dropping neutral (`rating == 0`) rows. The text
is the rest of the line: a tab inside it is kept, not an error.

`synthetic_sentiment` generates a labelled set from small word lists, so
examples run offline on a fresh machine with no data at all. It is easy on
purpose (the label follows from the words); use real data for real figures.
"""

import csv
import math
import numbers
import os
from pathlib import Path

import numpy as np

from bertzoo.datasets.files import ENCODING
from bertzoo.datasets.files import NUMBER_PATTERN
from bertzoo.datasets.files import LineTap
from bertzoo.datasets.files import allow_long_csv_fields
from bertzoo.datasets.files import not_utf8_error


def load_rated_sentences(path, max_rows=None):
    """Returns `(texts, labels)` from a rated-sentences TSV file.

    The file is UTF-8 (a byte-order mark is allowed), its header line is
    `id<TAB>rating<TAB>text`, and blank lines are skipped. The text is the
    rest of the line, so a tab inside it is kept. A rating that is not a
    finite number (ASCII digits, e.g. `-1.5` or `2`) or an empty text is a
    `ValueError` naming the line. `max_rows`: keep at most this many
    (non-neutral) rows, an int >= 1; None for all.

    Example:
    ```python
    texts, labels = load_rated_sentences("../shared/data/sentiment/amazon.tsv")
    ```
    """
    path = Path(path)
    if max_rows is not None and (
        isinstance(max_rows, bool) or not isinstance(max_rows, numbers.Integral) or max_rows < 1
    ):
        raise ValueError(f"`max_rows` must be an int >= 1 (or None for all rows), got {max_rows!r}.")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; expected a TSV file id<TAB>rating<TAB>text.")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: expected a TSV file id<TAB>rating<TAB>text.")
    allow_long_csv_fields()
    texts, labels = [], []
    neutral = 0
    with open(path, newline="", encoding=ENCODING) as f:
        tap = LineTap(f)  # The lines of each row, to name a carriage return that cut one.
        reader = csv.reader(tap, delimiter="\t", quoting=csv.QUOTE_NONE)
        previous = []  # The lines of the row before.
        seen_newline = False  # Lines ending "\n": then one ending in a bare "\r" was cut inside its text.
        try:
            header = next(reader, None)
            while header is not None and not any(cell.strip() for cell in header):
                header = next(reader, None)  # Blank lines before the header.
            _check_header(header, path)
            seen_newline, tap.lines = any(line.endswith("\n") for line in tap.lines), []
            for row in reader:
                lines, tap.lines = tap.lines, []
                seen_newline = seen_newline or any(line.endswith("\n") for line in lines)
                if not any(cell.strip() for cell in row):
                    continue  # A blank line, e.g. at the end of the file.
                cut, previous = previous, lines
                if len(row) < 3:
                    hint = ""
                    if seen_newline and any(line.endswith("\r") for line in cut + lines):
                        hint = (
                            " A line ends with a bare carriage return (\\r), which cuts the row (a carriage return "
                            "inside a text?): remove it from the text (e.g. replace it with a space)."
                        )
                    raise ValueError(
                        f"{path}:{reader.line_num}: expected 3 tab-separated fields, got {len(row)}.{hint}"
                    )
                rating = _rating(row[1], path, reader.line_num)
                text = "\t".join(row[2:]).strip()
                if not text:
                    raise ValueError(
                        f"{path}:{reader.line_num}: the text is empty; give every row a sentence (or delete the row)."
                    )
                if rating == 0:
                    neutral += 1
                    continue
                texts.append(text)
                labels.append(int(rating > 0))
                if max_rows is not None and len(texts) >= max_rows:
                    break
        except UnicodeDecodeError:
            raise not_utf8_error(path) from None
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: not valid TSV ({e}).") from None
    if not texts:
        raise ValueError(
            f"{path} has no usable rows: "
            + ("every row is neutral (rating 0), and neutral rows are dropped." if neutral else "a header but no rows.")
        )
    return texts, np.asarray(labels, dtype="int32")


def _check_header(header, path):
    """A `ValueError` unless `header` is exactly id, rating, text (any case;
    empty trailing fields allowed): a fourth named column would otherwise be
    read as part of every text."""
    names = [h.strip().lower() for h in header] if header is not None else None
    while names and not names[-1]:
        names.pop()
    if names == ["id", "rating", "text"]:
        return
    extra = ""
    if names is not None and names[:3] == ["id", "rating", "text"]:
        extra = (
            f" The extra columns {header[3:]!r} would be read as part of every text: remove them, or read the file "
            "with `bertzoo.datasets.threshold_labels(*load_labelled_texts(path, label_column='rating'), 0.0)`."
        )
    raise ValueError(f"{path}: expected a header line 'id<TAB>rating<TAB>text', got {header!r}.{extra}")


def _rating(field, path, line_number):
    """The rating in `field` as a float; a `ValueError` naming the line if it
    is not a finite number as people write one (`float` would also read
    "1_0" as 10, and other scripts' digits)."""
    rating = float(field) if NUMBER_PATTERN.fullmatch(field.strip()) else None
    if rating is None or not math.isfinite(rating):
        raise ValueError(
            f"{path}:{line_number}: the rating {field!r} is not a finite number; "
            "expected id<TAB>rating<TAB>text with a rating such as -1.5 or 2."
        )
    return rating


def split(texts, labels, test_fraction=0.2, seed=0):
    """A seeded shuffle-split into `(train_texts, train_labels), (test_texts, test_labels)`.

    `round(len(texts) * test_fraction)` examples go to the test side. The
    split is by position, not by text: a sentence that appears more than
    once in the data can land on both sides (dedupe the texts first if that
    matters). `test_fraction` outside (0, 1), texts and labels of
    different lengths, or a split that leaves one side empty is a
    `ValueError`.
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real) or not 0 < test_fraction < 1:
        raise ValueError(f"`test_fraction` must be a fraction between 0 and 1 (exclusive), got {test_fraction!r}.")
    if len(texts) != len(labels):
        raise ValueError(
            f"`texts` and `labels` must have one entry per example: got {len(texts)} texts and {len(labels)} labels."
        )
    order = np.random.default_rng(seed).permutation(len(texts))
    n_test = int(round(len(texts) * test_fraction))
    if not 0 < n_test < len(texts):
        raise ValueError(
            f"A test fraction of {test_fraction} of {len(texts)} examples leaves "
            f"{'no test' if n_test == 0 else 'no training'} examples; use more data or another fraction."
        )
    test, train = order[:n_test], order[n_test:]
    texts = np.asarray(texts, dtype=object)
    labels = np.asarray(labels)
    return (list(texts[train]), labels[train]), (list(texts[test]), labels[test])


SHARED_ENV = "BERTZOO_SHARED"


def shared_folders():
    """Where the shared folder may be: `$BERTZOO_SHARED` alone when it is set
    (a `FileNotFoundError` when that folder does not exist: a wrong setting is
    not silently replaced by another folder, or by generated data), else
    `../shared` next to the working directory, then next to the checkout.

    Example:
    ```python
    shared_folders()  # e.g. [PosixPath('/home/me/shared'), ...]: absolute, without $BERTZOO_SHARED
    ```
    """
    root = os.environ.get(SHARED_ENV)
    if root:
        if not Path(root).expanduser().is_dir():
            raise FileNotFoundError(
                f"${SHARED_ENV}={root} is not a folder: point it at the shared folder (the one holding data/ "
                "and models/), or unset it to look next to the checkout."
            )
        return [Path(root).expanduser()]
    return [Path.cwd().parent / "shared", Path(__file__).resolve().parents[3] / "shared"]


def find_shared(*parts):
    """Path of `parts` inside the shared folder (see `shared_folders`), or
    None when it has no such file or folder.

    Example:
    ```python
    model_dir = find_shared("models", "all-MiniLM-L6-v2")
    ```
    """
    for base in shared_folders():
        path = base.joinpath(*parts)
        if path.exists():
            return path
    return None


def find_shared_sentiment(name="amazon"):
    """Path of the shared folder's `data/sentiment/NAME.tsv`, or None; see
    `find_shared` for where it looks.

    Example:
    ```python
    path = find_shared_sentiment("tweets")
    ```
    """
    return find_shared("data", "sentiment", f"{name}.tsv")


_POSITIVE = "good great wonderful delightful superb lovely brilliant charming moving excellent".split()
_NEGATIVE = "bad awful boring dreadful clumsy tedious dull painful weak terrible".split()
_SUBJECTS = "the film|this book|the meal|our stay|the concert|that phone|the plot|the service".split("|")
_TEMPLATES = (
    "{s} was {w}.",
    "honestly, {s} felt {w} from start to finish",
    "i thought {s} was {w} and so did my friends",
    "{s}? {w}, really {w}.",
    "what a {w} experience {s} turned out to be",
)


def synthetic_sentiment(num_examples=512, seed=0):
    """A generated binary sentiment set: `(texts, labels)`.

    It has 800 distinct sentences, so a larger set repeats them, and a split
    of it has sentences on both sides: its test accuracy measures little
    more than the words' polarity.

    Example:
    ```python
    texts, labels = synthetic_sentiment(8)
    ```
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral) or num_examples < 1:
        raise ValueError(f"`num_examples` must be an int >= 1, got {num_examples!r}.")
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(num_examples):
        label = int(rng.integers(2))
        word = rng.choice(_POSITIVE if label else _NEGATIVE)
        template = _TEMPLATES[int(rng.integers(len(_TEMPLATES)))]
        subject = _SUBJECTS[int(rng.integers(len(_SUBJECTS)))]
        texts.append(template.format(s=subject, w=word))
        labels.append(label)
    return texts, np.asarray(labels, dtype="int32")
