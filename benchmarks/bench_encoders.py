"""Serving the retrieval families against a dense model on the same encoder (make bench-sparse, bench-multi-vector,
bench-hybrid): the model alone (byoc's default predict_fn in this process, 32 sentences a call, no HTTP), fp32
on ONNX Runtime, against each family's reference library encoding in the same process at batch 32.

  dense         the bundled all-MiniLM-L6-v2 (mean pooling), its graph written by `byoc export-onnx`; against
                sentence-transformers' `encode`
  sparse        the same encoder under a masked-language-model head (BertForMaskedLM: the output projection is
                the word embeddings, tied; the head's transform drawn at random: speed only) and SPLADE's max
                pooling of log(1 + ReLU), saved by sentence-transformers as a SparseEncoder, its graph by byoc.
                The head's bias is lowered until a text has about ACTIVE terms, as a trained SPLADE model's
                have (a random head leaves most of the 30,522 active). Against `SparseEncoder.encode`
  multi-vector  the same encoder as sentence-transformers 6.2 builds a ColBERT from a plain encoder: a
                128-wide projection (random: speed only), punctuation skipped in documents, queries expanded
                to 32 tokens, "[unused0] " / "[unused1] " prompts made single tokens (as ColBERT checkpoints
                register their prefix tokens). Documents timed (each text's token vectors in the answer), and
                queries with `--queries`. Against `MultiVectorEncoder.encode_document` / `encode_query`
  hybrid        the same encoder in bge-m3's format: FlagEmbedding's two heads beside it (a 384-wide ColBERT
                projection and a term-weight layer, random: speed only; the term layer's bias raised so that
                most tokens weigh something, as a trained model's do). Timed asking for the three outputs, and
                for the dense vectors alone. Against `BGEM3FlagModel.encode` with every return_* set

Each scenario is declared once (`SCENARIOS`) and run for `--seconds` on SICK's sentences, the scenarios
alternated over `--rounds` rounds (benchmarks/harness.py), the medians reported; the ratios are the figures
to read (these machines are noisy).

    .venv/bin/python benchmarks/bench_encoders.py --families sparse[,multi-vector,hybrid] [--queries]
        [--seconds 8] [--rounds 1] [--json benchmarks/results/sparse.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (benchmarks/: every results file with its provenance)
from child_process import exit_on_sigterm  # noqa: E402
from fixtures import ceiling, load, rate, sick_pairs  # noqa: E402  (the dense benchmark's loading and data)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "container"))
WORK = Path("/tmp/byoc-bench-encoders")
BATCH = 32
ACTIVE = 150  # terms a text: a trained SPLADE document's order of magnitude
HYBRID_OUTPUTS = ["dense", "sparse", "colbert"]
Encode = Callable[[list[str]], object]


# --- the folders: each family's model on the bundled encoder, with its graph ---------------------------------


def build_dense(target: Path) -> None:
    from byoc.training.model import bundled_model_dir

    shutil.copytree(bundled_model_dir(), target)


def build_sparse(target: Path) -> None:
    import torch
    from transformers import BertForMaskedLM

    from byoc import compat
    from byoc.training.model import bundled_model_dir

    mlm = target.parent / "mlm"
    torch.manual_seed(0)
    head = BertForMaskedLM.from_pretrained(str(bundled_model_dir()))
    sparsify(head, bundled_model_dir())
    head.save_pretrained(mlm)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (bundled_model_dir() / name).exists():
            shutil.copy(bundled_model_dir() / name, mlm / name)
    SparseEncoder, MLMTransformer, SpladePooling, _ = compat.sparse_encoder_api()
    modules = [MLMTransformer(str(mlm), max_seq_length=256), SpladePooling("max")]
    SparseEncoder(modules=modules, device="cpu").save(str(target))


def sparsify(head: Any, tokenizer_dir: Path) -> None:
    """Lower the head's output bias until SICK's texts have about ACTIVE terms each after SPLADE's pooling."""
    import torch
    from transformers import AutoTokenizer

    texts = list(dict.fromkeys(sick_pairs()[0]))[:256]
    encoded = AutoTokenizer.from_pretrained(str(tokenizer_dir))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = head(**encoded).logits.masked_fill(~encoded["attention_mask"].bool()[..., None], -1e4)
        pooled = logits.max(dim=1).values  # a text's highest logit for each term
        cut = pooled.topk(ACTIVE, dim=1).values[:, -1].mean()
        head.cls.predictions.bias -= cut


def build_multi_vector(target: Path) -> None:
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from tokenizers import AddedToken

    from byoc.training.model import bundled_model_dir

    torch.manual_seed(0)
    encoder = Transformer(str(bundled_model_dir()), query_expansion={"strategy": "fixed", "length": 32})
    prefixes = [AddedToken(token, normalized=False, special=True) for token in ("[unused0]", "[unused1]")]
    encoder.tokenizer.add_special_tokens({"additional_special_tokens": prefixes})  # in the vocabulary already
    projection = Dense(
        384, 128, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"
    )
    MultiVectorEncoder(
        modules=[encoder, projection, MultiVectorMask(list(string.punctuation)), Normalize("token_embeddings")],
        prompts={"query": "[unused0] ", "document": "[unused1] "},
        device="cpu",
    ).save(str(target))


def build_hybrid(target: Path) -> None:
    import torch

    from byoc.tasks.hybrid import COLBERT, SPARSE

    build_dense(target)
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(384, 384).state_dict(), target / COLBERT)
    sparse = torch.nn.Linear(384, 1)
    sparse.bias.data += 0.3
    torch.save(sparse.state_dict(), target / SPARSE)


# --- the references: each library's own encoding, 32 a call, answers as numpy --------------------------------


def sentence_transformers_encode(folder: Path) -> Encode:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return lambda batch: model.encode(batch, batch_size=BATCH, convert_to_numpy=True)


def sparse_encoder_encode(folder: Path) -> Encode:
    from byoc import compat

    model = compat.sparse_encoder_api()[0](str(folder), device="cpu")
    return lambda batch: model.encode(batch, batch_size=BATCH)


def multi_vector_encode(side: str) -> Callable[[Path], Encode]:
    def made(folder: Path) -> Encode:
        from sentence_transformers import MultiVectorEncoder

        model = MultiVectorEncoder(str(folder), device="cpu")
        encode = model.encode_query if side == "query" else model.encode_document
        return lambda batch: encode(batch, batch_size=BATCH, convert_to_numpy=True)

    return made


def bgem3_encode(folder: Path) -> Encode:
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu")
    outputs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    # batch_size one over the call's texts: still one pass of 32, and no progress bars (shown from a batch up)
    return lambda batch: model.encode(batch, batch_size=BATCH + 1, **outputs)


# --- the scenarios ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One timed pair: byoc's predict_fn with `parameters` on the family's folder, and `reference`'s encoding."""

    name: str
    family: str
    reference: str
    encode: Callable[[Path], Encode]
    parameters: dict[str, Any] = field(default_factory=dict)
    also: dict[str, dict[str, Any]] = field(default_factory=dict)  # more byoc figures: name -> parameters


FAMILIES: dict[str, Callable[[Path], None]] = {
    "dense": build_dense,
    "sparse": build_sparse,
    "multi-vector": build_multi_vector,
    "hybrid": build_hybrid,
}
SCENARIOS = [
    Scenario("dense", "dense", "sentence_transformers", sentence_transformers_encode),
    Scenario("sparse", "sparse", "sentence_transformers", sparse_encoder_encode),
    Scenario(
        "multi-vector documents",
        "multi-vector",
        "sentence_transformers",
        multi_vector_encode("document"),
        {"prompt_name": "document"},
    ),
    Scenario(
        "multi-vector queries",
        "multi-vector",
        "sentence_transformers",
        multi_vector_encode("query"),
        {"prompt_name": "query"},
    ),
    Scenario(
        "hybrid",
        "hybrid",
        "flagembedding",
        bgem3_encode,
        {"output": HYBRID_OUTPUTS},
        also={"byoc_dense_only": {}},
    ),
]


def chosen(families: list[str], queries: bool) -> list[Scenario]:
    """The dense baseline, then each asked family's scenarios (multi-vector queries only with `queries`)."""
    unknown = sorted(set(families) - set(FAMILIES) - {"dense"})
    if unknown:
        raise SystemExit(
            f"--families: {', '.join(unknown)} unknown; use {', '.join(f for f in FAMILIES if f != 'dense')}"
        )
    return [
        s
        for s in SCENARIOS
        if (s.family == "dense" or s.family in families) and (queries or s.name != "multi-vector queries")
    ]


def timed(scenario: Scenario, folder: Path, texts: list[str], seconds: float) -> Callable[[], dict[str, float]]:
    """The scenario as one round's run: byoc's rate (after a second's warm-up), its other figures, the reference's."""

    def run() -> dict[str, float]:
        model = load(folder, "fp32")
        ceiling(model, texts, 1.0, scenario.parameters)  # warm-up
        figures = {"byoc": round(ceiling(model, texts, seconds, scenario.parameters), 1)}
        figures.update({name: round(ceiling(model, texts, seconds, p), 1) for name, p in scenario.also.items()})
        encode = scenario.encode(folder)
        encode(texts[:BATCH])  # warm-up
        figures[scenario.reference] = round(rate(encode, texts, seconds, BATCH), 1)
        print(f"{scenario.name:24s} {figures}", flush=True)
        return figures

    return run


def summary(results: dict[str, Any], scenarios: list[Scenario]) -> dict[str, float]:
    """Each family's first scenario over dense (byoc's) and over its reference library."""
    dense = results["dense"]["byoc"]
    out = {}
    for scenario in scenarios:
        key = scenario.family.replace("-", "_")
        if scenario.family == "dense" or f"{key}_over_dense" in out:
            continue
        figures = results[scenario.name]
        out[f"{key}_over_dense"] = round(figures["byoc"] / dense, 3)
        out[f"{key}_over_{scenario.reference}"] = round(figures["byoc"] / figures[scenario.reference], 3)
    return out


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--families", default="sparse,multi-vector,hybrid", help="comma-separated: " + ", ".join(FAMILIES)
    )
    parser.add_argument("--queries", action="store_true", help="time the multi-vector model's queries too")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "encoders.json")
    options = parser.parse_args()
    scenarios = chosen([f.strip() for f in options.families.split(",") if f.strip()], options.queries)
    first, second, _ = sick_pairs()
    texts = list(dict.fromkeys(first + second))
    from byoc import onnx_graph

    shutil.rmtree(WORK, ignore_errors=True)
    folders = {}
    for family in dict.fromkeys(s.family for s in scenarios):
        folders[family] = WORK / family
        FAMILIES[family](folders[family])
        assert onnx_graph.export(folders[family]), family
    runs = harness.alternate(
        {s.name: timed(s, folders[s.family], texts, options.seconds) for s in scenarios}, options.rounds
    )
    results: dict[str, Any] = {"threads": os.cpu_count(), "batch": BATCH, "rounds": options.rounds}
    if any(s.family == "sparse" for s in scenarios):
        results["active_terms_target"] = ACTIVE
    results.update(harness.medians(runs))
    results.update(summary(results, scenarios))
    print({k: v for k, v in results.items() if "_over_" in k}, flush=True)
    harness.write_results(options.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
