"""byoc.safe_files: atomic records and archives unpacked only when every member is a file or folder."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from byoc.safe_files import UnsafeArchive, extract_archive, write_atomically


def _archive(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        config = b'{"model_type": "bert"}'
        info = tarfile.TarInfo("config.json")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config))
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


def test_a_plain_archive_unpacks(tmp_path):
    archive = _archive(tmp_path / "model.tar.gz", _member("code/inference.py"))
    extract_archive(archive, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_text() == '{"model_type": "bert"}'
    assert (tmp_path / "out" / "code" / "inference.py").read_text() == "x"


@pytest.mark.parametrize(
    "member,words",
    [
        # tarfile's data filter lets a link that stays inside the folder through; byoc wants none.
        (_member("tokenizer.json", tarfile.SYMTYPE, "config.json"), "is a link"),
        (_member("weights", tarfile.LNKTYPE, "config.json"), "is a link"),
        (_member("evil", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (_member("dev", tarfile.CHRTYPE), "device or special file"),
        (_member("pipe", tarfile.FIFOTYPE), "device or special file"),
        (_member("../outside.txt"), "outside the folder"),
        (_member("/tmp/absolute.txt"), "outside the folder"),
    ],
)
def test_links_devices_and_escaping_paths_are_refused_before_anything_is_written(tmp_path, member, words):
    archive = _archive(tmp_path / "model.tar.gz", member)
    with pytest.raises(UnsafeArchive, match=words):
        extract_archive(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_model_channel_with_an_unsafe_archive_is_a_model_error(tmp_path):
    from byoc.contract import Channel, Paths, TrainingContract
    from byoc.training.hyperparameters import parse_hyperparameters
    from byoc.training.model import ModelError, resolve_model

    channel = tmp_path / "model"
    channel.mkdir()
    _archive(channel / "model.tar.gz", _member("tokenizer.json", tarfile.SYMTYPE, "config.json"))
    contract = TrainingContract(
        paths=Paths(tmp_path / "opt-ml"), hyperparameters={}, channels={"model": Channel("model", channel)}
    )
    with pytest.raises(ModelError, match="cannot unpack the model archive model.tar.gz: 'tokenizer.json' is a link"):
        resolve_model(parse_hyperparameters({}), contract, tmp_path / "cache")


def test_write_atomically_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "record.json"
    write_atomically(path, "old")
    write_atomically(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["record.json"]
