"""Thread-local switches that code inside a `with` block can read."""

import contextlib
import threading


class ThreadScope:
    """A nestable `with` scope that code running in the same thread can ask
    about (`active()`), e.g. "an export is being traced": other threads, and
    the code after the block, see it inactive.

    Example:
    ```python
    tracing = ThreadScope()
    with tracing():
        tracing.active()  # True
    tracing.active()  # False
    ```
    """

    def __init__(self):
        self._local = threading.local()

    def active(self):
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def __call__(self):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
