"""Write a directory atomically: build it beside the target, then rename."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_directory(target, overwrite=True):
    """Yields a fresh temporary directory that replaces `target` on success.

    The temporary directory lives next to `target` (same filesystem, so the
    final rename is atomic). If the body raises, or the process dies, the
    existing `target` is untouched and the partial directory is removed (or, on
    a hard kill, left as a hidden `.NAME.tmp-*` sibling, never at `target`).

    Example:
    ```python
    with atomic_directory("runs/preset") as tmp:
        (tmp / "config.json").write_text("{}")
    ```
    """
    target = Path(target).expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory; choose another path.")
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"{target} already exists. Pass overwrite=True to replace it, or choose a new path."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, old / "previous")
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(old / "previous", target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
