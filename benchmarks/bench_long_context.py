"""An 8,192-token request to a ModernBERT-base-shaped embedding model (issue 58's long-context target): its time,
the server's peak memory while it runs, and /ping's answers meanwhile, on ONNX Runtime and on torch.

The model: ModernBERT's base shape (22 layers, 768 wide, 12 heads, global attention every third layer and a
128-token window in the others, 8,192 positions), drawn at random (speed and memory only), mean pooling, as a
sentence-transformers folder (gte-modernbert's layout) with MiniLM's WordPiece tokenizer; its graph by
`byoc export-onnx`. `byoc serve` runs it with the asynchronous profile's timeout (an 8,192-token pass on two
cores takes minutes). One warm-up request of a sentence, then one request of `--tokens` tokens while a
client asks /ping every 0.05 s and a sampler reads the server's resident memory (all its processes) every 0.1 s.
Run it alone: it measures on these cores.

    .venv/bin/python benchmarks/bench_long_context.py [--tokens 8192] [--shape base|small] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
import reference_stack  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)
from child_process import dies_with_parent, exit_on_sigterm  # noqa: E402

WORK = Path("/tmp/byoc-bench-long-context")
SHAPES = {
    "base": {"hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152},
    "small": {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "intermediate_size": 384},
}


def build_model(shape: str, positions: int) -> Path:
    """The random ModernBERT under WORK/<shape>/model, as a sentence-transformers folder with its graph."""
    import torch
    import transformers

    from byoc import onnx_graph
    from byoc.training.model import bundled_model_dir

    target = WORK / shape / "model"
    if (target / "model.onnx").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    source = bundled_model_dir()
    config = transformers.ModernBertConfig(
        vocab_size=30522,
        max_position_embeddings=positions,
        global_attn_every_n_layers=3,
        local_attention=128,
        pad_token_id=0,
        cls_token_id=101,
        sep_token_id=102,
        bos_token_id=101,
        eos_token_id=102,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    transformers.ModernBertModel(config).save_pretrained(target)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    tokenizer.model_max_length = positions
    tokenizer.save_pretrained(target)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (target / "modules.json").write_text(json.dumps(modules))
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": positions}))
    (target / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert onnx_graph.export(target) is not None
    return target


def serve(model: Path, port: int, backend: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "SAGEMAKER_BASE_DIR": str(model.parent),
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "BYOC_INFERENCE_BACKEND": backend,
        "BYOC_INFERENCE_PRECISION": "fp32",
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "3600",
    }
    command = [sys.executable, "-c", "from byoc.cli import main; main(['serve'])"]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_parent
    )


def measure(port: int, pid: int, tokens: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("/invocations", json={"inputs": ["a short sentence"]}).status_code == 200  # warm
    resting = servers.rss_tree_mib(pid)
    stop, pings, memory = threading.Event(), [], [resting]

    def pinger() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            client.get("/ping")
            pings.append(time.perf_counter() - started)
            time.sleep(0.05)

    def sampler() -> None:
        while not stop.is_set():
            memory.append(servers.rss_tree_mib(pid))
            time.sleep(0.1)

    threads = [threading.Thread(target=pinger), threading.Thread(target=sampler)]
    for thread in threads:
        thread.start()
    text = "word " * (tokens - 2)  # one WordPiece token each, with [CLS] and [SEP]: `tokens` in all
    started = time.perf_counter()
    answer = httpx.post(f"{url}/invocations", json={"inputs": [text]}, timeout=3600)
    seconds = time.perf_counter() - started
    stop.set()
    for thread in threads:
        thread.join()
    pings.sort()
    return {
        "tokens": tokens,
        "status": answer.status_code,
        "seconds": round(seconds, 1),
        "rss_resting_mib": round(resting),
        "rss_peak_mib": round(max(memory)),
        "pings": len(pings),
        "ping_p99_ms": round(1000 * pings[int(0.99 * (len(pings) - 1))], 1),
        "ping_worst_ms": round(1000 * pings[-1], 1),
    }


def served(model: Path, backend: str, opts: argparse.Namespace) -> dict:
    """One backend's server: the long request measured, as a row."""
    port = servers.free_port()
    proc = serve(model, port, backend)
    try:
        reference_stack.wait_ready(port, timeout=600, since=time.monotonic(), proc=proc)
        row = {"shape": opts.shape, "backend": backend, **measure(port, proc.pid, opts.tokens)}
        print(json.dumps(row), flush=True)
        return row
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "torch"])
    parser.add_argument("--json", type=Path)
    harness.add_rounds(parser)
    opts = parser.parse_args()
    model = build_model(opts.shape, max(8192, opts.tokens))
    declared = {backend: lambda b=backend: served(model, b, opts) for backend in opts.backends}
    results = list(harness.scenarios(declared, opts.rounds).values())
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(opts.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
