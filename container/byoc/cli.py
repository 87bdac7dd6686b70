"""`byoc`: the container's command line. It parses and dispatches; each command's work lives in its
room (training: `byoc.training.entry`; serving: `byoc.serving.server`), imported only when that
command runs, so that `byoc serve` and `byoc healthcheck` never load the training side or torch.

`toolkit_train` is the `SAGEMAKER_TRAINING_MODULE` hook (`byoc.cli:toolkit_train`), so the
sagemaker-training toolkit's own `train` command runs the same job, as in the AWS images.
"""

from __future__ import annotations

# Imported where used: each command loads its own room, so `byoc serve` loads neither training nor torch.
import argparse
import logging
import os
import sys
from typing import Any

from byoc import __version__
from byoc.logs import configure_logging

# What copies of code/train.py and older tests import from here; they live in byoc.training.entry.
_TRAINING_ENTRY_POINTS = ("run_job", "train", "failure_message")


def __getattr__(name: str) -> Any:
    """`from byoc.cli import run_job` (every copy of code/train.py made so far), loaded on first use."""
    if name in _TRAINING_ENTRY_POINTS:
        from byoc.training import entry

        return getattr(entry, name)
    raise AttributeError(f"module 'byoc.cli' has no attribute {name!r}")


def toolkit_train() -> None:
    """`SAGEMAKER_TRAINING_MODULE=byoc.cli:toolkit_train`: run under the toolkit's `train` command.

    The toolkit turns a SystemExit raised here into exit 0 (its `finally` exits with its own code),
    so a failure leaves through `os._exit` with the real code, after flushing the logs.
    """
    from byoc.training.entry import train

    configure_logging()
    code = train()
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="byoc", description="train and serve Hugging Face text models on SageMaker")
    parser.add_argument("--version", action="version", version=f"byoc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from byoc import tasks  # (light: no torch) the families, named from the registry, never a stale list

    sub.add_parser(
        "train",
        help="run the training job described by /opt/ml (or $SAGEMAKER_BASE_DIR)",
        description="run the training job /opt/ml (or $SAGEMAKER_BASE_DIR) describes: input/config's hyperparameters "
        f"(task: auto or {', '.join(n for n, t in tasks.TASKS.items() if t.trains)}; every name in "
        "docs/hyperparameters.md), its channels (train; validation, test, model optional) and hosts. Writes "
        "model/ (model.tar.gz), output/data/metrics.json, and output/failure when it fails",
    )
    sub.add_parser(
        "serve",
        help="serve /opt/ml/model (or $SAGEMAKER_BASE_DIR/model) over HTTP on $SAGEMAKER_BIND_TO_PORT",
        description="serve a model folder over HTTP (/ping, /invocations, and TEI's, OpenAI's and Cohere's routes). "
        "Settings, all from the environment (docs/settings.md): SM_MODEL_DIR (the folder; else "
        "$SAGEMAKER_BASE_DIR/model, else /opt/ml/model), SAGEMAKER_BIND_TO_PORT (8080), "
        "SAGEMAKER_MODEL_SERVER_WORKERS (1), BYOC_INFERENCE_BACKEND (auto, onnxruntime, torch), "
        "BYOC_INFERENCE_PRECISION, BYOC_PROFILE (realtime, async), BYOC_MAX_ANSWER_VALUES, "
        f"BYOC_TASK (one of {', '.join(tasks.NAMES)})",
    )
    sub.add_parser(
        "encode",
        help="encode the corpus channel into Parquet shards with the model channel's folder (/opt/ml, as train)",
        description="encode a corpus with a model folder byoc serves (embedding, sparse, multi-vector, hybrid): the "
        "job /opt/ml (or $SAGEMAKER_BASE_DIR) describes, its channels corpus (JSON Lines, CSV, Parquet; BEIR's "
        "corpus.jsonl) and model, its hyperparameters (docs/encoding.md) and hosts. Writes one Parquet file a shard "
        "and manifest.json to model/ (or output_dir), keeps finished shards in the checkpoint folder (a restart "
        "skips them), and output/failure when it fails. As a processing job: its inputs corpus and model, its "
        "output; settings as arguments over the hyperparameters (--name value, docs/encoding.md)",
    )
    sub.add_parser("worker", help="(internal) one rank of a launched training job")
    sub.add_parser("healthcheck", help="exit 0 if this container is healthy (the image's HEALTHCHECK)")
    what = (
        "write MODEL_DIR/model.onnx, the serving graph ONNX Runtime runs without torch, for a model folder byoc "
        f"serves ({', '.join(tasks.NAMES)}; a sentence-transformers folder's pooling and Dense layers inside the "
        "graph); for models from the Hub, trained before byoc wrote the graph, or whose weights were saved again"
    )
    export = sub.add_parser(
        "export-onnx",
        help="write MODEL_DIR/model.onnx, the serving graph, for a model folder byoc serves",
        description=what,
    )
    export.add_argument(
        "model_dir", help="the model folder: config.json and model.safetensors (save_pretrained's), and its tokenizer"
    )
    export.add_argument(
        "--int8",
        action="store_true",
        help="also write model.int8.onnx, so that serving with BYOC_INFERENCE_PRECISION=int8 starts without quantizing",
    )
    export.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code a model folder ships (config.json's auto_map) to trace it; the graph serves without it",
    )
    options, extra = parser.parse_known_args(argv)  # (byoc encode's settings: --name value, any name it takes)
    if extra and options.command != "encode":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if options.command == "healthcheck":
        from byoc.serving.server import healthcheck

        sys.exit(healthcheck())
    configure_logging()
    if options.command in ("train", "worker"):
        from byoc.training.entry import run_job, train

        sys.exit(train() if options.command == "train" else run_job())
    if options.command == "encode":
        from byoc import encoding

        problem = encoding.unavailable()
        if problem:
            from byoc.contract import Paths, write_failure

            logging.getLogger("byoc.encoding").error("encode failed: %s", problem)
            write_failure(Paths.from_env(), problem)
            sys.exit(1)
        from byoc.encoding.entry import encode

        sys.exit(encode(arguments=extra))
    if options.command == "export-onnx":
        from byoc import onnx_graph

        graph = onnx_graph.export(options.model_dir, options.trust_remote_code)
        ok = graph and (not options.int8 or onnx_graph.export_int8(options.model_dir))
        sys.exit(0 if ok else 1)
    from byoc.serving.server import main as serve

    serve()


if __name__ == "__main__":
    main()
