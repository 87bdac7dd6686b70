"""The handlers in process: a model's own code is loaded as the AWS toolkits load it."""

from __future__ import annotations

import json
import pickle
import sys

import pytest

from byoc.handlers import HandlerError, call, load_handlers


def test_handlers_get_context_only_when_they_take_it():
    class Unhashable:
        __hash__ = None

        def __call__(self, data, model, context):
            return context

    assert call(lambda data, model: "plain", "predict_fn", 1, 2, context="ctx") == "plain"
    assert call(lambda data, model, context=None: context, "predict_fn", 1, 2, context="ctx") == "ctx"
    assert call(lambda *args: args[-1], "predict_fn", 1, 2, context="ctx") == "ctx"
    assert call(Unhashable(), "predict_fn", 1, 2, context="ctx") == "ctx"


# --- a model's own code, loaded like the AWS toolkits load it ---------------------------------


def code_dir(tmp_path, files: dict[str, str]):
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    for name, source in files.items():
        (model / "code" / name).write_text(source)
    return model


USER_CODE = """
from __future__ import annotations

import pickle
from dataclasses import dataclass


@dataclass
class Answer:
    label: str
    score: float


def output_fn(prediction, accept):
    import helper  # a sibling, imported when first called, long after the module loaded

    answers = [Answer(p["label"], p["score"]) for p in prediction]
    again = pickle.loads(pickle.dumps(answers))  # a class of this module pickles and unpickles
    return helper.render(again), "application/json"
"""
HELPER = """
import json

import inference  # the module that imported this one: the same module object, not a second copy


def render(answers):
    assert all(isinstance(a, inference.Answer) for a in answers)
    return json.dumps([a.label for a in answers])
"""


def test_user_code_loads_like_the_toolkits(tmp_path):
    """Registered in sys.modules under its own name, its folder kept on sys.path: a dataclass with
    postponed annotations, pickling its classes and `import helper` inside a function all work."""
    model = code_dir(tmp_path, {"inference.py": USER_CODE, "helper.py": HELPER})
    handlers = load_handlers(model)
    assert handlers.output_fn(([{"label": "joy", "score": 0.5}]), "application/json") == (
        '["joy"]',
        "application/json",
    )
    assert sys.modules["inference"].Answer is pickle.loads(pickle.dumps(sys.modules["inference"].Answer))
    again = load_handlers(code_dir(tmp_path / "again", {"inference.py": USER_CODE, "helper.py": HELPER}))
    assert again.output_fn is not handlers.output_fn  # a model loaded again replaces the module


def test_code_that_exits_while_loading_is_a_failed_start(tmp_path):
    """argparse at import calls sys.exit: a SystemExit, not an Exception. It used to escape the
    loader and leave the server answering 503 until SageMaker's start-up timeout."""
    source = "import argparse\nargparse.ArgumentParser().parse_args(['--no-such-flag'])\n"
    with pytest.raises(HandlerError, match=r"SystemExit: 2.*__main__") as caught:
        load_handlers(code_dir(tmp_path, {"inference.py": source}))
    assert "inference" not in sys.modules or sys.modules["inference"].__file__ != str(
        tmp_path / "model" / "code" / "inference.py"
    )
    assert isinstance(caught.value, Exception)


def test_a_program_named_like_a_module_in_use_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_PROGRAM", "json.py")
    with pytest.raises(HandlerError, match="rename it"):
        load_handlers(code_dir(tmp_path, {"json.py": "def output_fn(p, a):\n    return '', 'text/plain'\n"}))
    assert sys.modules["json"] is json
