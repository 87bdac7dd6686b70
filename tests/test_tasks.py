"""byoc.tasks: the registry, its names and what each task must provide; serving asks the task, so a task
registered here is served without an edit elsewhere."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from byoc import tasks
from byoc.serving.model import default_handlers, task_parameters
from byoc.training import metrics


@pytest.mark.parametrize(
    ("written", "name"),
    [
        ("auto", None),
        ("NER", tasks.TOKEN_CLASSIFICATION),
        ("multi-label", tasks.MULTI_LABEL),
        (" Regress ", tasks.REGRESSION),
        ("classification", tasks.SINGLE_LABEL),
        ("single_label_classification", tasks.SINGLE_LABEL),
        ("embedding", tasks.EMBEDDING),
        ("feature-extraction", tasks.EMBEDDING),
        ("reranking", None),
    ],
)
def test_names_and_aliases(written, name):
    assert tasks.name_of(written) == name


def test_every_alias_is_one_tasks_and_no_name_is_another_alias():
    aliases = [alias for task in tasks.TASKS.values() for alias in task.aliases]
    assert len(aliases) == len(set(aliases)) and not set(aliases) & set(tasks.NAMES)
    assert all(tasks.name_of(alias) == task.name for task in tasks.TASKS.values() for alias in task.aliases)


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"architectures": ["BertForTokenClassification"], "num_labels": 5}, tasks.TOKEN_CLASSIFICATION),
        ({"problem_type": "multi_label_classification", "num_labels": 3}, tasks.MULTI_LABEL),
        ({"num_labels": 1}, tasks.REGRESSION),  # transformers leaves problem_type unset until a forward pass
        ({"id2label": {"0": "a", "1": "b"}}, tasks.SINGLE_LABEL),
        ({"problem_type": "something_else", "num_labels": 1}, tasks.REGRESSION),
    ],
)
def test_the_task_of_a_saved_config(config, name):
    assert tasks.of_config(config).name == name


def test_each_task_says_what_it_is_and_what_it_reports():
    for task in tasks.TASKS.values():
        assert task.name and task.described and task.metrics, task.name
        assert set(task.parameters) <= set(task_parameters.KNOWN), task.name
    # The metrics every evaluation may report, in the order METRIC_DEFINITIONS lists them: under
    # SageMaker's 40 definitions per job with the training ones.
    assert metrics.EVALUATED == (
        "loss",
        *("accuracy", "f1", "f1_weighted", "precision", "recall"),
        *("f1_micro", "f1_macro", "f1_samples", "exact_match", "jaccard"),
        *("pearson", "spearmanr", "mse", "mae"),
        *("spearman_cosine", "pearson_cosine", "mrr_at_10", "ndcg_at_10", "recall_at_1", "recall_at_10"),
    )
    assert len(metrics.METRIC_DEFINITIONS) <= 40
    for name in tasks.NAMES:  # each task's own list: what a job of it reports, under the limit too
        own = metrics.metric_definitions(name)
        assert len(own) <= 40
        reported = {d["Name"].split(":", 1)[1] for d in own if d["Name"].startswith("eval:")}
        assert set(tasks.get(name).metrics) <= reported, name
    assert "eval:mrr_at_10" not in {d["Name"] for d in metrics.METRIC_DEFINITIONS}


def test_serving_imports_the_tasks_without_torch_transformers_or_pandas():
    code = (
        "import sys, byoc.tasks, byoc.serving.model.default_handlers; "
        "print(sorted({'torch', 'transformers', 'pandas'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


class Sentiment(tasks.Task):
    """A task no room knows: a score from -1 to 1 out of two logits."""

    name = "sentiment_polarity"
    described = "a polarity model"
    metrics = ("polarity_error",)

    def answer(self, scores, id2label, parameters, model):
        return [{"polarity": round(float(row[1] - row[0]), 4)} for row in scores]


def test_a_task_registered_in_the_package_is_served_with_no_edit_elsewhere(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, Sentiment.name, Sentiment())
    logits = np.array([[2.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    model = {
        "task": Sentiment.name,
        "encode": lambda inputs: [{"input_ids": [101, 7, 102], "attention_mask": [1, 1, 1]} for _ in inputs],
        "logits": lambda batch: logits[: len(batch["input_ids"])],
        "pad_id": 0,
        "id2label": {0: "neg", 1: "pos"},
    }
    answer = default_handlers.predict_fn({"inputs": ["bad", "good"]}, model)
    assert answer == [{"polarity": -0.7616}, {"polarity": 0.7616}]  # softmax: tanh(1) either way
    with pytest.raises(task_parameters.InputError, match="does not apply to a polarity model: it takes no parameters"):
        default_handlers.predict_fn({"inputs": ["bad"], "parameters": {"top_k": 2}}, model)
