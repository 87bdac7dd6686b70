"""`byoc` on the command line: a thin door that parses and dispatches. Importing it loads no room and
no torch (`byoc serve` and `byoc healthcheck` never pay for the training side); the training entry
points stay importable from it, as copies of code/train.py import them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO


def _modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after `statement`."""
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "container", check=True
    )
    return set(done.stdout.split())


def test_importing_the_cli_loads_no_room_and_no_torch():
    loaded = _modules_after("import byoc.cli")
    rooms = {name for name in loaded if name.startswith(("byoc.training", "byoc.launch", "byoc.serving"))}
    assert rooms == set() and "torch" not in loaded and "transformers" not in loaded, sorted(rooms)


def test_the_check_above_can_fail():
    """The same check sees the training room once a training entry point is used."""
    loaded = _modules_after("from byoc.cli import run_job")
    assert "byoc.training.entry" in loaded and "torch" not in loaded


def test_the_training_entry_points_are_the_same_objects_at_the_old_path():
    import byoc.cli
    from byoc.training import entry

    assert byoc.cli.run_job is entry.run_job and byoc.cli.train is entry.train
    assert byoc.cli.failure_message is entry.failure_message
    with pytest.raises(AttributeError, match="has no attribute 'serve'"):
        byoc.cli.serve  # noqa: B018


def test_version_and_usage(capsys):
    import byoc.cli

    with pytest.raises(SystemExit) as done:
        byoc.cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("byoc ")
    with pytest.raises(SystemExit) as done:
        byoc.cli.main(["fly"])
    assert done.value.code == 2 and "invalid choice: 'fly'" in capsys.readouterr().err


def test_export_onnx_says_what_it_exports(capsys):
    """Any model folder byoc serves, not only "a saved classifier"."""
    import byoc.cli

    with pytest.raises(SystemExit) as done:
        byoc.cli.main(["export-onnx", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0 and "a saved classifier" not in text
    from byoc import tasks

    for kind in tasks.NAMES:  # every family, named from the registry (a list written by hand went stale)
        assert kind in text, kind
    with pytest.raises(SystemExit):
        byoc.cli.main(["--help"])
    assert "the serving graph, for a model folder byoc serves" in " ".join(capsys.readouterr().out.split())


def test_train_and_serve_help_name_every_family_and_the_settings(capsys):
    """`byoc train --help` listed 7 of the 10 trained tasks and `byoc serve --help` no setting (round six)."""
    import byoc.cli
    from byoc import tasks

    texts = {}
    for command in ("train", "serve"):
        with pytest.raises(SystemExit):
            byoc.cli.main([command, "--help"])
        texts[command] = " ".join(capsys.readouterr().out.split())
    assert all(name in texts["train"] for name, task in tasks.TASKS.items() if task.trains)
    assert all(name in texts["serve"] for name in ("SM_MODEL_DIR", "SAGEMAKER_BIND_TO_PORT", "docs/settings.md"))
