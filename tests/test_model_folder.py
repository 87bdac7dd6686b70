"""byoc.model_folder: the input-length rule training and serving share (training records it in the
model folder, serving truncates there: serving/test_under_fire.py's 5.8 MB text shows the effect)."""

from __future__ import annotations

import pytest

from byoc.model_folder import DEFAULT_MAX_LENGTH, max_length


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ((256, 512), 256),  # the tokenizer's model_max_length under the model's positions
        ((512, 128), 128),
        ((1e30, 512), 512),  # a tokenizer that does not know its limit reports 1e30
        ((None, 384), 384),
        ((True, 64), 64),  # a bool is no limit, though Python counts it an int
        ((0, -1, "512"), DEFAULT_MAX_LENGTH),  # nothing usable: the default
        ((), DEFAULT_MAX_LENGTH),
        ((300.0,), 300),
    ],
)
def test_the_smallest_known_limit_wins(limits, expected):
    assert max_length(*limits) == expected
