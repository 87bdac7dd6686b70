"""`byoc encode` through its entry point on a temporary /opt/ml: the folders `byoc train` writes (dense, sparse,
multi-vector) and a bge-m3 folder encode a BEIR corpus as their reference libraries do; every document is encoded
exactly once across ranks, hosts and a restart; what cannot be encoded fails the job saying why."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
import serve_helpers

from byoc import compat
from byoc.encoding import encoder, entry
from byoc.errors import EXIT_STOPPED
from byoc.training import entry as training
from helpers import Job, build_tiny_mlm, topic_rows, write_beir, write_jsonl

pytestmark = pytest.mark.integration

QUICK = {"max_steps": "4", "logging_steps": "2", "per_device_train_batch_size": "8", "device": "cpu"}
FAMILIES = {"dense": "embedding", "sparse": "sparse_embedding", "multi_vector": "multi_vector"}
# Multi-vector models: sentence-transformers 6.2 on (the torch-2.9 tier's 5.1 has none: those tests skip there)
MULTI_VECTOR = importlib.util.find_spec("sentence_transformers.multi_vector_encoder") is not None


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """The folder `byoc train` writes for each family, on the tiny BERT (4 steps: what is tested is the folder)."""
    folders = {}
    with pytest.MonkeyPatch.context() as patch:
        for family, task in FAMILIES.items():
            if family == "multi_vector" and not MULTI_VECTOR:
                continue
            root = tmp_path_factory.mktemp(f"train-{family}")
            patch.setenv("SAGEMAKER_BASE_DIR", str(root / "opt-ml"))
            patch.setenv("BYOC_CACHE_DIR", str(root / "cache"))
            job = Job(root / "opt-ml").resources().hyperparameters({**QUICK, "task": task})
            base = tiny_model_dir if family != "sparse" else build_tiny_mlm(tiny_model_dir, root / "mlm")
            job.model_channel(base)
            write_jsonl(job.channel("train") / "train.jsonl", topic_rows(32))
            assert training.train() == 0, job.failure
            folders[family] = job.model_dir
    return folders


def encode_job(root: Path, model: Path, hyperparameters: dict[str, str], **resources) -> Job:
    job = Job(root).resources(**resources).hyperparameters(hyperparameters)
    job.model_channel(model)
    return job


def run(job: Job, monkeypatch) -> int:
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(job.root))
    return entry.encode()


def rows(folder: Path) -> dict[str, dict]:
    """Every document's row in the shards under `folder`, by id."""
    table = ds.dataset(folder, format="parquet").to_table()
    out = {}
    for row in table.to_pylist():
        assert row["id"] not in out, f"{row['id']} written twice"
        out[row["id"]] = row
    return out


def assert_same(got: dict[str, dict], expected: dict[str, dict]) -> None:
    """The same ids, each with the same vector (fp32 from the same graph: the same to float precision)."""
    assert got.keys() == expected.keys()
    for doc_id, row in got.items():
        np.testing.assert_allclose(row["vector"], expected[doc_id]["vector"], atol=1e-6, err_msg=doc_id)


def beir_texts(corpus: Path) -> dict[str, str]:
    docs = [json.loads(line) for line in (corpus / "corpus.jsonl").read_text().splitlines()]
    return {d["_id"]: (d["title"] + " " + d["text"]).strip() for d in docs}  # (BEIR's loaders' join)


@pytest.mark.cpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_trained_folder_encodes_a_beir_corpus_as_its_reference_library(family, trained, tmp_path, monkeypatch):
    if family not in trained:
        pytest.skip("multi-vector models: sentence-transformers 6.2 on")
    job = encode_job(tmp_path / "opt-ml", trained[family], {"shard_size": "7", "batch_size": "4"})
    corpus = write_beir(job.channel("corpus"))
    assert run(job, monkeypatch) == 0, job.failure
    texts = beir_texts(corpus)
    got = rows(job.model_dir / "shards")
    assert sorted(got) == sorted(texts)
    ids = sorted(texts)
    folder = str(trained[family])
    if family == "dense":
        expected = compat.sentence_transformers_api()[0](folder, device="cpu").encode([texts[i] for i in ids])
        np.testing.assert_allclose([got[i]["vector"] for i in ids], expected, atol=1e-5)
    elif family == "sparse":
        encoded = compat.sparse_encoder_api()[0](folder, device="cpu").encode([texts[i] for i in ids])
        expected = encoded.to_dense().numpy()
        for i, row in zip(ids, expected):
            dense = np.zeros_like(row)
            dense[got[i]["indices"]] = got[i]["values"]
            np.testing.assert_allclose(dense, row, rtol=1e-4, atol=1e-5)
    else:
        from sentence_transformers import MultiVectorEncoder

        expected = MultiVectorEncoder(folder, device="cpu").encode([texts[i] for i in ids])
        schema = ds.dataset(job.model_dir / "shards", format="parquet").schema
        assert "halffloat" in str(schema.field("token_vectors").type)  # (float16 by default, as users store them)
        for i, want in zip(ids, expected):
            np.testing.assert_allclose(np.stack(got[i]["token_vectors"]), np.asarray(want), atol=2e-3)
    manifest = json.loads((job.model_dir / "manifest.json").read_text())
    assert manifest["documents"] == len(texts) and manifest["model"]["task"] == FAMILIES[family]
    assert [s["documents"] for s in manifest["shards"]] == [7] * (len(texts) // 7) + (
        [len(texts) % 7] * bool(len(texts) % 7)
    )
    for shard in manifest["shards"]:
        assert shard["sha256"] == entry._sha256(job.model_dir / shard["file"])
    assert (
        set(manifest["dimensions"]) == {"dense": {"vector"}, "sparse": set(), "multi_vector": {"token_vectors"}}[family]
    )


@pytest.mark.cpu
def test_a_bge_m3_folder_writes_each_output_asked_as_bgem3flagmodel_encodes(tiny_model_dir, tmp_path, monkeypatch):
    from tasks import test_hybrid

    m3 = test_hybrid.build(tiny_model_dir, tmp_path / "m3")
    job = encode_job(tmp_path / "opt-ml", m3, {"output": "dense,sparse,colbert", "dtype": "float32"})
    corpus = write_beir(job.channel("corpus"))
    assert run(job, monkeypatch) == 0, job.failure
    texts = beir_texts(corpus)
    ids = sorted(texts)
    expected = test_hybrid.reference(m3).encode(
        [texts[i] for i in ids], return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    got = rows(job.model_dir / "shards")
    for n, i in enumerate(ids):
        np.testing.assert_allclose(got[i]["vector"], expected["dense_vecs"][n], atol=1e-5)
        np.testing.assert_allclose(np.stack(got[i]["token_vectors"]), expected["colbert_vecs"][n], atol=1e-5)
        weights = expected["lexical_weights"][n]
        assert got[i]["indices"] == sorted(int(k) for k in weights)
        np.testing.assert_allclose(got[i]["values"], [float(weights[str(k)]) for k in got[i]["indices"]], rtol=1e-4)


def corpus_of(folder: Path, files: int = 2, each: int = 23) -> None:
    for f in range(files):
        write_jsonl(
            folder / f"part-{f}.jsonl", [{"id": f"{f}-{n}", "text": f"document {n} of part {f}"} for n in range(each)]
        )


@pytest.mark.cpu
def test_every_document_is_encoded_once_by_two_ranks_four_ranks_on_two_hosts_and_sharded_hosts(
    trained, tmp_path, monkeypatch
):
    settings = {"shard_size": "5", "batch_size": "3"}
    one = encode_job(tmp_path / "one", trained["dense"], settings)
    corpus_of(one.channel("corpus"))
    assert run(one, monkeypatch) == 0, one.failure
    expected = rows(one.model_dir / "shards")
    assert len(expected) == 46

    two = encode_job(tmp_path / "two", trained["dense"], {**settings, "processes_per_host": "2"})
    corpus_of(two.channel("corpus"))
    assert run(two, monkeypatch) == 0, two.failure
    assert_same(rows(two.model_dir / "shards"), expected)

    hosts = ["algo-1", "algo-2"]
    for distribution, per_host in (("FullyReplicated", "2"), ("ShardedByS3Key", "1")):
        written = {}
        for n, host in enumerate(hosts):
            job = encode_job(
                tmp_path / f"{distribution}-{host}",
                trained["dense"],
                {**settings, "processes_per_host": per_host},
                current=host,
                hosts=hosts,
            )
            folder = job.channel("corpus", distribution=distribution)
            corpus_of(folder)
            if distribution == "ShardedByS3Key":  # (SageMaker hands each host its own files)
                (folder / f"part-{1 - n}.jsonl").unlink()
            assert run(job, monkeypatch) == 0, job.failure
            mine = rows(job.model_dir / "shards")
            assert not set(mine) & set(written), f"{host} encoded documents another host did"
            written.update(mine)
            assert json.loads((job.model_dir / f"manifest-{host}.json").read_text())["documents"] == len(mine)
        assert_same(written, expected)


@pytest.mark.cpu
def test_a_job_stopped_mid_way_keeps_its_finished_shards_and_the_restart_encodes_the_rest(
    trained, tmp_path, monkeypatch, caplog
):
    reference = encode_job(tmp_path / "whole", trained["dense"], {"shard_size": "10"})
    corpus_of(reference.channel("corpus"))
    assert run(reference, monkeypatch) == 0
    job = encode_job(tmp_path / "opt-ml", trained["dense"], {"shard_size": "10"})
    corpus_of(job.channel("corpus"))
    published = encoder.publish

    def stop_after_the_first(path, output_dir):  # (as a SIGTERM between two shards: the flag its handler sets)
        published(path, output_dir)
        encoder.stop_requested.set()

    monkeypatch.setattr(encoder, "publish", stop_after_the_first)
    assert run(job, monkeypatch) == EXIT_STOPPED
    assert "stopped by SIGTERM" in job.failure and "encodes only what is left" in job.failure
    state = job.root / "checkpoints" / "encode"
    assert sorted(p.name for p in state.iterdir()) == ["job-algo-1.json", "part-0-00000.parquet"]  # (no partial)
    monkeypatch.setattr(encoder, "publish", published)
    (job.model_dir / "shards" / "stale-00000.parquet").write_text("an earlier run's")  # (goes: not this job's)
    with caplog.at_level("INFO"):
        assert run(job, monkeypatch) == 0, job.failure
    assert "1 of its 6 shard(s) finished before: skipped" in caplog.text
    assert_same(rows(job.model_dir / "shards"), rows(reference.model_dir / "shards"))

    job.hyperparameters({"shard_size": "10", "max_length": "8"})  # (another job's vectors must not mix in)
    assert run(job, monkeypatch) != 0
    assert "holds shards of another encode job (settings changed (max_length))" in job.failure
    job.hyperparameters({"shard_size": "10", "batch_size": "3"})  # (how the work is cut: the same job)
    assert run(job, monkeypatch) == 0, job.failure
    assert job.failure is None  # (the attempt before's, gone)
    write_jsonl(job.channel("corpus") / "part-1.jsonl", [{"id": "1-0", "text": "another text"}])
    assert run(job, monkeypatch) != 0
    assert "holds shards of another encode job (the corpus changed)" in job.failure


@pytest.mark.cpu
def test_a_corpus_file_that_shrinks_while_it_is_encoded_fails_the_job_and_no_short_shard_is_kept(
    trained, tmp_path, monkeypatch
):
    job = encode_job(tmp_path / "opt-ml", trained["dense"], {"shard_size": "10", "batch_size": "4"})
    corpus_of(job.channel("corpus"), files=1)  # (23 documents: shards of 10, 10 and 3)
    loaded = encoder.load

    def then_shrink(rank_job):  # (the file cut to 15 documents after the job counted 23)
        model = loaded(rank_job)
        part = job.channel("corpus") / "part-0.jsonl"
        part.write_text("".join(part.read_text().splitlines(keepends=True)[:15]))
        return model

    monkeypatch.setattr(encoder, "load", then_shrink)
    assert run(job, monkeypatch) != 0
    assert "part-0.jsonl ended before the end of its shard part-0-00001.parquet (23 document(s)" in job.failure
    state = job.root / "checkpoints" / "encode"
    assert sorted(p.name for p in state.glob("*.parquet")) == ["part-0-00000.parquet"]  # (the whole one only)
    assert sorted(p.name for p in (job.model_dir / "shards").glob("*.parquet")) == ["part-0-00000.parquet"]


@pytest.mark.cpu
@pytest.mark.parametrize("processes", ["1", "2"])
def test_sigterm_stops_the_byoc_encode_command_between_batches_and_a_rerun_finishes(
    trained, tmp_path, monkeypatch, processes
):
    hyperparameters = {"shard_size": "4", "batch_size": "2", "processes_per_host": processes}
    job = encode_job(tmp_path / "opt-ml", trained["dense"], hyperparameters)
    corpus_of(job.channel("corpus"), files=1, each=400)
    state = job.root / "checkpoints" / "encode"
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.root), "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen([sys.executable, "-m", "byoc.cli", "encode"], env=env)
    try:
        serve_helpers.wait_for(lambda: process.poll() is not None or list(state.glob("*.parquet")), "a first shard")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=serve_helpers.HANG_GUARD_S) == EXIT_STOPPED
    finally:
        process.kill()
    assert "stopped by SIGTERM" in job.failure
    kept = list(state.glob("part-0-*.parquet"))
    assert 0 < len(kept) < 100 and not list(state.glob(".*"))
    assert run(job, monkeypatch) == 0, job.failure
    assert len(rows(job.model_dir / "shards")) == 400


@pytest.mark.cpu
def test_a_host_sagemaker_gave_no_file_of_a_sharded_channel_has_nothing_to_do(trained, tmp_path, monkeypatch):
    job = encode_job(tmp_path / "opt-ml", trained["dense"], {}, current="algo-3", hosts=["algo-1", "algo-2", "algo-3"])
    job.channel("corpus", distribution="ShardedByS3Key")  # (fewer files than hosts: none here)
    assert run(job, monkeypatch) == 0, job.failure
    manifest = json.loads((job.model_dir / "manifest-algo-3.json").read_text())
    assert manifest["documents"] == 0 and manifest["shards"] == []


@pytest.mark.cpu
def test_max_length_and_dimensions_shape_the_vectors(trained, tmp_path, monkeypatch):
    job = encode_job(tmp_path / "opt-ml", trained["dense"], {"max_length": "6", "dimensions": "8"})
    write_jsonl(job.channel("corpus") / "c.jsonl", [{"id": "a", "text": "a rather long text of many words " * 4}])
    assert run(job, monkeypatch) == 0, job.failure
    model = compat.sentence_transformers_api()[0](str(trained["dense"]), device="cpu")
    model.max_seq_length = 6
    want = model.encode(["a rather long text of many words " * 4], truncate_dim=8)[0]  # (its folder: no Normalize)
    np.testing.assert_allclose(rows(job.model_dir / "shards")["a"]["vector"], want, atol=1e-5)
    assert json.loads((job.model_dir / "manifest.json").read_text())["dimensions"] == {"vector": 8}


def test_what_cannot_be_encoded_fails_the_job_saying_why(
    tmp_path_factory, tiny_model_dir, trained, tmp_path, monkeypatch
):
    classifier = serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)
    job = encode_job(tmp_path / "a", classifier, {})
    write_jsonl(job.channel("corpus") / "c.jsonl", [{"id": "a", "text": "x"}])
    assert run(job, monkeypatch) != 0
    assert re.search(r"is a .*classifier, which answers labels with their scores: byoc encode writes", job.failure)

    job = encode_job(tmp_path / "b", trained["dense"], {})
    write_jsonl(job.channel("corpus") / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    assert run(job, monkeypatch) != 0
    assert "1 document id(s) appear more than once in the corpus: 'a' (c.jsonl, c.jsonl)" in job.failure

    job = encode_job(tmp_path / "c", trained["sparse"], {"dimensions": "4"})
    write_jsonl(job.channel("corpus") / "c.jsonl", [{"id": "a", "text": "x"}])
    assert run(job, monkeypatch) != 0
    assert "hyperparameter dimensions does not apply to a sparse embedding model" in job.failure

    job = encode_job(tmp_path / "d", trained["dense"], {})
    assert run(job, monkeypatch) != 0
    assert "no `corpus` channel (channels: model)" in job.failure


def test_an_image_without_pyarrow_says_which_images_encode(tmp_path, monkeypatch):
    import importlib.util as util

    from byoc import cli

    job = Job(tmp_path / "opt-ml").resources()
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(job.root))
    find_spec = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "pyarrow" else find_spec(name, *a))
    with pytest.raises(SystemExit) as stop:
        cli.main(["encode"])
    assert stop.value.code == 1
    assert "this image does not have (the serving image" in job.failure and "Dockerfile.gpu" in job.failure
