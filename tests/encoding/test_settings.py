"""byoc.encoding.settings: an encode job's hyperparameters, as SageMaker's SDKs write them."""

from __future__ import annotations

import pytest

from byoc.encoding.settings import EncodeError, EncodeSettings


def test_values_as_the_sdks_write_them_are_parsed_and_auto_means_the_default():
    settings = EncodeSettings.from_hyperparameters(
        {
            "batch_size": "32",
            "dimensions": '"128"',
            "dtype": "Float16",
            "processes_per_host": "auto",
            "sagemaker_x": "1",
        }
    )
    assert settings.batch_size == 32 and settings.dimensions == 128 and settings.dtype == "float16"
    assert settings.processes_per_host is None and settings.shard_size == 10_000
    assert EncodeSettings.from_hyperparameters({"output": "dense, sparse"}).outputs() == ["dense", "sparse"]
    assert EncodeSettings().outputs() is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batchsize": "8"}, "unknown hyperparameter 'batchsize' for byoc encode \\(did you mean 'batch_size'\\?\\)"),
        ({"batch_size": "0"}, "batch_size='0' must be at least 1"),
        ({"shard_size": "1.5"}, "shard_size='1.5' must be an integer"),
        ({"dtype": "int8"}, "dtype='int8' must be one of auto, float32, float16"),
        ({"precision": "fp8"}, "precision='fp8' must be one of auto, fp32, fp16, bf16, int8"),
        ({"max_length": "1"}, "max_length='1' must be at least 2"),
    ],
)
def test_a_bad_value_is_refused_saying_what_it_must_be(values, message):
    with pytest.raises(EncodeError, match=message):
        EncodeSettings.from_hyperparameters(values)


def test_docs_encoding_md_lists_every_setting():
    from dataclasses import fields
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "encoding.md").read_text()
    table = page.split("## Settings", 1)[1].split("\n## ", 1)[0]
    listed = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert listed == [f.name for f in fields(EncodeSettings)]
