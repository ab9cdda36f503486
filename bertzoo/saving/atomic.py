"""Write a directory atomically: build it beside the target, then swap it in.

The new directory is written under a hidden sibling name,
`.NAME.tmp-<pid>-<random>`, on the same filesystem as `NAME`. On success it
replaces `NAME`:

- On Linux, with one `renameat2(RENAME_EXCHANGE)` call: the old and the new
  directory trade places in one atomic step, so at every instant `NAME` is
  either the complete old directory or the complete new one. The old one,
  now under the hidden name, is then deleted.
- Elsewhere (or on a filesystem without RENAME_EXCHANGE), with two renames:
  `NAME` -> `.NAME.old-<pid>-<random>`, then the new directory -> `NAME`.
  Between the two renames `NAME` does not exist for a moment; a process
  killed exactly there leaves the previous version under the `.old-` name,
  which the next save of `NAME` restores if `NAME` is still missing.

Every save of `NAME` first removes the hidden leftovers of earlier saves of
the same `NAME` whose process is gone (a `kill -9`, a power cut), so
interrupted saves never accumulate. Leftovers of a process still running
(a concurrent save) are left alone.
"""

import contextlib
import ctypes
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _leftover_pattern(name):
    return re.compile(rf"^\.{re.escape(name)}\.(tmp|old)-(\d+)-.+$|^\.{re.escape(name)}\.(tmp|old)-[^-]+$")


def process_alive(pid):
    """Whether process `pid` is running (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # Someone else's live process.
        return True
    return True


def leftovers(target):
    """Hidden `.NAME.tmp-*` / `.NAME.old-*` siblings of `target` whose
    writing process is gone (names without a process id come from older
    bertzoo versions and count as gone)."""
    target = Path(target).expanduser().absolute()
    if not target.parent.is_dir():
        return []
    pattern = _leftover_pattern(target.name)
    found = []
    for entry in target.parent.iterdir():
        match = pattern.match(entry.name)
        if match and (match.group(2) is None or not process_alive(int(match.group(2)))):
            found.append(entry)
    return sorted(found)


def clean_leftovers(target):
    """Removes what `leftovers(target)` lists; if `target` itself is missing
    and a leftover `.old-` directory holds the previous version (a save
    killed between its two renames), puts that back first."""
    target = Path(target).expanduser().absolute()
    stale = leftovers(target)
    if not target.exists():
        previous = [p / "previous" for p in stale if ".old-" in p.name and (p / "previous").is_dir()]
        if previous:
            os.rename(previous[-1], target)
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _renameat2(a, b, flags):
    """renameat2(a, b, flags) on Linux; returns False where the system or
    filesystem does not support it, raises `FileExistsError` for EEXIST
    (`RENAME_NOREPLACE` found `b`) and `OSError` otherwise."""
    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # glibc < 2.28, or another libc.
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    if code == errno.EEXIST:
        raise FileExistsError(code, os.strerror(code), str(b))
    raise OSError(code, f"Could not move {a} to {b}: {os.strerror(code)}", str(b))


def _exchange(a, b):
    """Atomically swaps two paths (RENAME_EXCHANGE); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def sync_directory(path):
    """Flushes a directory's entries (a rename into it, a new file) to disk;
    a no-op where directories cannot be opened (Windows) or synced."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # A platform without directory descriptors (Windows).
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_tree(root):
    """fsyncs every file and directory under `root`."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
        sync_directory(directory)


def hidden_sibling(target, kind="tmp"):
    """A new hidden directory next to `target`, named so that
    `leftovers(target)` finds it once this process is gone, with the mode a
    plain `mkdir` gives (`tempfile.mkdtemp` makes it 0700, which the
    directory would keep once renamed into place)."""
    directory = Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-{os.getpid()}-", dir=target.parent))
    os.chmod(directory, 0o777 & ~current_umask())
    return directory


def current_umask():
    """This process's umask, read without changing it where Linux shows it
    (`os.umask` can only read it by setting it, which races with other
    threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def occupied(path):
    """Whether writing a directory at `path` would replace something: it
    exists and is not an empty directory (one made ready for the output).

    Example:
    ```python
    if occupied(out) and not overwrite:
        raise FileExistsError(f"{out} already exists ...")
    ```
    """
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return path.exists() or path.is_symlink()
    return any(path.iterdir())


def check_directory_target(target):
    """Raises a `FileExistsError` naming the fix when no save can put a
    directory at `target`: a symbolic link, a file, a mount point. Callers
    with slow work before `atomic_directory` call it first.

    Example:
    ```python
    check_directory_target("serving/sentiment/1")  # Fine: missing, or a directory.
    ```
    """
    target = Path(target).expanduser().absolute()
    if target.is_symlink():  # The save would swap the link itself, not the directory it names.
        raise FileExistsError(
            f"{target} is a symbolic link (to {os.readlink(target)}); a save replaces a whole directory, so it "
            f"will not replace the link: write to the directory it names ({target.resolve()}) or to a new path."
        )
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory; choose another path.")
    if os.path.ismount(target):  # E.g. a Docker volume: the swap into place would fail with EBUSY at the end.
        raise FileExistsError(
            f"{target} is a mount point, which a save cannot replace: write into a directory inside it "
            f"(e.g. {target / '1'})."
        )


def make_parent_directories(path):
    """Creates the missing parent directories of `path`; returns them,
    deepest first, for `remove_empty_directories` after a failed write."""
    missing = []
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():  # mkdir's own error: "[Errno 17] File exists: '<that file>'".
                raise NotADirectoryError(
                    f"Cannot write {path}: {parent} is a file, not a directory. Choose a path under a directory."
                )
            break
        missing.append(parent)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(path, Path(path).parent, error) from None
    return missing


def _unwritable(target, directory, error):
    """`error` (an OSError from creating something in `directory`) again,
    of the same class, naming `target` rather than a temporary name."""
    return type(error)(
        error.errno,
        f"Cannot write {target}: nothing can be created in {directory} ({error.strerror}). Choose a writable location.",
    )


def remove_empty_directories(directories):
    """Removes `directories` (deepest first) while they are empty: what a
    failed write created leaves nothing behind, what another process has
    filled since stays."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def atomic_directory(target, overwrite=True):
    """Yields a fresh temporary directory that replaces `target` on success.

    If the body raises, the existing `target` is untouched and the partial
    directory is removed; on a hard kill it stays as a hidden sibling that
    the next save of `target` removes (see the module docstring).

    Example:
    ```python
    with atomic_directory("runs/preset") as tmp:
        (tmp / "config.json").write_text("{}")
    ```
    """
    target = Path(target).expanduser().absolute()
    check_directory_target(target)
    created = make_parent_directories(target)
    clean_leftovers(target)
    if occupied(target) and not overwrite:
        raise _exists_error(target)
    try:
        tmp = hidden_sibling(target, "tmp")
    except OSError as error:  # Its message names the temporary directory, not `target`.
        remove_empty_directories(created)
        raise _unwritable(target, target.parent, error) from None
    written = False
    try:
        yield tmp
        sync_tree(tmp)  # On disk before the swap makes it the target (power loss, not only kill -9).
        _install(tmp, target, overwrite)
        sync_directory(target.parent)
        written = True
    finally:
        if tmp.exists():  # The partial directory, or the previous version after an exchange.
            shutil.rmtree(tmp, ignore_errors=True)
        if not written:
            remove_empty_directories(created)


def _exists_error(target):
    return FileExistsError(
        f"{target} already exists. Pass overwrite=True (CLI: --overwrite) to replace it, or choose a new path."
    )


def _install(tmp, target, overwrite):
    """Moves the finished `tmp` to `target`. With `overwrite=False` a
    `target` that another process filled while `tmp` was written is refused
    here too, not replaced (the check before writing can be minutes old)."""
    if not overwrite and occupied(target):
        raise _exists_error(target)
    if not target.exists():
        try:
            if _renameat2(tmp, target, _RENAME_NOREPLACE):
                return
        except FileExistsError:  # Created since the check above.
            if not overwrite and occupied(target):
                raise _exists_error(target) from None
        else:  # No RENAME_NOREPLACE: a plain rename, which fails on a non-empty directory.
            if not target.exists():
                os.rename(tmp, target)
                return
    if _exchange(tmp, target):
        if not overwrite and any(tmp.iterdir()):  # Filled in the instant since the check: put it back.
            _exchange(tmp, target)
            raise _exists_error(target)
        return
    old = hidden_sibling(target, "old")
    try:
        os.rename(target, old / "previous")
    except BaseException:
        shutil.rmtree(old, ignore_errors=True)
        raise
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old / "previous", target)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
