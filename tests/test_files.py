"""write_atomically: readers see a file whole or not at all, and writers never collide."""

import os
import threading
from pathlib import Path

import pytest

from kindling.files import write_atomically


def test_writes_the_file_and_leaves_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "new" / "stats.json"
    write_atomically(path, lambda file: file.write(b"{}"))
    assert path.read_bytes() == b"{}"
    assert os.listdir(path.parent) == ["stats.json"]


def test_a_failed_write_keeps_the_old_file_and_no_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"old")

    def fails_halfway(file) -> None:
        file.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, fails_halfway)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["last.ckpt"]


@pytest.mark.parametrize("durable", [False, True])
def test_durable_syncs_the_data_before_the_rename(tmp_path, monkeypatch, durable: bool) -> None:
    path = tmp_path / "last.ckpt"
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(path.exists()))
    write_atomically(path, lambda file: file.write(b"weights"), durable=durable)
    assert synced == ([False] if durable else [])  # synced while `path` did not exist yet


def test_writers_of_the_same_path_at_once_each_write_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "statistics.json"
    errors = []

    def writer(number: int) -> None:
        try:
            for _ in range(50):
                write_atomically(path, lambda file: file.write(str(number).encode() * 1000))
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert path.read_text() in {str(n) * 1000 for n in range(1, 5)}
    assert os.listdir(tmp_path) == ["statistics.json"]


def test_the_file_has_the_permissions_of_any_new_file(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "a.json", lambda file: file.write(b"{}"))
    finally:
        os.umask(umask)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644  # readable by the group
