"""A number per text (or sentence pair): one output, mean squared error, Pearson and Spearman."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc.tasks.base import Task, activated, check_pairs, kept_rows, trained_on_pairs
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.kinds import Kind
from byoc.tasks.recipe import Recipe
from byoc.tasks.rows import Rows

NAME = "regression"


class RegressionHead(Head):
    """The serving head of a regression model."""

    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.NUMBER: {}}

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """Whether the model says it is a regression (byoc's pair regression does): a cross-encoder's one
        logit (no problem_type) is a relevance score, which a sigmoid makes a probability, as TEI serves it."""
        return {"stated_regression": config.get("problem_type") == NAME, "pairs": trained_on_pairs(config)}

    def check_rerank(self, model: Mapping) -> None:
        check_pairs(self.task, model)

    def relevance(self, row: np.ndarray, raw: bool, model: Mapping) -> float:
        """The logit through the cross-encoder's activation (its folder's, as CrossEncoder.predict applies
        it; a sigmoid where the folder names none), or as it is (`raw`; a stated regression's value)."""
        value = float(row.reshape(-1)[0])
        if raw or model.get("stated_regression"):
            return value
        return float(activated(np.asarray(value), model.get("activation") or "Sigmoid"))

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """{"score": value}, and the output's name where the model gives it one."""
        name = id2label.get(0)
        named = {"label": name} if name and name != "LABEL_0" else {}
        return [{**named, "score": float(row.reshape(-1)[0])} for row in scores]


class RegressionRows(Rows):
    """The training rows of a regression model."""

    def label_summary(self, labels: np.ndarray) -> str:
        return f"regression targets {labels.min():g}..{labels.max():g} (mean {labels.mean():.4g})"


class RegressionRecipe(Recipe):
    """The training recipe of a regression model."""

    masks_rows = True

    def head_summary(self, num_labels: int) -> str:
        return "one output (regression)"

    def row_loss(self, logits: Any, labels: Any) -> Any:
        rows = labels.shape[0]
        return (logits.float().reshape(rows) - labels.float().reshape(rows)) ** 2


class RegressionEvaluation(Evaluation):
    """The evaluation of a regression model."""

    metrics: tuple[str, ...] = ("pearson", "spearmanr", "mse", "mae")

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        return regression_metrics(*kept_rows(logits, labels)), {}

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        return {"label": round(float(label.reshape(-1)[0]), 6), "predicted": round(float(row.reshape(-1)[0]), 6)}


class Regression(Task):
    name = NAME
    aliases: tuple[str, ...] = ("regress",)
    described = "a regression model"
    head_class = RegressionHead
    rows_class = RegressionRows
    recipe_class = RegressionRecipe
    evaluation_class = RegressionEvaluation

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float64)


def regression_metrics(predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation, mean squared and mean absolute error."""
    import pandas as pd  # (training's: the slim serving image has no pandas)

    pred = np.asarray(predictions, dtype=np.float64).reshape(-1)
    true = np.asarray(targets, dtype=np.float64).reshape(-1)
    return {
        "pearson": _correlation(pred, true),
        # Spearman: Pearson of the ranks, ties sharing their average rank (pandas ranks as scipy does).
        "spearmanr": _correlation(pd.Series(pred).rank().to_numpy(), pd.Series(true).rank().to_numpy()),
        "mse": float(np.mean((pred - true) ** 2)) if len(pred) else 0.0,
        "mae": float(np.mean(np.abs(pred - true))) if len(pred) else 0.0,
    }


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r; 0 where either side is constant (r is undefined there)."""
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])
