"""`bertzoo.datasets` file readers: encodings (a UTF-8 byte-order mark, a
file that is not UTF-8), rows with too many fields, numeric labels, long CSV
fields, JSONL lines without a column and the rated-sentences TSV."""

import csv
import json
import math

import pytest

from bertzoo.datasets import find_shared
from bertzoo.datasets import find_shared_sentiment
from bertzoo.datasets import label_ids
from bertzoo.datasets import load_labelled_texts
from bertzoo.datasets import load_rated_sentences
from bertzoo.datasets import load_texts
from bertzoo.datasets import synthetic_sentiment
from bertzoo.datasets import threshold_labels
from bertzoo.datasets.sentiment import split


def write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding, newline="")
    return path


def jsonl(path, *objects):
    return write(path, "".join(json.dumps(o) + "\n" for o in objects))


def labels_of(path):
    return load_labelled_texts(path)[1]


def test_a_utf8_byte_order_mark_is_read_as_utf8(tmp_path):
    # Excel's "CSV UTF-8" and Notepad write one; it is not part of the first column's name.
    for name, body in [("a.csv", "text,label\nhéllo,1\n"), ("a.tsv", "text\tlabel\nhéllo\t1\n")]:
        assert load_labelled_texts(write(tmp_path / name, body, "utf-8-sig")) == (["héllo"], [1])
    bom = write(tmp_path / "a.jsonl", '{"text": "héllo", "label": 1}\n', "utf-8-sig")
    assert load_labelled_texts(bom) == (["héllo"], [1])
    assert load_texts(bom) == ["héllo"]
    rated = write(tmp_path / "rated.tsv", "id\trating\ttext\n1\t1.5\tgood\n", "utf-8-sig")
    texts, labels = load_rated_sentences(rated)
    assert texts == ["good"] and labels.tolist() == [1]


def test_a_file_that_is_not_utf8_is_a_value_error_naming_the_line_and_the_fix(tmp_path):
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"text,label\nok,0\nh\xe9llo,1\n")
    fix = r'Save the file as UTF-8 \(in Excel: "CSV UTF-8"\)'
    with pytest.raises(ValueError, match=rf"latin1\.csv:3: not UTF-8 text \(byte 0xe9\)\. {fix}") as raised:
        load_labelled_texts(latin1)
    assert not isinstance(raised.value, UnicodeDecodeError)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "h\xe9llo"}\n')
    with pytest.raises(ValueError, match=rf"latin1\.jsonl:1: not UTF-8 text \(byte 0xe9\)\. {fix}"):
        load_texts(tmp_path / "latin1.jsonl")
    write(tmp_path / "utf16.tsv", "text\tlabel\nhi\t1\n", "utf-16")  # Excel's "Unicode Text".
    with pytest.raises(ValueError, match=r"utf16\.tsv:1: not UTF-8 text \(byte 0xff\) \(it looks like UTF-16\)"):
        load_texts(tmp_path / "utf16.tsv")
    (tmp_path / "rated.tsv").write_bytes(b"id\trating\ttext\n1\t1\tcaf\xe9\n")
    with pytest.raises(ValueError, match=rf"rated\.tsv:2: not UTF-8 text \(byte 0xe9\)\. {fix}"):
        load_rated_sentences(tmp_path / "rated.tsv")


def test_a_row_with_more_fields_than_the_header_is_an_error(tmp_path):
    # An unquoted comma used to split "hello, world" into the text 'hello' and the label ' world'.
    unquoted = write(tmp_path / "t.csv", "text,label\nbye,0\nhello, world,1\n")
    with pytest.raises(
        ValueError,
        match=r"t\.csv:3: 3 fields, the header has 2 \(a comma inside a text\? Quote the fields that contain one",
    ):
        load_labelled_texts(unquoted)
    with pytest.raises(ValueError, match=r"t\.csv:3: 3 fields, the header has 2"):
        load_texts(unquoted)  # The text column comes first, but the row is still ambiguous.
    quoted = write(tmp_path / "q.csv", 'text,label\n"hello, world",1\n')
    assert load_labelled_texts(quoted) == (["hello, world"], [1])
    tab = write(tmp_path / "t.tsv", "label\ttext\n0\tbad\n1\tgreat\tfilm\n")
    with pytest.raises(
        ValueError, match=r"t\.tsv:3: 3 fields, the header has 2 \(a tab inside a text\? TSV fields cannot be quoted"
    ):
        load_labelled_texts(tab)
    # A line after a quoted multi-line field is named by its own line number.
    multiline = write(tmp_path / "m.csv", 'text,label\n"two\nlines",1\na,b,c\n')
    with pytest.raises(ValueError, match=r"m\.csv:4: 3 fields, the header has 2"):
        load_labelled_texts(multiline)
    # Fewer fields than the header: the missing value is named, as before.
    short = write(tmp_path / "s.csv", "text,label\nhello\n")
    with pytest.raises(ValueError, match=r"s\.csv:2: no value in the label column 'label'\."):
        load_labelled_texts(short)
    # A trailing delimiter on every line is an empty last column, not an extra field.
    assert load_labelled_texts(write(tmp_path / "e.csv", "text,label,\nhi,1,\n")) == (["hi"], [1])


def test_a_quote_that_never_closes_is_named_not_read_as_one_long_text(tmp_path):
    # The lenient CSV reader ends the open field at the end of the file: every later row became part of
    # one text (load_texts returned 2 texts for 4 rows) or a "missing label" on the wrong line.
    fix = r"Close the quote, or write a quote inside a quoted field as two \(\"\"\)\."
    open_quote = write(tmp_path / "o.csv", 'text,label\nfine,1\n"it was, well,0\nok,1\nbad,0\n')
    for load in (load_labelled_texts, load_texts):
        with pytest.raises(
            ValueError, match=rf"o\.csv:3: a double quote opens a field that is never closed, .* \(to line 5\) .*{fix}"
        ):
            load(open_quote)
    # Closed quotes, one line or several, and the lenient reading of a stray quote stay as they were.
    closed = write(tmp_path / "c.csv", 'text,label\n"say ""hi""",1\nx,0\n"two\nlines",1\n')
    assert load_labelled_texts(closed) == (['say "hi"', "x", "two\nlines"], [1, 0, 1])
    assert load_texts(write(tmp_path / "s.csv", 'text,label\n"a"bc,1\n')) == ["abc"]


def test_numeric_labels_are_numbers_and_whole_ones_are_ints(tmp_path):
    scores = jsonl(
        tmp_path / "r.jsonl", {"text": "a", "label": 0.5}, {"text": "b", "label": 10}, {"text": "c", "label": 2}
    )
    assert labels_of(scores) == [0.5, 10, 2]
    assert label_ids(labels_of(scores)) == ([0, 2, 1], [0.5, 2, 10])  # Numerically, not as text.
    floats = write(tmp_path / "f.csv", "text,label\na,2.5\nb,10.0\nc,2.0\n")
    assert labels_of(floats) == [2.5, 10, 2] and label_ids(labels_of(floats))[1] == [2, 2.5, 10]
    assert [type(label) for label in labels_of(floats)] == [float, int, int]
    one = write(tmp_path / "one.csv", "text,label\na,0\nb,1\nc,1.0\nd, 1e0 \n")
    assert labels_of(one) == [0, 1, 1, 1] and label_ids(labels_of(one)) == ([0, 1, 1, 1], [0, 1])
    whole = jsonl(
        tmp_path / "w.jsonl", {"text": "a", "label": 1.0}, {"text": "b", "label": "1"}, {"text": "c", "label": 0}
    )
    assert labels_of(whole) == [1, 1, 0] and all(type(label) is int for label in labels_of(whole))
    # An eval file that spells a class differently still maps onto the training classes.
    assert label_ids(labels_of(whole), classes=label_ids(labels_of(one))[1]) == ([1, 1, 0], [0, 1])
    # Unchanged: ints, bools, strings spelling ints, class names; one non-number makes them all strings.
    assert labels_of(jsonl(tmp_path / "i.jsonl", {"text": "a", "label": 3}, {"text": "b", "label": -1})) == [3, -1]
    assert labels_of(jsonl(tmp_path / "b.jsonl", {"text": "a", "label": True}, {"text": "b", "label": False})) == [1, 0]
    assert labels_of(write(tmp_path / "s.tsv", "text\tlabel\na\t 10 \nb\t2\n")) == [10, 2]
    assert labels_of(write(tmp_path / "n.csv", "text,label\na,pos\nb,neg\n")) == ["pos", "neg"]
    # Only ASCII numbers: "1_11" and Arabic-Indic digits stay text (int() would merge them with 111 and 1).
    quirks = write(tmp_path / "q.csv", "text,label\na,1_11\nb,111\nc,\u0661\nd,1\n")
    assert labels_of(quirks) == ["1_11", "111", "\u0661", "1"]
    with pytest.raises(ValueError, match=r"labels mix true/false with numbers"):
        labels_of(jsonl(tmp_path / "tb.jsonl", {"text": "a", "label": True}, {"text": "b", "label": 0}))
    mixed = write(tmp_path / "m.csv", "text,label\na,1\nb,1.5\nc,other\nd,nan\n")
    assert labels_of(mixed) == ["1", "1.5", "other", "nan"]
    assert label_ids(labels_of(mixed))[1] == ["1", "1.5", "nan", "other"]


def test_a_numeric_label_that_is_nan_or_infinite_is_an_error(tmp_path):
    for name, value in [("nan.csv", "nan"), ("inf.csv", "-inf"), ("big.csv", "1e999")]:
        path = write(tmp_path / name, f"text,label\na,1\nb,{value}\n")
        with pytest.raises(ValueError, match=rf"{name}:3: label '{value}' is not a finite number"):
            load_labelled_texts(path)
    with pytest.raises(ValueError, match=r"j\.jsonl:1: label nan is not a finite number"):
        load_labelled_texts(write(tmp_path / "j.jsonl", '{"text": "a", "label": NaN}\n{"text": "b", "label": 1}\n'))
    with pytest.raises(ValueError, match=r"r\.tsv: label 'nan' is not a finite number: a label threshold needs"):
        threshold_labels(["a", "b"], ["1.5", "nan"], 0.0, source="r.tsv")
    assert threshold_labels(["a", "b", "c"], [2.5, 0, -1], 0.0) == (["a", "c"], [1, 0])
    for threshold in (math.nan, math.inf, "3", True):
        with pytest.raises(ValueError, match=r"The label threshold must be a finite number"):
            threshold_labels(["a"], [1], threshold)


def test_a_csv_field_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    long_text = "word " * 30_000  # 150,000 characters, over csv's default 131,072.
    path = write(tmp_path / "long.csv", f'text,label\n"{long_text}",1\nshort,0\n')
    assert load_labelled_texts(path) == ([long_text, "short"], [1, 0])
    assert load_texts(write(tmp_path / "long.tsv", f"text\n{long_text}\n")) == [long_text]
    rated = write(tmp_path / "rated.tsv", f"id\trating\ttext\n1\t-2\t{long_text}\n")
    assert load_rated_sentences(rated)[0] == [long_text.strip()]
    # Any csv.Error (here a field over a limit set lower on purpose) is a ValueError naming the line.
    previous = csv.field_size_limit(1000)
    try:
        with pytest.raises(ValueError, match=r"long\.csv:2: not valid CSV \(field larger than field limit \(1000\)\)"):
            load_texts(path)
        with pytest.raises(ValueError, match=r"rated\.tsv:2: not valid TSV \(field larger than field limit \(1000\)\)"):
            load_rated_sentences(rated)
    finally:
        csv.field_size_limit(previous)


def test_a_jsonl_line_without_a_column_is_named_by_its_line(tmp_path):
    # The first object used to stand for the whole file's columns.
    first = jsonl(tmp_path / "x.jsonl", {"text": "a"}, {"text": "b", "label": 1}, {"text": "c", "label": 0})
    with pytest.raises(
        ValueError, match=r"x\.jsonl:1: no value in the label column 'label'; the keys on this line are \['text'\]\."
    ):
        load_labelled_texts(first)
    assert load_texts(first) == ["a", "b", "c"]
    later = jsonl(tmp_path / "y.jsonl", {"text": "a", "label": 1}, {"label": 0, "sentence": "b"})
    with pytest.raises(ValueError, match=r"y\.jsonl:2: no value in the text column 'text'; the keys on this line are"):
        load_labelled_texts(later)
    # A misnamed column fails on the first line, with the way to name the right one.
    misnamed = jsonl(tmp_path / "z.jsonl", {"text": "a", "stars": 1})
    with pytest.raises(
        ValueError, match=r"z\.jsonl:1: .*Give every line a 'label', or name the right one with --label-column"
    ):
        load_labelled_texts(misnamed)
    assert load_labelled_texts(misnamed, label_column="stars") == (["a"], [1])
    # Blank lines are skipped and do not shift the line numbers.
    blank = write(tmp_path / "w.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b", "label": null}\n')
    with pytest.raises(ValueError, match=r"w\.jsonl:3: no value in the label column 'label'\."):
        load_labelled_texts(blank)
    # CSV and TSV keep the whole-file message: their header names the columns.
    with pytest.raises(ValueError, match=r"h\.csv: no label column 'label'; columns found: \['text', 'stars'\]"):
        load_labelled_texts(write(tmp_path / "h.csv", "text,stars\na,1\n"))


def test_a_json_array_on_one_line_gets_the_json_lines_hint(tmp_path):
    one_line = write(tmp_path / "array.json", '[{"text": "a", "label": 1}]\n')
    with pytest.raises(ValueError, match=r"array\.json:1: expected a JSON object per line, got list\. JSON files are"):
        load_labelled_texts(one_line)
    spread = write(tmp_path / "spread.json", '[\n{"text": "a", "label": 1}\n]\n')
    with pytest.raises(ValueError, match=r"spread\.json:1: not valid JSON .* JSON files are read as JSON Lines"):
        load_labelled_texts(spread)


def test_rated_sentences_skip_blank_lines_and_name_bad_ratings(tmp_path):
    blank = write(tmp_path / "blank.tsv", "id\trating\ttext\n1\t1.5\tgood\n\n2\t-0.5\tbad \n3\t0\tmeh\n\n")
    texts, labels = load_rated_sentences(blank)
    assert texts == ["good", "bad"] and labels.tolist() == [1, 0]
    # The text is the rest of the line (documented): a tab inside it is kept.
    tabbed = write(tmp_path / "tab.tsv", "id\trating\ttext\n1\t2\tgreat\tfilm\n")
    assert load_rated_sentences(tabbed)[0] == ["great\tfilm"]
    with pytest.raises(ValueError, match=r"bad\.tsv:3: the rating 'n/a' is not a finite number; expected id<TAB>"):
        load_rated_sentences(write(tmp_path / "bad.tsv", "id\trating\ttext\n1\t1\tok\n2\tn/a\tgood\n"))
    for value in ["nan", "inf", "-Infinity"]:
        with pytest.raises(ValueError, match=rf"nan\.tsv:2: the rating '{value}' is not a finite number"):
            load_rated_sentences(write(tmp_path / "nan.tsv", f"id\trating\ttext\n1\t{value}\tgood\n2\t1\tok\n"))
    with pytest.raises(ValueError, match=r"short\.tsv:3: expected 3 tab-separated fields, got 2\."):
        load_rated_sentences(write(tmp_path / "short.tsv", "id\trating\ttext\n\n1\t1\n"))
    with pytest.raises(ValueError, match=r"header\.tsv: expected a header line 'id<TAB>rating<TAB>text'"):
        load_rated_sentences(write(tmp_path / "header.tsv", "rating\ttext\n1\tgood\n"))


def test_a_home_relative_path_is_expanded_and_a_directory_is_named_as_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "texts.tsv").write_text("text\tlabel\ngood\t1\n")
    assert load_texts("~/texts.tsv") == ["good"]
    with pytest.raises(IsADirectoryError, match="is a directory; expected a .tsv, .csv or .jsonl file"):
        load_texts(tmp_path)


def test_a_line_break_inside_a_quoted_tsv_text_is_named(tmp_path):
    path = write(tmp_path / "nl.tsv", 'text\tlabel\n"first line\nsecond line"\t1\nbad\t0\n')
    with pytest.raises(ValueError, match=r"nl\.tsv:2: 1 fields, the header has 2.*a line break inside a quoted text"):
        load_labelled_texts(path)  # It said "no value in the label column".
    # A quote that is just a text's first character is read as it is, also on a row without its optional last field.
    assert load_labelled_texts(write(tmp_path / "q.tsv", 'text\tlabel\n"quoted" words\t1\n'))[0] == ['"quoted" words']
    optional = write(tmp_path / "o.tsv", 'text\tlabel\tnote\n"Great," she said\t1\nfine\t0\tok\n')
    assert load_labelled_texts(optional) == (['"Great," she said', "fine"], [1, 0])


def test_a_repeated_jsonl_key_a_list_label_and_one_column_for_both_roles_are_refused(tmp_path):
    twice = write(
        tmp_path / "twice.jsonl", '{"text": "a", "label": 1}\n{"text": "first", "text": "second", "label": 0}\n'
    )
    with pytest.raises(ValueError, match=r"twice\.jsonl:2: the key 'text' appears more than once on this line"):
        load_labelled_texts(twice)  # Read as "second" before, where a CSV's repeated header is refused.
    listed = write(tmp_path / "listed.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b", "label": [1]}\n')
    with pytest.raises(ValueError, match=r"listed\.jsonl:3: labels must be numbers or strings, got \[1\]"):
        load_labelled_texts(listed)
    # Only a line's own object: a repeated key inside a nested one (not read) is no reason to refuse the file.
    nested = write(tmp_path / "nested.jsonl", '{"text": "a", "label": 1, "meta": {"k": 1, "k": 2}}\n')
    assert load_labelled_texts(nested) == (["a"], [1])
    with pytest.raises(ValueError, match=r"The text and the label column are both 'label'.*--text-column"):
        load_labelled_texts(twice, text_column="label")


def test_a_repeated_header_name_is_an_error_and_mixed_labels_keep_one_spelling_per_number(tmp_path):
    with pytest.raises(ValueError, match=r"repeated\.csv:1: the header names \['label'\] more than once"):
        load_labelled_texts(write(tmp_path / "repeated.csv", "text,label,label\ngood,1,0\n"))
    mixed = write(tmp_path / "mixed.csv", "text,label\na,1\nb,pos\nc,1.0\nd,01\n")
    assert load_labelled_texts(mixed)[1] == ["1", "pos", "1", "1"]


def test_labels_read_as_strings_in_one_file_map_onto_numbers_in_another(tmp_path):
    # One non-number makes a file's labels strings: ['1', '2'] used to be "not among the training classes".
    train = labels_of(write(tmp_path / "train.tsv", "text\tlabel\na\t1\nb\t2\nc\tnone\nd\t10\n"))
    assert train == ["1", "2", "none", "10"]
    ids, classes = label_ids(train)
    assert classes == ["1", "2", "10", "none"] and ids == [0, 1, 3, 2]  # Numbers numerically ("10" after "2").
    evaluation = labels_of(write(tmp_path / "eval.tsv", "text\tlabel\na\t2\nb\t1\nc\t10.0\n"))
    assert evaluation == [2, 1, 10]
    assert label_ids(evaluation, classes=classes) == ([1, 0, 2], classes)
    assert label_ids(["none", "2"], classes=[1, 2, "none"])[0] == [2, 1]
    # Only the labels that really are not classes are named.
    with pytest.raises(ValueError, match=r"eval\.tsv: labels \['3', 'other'\] are not among the training classes"):
        label_ids([1, 3, "other", "2"], classes=classes, source="eval.tsv")
    # Another kind of label than the classes (names against numbers, e.g. True/False as CSV text against
    # JSON's true/false read as 0/1): the message says so.
    with pytest.raises(ValueError, match=r"\['False', 'True'\] are not among .* \[0, 1\]\. These labels are names and"):
        label_ids(["True", "False"], classes=[0, 1], source="eval.csv")
    with pytest.raises(ValueError, match=r"These labels are numbers and those classes names"):
        label_ids([0, 1], classes=["neg", "pos"], source="eval.csv")


def test_lines_of_only_whitespace_are_skipped_and_trailing_empty_fields_dropped(tmp_path):
    blank = write(tmp_path / "b.tsv", "text\tlabel\ngood\t1\n   \n\t\t\nbad\t0\n \t \n")
    assert load_labelled_texts(blank) == (["good", "bad"], [1, 0])
    assert load_texts(write(tmp_path / "b.csv", "text,label\ngood,1\n  \n,,\nbad,0\n")) == ["good", "bad"]
    # A trailing tab (an empty field past the header's width) is no extra field; a filled one still is.
    trailing = write(tmp_path / "t.tsv", "text\tlabel\ngood\t1\t\nbad\t0\t \t\n")
    assert load_labelled_texts(trailing) == (["good", "bad"], [1, 0])
    with pytest.raises(ValueError, match=r"x\.tsv:2: 3 fields, the header has 2 \(a tab inside a text\?"):
        load_labelled_texts(write(tmp_path / "x.tsv", "text\tlabel\ngood\t1\tmore\n"))


def test_a_carriage_return_inside_a_text_is_named(tmp_path):
    # A bare \r ends a line for the reader: the row was cut in two, and the error did not say why.
    cause = r"the line ends with a bare carriage return \(\\r\), which cuts the row \(a carriage return inside a text\?"
    with pytest.raises(ValueError, match=rf"a\.tsv:2: {cause} Remove it from the text"):
        load_labelled_texts(write(tmp_path / "a.tsv", "text\tlabel\nfi\rne\t1\n"))
    with pytest.raises(ValueError, match=rf"b\.tsv:2: {cause}"):  # The text last: the row's rest is short.
        load_texts(write(tmp_path / "b.tsv", "label\ttext\n1\tfi\rne\n0\tbad\n"))
    with pytest.raises(ValueError, match=rf"c\.csv:2: {cause} Remove it from the text, or quote the field"):
        load_labelled_texts(write(tmp_path / "c.csv", "text,label\nfi\rne,1\n"))
    # Quoted in CSV, \r\n line ends, and a file of \r line ends are read as before.
    assert load_labelled_texts(write(tmp_path / "q.csv", 'text,label\n"fi\rne",1\n')) == (["fi\rne"], [1])
    assert load_labelled_texts(write(tmp_path / "w.tsv", "text\tlabel\r\ngood\t1\r\n")) == (["good"], [1])
    assert load_labelled_texts(write(tmp_path / "m.tsv", "text\tlabel\rgood\t1\rbad\t0\r")) == (["good", "bad"], [1, 0])
    rated = write(tmp_path / "r.tsv", "id\trating\ttext\n1\t1\tfi\rne film\n2\t-1\tbad\n")
    with pytest.raises(ValueError, match=r"r\.tsv:3: expected 3 tab-separated fields, got 1\. A line ends with a bare"):
        load_rated_sentences(rated)


def test_rated_sentences_refuse_empty_texts_bad_max_rows_and_loose_numbers(tmp_path):
    empty = write(tmp_path / "e.tsv", "id\trating\ttext\n1\t1\tgood\n2\t-1\t  \n")
    with pytest.raises(ValueError, match=r"e\.tsv:3: the text is empty; give every row a sentence"):
        load_rated_sentences(empty)
    rated = write(tmp_path / "r.tsv", "id\trating\ttext\n1\t1\tgood\n2\t-1\tbad\n")
    assert load_rated_sentences(rated, max_rows=1)[0] == ["good"]
    for max_rows in (0, -1, 1.5, True):  # 0 and -1 used to mean all rows.
        with pytest.raises(
            ValueError, match=rf"`max_rows` must be an int >= 1 \(or None for all rows\), got {max_rows}"
        ):
            load_rated_sentences(rated, max_rows=max_rows)
    # float() reads "1_0" as 10 and Arabic-Indic digits as numbers.
    for rating in ("1_0", "\u0661"):
        with pytest.raises(ValueError, match=r"u\.tsv:2: the rating .* is not a finite number"):
            load_rated_sentences(write(tmp_path / "u.tsv", f"id\trating\ttext\n1\t{rating}\tgood\n"))
    assert load_rated_sentences(write(tmp_path / "n.tsv", "id\trating\ttext\n1\t 1e0 \tgood\n2\t-.5\tbad\n"))[
        1
    ].tolist() == [1, 0]


def test_split_checks_its_arguments_and_keeps_its_seeded_split():
    texts, labels = [f"t{i}" for i in range(10)], list(range(10))
    (train_texts, train_labels), (test_texts, test_labels) = split(texts, labels, 0.2)
    assert test_texts == ["t4", "t6"] and test_labels.tolist() == [4, 6]  # Seed 0, as the benchmarks use.
    assert train_texts == ["t2", "t7", "t3", "t5", "t9", "t0", "t8", "t1"] and train_labels.tolist()[:2] == [2, 7]
    for fraction in (0, 1, -0.5, 1.5, True):
        with pytest.raises(ValueError, match=rf"`test_fraction` must be a fraction between 0 and 1 .*got {fraction}"):
            split(texts, labels, fraction)
    with pytest.raises(ValueError, match=r"got 10 texts and 9 labels"):
        split(texts, labels[:9])


def test_rated_sentences_want_exactly_their_three_columns_and_some_usable_rows(tmp_path):
    # A fourth named column used to be glued onto every text ("a\ttwitter").
    extra = write(tmp_path / "x.tsv", "id\trating\ttext\tsource\n1\t1\ta\ttwitter\n")
    with pytest.raises(ValueError, match=r"x\.tsv: expected a header line .* extra columns \['source'\] would be read"):
        load_rated_sentences(extra)
    # An empty trailing header field and blank lines before the header are fine.
    loose = write(tmp_path / "l.tsv", "\n\nid\trating\ttext\t\n1\t1\tgood\n")
    assert load_rated_sentences(loose)[0] == ["good"]
    with pytest.raises(ValueError, match=r"h\.tsv has no usable rows: a header but no rows"):
        load_rated_sentences(write(tmp_path / "h.tsv", "id\trating\ttext\n"))
    with pytest.raises(ValueError, match=r"n\.tsv has no usable rows: every row is neutral \(rating 0\)"):
        load_rated_sentences(write(tmp_path / "n.tsv", "id\trating\ttext\n1\t0\tmeh\n"))
    with pytest.raises(IsADirectoryError, match=r"is a directory; expected a TSV file"):
        load_rated_sentences(tmp_path)


def test_labelled_files_refuse_empty_texts_and_name_a_wrong_delimiter(tmp_path):
    with pytest.raises(ValueError, match=r"e\.csv:2: the text column 'text' is empty; give every row a text"):
        load_labelled_texts(write(tmp_path / "e.csv", "text,label\n,1\nx,0\n"))
    with pytest.raises(ValueError, match=r"w\.tsv:3: the text column 'text' is empty"):
        load_texts(write(tmp_path / "w.tsv", "text\tlabel\ngood\t1\n \t0\n"))
    # A European "CSV" (semicolons): the delimiter is the problem, not the column's name.
    with pytest.raises(ValueError, match=r"s\.csv: the header has one column, 'text;label': its fields look separated"):
        load_labelled_texts(write(tmp_path / "s.csv", "text;label\ngood;1\n"))
    with pytest.raises(ValueError, match=r"separated by ','.*\(or name it \.csv\)"):
        load_labelled_texts(write(tmp_path / "c.tsv", "text,label\ngood,1\n"))


def test_a_label_threshold_reads_numbers_as_the_readers_do():
    assert threshold_labels(["a", "b", "c"], ["2", " -1.5 ", 0], 0.0) == (["a", "b"], [1, 0])
    for label in ("1_0", "\u0663", True):  # float() reads the first two as 10 and 3.
        with pytest.raises(ValueError, match=r"r\.tsv: label .* is not a number"):
            threshold_labels(["a"], [label], 0.0, source="r.tsv")


def test_split_refuses_an_empty_side():
    with pytest.raises(ValueError, match=r"0.2 of 2 examples leaves no test examples"):
        split(["a", "b"], [0, 1], 0.2)
    with pytest.raises(ValueError, match=r"0.6 of 1 examples leaves no training examples"):
        split(["a"], [0], 0.6)


def test_generated_sentences_are_seeded_and_their_number_checked():
    texts, labels = synthetic_sentiment(64, seed=3)
    again, same_labels = synthetic_sentiment(64, seed=3)
    assert texts == again and labels.tolist() == same_labels.tolist()
    assert len(texts) == 64 and set(labels.tolist()) == {0, 1}
    for bad in (0, -3, 2.5, True):  # -3 used to give an empty set, 2.5 a bare TypeError.
        with pytest.raises(ValueError, match="`num_examples` must be an int >= 1"):
            synthetic_sentiment(bad)


def test_bertzoo_shared_is_the_only_place_looked_in_when_set(tmp_path, monkeypatch):
    data = tmp_path / "data" / "sentiment"
    data.mkdir(parents=True)
    write(data / "tweets.tsv", "id\trating\ttext\n1\t1\tgood\n")
    monkeypatch.setenv("BERTZOO_SHARED", str(tmp_path))
    assert find_shared_sentiment("tweets") == data / "tweets.tsv"
    assert find_shared_sentiment("amazon") is None  # Not in the folder set: not looked for elsewhere.
    # A wrong setting is an error, not a silent fallback to another folder or to generated data.
    monkeypatch.setenv("BERTZOO_SHARED", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"\$BERTZOO_SHARED=.*nowhere is not a folder: point it at"):
        find_shared_sentiment("amazon")
    monkeypatch.chdir(tmp_path)  # No ../shared next to it.
    monkeypatch.delenv("BERTZOO_SHARED")
    assert find_shared("no", "such", "thing") is None
