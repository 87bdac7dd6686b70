"""byoc.encoding.processing: `byoc encode` as a SageMaker Processing job (its inputs, output, hosts and
ContainerArguments), through the same entry point and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import serve_helpers

from byoc import cli
from byoc.encoding import entry, processing
from byoc.encoding.settings import EncodeError
from helpers import write_jsonl

pytestmark = pytest.mark.integration


def processing_tree(base: Path, model: Path, outputs: list[str]) -> Path:
    """A processing job's /opt/ml (relocated to `base`), its paths as SageMaker writes them."""
    inputs = [
        {
            "InputName": name,
            "S3Input": {
                "LocalPath": f"/opt/ml/processing/input/{name}",
                "S3InputMode": "File",
                "S3DataDistributionType": "FullyReplicated",
                "S3Uri": f"s3://b/{name}",
            },
        }
        for name in ("corpus", "model")
    ]
    out = [
        {
            "OutputName": name,
            "S3Output": {
                "LocalPath": f"/opt/ml/processing/output/{name}",
                "S3Uri": "s3://b/o",
                "S3UploadMode": "EndOfJob",
            },
        }
        for name in outputs
    ]
    config = {"ProcessingJobName": "encode-1", "ProcessingInputs": inputs, "ProcessingOutputConfig": {"Outputs": out}}
    (base / "config").mkdir(parents=True)
    (base / "config" / "processingjobconfig.json").write_text(json.dumps(config))
    (base / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (base / "processing" / "input").mkdir(parents=True)
    (base / "processing" / "input" / "model").symlink_to(model, target_is_directory=True)
    texts = [{"id": f"d{n}", "text": f"text number {n}"} for n in range(9)]
    (base / "processing" / "input" / "corpus").mkdir()
    write_jsonl(base / "processing" / "input" / "corpus" / "c.jsonl", texts)
    return base


@pytest.mark.cpu
def test_a_processing_job_reads_its_inputs_and_writes_its_output_with_settings_from_its_arguments(
    tmp_path_factory, tiny_model_dir, tmp_path, monkeypatch
):
    from tasks import test_hybrid

    base = processing_tree(tmp_path / "opt-ml", test_hybrid.build(tiny_model_dir, tmp_path / "m3"), ["shards"])
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    assert processing.is_processing(base)
    with pytest.raises(SystemExit) as done:
        cli.main(["encode", "--shard_size", "4", "--output=dense,sparse"])
    assert done.value.code == 0, (base / "output" / "failure").read_text()
    out = base / "processing" / "output" / "shards"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["shard_size"] == 4 and manifest["documents"] == 9 and len(manifest["shards"]) == 3
    table = ds.dataset(out / "shards", format="parquet").to_table()
    assert table.column_names == ["id", "vector", "indices", "values"] and table.num_rows == 9

    classifier = serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)
    failing = processing_tree(tmp_path / "failing", classifier, ["a", "b"])
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(failing))
    assert entry.encode() != 0
    message = (failing / "output" / "message").read_text()  # (the ExitMessage)
    assert "several outputs (a, b): name the shards' one `shards`" in message


def test_settings_on_the_command_line():
    assert entry.arguments_of(["--batch_size", "8", "--prompt-name=document", "dtype=float16"]) == {
        "batch_size": "8",
        "prompt_name": "document",
        "dtype": "float16",
    }
    with pytest.raises(EncodeError, match="'oops' is not a setting: give --name value"):
        entry.arguments_of(["oops"])
