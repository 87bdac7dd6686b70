"""The shared sample data is found in one place (benchmarks/shared_data.py), relative to the checkout,
and a dataset that is not there fails saying where it was looked for, instead of being skipped."""

from __future__ import annotations

import pytest

from helpers import REPO, shared_data


def test_finds_the_data_beside_the_checkout():
    emotion = shared_data.folder("emotion")
    assert emotion.is_dir() and (emotion / "train.txt").is_file()
    assert shared_data.ROOTS[0] == REPO.parent / "shared" / "data"  # relative to the checkout, no machine's path


def test_a_missing_dataset_fails_naming_where_it_looked():
    assert shared_data.find("no-such-dataset") is None
    with pytest.raises(FileNotFoundError, match="'no-such-dataset' is not here: looked in .*shared/data") as failed:
        shared_data.folder("no-such-dataset")
    assert "../shared/data resolves" in str(failed.value)
