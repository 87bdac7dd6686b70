"""A sparse model's folder as sentence-transformers writes it, read as JSON and bytes (the serving image has no
torch): the SpladePooling settings, and for an inference-free model its query side.

An inference-free model (sentence-transformers 6's `Router`, the folder's one module: router_config.json names
each route's module folders) encodes documents with an MLM transformer and SpladePooling (in
`document_0_MLMTransformer/` and `document_1_SpladePooling/`: byoc.model_folder.weights_dir finds the
transformer) and queries with no model at all: a `SparseStaticEmbedding`, a weight per vocabulary term
(`query_0_SparseStaticEmbedding/model.safetensors`), each of the query's tokens weighing its term's weight.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder, sentence_folder

POOLINGS = ("max", "sum")  # SpladePooling's pooling_strategy
ACTIVATIONS = ("relu", "log1p_relu")  # its activation_function: log(1 + ReLU), or that logged again
TRANSFORMERS = ("MLMTransformer", "Transformer")  # a document route's first module (Transformer: fill-mask)
QUERY, DOCUMENT = "query", model_folder.DOCUMENT_ROUTE
_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}  # safetensors' names


def modules(model_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Each route's modules as (folder, class name): {"": [...]} for a plain folder (modules.json), the query
    and document routes for a Router folder (router_config.json)."""
    model_dir = Path(model_dir)
    routes = model_folder.router_routes(model_dir)
    if routes:
        types = sentence_folder.read_json(model_dir / model_folder.ROUTER_CONFIG).get("types") or {}
        return {route: [(name, _class(types.get(name))) for name in names] for route, names in routes.items()}
    listed = sentence_folder.read_json(model_dir / sentence_folder.MODULES)
    listed = listed if isinstance(listed, list) else []
    return {"": [(str(m.get("path", "")), _class(m.get("type"))) for m in listed]}


def splade_settings(model_dir: Path) -> dict[str, str]:
    """The folder's SpladePooling settings ({"pooling", "activation"}), read from its module's config.json (the
    document route's, in a Router folder), after checking the modules are ones byoc serves."""
    model_dir = Path(model_dir)
    found = modules(model_dir)
    if set(found) != {""}:
        _check_router(model_dir, found)
    chain = found.get("", found.get(DOCUMENT, []))
    pooling = [name for name, kind in chain if kind == "SpladePooling"]
    if len(pooling) != 1:
        raise sentence_folder.FolderError(
            f"{model_dir / sentence_folder.MODULES}: a SparseEncoder folder byoc serves has one SpladePooling module "
            f"after an MLMTransformer (found {len(pooling)})"
        )
    path = model_dir / pooling[0] / "config.json"
    config = sentence_folder.read_json(path) if path.is_file() else {}
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if strategy not in POOLINGS or activation not in ACTIVATIONS:
        raise sentence_folder.FolderError(
            f"{path}: pooling_strategy {strategy!r} and activation_function {activation!r}: byoc serves "
            f"{' or '.join(POOLINGS)} pooling of {' or '.join(ACTIVATIONS)}"
        )
    return {"pooling": str(strategy), "activation": str(activation)}


def query_table(model_dir: Path) -> dict[str, Any] | None:
    """An inference-free model's query side: {"weights": a weight per vocabulary term, "tokenizer": its
    tokenizer.json's path, "max_length": the tokens a query keeps}; None for a folder without one."""
    model_dir = Path(model_dir)
    route = modules(model_dir).get(QUERY)
    if not route:
        return None
    folder = model_dir / route[0][0]
    weights = read_vector(folder / model_folder.WEIGHTS, "weight")
    config_path = folder / model_folder.TOKENIZER_CONFIG
    config = sentence_folder.read_json(config_path) if config_path.is_file() else {}
    tokenizer = folder / model_folder.TOKENIZER
    if not tokenizer.is_file():
        raise sentence_folder.FolderError(f"{tokenizer} is missing: the query side is served with its tokenizer")
    return {
        "weights": weights,
        "tokenizer": str(tokenizer),
        "max_length": model_folder.max_length(config.get("model_max_length"), len(weights)),
    }


def read_vector(path: Path, name: str) -> np.ndarray:
    """One 1-D tensor of a safetensors file, as float32, read without torch or safetensors (a JSON header, then
    the raw little-endian data)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
            entry = header[name]
            begin, end = entry["data_offsets"]
            f.seek(8 + size + begin)
            raw = f.read(end - begin)
        dtype = _DTYPES[entry["dtype"]]
    except FileNotFoundError:
        raise sentence_folder.FolderError(f"{path} is missing: the query side's term weights") from None
    except (KeyError, ValueError, struct.error) as err:
        raise sentence_folder.FolderError(f"{path}: no readable 1-D {name!r} tensor of F32/F16 ({err})") from None
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(np.float32)


def _check_router(model_dir: Path, found: dict[str, list[tuple[str, str]]]) -> None:
    """The Router folders byoc serves: queries through one SparseStaticEmbedding, documents through a transformer
    and SpladePooling (sentence-transformers' inference-free SPLADE)."""
    query, document = [kind for _, kind in found.get(QUERY, [])], [kind for _, kind in found.get(DOCUMENT, [])]
    if query != ["SparseStaticEmbedding"] or len(document) != 2 or document[0] not in TRANSFORMERS:
        raise sentence_folder.FolderError(
            f"{model_dir / model_folder.ROUTER_CONFIG}: routes {found}; byoc serves an inference-free sparse model: "
            "queries through a SparseStaticEmbedding, documents through an MLMTransformer and SpladePooling"
        )
    if model_folder.weights_dir(model_dir) == model_dir:
        raise sentence_folder.FolderError(
            f"{model_dir / found[DOCUMENT][0][0]} holds no config.json: the document route's transformer is missing"
        )


def _class(path: Any) -> str:
    return str(path or "").rsplit(".", 1)[-1]
