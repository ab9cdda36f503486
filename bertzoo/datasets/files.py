"""Labelled text files: TSV, CSV or JSON Lines with named text and label columns.

`load_labelled_texts` reads one file into `(texts, labels)` with the labels
as read (ints or strings); `label_ids` maps labels to class ids by sorted
order (numbers numerically, otherwise as strings) and returns the classes,
so the mapping can be recorded and applied to another file.
"""

import csv
import json
from pathlib import Path

FORMATS = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


def _format_of(path):
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"{path}: unknown file type {path.suffix or '(no extension)'!r}; expected .tsv, .csv or "
            ".jsonl (one JSON object per line) with a header naming the columns."
        )
    return kind


def _rows(path, kind):
    """Yields `(line_number, columns, row dict)`; `columns` is the header."""
    with open(path, newline="", encoding="utf-8") as f:
        if kind == "jsonl":
            columns = None
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_number}: not valid JSON ({e.msg}).") from None
                if not isinstance(row, dict):
                    raise ValueError(
                        f"{path}:{line_number}: expected a JSON object per line, got {type(row).__name__}."
                    )
                if columns is None:
                    columns = list(row)
                yield line_number, columns, row
            return
        # TSV files are read as plain tab-separated fields (no quoting), as GLUE's are.
        if kind == "tsv":
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            reader = csv.reader(f)
        columns = None
        for row in reader:
            if columns is None:
                if not row or not any(cell.strip() for cell in row):
                    continue
                columns = [cell.strip() for cell in row]
                continue
            if not row:
                continue
            yield reader.line_num, columns, dict(zip(columns, row))
        if columns is not None:
            yield None, columns, None  # A header with no rows.


def load_labelled_texts(path, text_column="text", label_column="label"):
    """Returns `(texts, labels)` from a TSV, CSV or JSONL file.

    TSV and CSV files need a header line naming the columns; JSONL files hold
    one object per line. Labels are returned as read: ints stay ints, and
    strings that all spell integers become ints. A missing column, an empty
    file or a row without a label is a `ValueError` naming the file.

    Example:
    ```python
    texts, labels = load_labelled_texts("train.tsv", text_column="sentence", label_column="label")
    ```
    """
    path, texts, labels = _read_columns(path, text_column, label_column)
    return texts, _as_ints_if_possible(labels, path)


def load_texts(path, text_column="text"):
    """Returns the texts of a TSV, CSV or JSONL file (other columns are
    ignored): unlabelled text, e.g. a distillation transfer set. Errors as
    `load_labelled_texts`.

    Example:
    ```python
    transfer = load_texts("unlabelled.jsonl")
    ```
    """
    return _read_columns(path, text_column, None)[1]


def _read_columns(path, text_column, label_column):
    """`(path, texts, labels)`; no labels (an empty list) when `label_column` is None."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (expected a .tsv, .csv or .jsonl file).")
    kind = _format_of(path)
    texts, labels = [], []
    columns = None
    wanted = (("text", text_column),) + ((("label", label_column),) if label_column is not None else ())
    for line_number, columns, row in _rows(path, kind):
        for role, name in wanted:
            if name not in columns:
                raise ValueError(
                    f"{path}: no {role} column {name!r}; columns found: {columns}. "
                    f"Name the right one with --{role}-column (Python: {role}_column=...)."
                )
        if row is None:
            break
        text = row.get(text_column)
        if label_column is not None:
            label = row.get(label_column)
            if label is None or (isinstance(label, str) and not label.strip()):
                raise ValueError(f"{path}:{line_number}: no value in the label column {label_column!r}.")
            labels.append(label.strip() if isinstance(label, str) else label)
        if text is None:
            raise ValueError(f"{path}:{line_number}: no value in the text column {text_column!r}.")
        if not isinstance(text, str):
            raise ValueError(f"{path}:{line_number}: the text column {text_column!r} holds {text!r}, not a string.")
        texts.append(text)
    if not texts:
        raise ValueError(f"{path} is empty: " + ("a header but no rows." if columns else "no header and no rows."))
    return path, texts, labels


def _as_ints_if_possible(labels, path):
    for label in labels:
        if isinstance(label, (dict, list)) or label is None:
            raise ValueError(f"{path}: labels must be ints or strings, got {label!r}.")
    if all(isinstance(label, bool) for label in labels):
        return [int(label) for label in labels]
    if all(isinstance(label, int) and not isinstance(label, bool) for label in labels):
        return labels
    strings = [str(label) for label in labels]
    try:
        return [int(s) for s in strings]
    except ValueError:
        return strings


def label_ids(labels, classes=None, source=None):
    """Maps labels to class ids; returns `(ids, classes)`.

    Without `classes`, the classes are the distinct labels in sorted order
    (numbers numerically); with them (e.g. the training file's), a label
    outside them is a `ValueError` naming `source`.
    """
    if classes is None:
        classes = sorted(set(labels), key=lambda c: (isinstance(c, str), c))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({str(label) for label in labels if label not in index})
    if unknown:
        where = f"{source}: " if source else ""
        raise ValueError(f"{where}labels {unknown[:10]} are not among the training classes {list(classes)}.")
    return [index[label] for label in labels], list(classes)


def threshold_labels(texts, labels, threshold, source=None):
    """Binary labels from numeric ratings: 1 above `threshold`, 0 below; rows
    rated exactly `threshold` are dropped (SST-2 style). Returns `(texts,
    labels)`; a label that is not a number is a `ValueError` naming `source`.

    Example:
    ```python
    texts, labels = threshold_labels(*load_labelled_texts("rated.tsv", label_column="rating"), 0.0)
    ```
    """
    kept_texts, kept_labels = [], []
    for text, label in zip(texts, labels):
        try:
            value = float(label)
        except (TypeError, ValueError):
            where = f"{source}: " if source else ""
            raise ValueError(
                f"{where}label {label!r} is not a number: a label threshold needs numeric ratings."
            ) from None
        if value != threshold:
            kept_texts.append(text)
            kept_labels.append(int(value > threshold))
    return kept_texts, kept_labels
