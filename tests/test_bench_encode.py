"""The corpus-encoding benchmark's ceiling (benchmarks/bench_encode.py): the encoder's matrix products alone, on
the corpus's own tokens, as the model's layers do them, through torch and ONNX Runtime; each rate read as its
share of the faster engine's."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_encode  # noqa: E402


class Reference:
    """A SentenceTransformer's parts the ceiling reads: its encoder's config, tokenizer and length limit."""

    max_seq_length = 5

    def __init__(self) -> None:
        config = SimpleNamespace(hidden_size=8, intermediate_size=32, num_hidden_layers=3)
        self.modules = [SimpleNamespace(auto_model=SimpleNamespace(config=config))]

    def __getitem__(self, index: int) -> SimpleNamespace:
        return self.modules[index]

    def tokenizer(self, texts: list[str], truncation: bool, max_length: int) -> dict[str, list[list[int]]]:
        assert truncation
        return {"input_ids": [list(range(min(len(text.split()), max_length))) for text in texts]}


def test_the_ceiling_does_every_layers_products_on_the_corpus_tokens_and_no_padding(monkeypatch):
    products = []
    linear = torch.nn.functional.linear

    def counted(states, weight):
        products.append((states.shape[0], tuple(weight.shape), states.dtype))
        return linear(states, weight)

    monkeypatch.setattr(torch.nn.functional, "linear", counted)
    monkeypatch.setattr(bench_encode, "BATCH", 2)
    texts = ["a b", "a b c d e f g", "a", "a b c"]  # 2 + 5 (cut at max_seq_length) + 1 + 3 tokens
    rate = bench_encode.matmul_ceiling(Reference(), texts, torch.bfloat16)
    assert rate > 0
    timed = products[1:]  # (the first: the warm-up product)
    layer = [(24, 8), (8, 8), (32, 8), (8, 32)]  # query-key-value, output, up, down
    # Each batch's tokens, unpadded (7 rows, then 4), through each of the 3 layers' four products:
    assert timed == [(rows, weight, torch.bfloat16) for rows in (7, 4) for _ in range(3) for weight in layer]


def test_onnx_runtime_does_the_same_products_in_fp32(monkeypatch):
    monkeypatch.setattr(bench_encode, "BATCH", 2)
    assert bench_encode.onnxruntime_ceiling(Reference(), ["a b", "a b c d e f g", "a", "a b c"], threads=1) > 0


def test_the_fp32_ceiling_is_the_faster_engines_and_each_rate_is_read_as_its_share_of_its_precisions():
    results = {
        "matmul_ceiling": {"torch_fp32": 700.0, "onnxruntime_fp32": 800.0, "torch_bf16": 1600.0},
        "st_encode": {"documents_per_s": 400.0},
        "byoc_encode": {"documents_per_s": 600.0},
        "byoc_encode_bf16": {"documents_per_s": 800.0},
    }
    assert bench_encode.of_ceiling(results) == pytest.approx(
        {
            "fp32_ceiling": 800.0,
            "bf16_ceiling": 1600.0,
            "st_encode_of_fp32_ceiling": 0.5,
            "byoc_encode_of_fp32_ceiling": 0.75,
            "byoc_encode_bf16_of_bf16_ceiling": 0.5,
            "fp32_target_of_ceiling": 0.75,
        }
    )
