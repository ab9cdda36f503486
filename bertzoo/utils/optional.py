"""TensorFlow and TensorFlow Text, imported on first use.

bertzoo's layers and models are Keras 3 code: they run on Keras's JAX and
torch backends with no TensorFlow installed (a GPU machine with only PyTorch
or JAX, say). Its text pipeline (tokenizers, preprocessors, `tf.data`
masking) and its SavedModel export are TensorFlow code. Their modules refer
to `tf` and `tf_text` from here, so `import bertzoo` imports neither, and
the first use of one without it installed raises an `ImportError` that names
what to install.

Example:

```python
from bertzoo.utils.optional import tf

def lengths(texts):
    return tf.strings.length(texts)  # TensorFlow is imported here.
```
"""

import importlib
import importlib.util
import sys

_WHY = (
    "bertzoo's text pipeline (tokenizers, preprocessors, raw-string fit/predict, tf.data) "
    "and its SavedModel export need it; the models alone run on Keras's JAX and torch backends without it"
)


class LazyModule:
    """A module imported when one of its attributes is first read."""

    def __init__(self, name, install):
        self._name = name
        self._install = install
        self._module = None

    def _load(self):
        if self.__dict__.get("_module") is None:
            try:
                self._module = importlib.import_module(self._name)
            except ImportError as error:
                raise ImportError(
                    f"`{self._name}` is not installed: {_WHY}. Install it with `{self._install}`."
                ) from error
        return self._module

    def __getattr__(self, attribute):
        if attribute in ("_name", "_install", "_module"):
            raise AttributeError(attribute)  # Asked before `__init__` ran (copy, pickle).
        try:
            module = self._load()
        except ImportError:
            if attribute.startswith("__"):
                # Introspection (inspect.unwrap, copy) asks for special names:
                # for a missing module the answer is "no such attribute".
                raise AttributeError(attribute) from None
            raise
        return getattr(module, attribute)

    def __repr__(self):
        state = "imported" if self._module is not None else "not imported yet"
        return f"<LazyModule {self._name} ({state})>"


tf = LazyModule("tensorflow", "pip install tensorflow")
tf_text = LazyModule("tensorflow_text", "pip install tensorflow-text")


def installed(name):
    """True when module `name` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_tf_dataset(x):
    """True when `x` is a `tf.data.Dataset`, without importing TensorFlow.

    A dataset can only exist once TensorFlow has been imported, so when it
    has not been, the answer is False and TensorFlow need not be installed.
    """
    dataset = getattr(getattr(sys.modules.get("tensorflow"), "data", None), "Dataset", None)
    return dataset is not None and isinstance(x, dataset)


def is_tf_tensor(x):
    """True when `x` is a TensorFlow tensor, without importing TensorFlow
    (as `is_tf_dataset`)."""
    tensor = getattr(sys.modules.get("tensorflow"), "Tensor", None)
    return tensor is not None and isinstance(x, tensor)


def is_tf_ragged(x):
    """True when `x` is a `tf.RaggedTensor`, without importing TensorFlow."""
    ragged = getattr(sys.modules.get("tensorflow"), "RaggedTensor", None)
    return ragged is not None and isinstance(x, ragged)
