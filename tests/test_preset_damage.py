"""A drill of damaged presets: copies of one tiny classifier preset, each with
one kind of damage (deleted, emptied, truncated, bit-flipped files; invalid
or wrongly typed `config.json` values; missing keys; odd vocabularies;
symlinks; directories in place of files), loaded in this process.

Every case ends in a `bertzoo.PresetError` whose message names the file and
the key (checked), or, for damage that is harmless by design, loads with
identical predictions. Harmless by design:
- a vocabulary with Windows line endings, a UTF-8 byte-order mark or
  trailing blank lines (`load_vocabulary` ignores them; its checksum in
  `metadata.json` is over the tokens, not the bytes);
- a weights file or vocabulary that is a symlink to a file inside the preset
  directory, and a preset directory that is itself a symlink (nothing is
  read from outside the preset);
- extra files in the directory (a README, hidden leftovers);
- `metadata.json` fields that are not checksums (dates, versions);
- no `metadata.json` when the caller passes `verify_checksums=False`.
Anything else counts as a crash (another exception type, or a PresetError
whose message does not name what it should) or a silent load (a load where an
error was expected); `test_summary` requires zero of both and prints the
counts.
"""

import json
import logging
import os
import shutil

import keras
import numpy as np
import pytest

import bertzoo
from bertzoo.saving.preset import vocabulary_checksum
from bertzoo.text import BertPreprocessor
from bertzoo.text import BertTokenizer
from bertzoo.text.vocabulary import builtin_vocabulary

VOCABULARY_SIZE = 1200
TEXTS = ["a warm and sunny day", "cold rain all morning", "", "x" * 50]
HARMLESS = "harmless"
FILES = ("config.json", "model.weights.h5", "task.weights.h5", "vocabulary.txt", "metadata.json")


def build_classifier(num_classes=2, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = bertzoo.BertBackbone(
        vocabulary_size=VOCABULARY_SIZE,
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        max_sequence_length=32,
    )
    preprocessor = BertPreprocessor(BertTokenizer(builtin_vocabulary(VOCABULARY_SIZE)), sequence_length=16)
    return bertzoo.BertClassifier(backbone, num_classes, preprocessor=preprocessor, dropout=0.0)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The clean preset (built and saved once), its predictions, and a
    3-class head's task weights (for a 'weights of another model' case)."""
    root = tmp_path_factory.mktemp("damage")
    model = build_classifier()
    model.save_to_preset(root / "clean")
    build_classifier(num_classes=3, seed=1).save_to_preset(root / "three")
    return {"root": root, "dir": root / "clean", "predictions": model.predict(TEXTS, verbose=0)}


# --- Damage helpers ----------------------------------------------------------


def read_json(path):
    return json.loads(path.read_text())


def write_json(path, value):
    path.write_text(json.dumps(value))


def edit_config(edit):
    def damage(d, clean):
        config = read_json(d / "config.json")
        edit(config)
        write_json(d / "config.json", config)

    return damage


def set_key(node, key, value):
    """Sets (or with `value=DELETE` removes) `key` of the node
    `node` ("backbone", "task", "preprocessor", "tokenizer") in config.json."""

    def edit(config):
        target = config["preprocessor"]["config"]["tokenizer"] if node == "tokenizer" else config[node]
        target = target["config"] if key not in ("class_name", "registered_name", "module") else target
        if value is DELETE:
            del target[key]
        else:
            target[key] = value

    return edit_config(edit)


DELETE = object()


def edit_metadata(edit):
    def damage(d, clean):
        metadata = read_json(d / "metadata.json")
        edit(metadata)
        write_json(d / "metadata.json", metadata)

    return damage


def deleted(name):
    return lambda d, clean: os.remove(d / name)


def emptied(name):
    return lambda d, clean: (d / name).write_bytes(b"")


def truncated(name):
    def damage(d, clean):
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])

    return damage


def bit_flipped(name):
    """Flips the top bit of the middle byte: a text file becomes invalid
    UTF-8, a weights file no longer matches its checksum."""

    def damage(d, clean):
        data = bytearray((d / name).read_bytes())
        data[len(data) // 2] ^= 0x80
        (d / name).write_bytes(bytes(data))

    return damage


def appended(name):
    def damage(d, clean):
        with open(d / name, "ab") as f:
            f.write(b"\0" * 64)

    return damage


def directory_instead(name):
    def damage(d, clean):
        os.remove(d / name)
        (d / name).mkdir()
        (d / name / name).write_bytes((clean["dir"] / name).read_bytes())

    return damage


def symlink_outside(name):
    """An identical copy, but outside the preset directory."""

    def damage(d, clean):
        outside = d.parent / f"{d.name}-outside-{name}"
        shutil.copy(d / name, outside)
        os.remove(d / name)
        os.symlink(outside, d / name)

    return damage


def symlink_inside(name):
    def damage(d, clean):
        os.rename(d / name, d / f".{name}.real")
        os.symlink(f".{name}.real", d / name)

    return damage


def dangling_symlink(name):
    def damage(d, clean):
        os.remove(d / name)
        os.symlink(d / "nowhere", d / name)

    return damage


def symlink_loop(name):
    def damage(d, clean):
        os.remove(d / name)
        os.symlink(name, d / name)

    return damage


def edit_vocabulary(edit):
    def damage(d, clean):
        path = d / "vocabulary.txt"
        path.write_bytes(edit(path.read_text(encoding="utf-8")).encode("utf-8"))

    return damage


def vocabulary_lines(edit):
    def text(content):
        lines = content.split("\n")[:-1]
        return "".join(line + "\n" for line in edit(lines))

    return edit_vocabulary(text)


def swapped(a, b):
    def damage(d, clean):
        os.rename(d / a, d / "swap")
        os.rename(d / b, d / a)
        os.rename(d / "swap", d / b)

    return damage


def other_task_weights(d, clean):
    """A 3-class head's task weights, with metadata.json updated to match
    (so only loading can notice they belong to another model)."""
    shutil.copy(clean["root"] / "three" / "task.weights.h5", d / "task.weights.h5")
    other = read_json(clean["root"] / "three" / "metadata.json")
    metadata = read_json(d / "metadata.json")
    metadata["files"]["task.weights.h5"] = other["files"]["task.weights.h5"]
    write_json(d / "metadata.json", metadata)


def replace_token(index, token):
    def edit(lines):
        lines[index] = token
        return lines

    return edit


def vocabulary_rewritten(edit):
    """Rewrites the vocabulary *and* its recorded checksum, as a user editing
    both would: only the structural checks can notice."""

    def damage(d, clean):
        vocabulary_lines(edit)(d, clean)
        metadata = read_json(d / "metadata.json")
        lines = (d / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        metadata["vocabulary"]["sha256"] = vocabulary_checksum(lines[:-1] if lines[-1] == "" else lines)
        write_json(d / "metadata.json", metadata)

    return damage


# --- The cases ---------------------------------------------------------------
# (id, damage(directory, clean), expected: substrings the PresetError must name,
#  or HARMLESS; optional from_preset kwargs)

CASES = []
for name in FILES:
    CASES += [
        (f"deleted-{name}", deleted(name), [name]),
        (f"emptied-{name}", emptied(name), [name]),
        (f"truncated-{name}", truncated(name), [name]),
        (f"bit-flipped-{name}", bit_flipped(name), [name]),
        (f"directory-{name}", directory_instead(name), [name, "directory"]),
        (f"symlink-outside-{name}", symlink_outside(name), [name, "outside the preset"]),
        (f"dangling-symlink-{name}", dangling_symlink(name), [name, "symlink"]),
    ]
CASES += [
    ("symlink-loop-model.weights.h5", symlink_loop("model.weights.h5"), ["model.weights.h5"]),
    ("appended-model.weights.h5", appended("model.weights.h5"), ["model.weights.h5", "bytes"]),
    ("appended-task.weights.h5", appended("task.weights.h5"), ["task.weights.h5", "bytes"]),
    ("swapped-weights", swapped("model.weights.h5", "task.weights.h5"), ["weights.h5", "metadata.json"]),
    ("other-model-task-weights", other_task_weights, ["task.weights.h5", "BertClassifier"]),
    (
        "task-weights-deleted-unverified",
        deleted("task.weights.h5"),
        ["task.weights.h5", "missing"],
        {"verify_checksums": False},
    ),
    (
        "task-weights-directory-unverified",
        directory_instead("task.weights.h5"),
        ["task.weights.h5", "directory"],
        {"verify_checksums": False},
    ),
    (
        "task-weights-truncated-unverified",
        truncated("task.weights.h5"),
        ["task.weights.h5"],
        {"verify_checksums": False},
    ),
]

# Backbone config: missing keys, wrong types and ranges, absurd sizes.
for key in ("vocabulary_size", "num_layers", "hidden_dim", "num_heads", "intermediate_dim"):
    CASES.append((f"backbone-missing-{key}", set_key("backbone", key, DELETE), ["config.json", key, "missing"]))
for key, value, expected in [
    ("vocabulary_size", "1200", "positive integer"),
    ("vocabulary_size", None, "positive integer"),
    ("vocabulary_size", -1, "positive integer"),
    ("vocabulary_size", 1.5, "positive integer"),
    ("vocabulary_size", True, "positive integer"),
    ("vocabulary_size", 10**12, "GiB"),
    ("num_layers", 0, "positive integer"),
    ("num_layers", "two", "positive integer"),
    ("num_layers", 10**9, "GiB"),
    ("hidden_dim", 10**8, "GiB"),
    ("num_heads", [2, 2, 2], "num_layers"),
    ("num_heads", 0, "positive integer"),
    ("intermediate_dim", -5, "positive integer"),
    ("intermediate_dim", {"a": 1}, "positive integer"),
    ("dropout", None, "[0, 1)"),
    ("dropout", 2.0, "[0, 1)"),
    ("attention_dropout", "x", "[0, 1)"),
    ("activation", "gelu", "ambiguous"),
    ("activation", "nope", "Unknown activation"),
    ("activation", [1], "activation name"),
    ("max_sequence_length", 0, "positive integer"),
    ("max_sequence_length", 10**12, "GiB"),
    ("num_segments", "2", "positive integer"),
    ("layer_norm_epsilon", -1, "positive number"),
    ("layer_norm_epsilon", None, "positive number"),
    ("initializer_range", "0.02", "positive number"),
    ("shared_sublayers", "some", "shared_sublayers"),
    ("num_groups", 3, "divisible"),
    ("foo", 1, "not an argument"),
    ("dtype", "float99", "dtype policy"),
    ("dtype", 5, "dtype policy"),
    ("name", 5, "string"),
    ("trainable", "yes", "True or False"),
]:
    CASES.append((f"backbone-{key}={value!r}"[:60], set_key("backbone", key, value), ["config.json", key, expected]))
CASES += [
    # Valid on their own, but not this model's: the vocabulary or the weights say so.
    (
        "backbone-vocabulary_size-1199",
        set_key("backbone", "vocabulary_size", 1199),
        ["vocabulary.txt", "vocabulary_size=1199"],
    ),
    # 15 is not divisible by the 2 heads (the head size is derived, not saved): config.json says so first.
    ("backbone-hidden_dim-15", set_key("backbone", "hidden_dim", 15), ["config.json", "hidden_dim", "num_heads"]),
    ("backbone-hidden_dim-32", set_key("backbone", "hidden_dim", 32), ["model.weights.h5", "BertBackbone"]),
    (
        "backbone-unknown-class",
        set_key("backbone", "registered_name", "bertzoo>BertNope"),
        ["config.json", "BertBackbone"],
    ),
    (
        "backbone-evil-module",
        edit_config(lambda c: c["backbone"].update(module="evil", registered_name=None)),
        ["config.json", "'BertBackbone'", "refused"],
    ),
    (
        "backbone-keras-class",
        edit_config(
            lambda c: c.update(
                backbone={
                    "module": "keras.layers",
                    "class_name": "Dense",
                    "config": {"units": 2},
                    "registered_name": None,
                }
            )
        ),
        ["config.json", "'Dense'", "backbone"],
    ),
    ("backbone-not-an-object", edit_config(lambda c: c.update(backbone=[1, 2])), ["config.json", "backbone"]),
    ("backbone-no-config", edit_config(lambda c: c["backbone"].pop("config")), ["config.json", "backbone"]),
    ("backbone-missing", edit_config(lambda c: c.pop("backbone")), ["config.json", "backbone"]),
]

# Task config.
CASES += [
    # num_classes is optional (default 2, the clean preset's count): harmless here; a preset of another
    # count would fail on its head weights, naming task.weights.h5.
    ("task-missing-num_classes", set_key("task", "num_classes", DELETE), HARMLESS),
    ("task-num_classes-str", set_key("task", "num_classes", "2"), ["config.json", "num_classes"]),
    ("task-num_classes-0", set_key("task", "num_classes", 0), ["config.json", "num_classes"]),
    ("task-num_classes-null", set_key("task", "num_classes", None), HARMLESS),  # None is the default: 2 classes.
    ("task-num_classes-3", set_key("task", "num_classes", 3), ["task.weights.h5"]),
    ("task-dropout-null", set_key("task", "dropout", None), ["config.json", "dropout"]),
    ("task-class_names--3", set_key("task", "class_names", -3), ["config.json", "class_names"]),
    ("task-class_names-short", set_key("task", "class_names", ["a"]), ["config.json", "class_names"]),
    ("task-class_names-ints", set_key("task", "class_names", [1, 2]), ["config.json", "class_names"]),
    ("task-activation-nope", set_key("task", "activation", "nope"), ["config.json", "nope"]),
    ("task-unknown-key", set_key("task", "colour", "red"), ["config.json", "colour"]),
    (
        "task-unknown-class",
        set_key("task", "registered_name", "bertzoo>BertNope"),
        ["config.json", "BertClassifier", "task"],
    ),
    (
        "task-keras-class",
        edit_config(lambda c: c["task"].update(module="keras.layers", class_name="Dense", registered_name=None)),
        ["config.json", "'Dense'", "task"],
    ),
    ("task-holds-backbone", set_key("task", "backbone", {"x": 1}), ["config.json", "task.config.backbone"]),
]

# Top level, format and preprocessor.
CASES += [
    ("config-is-a-list", lambda d, clean: write_json(d / "config.json", [1]), ["config.json", "object"]),
    (
        "config-deeply-nested",
        lambda d, clean: (d / "config.json").write_text("[" * 100000 + "]" * 100000),
        ["config.json", "JSON"],
    ),
    ("format_version-3", edit_config(lambda c: c.update(format_version=3)), ["newer bertzoo"]),
    (
        "format_version-3-rearranged",
        lambda d, clean: write_json(d / "config.json", {"format_version": 3, "model": {}}),
        ["newer bertzoo", "Upgrade bertzoo"],
    ),
    ("format_version-str", edit_config(lambda c: c.update(format_version="2")), ["config.json", "format_version"]),
    ("format_version-0", edit_config(lambda c: c.update(format_version=0)), ["config.json", "format_version"]),
    ("top-level-unknown-key", edit_config(lambda c: c.update(extra=1)), ["config.json", "extra"]),
    (
        "preprocessor-sequence_length-1",
        set_key("preprocessor", "sequence_length", 1),
        ["config.json", "sequence_length"],
    ),
    ("preprocessor-truncate-nope", set_key("preprocessor", "truncate", "nope"), ["config.json", "truncate"]),
    ("preprocessor-not-an-object", edit_config(lambda c: c.update(preprocessor="x")), ["config.json", "preprocessor"]),
    (
        "tokenizer-vocabulary-path",
        set_key("tokenizer", "vocabulary", "/etc/passwd"),
        ["config.json", "vocabulary", "/etc/passwd"],
    ),
    ("tokenizer-lowercase-str", set_key("tokenizer", "lowercase", "yes"), ["config.json", "lowercase"]),
    (
        "tokenizer-unknown-class",
        edit_config(lambda c: c["preprocessor"]["config"]["tokenizer"].update(registered_name="bertzoo>Nope")),
        ["config.json", "Nope"],
    ),
]

# Vocabulary.
CASES += [
    ("vocabulary-one-fewer", vocabulary_lines(lambda lines: lines[:-1]), ["vocabulary.txt"]),
    ("vocabulary-one-more", vocabulary_lines(lambda lines: lines + ["extra"]), ["vocabulary.txt"]),
    (
        "vocabulary-tokens-swapped",
        vocabulary_lines(lambda lines: [lines[1001], lines[1000]] + lines[:1000] + lines[1002:]),
        ["vocabulary.txt", "checksum"],
    ),
    ("vocabulary-duplicate", vocabulary_rewritten(replace_token(1100, "[CLS]")), ["vocabulary.txt", "duplicate"]),
    ("vocabulary-blank-line", vocabulary_rewritten(replace_token(1100, "")), ["vocabulary.txt", "blank line"]),
    ("vocabulary-no-cls", vocabulary_rewritten(replace_token(101, "[NOTCLS]")), ["vocabulary.txt", "[CLS]"]),
    (
        "vocabulary-latin1",
        lambda d, clean: (d / "vocabulary.txt").write_bytes(
            (d / "vocabulary.txt").read_bytes() + "caf\u00e9\n".encode("latin-1")
        ),
        ["vocabulary.txt"],
    ),
    ("vocabulary-crlf", edit_vocabulary(lambda text: text.replace("\n", "\r\n")), HARMLESS),
    ("vocabulary-bom", edit_vocabulary(lambda text: "\ufeff" + text), HARMLESS),
    ("vocabulary-trailing-blank-lines", edit_vocabulary(lambda text: text + "\n\n"), HARMLESS),
]

# Metadata.
CASES += [
    (
        "metadata-no-task-checksum",
        edit_metadata(lambda m: m["files"].pop("task.weights.h5")),
        ["metadata.json", "task.weights.h5"],
    ),
    ("metadata-no-files", edit_metadata(lambda m: m.pop("files")), ["metadata.json", "model.weights.h5"]),
    (
        "metadata-wrong-sha",
        edit_metadata(lambda m: m["files"]["model.weights.h5"].update(sha256="0" * 64)),
        ["model.weights.h5", "checksum"],
    ),
    (
        "metadata-bytes-str",
        edit_metadata(lambda m: m["files"]["model.weights.h5"].update(bytes="12")),
        ["metadata.json", "files.model.weights.h5"],
    ),
    ("metadata-files-list", edit_metadata(lambda m: m.update(files=[])), ["metadata.json", "files"]),
    ("metadata-is-a-list", lambda d, clean: write_json(d / "metadata.json", []), ["metadata.json", "object"]),
    (
        "metadata-vocabulary-sha",
        edit_metadata(lambda m: m["vocabulary"].update(sha256="0" * 64)),
        ["vocabulary.txt", "checksum"],
    ),
    ("metadata-vocabulary-str", edit_metadata(lambda m: m.update(vocabulary="x")), ["metadata.json", "vocabulary"]),
    (
        "metadata-vocabulary-deleted",
        edit_metadata(lambda m: m.pop("vocabulary")),
        ["metadata.json", "no checksum of vocabulary.txt", "verify_checksums=False"],
    ),
]

# Harmless by design.
CASES += [
    ("symlink-inside-model.weights.h5", symlink_inside("model.weights.h5"), HARMLESS),
    ("symlink-inside-vocabulary.txt", symlink_inside("vocabulary.txt"), HARMLESS),
    ("preset-directory-is-a-symlink", "symlinked-directory", HARMLESS),
    ("extra-files", lambda d, clean: [(d / "README.md").write_text("hi"), (d / ".clean.tmp-1-x").mkdir()], HARMLESS),
    (
        "metadata-other-fields",
        edit_metadata(lambda m: m.update(created="yesterday", bertzoo_version="0.0.1")),
        HARMLESS,
    ),
    ("metadata-deleted-unverified", deleted("metadata.json"), HARMLESS, {"verify_checksums": False}),
]

IDS = [case[0] for case in CASES]
assert len(set(IDS)) == len(IDS), "duplicate case ids"
RESULTS = {}


def run_case(case, clean, tmp_path):
    """Applies one damage to a fresh copy and loads it; returns
    (outcome, detail) with outcome in "clear", "harmless", "unclear",
    "crash", "silent"."""
    name, damage, expected = case[:3]
    kwargs = case[3] if len(case) > 3 else {}
    directory = tmp_path / "clean"
    shutil.copytree(clean["dir"], directory, symlinks=True)
    if damage == "symlinked-directory":
        os.symlink(directory, tmp_path / "link")
        directory = tmp_path / "link"
    else:
        damage(directory, clean)
    try:
        model = bertzoo.BertClassifier.from_preset(directory, **kwargs)
    except bertzoo.PresetError as e:
        if expected == HARMLESS:
            return "unclear", f"refused harmless damage: {e}"
        missing = [s for s in expected if s not in str(e)]
        return ("unclear", f"message lacks {missing}: {e}") if missing else ("clear", str(e))
    except Exception as e:  # noqa: BLE001 - counting what escapes
        return "crash", f"{type(e).__name__}: {e}"
    if expected != HARMLESS:
        return "silent", "loaded"
    predictions = model.predict(TEXTS, verbose=0)
    if not np.array_equal(predictions, clean["predictions"]):
        return "silent", "loaded with different predictions"
    return "harmless", "identical predictions"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_damaged_preset(case, clean, tmp_path):
    outcome, detail = run_case(case, clean, tmp_path)
    RESULTS[case[0]] = (outcome, detail)
    assert outcome in ("clear", "harmless"), f"{case[0]}: {outcome}: {detail}"


def test_loading_into_another_head_on_purpose_says_so(clean, tmp_path, caplog):
    """Requirement 2's other half: a new head on purpose (other head
    arguments, or another task class) loads the backbone, with a warning,
    even without task weights."""
    directory = tmp_path / "p"
    shutil.copytree(clean["dir"], directory)
    os.remove(directory / "task.weights.h5")
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        model = bertzoo.BertClassifier.from_preset(directory, num_classes=3)
    assert model.num_classes == 3
    assert "new, randomly initialized BertClassifier head" in caplog.text and "num_classes" in caplog.text
    backbone = bertzoo.BertBackbone.from_preset(clean["dir"])
    for a, b in zip(model.backbone.weights, backbone.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertzoo"):
        bertzoo.BertTokenClassifier.from_preset(directory, num_classes=3)
    assert "holds a BertClassifier" in caplog.text


def test_summary(clean, tmp_path_factory):
    """Runs the cases not run yet, prints the counts, and requires zero
    crashes, unclear errors and silent loads over at least 80 cases."""
    for case in CASES:
        if case[0] not in RESULTS:
            RESULTS[case[0]] = run_case(case, clean, tmp_path_factory.mktemp("case"))
    counts = {k: 0 for k in ("clear", "harmless", "unclear", "crash", "silent")}
    for outcome, _ in RESULTS.values():
        counts[outcome] += 1
    print(
        f"\npreset damage drill: {len(RESULTS)} cases, {counts['clear']} clear errors, {counts['harmless']} "
        f"harmless loads (identical predictions), {counts['unclear']} unclear errors, {counts['crash']} crashes, "
        f"{counts['silent']} silent loads"
    )
    bad = {k: v for k, v in RESULTS.items() if v[0] not in ("clear", "harmless")}
    assert len(RESULTS) >= 80
    assert counts["crash"] == counts["silent"] == counts["unclear"] == 0, bad
