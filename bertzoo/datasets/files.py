"""Labelled text files: TSV, CSV or JSON Lines with named text and label columns.

`load_labelled_texts` reads one file into `(texts, labels)` with the labels
as read (numbers or strings); `label_ids` maps labels to class ids by sorted
order (numbers, and strings that spell finite numbers, numerically and
first; other strings after them, as text) and returns the classes, so the
mapping can be recorded and applied to another file: there `1`, `"1"` and
`"1.0"` are one class.

Files are read as UTF-8, with or without a byte-order mark (Excel's "CSV
UTF-8", Notepad); any other encoding is a `ValueError` naming the line.
"""

import collections
import csv
import functools
import json
import math
import numbers
import re
import sys
from pathlib import Path

FORMATS = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
# "utf-8-sig" reads UTF-8 and drops a leading byte-order mark, if any.
ENCODING = "utf-8-sig"


def _format_of(path):
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"{path}: unknown file type {path.suffix or '(no extension)'!r}; expected .tsv, .csv or "
            ".jsonl (one JSON object per line) with a header naming the columns."
        )
    return kind


@functools.cache
def allow_long_csv_fields():
    """Lifts the `csv` module's 131072-character field limit (a long text is
    no error), once per process, to the largest the platform accepts."""
    limit = min(sys.maxsize, 2**31 - 1)  # A C long: 32 bits on Windows.
    if csv.field_size_limit() < limit:
        csv.field_size_limit(limit)


def not_utf8_error(path):
    """The `ValueError` for a file that does not decode as UTF-8: names the
    first bad line and byte, and the fix."""
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                utf16 = line_number == 1 and line[:2] in (b"\xff\xfe", b"\xfe\xff")
                return ValueError(
                    f"{path}:{line_number}: not UTF-8 text (byte 0x{line[e.start]:02x})"
                    f'{" (it looks like UTF-16)" if utf16 else ""}. Save the file as UTF-8 (in Excel: "CSV '
                    f'UTF-8"), or convert it, e.g. `iconv -f {"utf-16" if utf16 else "latin1"} -t utf-8`.'
                )
    return ValueError(f"{path}: not UTF-8 text. Save the file as UTF-8.")


def _rows(path, kind):
    """Yields `(line_number, columns, row dict)`; `columns` is the header
    (for JSONL, the keys of that line's object)."""
    allow_long_csv_fields()
    with open(path, newline="", encoding=ENCODING) as f:
        rows = _json_rows(f, path) if kind == "jsonl" else _delimited_rows(f, path, kind)
        try:
            yield from rows
        except UnicodeDecodeError:
            raise not_utf8_error(path) from None


class _RepeatedKeys(dict):
    """A JSON object that gives the key `repeated` more than once (JSON keeps the last)."""

    repeated = None


def _unique_keys(pairs):
    """A JSON object as a dict, marked when it gives a key twice: only a line's
    own object is refused for that (as a TSV/CSV header's repeated name is),
    not an object nested in it."""
    row = dict(pairs)
    if len(row) < len(pairs):
        counts = collections.Counter(key for key, _ in pairs)
        row = _RepeatedKeys(row)
        row.repeated = next(key for key, count in counts.items() if count > 1)
    return row


def _json_rows(f, path):
    """JSON Lines: one object per line, blank lines skipped."""
    for line_number, line in enumerate(f, start=1):
        if not line.strip():
            continue
        hint = (
            " JSON files are read as JSON Lines: one object per line, e.g. "
            '{"text": "...", "label": 1}; a JSON array or an object spread over several lines is not. '
            "Write one object per line (with Python: json.dumps(row) per line)."
        )
        try:
            row = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            shown = hint if line.lstrip().startswith(("[", "{")) and line_number == 1 else ""
            raise ValueError(f"{path}:{line_number}: not valid JSON ({e.msg}).{shown}") from None
        if not isinstance(row, dict):
            shown = hint if isinstance(row, list) and line_number == 1 else ""
            raise ValueError(f"{path}:{line_number}: expected a JSON object per line, got {type(row).__name__}.{shown}")
        if isinstance(row, _RepeatedKeys):
            raise ValueError(
                f"{path}:{line_number}: the key {row.repeated!r} appears more than once on this line (JSON keeps the "
                "last silently); keep one."
            )
        yield line_number, list(row), row


def _delimited_rows(f, path, kind):
    """CSV or TSV rows under a header line; a row with more fields than the header is an error."""
    # TSV files are read as plain tab-separated fields (no quoting), as GLUE's are.
    tap = LineTap(f)
    if kind == "tsv":
        dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
        hint = "a tab inside a text? TSV fields cannot be quoted: remove the tab, or save as CSV and quote that field"
    else:
        dialect = {}
        hint = 'a comma inside a text? Quote the fields that contain one: "hello, world",1'
    cr_fix = (
        "Remove it from the text (e.g. replace it with a space)"
        if kind == "tsv"
        else 'Remove it from the text, or quote the field: "one\\rtwo",1'
    )
    reader = csv.reader(tap, **dialect)
    columns = None
    seen_newline = False  # Lines ending "\n" (or "\r\n"): then one ending in a bare "\r" is no line end.
    held = None  # The last row read, yielded once the next one shows it was not cut off by the end of the file.
    try:
        for row in reader:
            lines, tap.lines = tap.lines, []
            seen_newline = seen_newline or any(line.endswith("\n") for line in lines)
            if columns is None:
                if not row or not any(cell.strip() for cell in row):
                    continue
                columns = [cell.strip() for cell in row]
                repeated = sorted({name for name in columns if name and columns.count(name) > 1})
                if repeated:
                    raise ValueError(
                        f"{path}:{reader.line_num}: the header names {repeated} more than once; give each column "
                        "its own name."
                    )
                continue
            if not any(cell.strip() for cell in row):
                continue  # A blank line, or one of only spaces or tabs (or delimiters).
            if len(row) > len(columns) and not any(cell.strip() for cell in row[len(columns) :]):
                row = row[: len(columns)]  # A trailing delimiter: empty fields past the header's width.
            if len(row) > len(columns):
                raise ValueError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(columns)} ({hint})."
                )
            if len(row) < len(columns) and seen_newline:
                # A bare carriage return ends a line for the reader: inside a text, it cuts the row in two.
                cut_at = reader.line_num if _ends_with_bare_cr(lines) else None
                if cut_at is None and held is not None and _ends_with_bare_cr(held[3]):
                    cut_at = held[0]  # The row before was cut: this is its rest.
                if cut_at is not None:
                    raise ValueError(
                        f"{path}:{cut_at}: the line ends with a bare carriage return (\\r), which cuts the row "
                        f"(a carriage return inside a text? {cr_fix})."
                    )
            if kind == "tsv" and len(row) < len(columns) and any(_opens_a_quote(cell) for cell in row):
                # A quoted text with a line break (CSV-style) splits into short rows here.
                raise ValueError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(columns)}, and a field opens a "
                    "quote it never closes: a line break inside a quoted text? TSV fields cannot be quoted, so a line break "
                    "ends the row: remove it from the text (e.g. replace it with a space), or save as CSV and quote "
                    "that field."
                )
            if held is not None:
                yield held[:3]
            held = (reader.line_num, columns, dict(zip(columns, row)), lines)
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not valid {kind.upper()} ({e}).") from None
    if held is not None:
        line_number, _, _, lines = held
        if len(lines) > 1 and _ends_inside_quotes(lines, dialect):
            raise ValueError(
                f"{path}:{line_number - len(lines) + 1}: a double quote opens a field that is never closed, so the "
                f"rest of the file (to line {line_number}) would be one text. Close the quote, or write a quote "
                'inside a quoted field as two ("").'
            )
        yield held[:3]
    if columns is not None:
        yield None, columns, None  # A header with no rows.


class LineTap:
    """Iterates over a file's lines for `csv.reader`, keeping those read
    since `lines` was last emptied (the current row's)."""

    def __init__(self, f):
        self.f = f
        self.lines = []

    def __iter__(self):
        return self

    def __next__(self):
        line = next(self.f)
        self.lines.append(line)
        return line


def _opens_a_quote(cell):
    """A field that opens a double quote and never closes it (`"first line`), as
    a CSV-style quoted text cut by its line break leaves in a TSV row."""
    cell = cell.lstrip()
    return cell.startswith('"') and cell[1:].count('"') % 2 == 0 and not cell.rstrip().endswith('"')


def _ends_with_bare_cr(lines):
    """Whether the last of `lines` ends with a carriage return alone (not "\\r\\n")."""
    return bool(lines) and lines[-1].endswith("\r")


def _ends_inside_quotes(lines, dialect):
    """Whether the row made of `lines` ends inside a quoted field (the
    lenient reader takes the end of the file as the field's end)."""
    try:
        list(csv.reader(lines, strict=True, **dialect))
    except csv.Error as e:
        return "unexpected end of data" in str(e)
    return False


def load_labelled_texts(path, text_column="text", label_column="label"):
    """Returns `(texts, labels)` from a TSV, CSV or JSONL file.

    TSV and CSV files need a header line naming the columns, and no row may
    have more fields than the header; JSONL files hold one object per line.
    Labels are returned as read: numbers stay numbers, and strings that all
    spell numbers become numbers; a whole number is an int (`1.0` is `1`),
    so `1` and `1.0` are one class. A missing column, an empty file, a row
    without a label or a text, or a label that is NaN or infinite is a
    `ValueError` naming the file.

    Example:
    ```python
    texts, labels = load_labelled_texts("train.tsv", text_column="sentence", label_column="label")
    ```
    """
    if text_column == label_column:
        raise ValueError(
            f"The text and the label column are both {text_column!r}: the model would read its labels as text. "
            "Name two columns (--text-column and --label-column; Python: text_column=, label_column=)."
        )
    path, texts, labels, lines = _read_columns(path, text_column, label_column)
    return texts, _as_numbers_if_possible(labels, path, lines)


def load_texts(path, text_column="text", option="text"):
    """Returns the texts of a TSV, CSV or JSONL file (other columns are
    ignored): unlabelled text, e.g. a distillation transfer set. Errors as
    `load_labelled_texts`; a missing column's message names the setting
    `--<option>-column` / `<option>_column` that chooses it.

    Example:
    ```python
    transfer = load_texts("unlabelled.jsonl")
    ```
    """
    return _read_columns(path, text_column, None, text_option=option)[1]


def _read_columns(path, text_column, label_column, text_option="text"):
    """`(path, texts, labels, line numbers)`; no labels (an empty list) when `label_column` is None."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; expected a .tsv, .csv or .jsonl file.")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (expected a .tsv, .csv or .jsonl file).")
    kind = _format_of(path)
    texts, labels, lines = [], [], []
    columns = None
    wanted = (("text", text_column, text_option),) + (
        (("label", label_column, "label"),) if label_column is not None else ()
    )
    for line_number, columns, row in _rows(path, kind):
        for role, name, option in wanted:
            if name not in columns:
                raise _missing_column(path, kind, line_number, role, name, columns, option)
        if row is None:
            break
        text = row.get(text_column)
        if label_column is not None:
            label = row.get(label_column)
            if label is None or (isinstance(label, str) and not label.strip()):
                raise ValueError(f"{path}:{line_number}: no value in the label column {label_column!r}.")
            labels.append(label.strip() if isinstance(label, str) else label)
            lines.append(line_number)
        if text is None:
            raise ValueError(f"{path}:{line_number}: no value in the text column {text_column!r}.")
        if not isinstance(text, str):
            raise ValueError(f"{path}:{line_number}: the text column {text_column!r} holds {text!r}, not a string.")
        if not text.strip():
            raise ValueError(
                f"{path}:{line_number}: the text column {text_column!r} is empty; give every row a text "
                "(or delete the row)."
            )
        texts.append(text)
    if not texts:
        raise ValueError(f"{path} is empty: " + ("a header but no rows." if columns else "no header and no rows."))
    return path, texts, labels, lines


def _missing_column(path, kind, line_number, role, name, columns, option):
    """The `ValueError` for a column the header (CSV, TSV) or one line's
    object (JSONL, whose lines may differ) does not have; `option` names the
    setting that chooses the column."""
    fix = f"Name the right one with --{option}-column (Python: {option}_column=...)."
    if kind == "jsonl":
        return ValueError(
            f"{path}:{line_number}: no value in the {role} column {name!r}; the keys on this line are {columns}. "
            f"Give every line a {name!r}, or {fix[0].lower()}{fix[1:]}"
        )
    delimiter = {"csv": ",", "tsv": "\t"}.get(kind)
    if len(columns) == 1 and delimiter is not None:
        used = next((d for d in (";", "\t", ",", "|") if d != delimiter and d in columns[0]), None)
        if used is not None:
            rename = {"\t": " (or name it .tsv)", ",": " (or name it .csv)"}.get(used, "")
            return ValueError(
                f"{path}: the header has one column, {columns[0]!r}: its fields look separated by {used!r}, but "
                f"a .{kind} file's are separated by {delimiter!r}. Save it with {delimiter!r} between fields"
                f"{rename}."
            )
    return ValueError(f"{path}: no {role} column {name!r}; columns found: {columns}. {fix}")


def _as_numbers_if_possible(labels, path, lines):
    """The labels as numbers (whole ones as ints) when they all are or spell
    numbers, as ints when they are all bools, otherwise as strings; `lines`
    are their line numbers, for the errors."""
    for label, line in zip(labels, lines):
        if isinstance(label, (dict, list)) or label is None:
            raise ValueError(f"{path}:{line}: labels must be numbers or strings, got {label!r}.")
    if all(isinstance(label, bool) for label in labels):
        return [int(label) for label in labels]
    if any(isinstance(label, bool) for label in labels) and any(
        isinstance(label, (int, float)) and not isinstance(label, bool) for label in labels
    ):
        raise ValueError(
            f"{path}: labels mix true/false with numbers; use one kind (0 and 1, or true and false) in every row."
        )
    numbers = [_number(label) for label in labels]
    if any(n is None for n in numbers):
        # Class names; numbers among them keep one spelling each ("1" and "1.0" are one class).
        return [
            str(label) if n is None else str(int(n) if float(n).is_integer() else n)
            for label, n in zip(labels, numbers)
        ]
    for label, number, line in zip(labels, numbers, lines):
        if not math.isfinite(number):
            raise ValueError(
                f"{path}:{line}: label {label!r} is not a finite number; give every row a numeric label (or a class "
                "name)."
            )
    return [int(n) if isinstance(n, float) and n.is_integer() else n for n in numbers]


# A number as people write one in a data file: ASCII digits, an optional
# sign, decimals and exponent, "nan" and "inf" (Python's int() and float()
# also take "1_000" and other scripts' digits, which would merge classes).
NUMBER_PATTERN = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE | re.ASCII)


def _number(label):
    """`label` as an int or float, or None if it is not (and does not spell) one."""
    if isinstance(label, bool):
        return None
    if isinstance(label, (int, float)):
        return label
    text = str(label).strip()
    if not NUMBER_PATTERN.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def label_ids(labels, classes=None, source=None, of="the training classes"):
    """Maps labels to class ids; returns `(ids, classes)`.

    Labels are compared by value: a number and a string spelling it (`1`,
    `"1"`, `"1.0"`) are one class, so a file whose labels were read as
    strings (one of them was not a number) maps onto another's numbers.
    Without `classes`, the classes are the distinct labels (the first
    spelling of each) in sorted order: numbers, and strings that spell
    finite numbers, numerically and first; other labels after them, as text
    (`[2, 10, "none"]` for `["10", "2", "none"]`). With `classes` (e.g. the
    training file's), a label outside them is a `ValueError` naming
    `source` and, in `of`, where the classes came from.

    Example:
    ```python
    label_ids(["10", "2", "none"])  # ([1, 0, 2], ['2', '10', 'none'])
    label_ids([2, 1], classes=["1", "2", "none"])  # ([1, 0], ['1', '2', 'none'])
    ```
    """
    if classes is None:
        distinct = {}
        for label in labels:
            distinct.setdefault(_class_key(label), label)
        classes = [distinct[key] for key in sorted(distinct, key=_class_order)]
    index = {}
    for i, c in enumerate(classes):
        index.setdefault(_class_key(c), i)
    keys = [_class_key(label) for label in labels]
    unknown = sorted({str(label) for label, key in zip(labels, keys) if key not in index})
    if unknown:
        where = f"{source}: " if source else ""
        named = [_number(label) is None for label, key in zip(labels, keys) if key not in index]
        numeric_classes = [_number(c) is not None for c in classes]
        hint = ""
        if all(named) and all(numeric_classes):
            hint = " These labels are names and those classes numbers: use the same kind of labels in every file."
        elif not any(named) and not any(numeric_classes):
            hint = " These labels are numbers and those classes names: use the same kind of labels in every file."
        raise ValueError(f"{where}labels {unknown[:10]} are not among {of} {list(classes)}.{hint}")
    return [index[key] for key in keys], list(classes)


def _class_key(label):
    """A label's class, as `label_ids` compares them: a finite number (a
    whole one as an int; bools as 0 and 1), whether given as a number or as
    a string spelling one, otherwise the label as a string."""
    number = int(label) if isinstance(label, bool) else _number(label)
    if number is None or not math.isfinite(number):
        return str(label).strip() if isinstance(label, str) else str(label)
    return int(number) if float(number).is_integer() else float(number)


def _class_order(key):
    """Sorts `_class_key`s: numbers numerically, then strings as text."""
    return (1, 0, key) if isinstance(key, str) else (0, key, "")


def threshold_labels(texts, labels, threshold, source=None):
    """Binary labels from numeric ratings: 1 above `threshold`, 0 below; rows
    rated exactly `threshold` are dropped (SST-2 style). Returns `(texts,
    labels)`; a label that is not a finite number is a `ValueError` naming
    `source`.

    Example:
    ```python
    texts, labels = threshold_labels(*load_labelled_texts("rated.tsv", label_column="rating"), 0.0)
    ```
    """
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
        raise ValueError(f"The label threshold must be a finite number, got {threshold!r}.")
    kept_texts, kept_labels = [], []
    where = f"{source}: " if source else ""
    for text, label in zip(texts, labels):
        value = _number(label)
        if value is None:
            raise ValueError(f"{where}label {label!r} is not a number: a label threshold needs numeric ratings.")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{where}label {label!r} is not a finite number: a label threshold needs numeric ratings.")
        if value != threshold:
            kept_texts.append(text)
            kept_labels.append(int(value > threshold))
    return kept_texts, kept_labels
