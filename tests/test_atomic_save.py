"""Atomic directory writes: no window without a complete target, no leftovers
after interrupted saves (`kill -9` in a subprocess), previous version restored."""

import functools
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bertzoo.saving import atomic
from bertzoo.saving.atomic import atomic_directory
from bertzoo.saving.atomic import clean_leftovers
from bertzoo.saving.atomic import leftovers

FILES = ("a.bin", "b.bin", "c.bin")


def write_version(directory, version, size=1 << 16):
    for name in FILES:
        (directory / name).write_bytes(version.to_bytes(4, "little") * (size // 4))
    (directory / "version.txt").write_text(str(version))


def check_complete(directory):
    version = int((directory / "version.txt").read_text())
    for name in FILES:
        data = (directory / name).read_bytes()
        assert data[:4] == version.to_bytes(4, "little") and len(data) == 1 << 16
    return version


def _open_in(directory_fd, name, flags):
    return os.open(name, flags, dir_fd=directory_fd)


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def hidden_siblings(target):
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def test_replaces_the_target_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "preset"
    for version in range(3):
        with atomic_directory(target) as tmp:
            write_version(tmp, version)
        assert check_complete(target) == version
    assert hidden_siblings(target) == []


def test_an_empty_directory_is_free_and_anything_else_needs_overwrite(tmp_path):
    target = tmp_path / "made_ready"
    target.mkdir()  # `mkdir -p out && bertzoo ... out` is a common first step.
    assert not atomic.occupied(target)
    with atomic_directory(target, overwrite=False) as tmp:
        write_version(tmp, 1)
    assert check_complete(target) == 1 and atomic.occupied(target)
    with pytest.raises(FileExistsError, match=r"made_ready already exists. Pass overwrite=True"):
        with atomic_directory(target, overwrite=False):
            pass
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert atomic.occupied(tmp_path / "file") and atomic.occupied(tmp_path / "dangling")
    assert not atomic.occupied(tmp_path / "absent")


def test_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch):
    volume = tmp_path / "volume"
    volume.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: str(path) == str(volume))
    with pytest.raises(FileExistsError, match=r"volume is a mount point.*inside it \(e\.g\. .*volume/1\)"):
        with atomic_directory(volume, overwrite=True):
            raise AssertionError("the body ran")


def test_a_symbolic_link_or_a_file_is_refused_with_the_way_out(tmp_path):
    real = tmp_path / "3"
    with atomic_directory(real) as tmp:
        write_version(tmp, 3)
    (tmp_path / "latest").symlink_to("3")
    # overwrite=True cannot help (the save would swap the link itself): the message says what can.
    with pytest.raises(FileExistsError, match=r"latest is a symbolic link \(to 3\).* write to the directory it names"):
        with atomic_directory(tmp_path / "latest", overwrite=True):
            raise AssertionError("the body ran")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match=r"file exists and is not a directory; choose another path"):
        atomic.check_directory_target(tmp_path / "file")
    assert check_complete(real) == 3 and (tmp_path / "file").read_text() == "x"


def test_a_place_nothing_can_be_written_is_named_with_the_target(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    # mkdir said "[Errno 17] File exists: '.../file'".
    with pytest.raises(NotADirectoryError, match=r"Cannot write .*file/sub/1: .*file is a file, not a directory"):
        with atomic_directory(tmp_path / "file" / "sub" / "1"):
            raise AssertionError("the body ran")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "new" / ".1.tmp-1-x"))

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", refused)  # As in a read-only directory (root may write anywhere).
    # The error named the temporary directory; the parents this save created are removed.
    with pytest.raises(
        PermissionError, match=r"Cannot write .*new/1: nothing can be created in .*new \(Permission denied\)"
    ):
        with atomic_directory(tmp_path / "new" / "1"):
            raise AssertionError("the body ran")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_directory_gets_the_mode_mkdir_would_give(tmp_path):
    # Not mkdtemp's 0700: a serving process running as another user reads it.
    previous = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "preset") as tmp:
            write_version(tmp, 0)
        plain = tmp_path / "plain"
        plain.mkdir()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "preset").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o755


def test_a_failing_body_keeps_the_old_target(tmp_path):
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 1)
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(target) as tmp:
        write_version(tmp, 2)
        raise RuntimeError("boom")
    assert check_complete(target) == 1 and hidden_siblings(target) == []
    with pytest.raises(FileExistsError, match="overwrite=True"), atomic_directory(target, overwrite=False):
        pass


def test_a_failing_body_removes_the_parent_directories_it_created(tmp_path):
    (tmp_path / "kept").mkdir()  # Empty, but there before: stays.
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(tmp_path / "kept" / "new" / "sub" / "p") as tmp:
        write_version(tmp, 1)
        raise RuntimeError("boom")
    assert [p.name for p in tmp_path.rglob("*")] == ["kept"]
    with atomic_directory(tmp_path / "kept" / "new" / "p") as tmp:  # A success keeps them.
        write_version(tmp, 1)
    assert check_complete(tmp_path / "kept" / "new" / "p") == 1


def test_leftovers_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 1)
    gone = dead_pid()
    for name in (f".preset.tmp-{gone}-abc", f".preset.old-{gone}-def", ".preset.tmp-legacy8"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.weights.h5").write_bytes(b"x" * 1000)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".preset.tmp-{sleeper.pid}-xyz"
        live.mkdir()
        (tmp_path / ".other.tmp-1-abc").mkdir()  # Another target's: not ours to touch.
        assert [p.name for p in leftovers(target)] == sorted(
            [f".preset.old-{gone}-def", f".preset.tmp-{gone}-abc", ".preset.tmp-legacy8"]
        )
        with atomic_directory(target) as tmp:
            write_version(tmp, 2)
        assert hidden_siblings(target) == [live.name]
        assert (tmp_path / ".other.tmp-1-abc").is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_save_killed_between_the_two_renames_is_restored(tmp_path):
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 7)
    old = tmp_path / f".preset.old-{dead_pid()}-abc"
    old.mkdir()
    os.rename(target, old / "previous")  # The fallback's first rename, then the process died.
    assert not target.exists()
    clean_leftovers(target)
    assert check_complete(target) == 7 and hidden_siblings(target) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two_renames"])
def test_readers_always_find_a_complete_target(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 0)
    missing, stop = [], threading.Event()

    def read():
        # Each look opens the directory once and reads its files relative to
        # it, as one consistent version (a loader reading by path could mix
        # two versions; the preset checksums catch that).
        while not stop.is_set():
            try:
                fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError as e:
                missing.append(repr(e))
                continue
            try:
                opener = functools.partial(_open_in, fd)
                with open("version.txt", opener=opener) as f:
                    version = int(f.read())
                for name in FILES:
                    with open(name, "rb", opener=opener) as f:
                        assert f.read(4) == version.to_bytes(4, "little")
            except (FileNotFoundError, ValueError):
                pass  # An old version, deleted after the swap while this reader still held it.
            finally:
                os.close(fd)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in range(1, 40):
            with atomic_directory(target) as tmp:
                write_version(tmp, version)
    finally:
        stop.set()
        reader.join()
    assert check_complete(target) == 39
    if exchange and sys.platform.startswith("linux"):
        assert missing == []  # One atomic exchange: never a moment without the target.


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux-only")
def test_exchange_is_used_on_linux(tmp_path, monkeypatch):
    calls = []
    real = atomic._exchange
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: calls.append((a, b)) or real(a, b))
    target = tmp_path / "preset"
    for version in range(2):
        with atomic_directory(target) as tmp:
            write_version(tmp, version)
    assert len(calls) == 1 and check_complete(target) == 1


SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from bertzoo.saving.atomic import atomic_directory
    sys.path.insert(0, {tests!r})
    from test_atomic_save import write_version
    target = Path(sys.argv[1])
    version = 100
    while True:
        version += 1
        with atomic_directory(target) as tmp:
            write_version(tmp, version, size=1 << 20)
    """
)


def test_kill_9_during_repeated_saves_never_loses_the_target_and_leaks_nothing(tmp_path):
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 1, size=1 << 16)
    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(tests=str(Path(__file__).parent)))
    kills = 12
    for i in range(kills):
        process = subprocess.Popen([sys.executable, str(script), str(target)])
        time.sleep(0.3 + 0.07 * i)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert target.is_dir(), f"kill {i}: no preset at the target"
        assert check_complete(target) >= 1  # The old or a new version, whole.
    with atomic_directory(target) as tmp:  # The next save cleans every leftover.
        write_version(tmp, 2, size=1 << 16)
    assert check_complete(target) == 2
    assert hidden_siblings(target) == []


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "plain_renames"])
@pytest.mark.parametrize("existing", [False, True], ids=["missing", "empty_directory"])
def test_overwrite_false_refuses_a_target_filled_during_the_save(tmp_path, monkeypatch, renameat2, existing):
    if not renameat2:
        monkeypatch.setattr(atomic, "_renameat2", lambda a, b, flags: False)
    target = tmp_path / "export"
    if existing:
        target.mkdir()  # Empty: made ready for the output, so not "occupied".
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with atomic_directory(target, overwrite=False) as tmp:
            write_version(tmp, 1)
            target.mkdir(exist_ok=True)  # Another writer, while this save was being written.
            write_version(target, 2)
    assert check_complete(target) == 2  # Theirs, whole.
    assert hidden_siblings(target) == []


def test_overwrite_false_puts_back_a_target_filled_at_the_last_instant(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux-only")
    target = tmp_path / "export"
    target.mkdir()
    real = atomic._exchange

    def fill_then_exchange(a, b):  # The other writer fills it between the last check and the swap.
        write_version(Path(b), 2)
        monkeypatch.setattr(atomic, "_exchange", real)
        return real(a, b)

    monkeypatch.setattr(atomic, "_exchange", fill_then_exchange)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with atomic_directory(target, overwrite=False) as tmp:
            write_version(tmp, 1)
    assert check_complete(target) == 2
    assert hidden_siblings(target) == []


def test_a_failed_first_rename_of_the_fallback_leaves_nothing_beside_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "preset"
    with atomic_directory(target) as tmp:
        write_version(tmp, 1)
    real_rename = os.rename

    def busy(src, dst):
        if Path(src) == target:
            raise OSError(16, "Device or resource busy", str(src))
        return real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", busy)
    with pytest.raises(OSError, match="busy"):
        with atomic_directory(target) as tmp:
            write_version(tmp, 2)
    assert check_complete(target) == 1
    assert hidden_siblings(target) == []
