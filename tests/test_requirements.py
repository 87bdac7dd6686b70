"""requirements.txt of the user's code (serving's model/code, script mode's source_dir): one installer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from byoc import requirements
from byoc.requirements import RequirementsError, install_requirements


def test_nothing_to_install_starts_no_pip(tmp_path, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip started for a file that lists nothing")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert install_requirements(tmp_path) is None  # no file
    (tmp_path / "requirements.txt").write_text("# extra packages go here\n\n   # indented comment\n")
    assert install_requirements(tmp_path) is None


def test_pip_runs_in_the_code_folder(tmp_path, monkeypatch):
    """Relative entries (./my_package, -e .) mean the code's own folder, wherever the process started."""
    calls = []

    def pip(cmd, **options):
        calls.append((cmd, options))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", pip)
    (tmp_path / "requirements.txt").write_text("./my_package  # local\n")
    assert install_requirements(tmp_path) == tmp_path / "requirements.txt"
    ((cmd, options),) = calls
    assert cmd[1:] == ["-m", "pip", "install", "--no-input", "-r", str(tmp_path / "requirements.txt")]
    assert Path(options["cwd"]) == tmp_path


def test_installs_for_real_and_says_why_pip_failed(tmp_path, caplog):
    (tmp_path / "requirements.txt").write_text("numpy\n")  # already satisfied: no network needed
    with caplog.at_level("INFO", logger="byoc.requirements"):
        assert install_requirements(tmp_path) == tmp_path / "requirements.txt"
    assert "installing" in caplog.text

    (tmp_path / "requirements.txt").write_text("./no-such-folder\n")
    with pytest.raises(RequirementsError) as failed:
        install_requirements(tmp_path)
    assert failed.value.requirements == tmp_path / "requirements.txt"
    assert "no-such-folder" in str(failed.value) and "\n" not in str(failed.value)


def test_a_file_that_is_not_utf8_still_goes_to_pip(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: bad\n"))
    (tmp_path / "requirements.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(RequirementsError, match="ERROR: bad"):
        install_requirements(tmp_path)
    assert requirements.lists_anything(tmp_path / "requirements.txt")
