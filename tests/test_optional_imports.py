"""`bertzoo.utils.optional`: TensorFlow imported on first use, with an error
that says what to install when it is missing."""

import json

import pytest
import tensorflow as tf

from bertzoo.utils.optional import LazyModule
from bertzoo.utils.optional import installed
from bertzoo.utils.optional import is_tf_dataset


def test_attributes_come_from_the_module_once_it_is_used():
    lazy = LazyModule("json", "pip install json")
    assert "not imported yet" in repr(lazy)
    assert lazy.dumps([1, 2]) == json.dumps([1, 2])
    assert "imported" in repr(lazy) and "not" not in repr(lazy)


def test_a_missing_module_names_what_needs_it_and_how_to_install_it():
    lazy = LazyModule("bertzoo_no_such_module", "pip install bertzoo-no-such-module")
    with pytest.raises(
        ImportError, match=r"`bertzoo_no_such_module` is not installed: bertzoo's text pipeline"
    ) as info:
        lazy.constant(1)
    assert "Install it with `pip install bertzoo-no-such-module`." in str(info.value)
    assert "run on Keras's JAX and torch backends without it" in str(info.value)


def test_installed_looks_without_importing():
    assert installed("json") and installed("tensorflow")
    assert not installed("bertzoo_no_such_module")
    assert not installed("")  # find_spec's ValueError is an answer, not a crash.


def test_dataset_check():
    assert is_tf_dataset(tf.data.Dataset.range(3))
    assert not is_tf_dataset([1, 2, 3]) and not is_tf_dataset({"token_ids": [[1]]})


def test_introspection_neither_imports_nor_fails(monkeypatch):
    import copy
    import inspect

    lazy = LazyModule("bertzoo_no_such_module", "pip install it")
    assert not hasattr(lazy, "__wrapped__")
    assert inspect.unwrap(lazy) is lazy
    assert getattr(copy.copy(lazy), "_name", None) == "bertzoo_no_such_module"
    monkeypatch.setitem(__import__("sys").modules, "tensorflow", None)  # An import blocked this way.
    assert not is_tf_dataset([1])
