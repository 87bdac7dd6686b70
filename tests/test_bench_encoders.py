"""The retrieval families' serving benchmark (benchmarks/bench_encoders.py): scenarios declared once, the dense
baseline always run, each family's ratios over dense and over its reference library."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_encoders  # noqa: E402


def test_each_family_is_run_beside_the_dense_baseline():
    names = lambda families, queries=False: [s.name for s in bench_encoders.chosen(families, queries)]
    assert names(["sparse"]) == ["dense", "sparse"]
    assert names(["multi-vector"]) == ["dense", "multi-vector documents"]
    assert names(["multi-vector"], queries=True) == ["dense", "multi-vector documents", "multi-vector queries"]
    assert names(["hybrid", "sparse"]) == ["dense", "sparse", "hybrid"]
    assert {s.family for s in bench_encoders.SCENARIOS} == set(bench_encoders.FAMILIES)
    with pytest.raises(SystemExit, match="--families: splade unknown; use sparse, multi-vector, hybrid"):
        bench_encoders.chosen(["splade"], False)


def test_ratios_are_over_dense_and_over_the_familys_reference():
    scenarios = bench_encoders.chosen(["multi-vector", "hybrid"], True)
    results = {
        "dense": {"byoc": 400.0, "sentence_transformers": 300.0},
        "multi-vector documents": {"byoc": 360.0, "sentence_transformers": 300.0},
        "multi-vector queries": {"byoc": 100.0, "sentence_transformers": 200.0},
        "hybrid": {"byoc": 300.0, "byoc_dense_only": 350.0, "flagembedding": 100.0},
    }
    assert bench_encoders.summary(results, scenarios) == {
        "multi_vector_over_dense": 0.9,  # (documents: the family's first scenario)
        "multi_vector_over_sentence_transformers": 1.2,
        "hybrid_over_dense": 0.75,
        "hybrid_over_flagembedding": 3.0,
    }
