"""`push_directory` to a file:// repository: every file copied, its sha256 and size recorded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmbus.artifacts.location import MANIFEST_NAME
from llmbus.artifacts.push import push_directory, read_artifact


def test_every_file_is_copied_with_its_digest_and_size(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "tokenizer").mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 128}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB: more than one chunk
    (model / "tokenizer" / "tokenizer.json").write_text("{}")
    repo = tmp_path / "repo" / "tiny" / "2" / "bf16"

    artifact = push_directory(model, repo.as_uri(), format="bf16", quantization=None)

    assert artifact.uri == repo.as_uri() + "/" and artifact.format == "bf16" and artifact.quantization is None
    assert [f.path for f in artifact.files] == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    for f in artifact.files:
        copied = (repo / f.path).read_bytes()
        assert copied == (model / f.path).read_bytes()
        assert f.sha256 == hashlib.sha256(copied).hexdigest() and f.size_bytes == len(copied)
    assert artifact.size_bytes == sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert not list(repo.rglob("*.tmp"))  # every file written aside, then renamed
    assert read_artifact(repo.as_uri()) == artifact  # the manifest beside the files, written last
    assert (repo / MANIFEST_NAME).exists()


def test_what_cannot_be_pushed_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no files to push"):
        push_directory(tmp_path / "empty", (tmp_path / "repo").as_uri(), format="bf16", quantization=None)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        push_directory(tmp_path / "missing", (tmp_path / "repo").as_uri(), format="bf16", quantization=None)
    with pytest.raises(ValueError, match="names an absolute directory"):
        push_directory(tmp_path / "empty", "file://otherhost/models/", format="bf16", quantization=None)
    with pytest.raises(ValueError, match="an artifact lives at"):
        push_directory(tmp_path / "empty", "http://example.invalid/models/", format="bf16", quantization=None)
