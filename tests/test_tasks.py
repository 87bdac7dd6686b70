"""byoc.tasks: the registry, its names and what each task must provide; serving asks the task, so a task
registered here is served without an edit elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from byoc import sentence_folder, tasks
from byoc.serving import default_pipeline
from byoc.serving.protocol import task_parameters
from byoc.tasks.base import activated
from byoc.tasks.head import Head
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
        ("reranking", tasks.RERANKER),
        ("cross-encoder", tasks.RERANKER),
        ("ranking", None),
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
        assert task.name and task.described and (task.evaluation.metrics or not task.trains), task.name
        assert set(task.head.parameters) <= set(task_parameters.KNOWN), task.name
    # The metrics every evaluation may report, in the order METRIC_DEFINITIONS lists them: under
    # SageMaker's 40 definitions per job with the training ones.
    assert metrics.EVALUATED == (
        "loss",
        *("accuracy", "f1", "f1_weighted", "precision", "recall"),
        *("f1_micro", "f1_macro", "f1_samples", "exact_match", "jaccard"),
        *("pearson", "spearmanr", "mse", "mae"),
        *("spearman_cosine", "pearson_cosine", "mrr_at_10", "ndcg_at_10", "recall_at_1", "recall_at_10"),
        "active_dims",
        "average_precision",
    )
    assert len(metrics.METRIC_DEFINITIONS) <= 40
    for name in tasks.NAMES:  # each task's own list: what a job of it reports, under the limit too
        own = metrics.metric_definitions(name)
        assert len(own) <= 40
        reported = {d["Name"].split(":", 1)[1] for d in own if d["Name"].startswith("eval:")}
        assert set(tasks.get(name).evaluation.metrics) <= reported, name
    assert "eval:mrr_at_10" not in {d["Name"] for d in metrics.METRIC_DEFINITIONS}


def test_serving_imports_the_tasks_without_torch_transformers_or_pandas():
    code = (
        "import sys, byoc.tasks, byoc.serving.default_pipeline; "
        "print(sorted({'torch', 'transformers', 'pandas'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


class SentimentHead(Head):
    def answer(self, scores, id2label, parameters, model):
        return [{"polarity": round(float(row[1] - row[0]), 4)} for row in scores]


class Sentiment(tasks.Task):
    """A task no room knows: a score from -1 to 1 out of two logits."""

    name = "sentiment_polarity"
    described = "a polarity model"
    head_class = SentimentHead


def test_a_part_s_member_on_the_task_itself_is_refused_naming_its_part():
    """A task written as one class (byoc before the parts) would define its answer where no room asks: refused when
    the class is made, saying where it goes."""
    with pytest.raises(TypeError, match=r"OldStyle defines answer.*the head's \(byoc.tasks.head.Head\).*head_class"):

        class OldStyle(tasks.Task):
            def answer(self, scores, id2label, parameters, model):
                return []


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
    answer = default_pipeline.predict_fn({"inputs": ["bad", "good"]}, model)
    assert answer == [{"polarity": -0.7616}, {"polarity": 0.7616}]  # softmax: tanh(1) either way
    with pytest.raises(task_parameters.InputError, match="does not apply to a polarity model: it takes no parameters"):
        default_pipeline.predict_fn({"inputs": ["bad"], "parameters": {"top_k": 2}}, model)


def test_a_tasks_own_values_are_checked_for_that_tasks_models_only():
    """The same parameter takes other values in other tasks: an embedding model's "prompt_name" is any of its
    prompts (e5's "passage"), a multi-vector model's "query" or "document". Before, every task's check ran on
    every request, so an embedding model's "passage" prompt was refused by the multi-vector check."""
    parameters = {"prompt_name": "passage"}
    task_parameters.check_values(parameters)  # (the body read: no task yet)
    task_parameters.check_task(tasks.get(tasks.EMBEDDING), parameters)
    with pytest.raises(task_parameters.InputError, match='"prompt_name" is the side a text is encoded as'):
        task_parameters.check_task(tasks.get(tasks.MULTI_VECTOR), parameters)
    with pytest.raises(task_parameters.InputError, match='"return_tokens" must be true or false'):
        task_parameters.check_task(tasks.get(tasks.SPARSE_EMBEDDING), {"return_tokens": "yes"})


def test_a_rerank_bodys_parameters_reach_the_tasks_that_take_them_and_are_refused_elsewhere():
    """A hybrid model weighs a pair's scores (`weights`) in a rerank body too; a reranker takes no such
    parameter: a 400 naming it, where before a rerank body's "parameters" were dropped unread."""
    from byoc.serving.protocol import bodies

    parsed = bodies.parse(
        json.dumps({"query": "q", "texts": ["a"], "top_n": 1, "parameters": {"weights": [1, 0, 0]}}),
        "application/json",
        False,
    )
    assert parsed.shape == bodies.RERANK and parsed.parameters == {"weights": [1, 0, 0], "top_n": 1}
    task_parameters.check_task(tasks.get(tasks.HYBRID), parsed.parameters, parsed.shape)
    with pytest.raises(task_parameters.InputError, match='"weights" does not apply to a rerank request'):
        task_parameters.check_task(tasks.get(tasks.RERANKER), parsed.parameters, parsed.shape)


def sentence_folder_of(tmp_path, settings: dict | None) -> Path:
    """A sentence-transformers folder's two files as sentence-transformers 6 writes them: modules.json (a
    CrossEncoder's too) and, where `settings` is given, config_sentence_transformers.json."""
    module = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}
    (tmp_path / "modules.json").write_text(json.dumps([module]))
    if settings is not None:
        (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {}, **settings}))
    return tmp_path


@pytest.mark.parametrize(
    ("settings", "config", "name"),
    [
        ({"model_type": "SentenceTransformer"}, {}, tasks.EMBEDDING),
        ({}, {}, tasks.EMBEDDING),  # older folders say nothing: an embedding model, as sentence-transformers reads them
        (None, {}, tasks.EMBEDDING),
        ({"model_type": "CrossEncoder"}, {"num_labels": 1}, tasks.REGRESSION),  # a reranker's one logit
        ({"model_type": "CrossEncoder"}, {"id2label": {"0": "no", "1": "yes"}}, tasks.SINGLE_LABEL),
    ],
)
def test_a_sentence_transformers_folder_is_an_embedding_model_unless_it_is_a_cross_encoder(
    tmp_path, settings, config, name
):
    folder = sentence_folder_of(tmp_path, settings)
    assert tasks.of_folder(folder, config).name == name
    assert tasks.of_folder(folder, config, tasks.EMBEDDING).name == tasks.EMBEDDING  # BYOC_TASK still decides


def test_a_sentence_transformers_model_byoc_does_not_serve_is_named(tmp_path):
    with pytest.raises(sentence_folder.FolderError, match="model_type 'ImageEncoder': byoc serves"):
        tasks.of_folder(sentence_folder_of(tmp_path, {"model_type": "ImageEncoder"}), {})


@pytest.mark.parametrize(
    ("settings", "config", "activation"),
    [
        # CrossEncoder's own defaults: a sigmoid on one output, the logits themselves of more
        ({"model_type": "CrossEncoder"}, {"num_labels": 1}, "Sigmoid"),
        ({"model_type": "CrossEncoder"}, {"num_labels": 2}, "Identity"),
        # what sentence-transformers 6 saves, then what earlier versions kept in config.json
        (
            {"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"},
            {"num_labels": 1},
            "Identity",
        ),
        (
            {"model_type": "CrossEncoder"},
            {"num_labels": 1, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}},
            "Tanh",
        ),
        (
            {"model_type": "CrossEncoder"},
            {"num_labels": 1, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
            "Identity",
        ),
        # a class outside torch is custom code: ignored, as sentence-transformers ignores it
        ({"model_type": "CrossEncoder", "activation_fn": "my_code.Activation"}, {"num_labels": 1}, "Sigmoid"),
        ({"model_type": "SentenceTransformer"}, {"num_labels": 1}, None),
    ],
)
def test_a_cross_encoders_activation_is_the_one_its_predict_applies(tmp_path, settings, config, activation):
    assert tasks.cross_encoder_activation(sentence_folder_of(tmp_path, settings), config) == activation


def test_a_plain_folder_has_no_cross_encoder_activation(tmp_path):
    assert tasks.cross_encoder_activation(tmp_path, {"num_labels": 1}) is None
    settings = {"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.activation.GELU"}
    with pytest.raises(sentence_folder.FolderError, match="activation 'torch.nn.modules.activation.GELU' is not"):
        tasks.cross_encoder_activation(sentence_folder_of(tmp_path, settings), {"num_labels": 1})


def test_activations_are_torchs():
    logits = np.array([[-2.0, 0.0, 3.0]])
    np.testing.assert_allclose(activated(logits, "Sigmoid"), 1 / (1 + np.exp(-logits)))
    np.testing.assert_allclose(activated(logits, "Tanh"), np.tanh(logits))
    np.testing.assert_allclose(activated(logits, "Identity"), logits)
    np.testing.assert_allclose(activated(logits, "Softmax").sum(axis=-1), 1.0)
