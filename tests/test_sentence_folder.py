"""byoc.sentence_folder: a sentence-transformers folder's modules, read as sentence-transformers writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from byoc import sentence_folder
from byoc.training.model import bundled_model_dir


def write(folder: Path, files: dict[str, object]) -> Path:
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content))
    return folder


def test_the_bundled_minilm_is_mean_pooled_and_normalized():
    model = bundled_model_dir()
    assert model is not None
    folder = sentence_folder.read(model)
    assert folder.sentence_transformers and folder.pooling == ("mean",) and folder.normalize
    assert folder.dense == () and folder.max_seq_length == 256 and folder.prompts == {}


def test_pooling_dense_normalize_and_prompts(tmp_path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write(
        tmp_path,
        {
            "modules.json": modules,
            "1_Pooling/config.json": {"pooling_mode_max_tokens": True, "pooling_mode_cls_token": True},
            "2_Dense/config.json": {
                "in_features": 64,
                "out_features": 16,
                "bias": False,
                "activation_function": "torch.nn.modules.activation.Tanh",
            },
            "config_sentence_transformers.json": {
                "prompts": {"query": "query: ", "passage": "passage: "},
                "default_prompt_name": "query",
            },
        },
    )
    folder = sentence_folder.read(tmp_path)
    assert folder.pooling == ("cls", "max")  # sentence-transformers' order, whatever the file's
    assert folder.dense == (sentence_folder.Dense(tmp_path / "2_Dense", 64, 16, False, "Tanh"),)
    assert folder.normalize and folder.default_prompt_name == "query" and folder.prompts["passage"] == "passage: "


def test_sentence_transformers_6_names_its_modes_in_their_order(tmp_path):
    modules = [{"type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling", "path": "1_Pooling"}]
    write(
        tmp_path, {"modules.json": modules, "1_Pooling/config.json": {"pooling_mode": ["mean_sqrt_len_tokens", "cls"]}}
    )
    assert sentence_folder.read(tmp_path).pooling == ("mean_sqrt_len", "cls")
    write(tmp_path, {"1_Pooling/config.json": {"pooling_mode": "lasttoken"}})
    assert sentence_folder.read(tmp_path).pooling == ("lasttoken",)
    write(tmp_path, {"1_Pooling/config.json": {"pooling_mode": "median"}})
    with pytest.raises(sentence_folder.FolderError, match="'median' is not one byoc serves"):
        sentence_folder.read(tmp_path)


def test_a_plain_folder_is_mean_pooled(tmp_path):
    folder = sentence_folder.read(tmp_path)
    assert not folder.sentence_transformers and folder.pooling == ("mean",) and not folder.normalize


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"modules.json": [{"type": "sentence_transformers.models.CLIPModel", "path": ""}]}, "CLIPModel"),
        ({"modules.json": [{"type": "x.Pooling", "path": "1_Pooling"}]}, "1_Pooling/config.json is missing"),
        (
            {
                "modules.json": [{"type": "x.Pooling", "path": "p"}],
                "p/config.json": {"pooling_mode_mean_tokens": False},
            },
            "no pooling mode",
        ),
        (
            {
                "modules.json": [{"type": "x.Pooling", "path": "p"}],
                "p/config.json": {"pooling_mode_mean_tokens": True, "include_prompt": False},
            },
            "include_prompt=false",
        ),
        (
            {"modules.json": [{"type": "x.Dense", "path": "d"}], "d/config.json": {"in_features": 3}},
            "needs in_features and out_features",
        ),
        ({"config_sentence_transformers.json": {"prompts": {"q": "q: "}, "default_prompt_name": "z"}}, "'z'"),
    ],
)
def test_what_byoc_cannot_serve_is_named(tmp_path, files, message):
    write(tmp_path, files)
    with pytest.raises(sentence_folder.FolderError, match=message.replace("(", r"\(")):
        sentence_folder.read(tmp_path)


def test_module_types_of_the_folders_own_are_found_in_modules_json_and_in_its_routers(tmp_path):
    """What loading the folder would import from the folder itself (byoc.tasks.embedding.model refuses it unless
    trust_remote_code=true): any module type outside sentence_transformers.*, a Router's inner modules included."""
    assert sentence_folder.foreign_modules(bundled_model_dir()) == []
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "evil_pool.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Router", "type": "sentence_transformers.base.modules.router.Router"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers_extra.Normalize"},
    ]
    router = {
        "types": {
            "query_0_Dense": "sentence_transformers.models.Dense",
            "document_0_Asym": "sentence_transformers.models.Asym",  # a Router of the older name, in the Router
            "document_1_Custom": "my_code.Custom",
        },
        "structure": {"query": ["query_0_Dense"], "document": ["document_0_Asym", "document_1_Custom"]},
    }
    write(
        tmp_path,
        {
            "modules.json": modules,
            "2_Router/router_config.json": router,
            "2_Router/document_0_Asym/config.json": {"types": {"inner": "deeper.Module"}},
        },
    )
    found = sentence_folder.foreign_modules(tmp_path)
    assert found == ["evil_pool.Pooling", "deeper.Module", "my_code.Custom", "sentence_transformers_extra.Normalize"]
    write(tmp_path, {"modules.json": {"not": "a list"}})
    with pytest.raises(sentence_folder.FolderError, match="must list the modules"):
        sentence_folder.foreign_modules(tmp_path)


def test_a_dense_module_that_names_no_activation_has_sentence_transformers_default_tanh(tmp_path):
    """sentence-transformers' Dense loads a config without activation_function with Tanh, its default: byoc read
    Identity there, and served such a folder's vectors without the Tanh."""
    write(tmp_path, {"2_Dense/config.json": {"in_features": 8, "out_features": 4}})
    assert sentence_folder.dense_module(tmp_path / "2_Dense").activation == "Tanh"
    write(tmp_path, {"2_Dense/config.json": {"in_features": 8, "out_features": 4, "use_residual": True}})
    with pytest.raises(sentence_folder.FolderError, match="use_residual"):
        sentence_folder.dense_module(tmp_path / "2_Dense")
