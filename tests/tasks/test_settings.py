"""byoc.tasks.settings: a training recipe's hyperparameters, declared by the tasks that train with them and read
by byoc.training as its own are (decoded, bounded, listed), with no family field in the training room."""

from __future__ import annotations

from pathlib import Path

import pytest

from byoc import tasks
from byoc.tasks.settings import sizes
from byoc.training.argument_table import hyperparameter_table
from byoc.training.arguments import HyperparameterError
from byoc.training.hyperparameters import parse_hyperparameters
from byoc.training.model import recipe_settings

TRAINING = Path(__file__).resolve().parents[2] / "container" / "byoc" / "training"


def test_each_setting_is_declared_by_its_tasks_and_named_nowhere_in_the_training_room():
    settings = tasks.recipe_settings()
    assert set(settings) == {"matryoshka_dims", "mini_batch_size", "inference_free", "lora_r", "listwise_loss"}
    takers = {
        name: {t.name for t in tasks.TASKS.values() if s in t.recipe.recipe_settings} for name, s in settings.items()
    }
    assert takers["lora_r"] == {"embedding", "generative_reranker"}  # (one declaration, two recipes)
    assert takers["mini_batch_size"] == {"embedding", "multi_vector"}
    for path in TRAINING.rglob("*.py"):
        source = path.read_text()
        assert not [name for name in settings if name in source], path.name


def test_a_recipe_setting_is_read_checked_and_listed_as_byocs_own_are():
    args = parse_hyperparameters({"mini-batch-size": "4", "lora_r": "8", "matryoshka_dims": "[256, 64]"})
    assert args.recipe == {"mini_batch_size": 4, "lora_r": 8, "matryoshka_dims": "[256, 64]"}
    flat = args.as_dict()  # (metrics.json's hyperparameters, the job's fingerprint: flat, defaults included)
    assert flat["mini_batch_size"] == 4 and flat["inference_free"] is False and flat["listwise_loss"] is None
    assert recipe_settings(args, tasks.get("embedding")) == {
        "mini_batch_size": 4,
        "lora_r": 8,
        "matryoshka_dims": [256, 64],
    }
    with pytest.raises(HyperparameterError, match="mini_batch_size must be from 1 to 2147483647 or null"):
        parse_hyperparameters({"mini_batch_size": "0"})
    with pytest.raises(HyperparameterError, match="listwise_loss must be one of lambdaloss, listnet"):
        parse_hyperparameters({"listwise_loss": "pairwise"})
    with pytest.raises(HyperparameterError, match="matryoshka_dims must be a list of vector sizes"):
        parse_hyperparameters({"matryoshka_dims": "big"})
    with pytest.raises(HyperparameterError, match="inference_free must be a boolean"):
        parse_hyperparameters({"inference_free": "maybe"})
    with pytest.raises(HyperparameterError, match="lora_r is a setting of an embedding model and a generative"):
        recipe_settings(parse_hyperparameters({"lora_r": "8"}), tasks.get("single_label_classification"))
    table = hyperparameter_table()
    assert "| `listwise_loss` |  |  | `lambdaloss`, `listnet` | Listwise rerankers" in table
    assert table.index("| `output_dir` |") < table.index("| `matryoshka_dims` |")  # (after byoc's own)


def test_sizes_are_read_largest_first():
    assert sizes("768,256,64") == sizes("[64, 256, 768]") == [768, 256, 64]
    assert sizes("") == sizes(None) == []
    for bad in ("0,64", "a,b", "-1"):
        with pytest.raises(ValueError, match="768,256,64"):
            sizes(bad)
