"""Encoding a corpus (make bench-encode): `byoc encode` as a job runs it (a process of its own on a temporary
/opt/ml), against sentence-transformers' `encode` and byoc serve's own pass (the default predict_fn in this process,
no HTTP) on the same folder and batch size; its peak memory on a corpus and on one 10 times larger; int8's and
bf16's recall@10 against fp32's.

The model: the bundled all-MiniLM-L6-v2 with its graphs (fp32 and int8) written by byoc's export. The corpus:
SICK's distinct sentences (shared data), each a document; the queries: each test pair's first sentence where
the pair is related (relatedness at least 4), its second sentence the relevant document.

Scenarios (alternated over `--rounds`, benchmarks/harness.py; the medians reported):
  byoc_encode      documents/s of the job's encoding (its rank's rate: model loaded, corpus read), and the job's
                   whole time from start to manifest; fp32 (the default on the CPU)
  byoc_encode_int8 the same with precision=int8 (ONNX Runtime's quantized graph)
  byoc_encode_bf16 the same with precision=bf16 (torch, the weights in bfloat16: fast where the CPU has bf16
                   instructions, AVX512-BF16 or AMX, about as slow as fp32 or slower where it has none)
  st_encode        SentenceTransformer.encode(corpus, batch_size=BATCH) on the whole corpus in one call (sorted by
                   length throughout, as users call it), in this process, model loaded before
  serve_pass       byoc serve's predict_fn, BATCH texts a call, in this process, model loaded before
  matmul_ceiling   the machine's ceiling for this model: the encoder's matrix products alone (every layer's
                   query-key-value, output and feed-forward projections) on the corpus's own tokens, no padding, in
                   batches of BATCH documents, as documents/s, through each engine at this process's threads:
                   torch's GEMM in fp32 and in bf16, ONNX Runtime's MatMul in fp32 (its MLAS kernels can outrun
                   torch's MKL on an AMD CPU). The fp32 ceiling is the faster engine's. An encoder that passes it
                   in that precision would have to skip arithmetic the model does; `fp32_target_of_ceiling` says
                   what share of it 1.5x sentence-transformers' rate would take.
Then, once: peak resident memory of `byoc encode` on SMALL documents and on 10 times as many; recall@10 of the
int8 corpus and queries against fp32's.

    .venv/bin/python benchmarks/bench_encode.py [--rounds 2] [--json benchmarks/results/encode.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from child_process import dies_with_parent, exit_on_sigterm  # noqa: E402
from fixtures import load, model_folder, rate, sick_pairs  # noqa: E402  (the dense benchmark's model and data)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
WORK = Path("/tmp/byoc-bench-encode")
BATCH = 64
SMALL = 2_000  # documents of the memory check's small corpus (the large one: 10 times as many)
# The job's own peak, read as every benchmark reads it (harness.peak_rss_mib: VmHWM, not ru_maxrss, which would
# start at this benchmark's peak).
RUN = (
    "import sys\n"
    "from byoc.logs import configure_logging\n"
    "from byoc.encoding.entry import encode\n"
    "configure_logging()\n"
    "code = encode()\n"
    "import harness\n"  # (after the job: its import asks git for the commit, no part of the job's time)
    "print('PEAK_MIB', harness.peak_rss_mib(), flush=True)\n"
    "sys.exit(code)\n"
)


def corpus() -> tuple[dict[str, str], list[str], list[str]]:
    """SICK's distinct sentences by id, and the related test pairs' queries with their documents' ids."""
    first, second, gold = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    ids = {text: f"sick-{n}" for n, text in enumerate(texts)}
    related = [(a, b) for a, b, g in zip(first, second, gold) if g >= 4.0 and a != b]
    return {ids[t]: t for t in texts}, [a for a, _ in related], [ids[b] for _, b in related]


def job_tree(root: Path, model: Path, documents: dict[str, str], hyperparameters: dict[str, str]) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "data" / "corpus").mkdir(parents=True)
    (root / "input" / "data" / "model").symlink_to(model, target_is_directory=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    channels = {
        name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for name in ("corpus", "model")
    }
    (root / "input" / "config" / "inputdataconfig.json").write_text(json.dumps(channels))
    with (root / "input" / "data" / "corpus" / "corpus.jsonl").open("w") as file:
        for doc_id, text in documents.items():
            file.write(json.dumps({"id": doc_id, "text": text}) + "\n")
    return root


def run_job(root: Path) -> dict[str, float]:
    """`byoc encode` in a process of its own: its rank's documents/s, its whole time, its peak memory."""
    started = time.monotonic()
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "PYTHONPATH": f"{REPO / 'container'}:{REPO / 'benchmarks'}"}
    done = subprocess.run(
        [sys.executable, "-c", RUN], env=env, capture_output=True, text=True, preexec_fn=dies_with_parent
    )
    output = done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(f"byoc encode failed ({done.returncode}):\n{output[-3000:]}")
    rate_found = re.findall(r"documents_per_second=([0-9.]+)", output)
    peak = re.search(r"PEAK_MIB ([0-9.]+)", output)
    return {
        "documents_per_s": float(rate_found[-1]),
        "job_s": time.monotonic() - started,
        "peak_mib": float(peak.group(1)) if peak else float("nan"),
    }


def vectors(root: Path) -> tuple[list[str], np.ndarray]:
    import pyarrow.dataset as ds

    table = ds.dataset(root / "model" / "shards", format="parquet").to_table()
    return table["id"].to_pylist(), np.stack(table["vector"].to_numpy(zero_copy_only=False)).astype(np.float32)


def recall_at_10(ids: list[str], documents: np.ndarray, queries: np.ndarray, relevant: list[str]) -> float:
    scores = queries @ documents.T
    top = np.argsort(-scores, axis=1)[:, :10]
    return float(np.mean([relevant[q] in {ids[i] for i in row} for q, row in enumerate(top)]))


def of_ceiling(results: dict[str, Any]) -> dict[str, float]:
    """The fp32 ceiling (the faster engine's) and the bf16 one; each rate as a share of the ceiling in its
    precision, and the share 1.5x sentence-transformers' rate would take of the fp32 one."""
    engines = results["matmul_ceiling"]
    fp32, bf16 = max(engines["torch_fp32"], engines["onnxruntime_fp32"]), engines["torch_bf16"]
    st = results["st_encode"]["documents_per_s"]
    return {
        "fp32_ceiling": fp32,
        "bf16_ceiling": bf16,
        "st_encode_of_fp32_ceiling": st / fp32,
        "byoc_encode_of_fp32_ceiling": results["byoc_encode"]["documents_per_s"] / fp32,
        "byoc_encode_bf16_of_bf16_ceiling": results["byoc_encode_bf16"]["documents_per_s"] / bf16,
        "fp32_target_of_ceiling": 1.5 * st / fp32,
    }


def token_rows(reference: Any, texts: list[str]) -> list[int]:
    """Each batch of BATCH documents' tokens, as the reference's tokenizer cuts them (no padding)."""
    tokens = reference.tokenizer(texts, truncation=True, max_length=reference.max_seq_length)["input_ids"]
    return [sum(len(ids) for ids in tokens[start : start + BATCH]) for start in range(0, len(tokens), BATCH)]


def layer_weights(config: Any, seed: int = 0) -> list[np.ndarray]:
    """One layer's four projections as (in, out) fp32 matrices: query-key-value as one (the fastest way to do
    their arithmetic, so still a ceiling), output, feed-forward up and down."""
    hidden, inner = config.hidden_size, config.intermediate_size
    rng = np.random.default_rng(seed)
    shapes = ((hidden, 3 * hidden), (hidden, hidden), (hidden, inner), (inner, hidden))
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def matmul_ceiling(reference: Any, texts: list[str], dtype: Any) -> float:
    """Documents/s of the encoder's matrix products alone on `texts`' tokens through torch, in `dtype`."""
    import torch

    config = reference[0].auto_model.config
    rows = token_rows(reference, texts)
    qkv, out, up, down = (torch.from_numpy(w.T.copy()).to(dtype) for w in layer_weights(config))
    rng = np.random.default_rng(1)
    inputs = {
        n: torch.from_numpy(rng.standard_normal((n, config.hidden_size), dtype=np.float32)).to(dtype) for n in set(rows)
    }
    with torch.inference_mode():
        torch.nn.functional.linear(inputs[rows[0]], qkv)  # (the first product allocates the GEMM's buffers)
        started = time.monotonic()
        for n in rows:
            states = inputs[n]
            for _ in range(config.num_hidden_layers):
                torch.nn.functional.linear(states, qkv)
                torch.nn.functional.linear(states, out)
                torch.nn.functional.linear(torch.nn.functional.linear(states, up), down)
    return len(texts) / (time.monotonic() - started)


def onnxruntime_ceiling(reference: Any, texts: list[str], threads: int) -> float:
    """The same products through ONNX Runtime's MatMul in fp32 (a graph of one layer, run once a layer)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    config = reference[0].auto_model.config
    rows = token_rows(reference, texts)
    weights = [numpy_helper.from_array(w, name) for w, name in zip(layer_weights(config), ("qkv", "out", "up", "down"))]
    nodes = [
        helper.make_node("MatMul", ["states", "qkv"], ["mixed"]),
        helper.make_node("MatMul", ["states", "out"], ["projected"]),
        helper.make_node("MatMul", ["states", "up"], ["inner"]),
        helper.make_node("MatMul", ["inner", "down"], ["down_out"]),
    ]
    io = lambda name, width: helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, width])  # noqa: E731
    hidden = config.hidden_size
    graph = helper.make_graph(
        nodes,
        "layer",
        [io("states", hidden)],
        [io("mixed", 3 * hidden), io("projected", hidden), io("down_out", hidden)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((n, hidden), dtype=np.float32) for n in set(rows)}
    session.run(None, {"states": inputs[rows[0]]})  # (the first run allocates its buffers)
    started = time.monotonic()
    for n in rows:
        for _ in range(config.num_hidden_layers):
            session.run(None, {"states": inputs[n]})
    return len(texts) / (time.monotonic() - started)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "encode.json")
    options = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from byoc.serving import default_pipeline

    folder = model_folder()
    documents, queries, relevant = corpus()
    texts = list(documents.values())
    reference = SentenceTransformer(str(folder), device="cpu")
    served = load(folder, "fp32")
    seconds = 10.0

    def byoc_encode() -> dict[str, float]:
        return run_job(job_tree(WORK / "job", folder, documents, {"batch_size": str(BATCH)}))

    def byoc_encode_int8() -> dict[str, float]:
        return run_job(job_tree(WORK / "job", folder, documents, {"batch_size": str(BATCH), "precision": "int8"}))

    def st_encode() -> dict[str, float]:
        started = time.monotonic()  # (the whole corpus in one call, as users call it: sorted by length throughout)
        reference.encode(texts, batch_size=BATCH)
        return {"documents_per_s": len(texts) / (time.monotonic() - started)}

    def serve_pass() -> dict[str, float]:
        def answer(batch: list[str]) -> object:
            return default_pipeline.predict_fn({"inputs": batch, "parameters": {}}, served)

        return {"documents_per_s": rate(answer, texts, seconds, BATCH)}

    def byoc_encode_bf16() -> dict[str, float]:
        return run_job(job_tree(WORK / "job", folder, documents, {"batch_size": str(BATCH), "precision": "bf16"}))

    def ceiling() -> dict[str, float]:
        import torch

        return {
            "torch_fp32": matmul_ceiling(reference, texts, torch.float32),
            "torch_bf16": matmul_ceiling(reference, texts, torch.bfloat16),
            "onnxruntime_fp32": onnxruntime_ceiling(reference, texts, os.cpu_count() or 1),
        }

    scenarios = {
        "matmul_ceiling": ceiling,
        "byoc_encode": byoc_encode,
        "byoc_encode_int8": byoc_encode_int8,
        "byoc_encode_bf16": byoc_encode_bf16,
        "st_encode": st_encode,
    }
    runs = harness.alternate({**scenarios, "serve_pass": serve_pass}, options.rounds)
    results: dict[str, Any] = {
        "batch": BATCH,
        "documents": len(documents),
        "rounds": options.rounds,
        "threads": os.cpu_count(),
    }
    results.update(harness.medians(runs))
    encoded = results["byoc_encode"]["documents_per_s"]
    results["byoc_encode_over_st_encode"] = encoded / results["st_encode"]["documents_per_s"]
    results["byoc_encode_over_serve_pass"] = encoded / results["serve_pass"]["documents_per_s"]
    int8 = results["byoc_encode_int8"]["documents_per_s"]
    results["byoc_encode_int8_over_st_encode"] = int8 / results["st_encode"]["documents_per_s"]
    bf16 = results["byoc_encode_bf16"]["documents_per_s"]
    results["byoc_encode_bf16_over_st_encode"] = bf16 / results["st_encode"]["documents_per_s"]
    results.update(of_ceiling(results))

    small = dict(list(documents.items())[:SMALL])
    large = {f"{doc_id}-{copy}": text for copy in range(10) for doc_id, text in small.items()}
    results["memory"] = {
        "small_documents": len(small),
        "large_documents": len(large),
        "small_peak_mib": run_job(job_tree(WORK / "small", folder, small, {"batch_size": str(BATCH)}))["peak_mib"],
        "large_peak_mib": run_job(job_tree(WORK / "large", folder, large, {"batch_size": str(BATCH)}))["peak_mib"],
    }
    results["memory"]["large_over_small"] = results["memory"]["large_peak_mib"] / results["memory"]["small_peak_mib"]

    recall = {}
    for precision in ("fp32", "int8", "bf16"):
        root = job_tree(WORK / precision, folder, documents, {"batch_size": str(BATCH), "precision": precision})
        run_job(root)
        ids, corpus_vectors = vectors(root)
        model = load(folder, precision, backend="auto")  # (bf16: torch's, as the job chose)
        asked = np.asarray(default_pipeline.predict_fn({"inputs": queries, "parameters": {}}, model), dtype=np.float32)
        recall[precision] = recall_at_10(ids, corpus_vectors, asked, relevant)
    results["recall_at_10"] = {
        **recall,
        "queries": len(queries),
        "int8_minus_fp32": recall["int8"] - recall["fp32"],
        "bf16_minus_fp32": recall["bf16"] - recall["fp32"],
    }
    print({k: v for k, v in results.items() if "_over_" in k or k in ("memory", "recall_at_10")}, flush=True)
    harness.write_results(options.json, results)
    shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
