"""The fixtures; everything else the tests share is in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import Job, build_tiny_bert


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny BERT (build_tiny_bert): trains in seconds on CPU."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def job(tmp_path, monkeypatch) -> Job:
    """An empty job tree; SAGEMAKER_BASE_DIR points at it and caches stay inside tmp_path."""
    root = tmp_path / "opt-ml"
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.delenv("SM_OUTPUT_DATA_DIR", raising=False)
    return Job(root).resources()
