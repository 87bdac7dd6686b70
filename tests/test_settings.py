"""Settings in one place (byoc.environment): one typed reader, one settings object per program, read
once at start, a bad value stopped there naming the variable; no other module reads the
environment; and docs/settings.md's table equal to the variables the code reads."""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import replace
from pathlib import Path

import pytest

from byoc.contract import ContractError, Paths, read_training_contract
from byoc.environment import Environment, SettingError, child_environment
from byoc.launch.settings import LaunchError, LaunchSettings, RankSettings
from byoc.serving.settings import InferenceSettings, ServeSettings, ServeSettingsError
from byoc.training.settings import TrainingSettings, XlaSettings
from helpers import REPO

PACKAGE = REPO / "container" / "byoc"
DOCS = REPO / "docs"


# ---------------------------------------------------------------------------------------------
# The reader


def test_an_empty_variable_is_unset():
    read = Environment({"A": "", "B": "  ", "C": " 7 "})
    assert read.integer("A", 3, 0) == 3 and read.number("B", 1.5) == 1.5 and read.text("A") is None
    assert read.integer("C", 3, 0) == 7 and not read.is_set("B") and read.is_set("C")
    assert read.flag("A", default=True) and read.choice("B", "auto", ("auto", "x")) == "auto"
    assert read.path("A") is None and read.path("C") == Path("7")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda r: r.integer("N", 4, 1), "N='x': must be a whole number of at least 1 (default 4)"),
        (lambda r: r.integer("N", 4, 1, 9), "N='x': must be a whole number from 1 to 9 (default 4)"),
        (lambda r: r.integer("N", None, 0), "N='x': must be a whole number of at least 0 (unset by default)"),
        (lambda r: r.number("N", 2.5), "N='x': must be a number 0 or more (default 2.5)"),
        (lambda r: r.number("N", 60.0, positive=True), "N='x': must be a number greater than 0 (default 60)"),
        (lambda r: r.number("N", 300.0, minimum=1), "N='x': must be a number of at least 1 (default 300)"),
        (lambda r: r.flag("N"), "N='x': use 1 or 0 (or true/false, yes/no, on/off)"),
        (lambda r: r.choice("N", "a", ("a", "b", "c")), "N='x': use a, b or c"),
        (lambda r: r.parsed("N", int, "a whole number"), "N='x': must be a whole number"),
    ],
)
def test_a_bad_value_is_named_with_what_is_allowed(call, message):
    with pytest.raises(SettingError) as caught:
        call(Environment({"N": "x"}))
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "value, read",
    [
        ("0", lambda r: r.integer("N", 1, 1)),
        ("-1", lambda r: r.integer("N", 1, 0)),
        ("1.5", lambda r: r.integer("N", 1, 0)),
        ("70000", lambda r: r.integer("N", 1, 1, 65535)),
        ("nan", lambda r: r.number("N", 1.0)),
        ("inf", lambda r: r.number("N", 1.0)),
        ("-0.5", lambda r: r.number("N", 1.0)),
        ("0", lambda r: r.number("N", 1.0, positive=True)),
    ],
)
def test_numbers_out_of_range_are_refused(value, read):
    with pytest.raises(SettingError, match=f"N='{value}'"):
        read(Environment({"N": value}))


def test_values_of_their_kind_are_read():
    read = Environment({"I": "12", "F": "0.5", "T": "Yes", "O": "off", "C": "TORCH", "P": "/x"})
    assert (read.integer("I", 0, 0, 12), read.number("F", 1.0), read.flag("T"), read.flag("O", True)) == (
        12,
        0.5,
        True,
        False,
    )
    assert read.choice("C", "auto", ("auto", "torch")) == "torch" and read.path("P") == Path("/x")


def test_the_error_is_the_programs_own():
    with pytest.raises(LaunchError):
        Environment({"N": "x"}, error=LaunchError).integer("N", 0, 0)


def test_a_child_gets_this_environment_and_more(monkeypatch):
    monkeypatch.setenv("BYOC_SOMETHING", "1")
    env = child_environment({"BYOC_PRECOMPILING": "1"})
    assert env["BYOC_SOMETHING"] == "1" and env["BYOC_PRECOMPILING"] == "1"


# ---------------------------------------------------------------------------------------------
# Each program's settings: the defaults, and a bad value stopped at start naming the variable


def test_the_defaults_of_each_program():
    assert LaunchSettings.from_env({}) == LaunchSettings()
    assert TrainingSettings.from_env({}) == TrainingSettings()
    assert RankSettings.from_env({}) == RankSettings() and not RankSettings().launched
    assert InferenceSettings.from_env({}) == InferenceSettings()


def test_the_launcher_reads_its_variables():
    settings = LaunchSettings.from_env(
        {
            "BYOC_PROCESSES_PER_HOST": "2",
            "BYOC_MASTER_PORT": "7777",
            "BYOC_HOSTS_TIMEOUT": "30.5",
            "BYOC_SHUTDOWN_TIMEOUT": "60",
            "NEURON_RT_VISIBLE_CORES": "0-3,8",
            "BYOC_PRECOMPILING": "1",
            "GLOO_SOCKET_IFNAME": "ens5",
        }
    )
    assert (settings.processes_per_host, settings.master_port, settings.hosts_timeout) == (2, 7777, 30.5)
    assert (settings.shutdown_timeout, settings.neuron_cores, settings.precompiling) == (60, 5, True)
    assert settings.network == {"GLOO_SOCKET_IFNAME": "ens5"}
    assert LaunchSettings.from_env({"NEURON_RT_NUM_CORES": "2"}).neuron_cores == 2


def test_a_rank_reads_what_the_launcher_and_torch_set(tmp_path):
    rank = RankSettings.from_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "BYOC_BACKEND": "gloo",
            "BYOC_COLLECTIVE_TIMEOUT": "90",
            "BYOC_FAILURE_DIR": str(tmp_path),
            "BYOC_HOST": "algo-2",
        }
    )
    assert (rank.rank, rank.world_size, rank.local_rank, rank.local_world_size, rank.node_rank) == (3, 4, 1, 2, 1)
    assert (rank.backend, rank.collective_timeout, rank.failure_dir, rank.host) == ("gloo", 90.0, tmp_path, "algo-2")
    assert rank.launched


def test_the_training_job_reads_its_variables(tmp_path):
    settings = TrainingSettings.from_env(
        {
            "BYOC_CACHE_DIR": str(tmp_path / "cache"),
            "BYOC_CODE_DIR": str(tmp_path / "code"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            "PJRT_DEVICE": "CPU",
            "NEURON_CC_FLAGS": "-O1",
            "NEURON_COMPILE_CACHE_URL": "s3://bucket/cache",
            "XLA_USE_BF16": "1",
            "XLA_DOWNCAST_BF16": "0",
        }
    )
    assert (settings.cache_dir, settings.code_dir) == (tmp_path / "cache", tmp_path / "code")
    assert settings.compile_cache == str(tmp_path / "inductor")
    assert settings.xla == XlaSettings("CPU", None, "-O1", "s3://bucket/cache", ("XLA_USE_BF16",))


@pytest.mark.parametrize(
    "read, variable, value",
    [
        (LaunchSettings.from_env, "BYOC_PROCESSES_PER_HOST", "two"),
        (LaunchSettings.from_env, "BYOC_MASTER_PORT", "70000"),
        (LaunchSettings.from_env, "BYOC_HOSTS_TIMEOUT", "0"),
        (LaunchSettings.from_env, "BYOC_SHUTDOWN_TIMEOUT", "soon"),
        (LaunchSettings.from_env, "BYOC_PRECOMPILING", "maybe"),
        (LaunchSettings.from_env, "NEURON_RT_VISIBLE_CORES", "0-x"),
        (LaunchSettings.from_env, "NEURON_RT_VISIBLE_CORES", "3-1"),
        (LaunchSettings.from_env, "NEURON_RT_NUM_CORES", "all"),
        (LaunchSettings.from_env, "BYOC_LOG_LEVEL", "loud"),
        (TrainingSettings.from_env, "BYOC_COLLECTIVE_TIMEOUT", "soon"),  # was float() on it, unchecked
        (TrainingSettings.from_env, "BYOC_COLLECTIVE_TIMEOUT", "0"),
        (TrainingSettings.from_env, "WORLD_SIZE", "0"),
        (TrainingSettings.from_env, "RANK", "-1"),
        (TrainingSettings.from_env, "LOCAL_RANK", "first"),
        (TrainingSettings.from_env, "GROUP_RANK", "1.5"),
        (TrainingSettings.from_env, "BYOC_BACKEND", "mpi"),
        (TrainingSettings.from_env, "XLA_USE_BF16", "bf16"),
        (TrainingSettings.from_env, "NEURON_RT_NUM_CORES", "-2"),
        (TrainingSettings.from_env, "BYOC_LOG_LEVEL", "verbose"),
        (ServeSettings.from_env, "BYOC_INFERENCE_BACKEND", "tensorrt"),
        (ServeSettings.from_env, "BYOC_INFERENCE_PRECISION", "fp8"),
        (ServeSettings.from_env, "BYOC_INFERENCE_COMPILE", "maybe"),
        (ServeSettings.from_env, "OMP_NUM_THREADS", "0"),
        (ServeSettings.from_env, "BYOC_LOG_LEVEL", "chatty"),
    ],
)
def test_a_bad_value_stops_its_program_at_start_naming_it(read, variable, value):
    with pytest.raises(LaunchError if read == LaunchSettings.from_env else SettingError) as caught:
        read({variable: value})
    assert f"{variable}={value!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # a UserError: its message is the failure, without a traceback


def test_a_rank_outside_its_world_is_refused():
    with pytest.raises(SettingError, match="RANK=2 is not under WORLD_SIZE=2"):
        RankSettings.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(SettingError, match="LOCAL_RANK=1 is not under LOCAL_WORLD_SIZE=1"):
        RankSettings.from_env({"LOCAL_RANK": "1"})


def test_the_server_reads_what_serving_read_elsewhere():
    settings = ServeSettings.from_env(
        {"SAGEMAKER_PROGRAM": "serve.py", "OMP_NUM_THREADS": "3", "BYOC_INFERENCE_BACKEND": "Torch"}
    )
    assert settings.program == "serve.py"
    assert settings.inference == InferenceSettings(backend="torch", threads=3)
    with pytest.raises(ServeSettingsError):  # the server's own error, which `byoc serve` reports at start
        ServeSettings.from_env({"BYOC_INFERENCE_PRECISION": "fp8"})


def test_a_rank_knows_its_place_from_setup_only(monkeypatch):
    """The rank's settings reach every training module through byoc.launch.distributed, given once by
    `setup` from what the job read at its entry point; that module never reads the environment."""
    from byoc.launch import distributed

    monkeypatch.setattr(distributed._place, "rank", RankSettings())
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    assert (distributed.world_size(), distributed.rank(), distributed.is_distributed()) == (1, 0, False)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)  # joined already: setup only records
    distributed.setup(RankSettings(rank=3, world_size=4, local_world_size=2, node_rank=1, backend="gloo"))
    assert (distributed.rank(), distributed.is_distributed(), distributed.host_ranks()) == (3, True, [2, 3])
    assert distributed.backend() == "gloo" and distributed.world_size() == 4


def test_two_servers_in_one_process_load_with_their_own_settings(
    tmp_path, tmp_path_factory, tiny_model_dir, monkeypatch
):
    """model_fn(model_dir) has no room for settings: each server wraps its load in its own
    (default_pipeline.serving_with), so the default model_fn and inference_threads() called from a
    user's model_fn see that server's backend and threads, and nothing is left behind for the next."""
    import sys
    from dataclasses import replace

    import serve_helpers

    from byoc.serving import default_pipeline
    from byoc.serving.execution.model_server import ModelServer

    torch = sys.modules.get("torch")
    threads_before = torch.get_num_threads() if torch is not None else None
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the servers write it (torch reads it at import); restored after
    model = serve_helpers.model_with_code(
        serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir),
        tmp_path,
        "from byoc import inference\n"
        "from byoc.handlers import inference_threads\n"
        "def model_fn(model_dir):\n"
        "    return {'threads': inference_threads(), 'backend': inference.model_fn(model_dir)['backend']}\n",
    )
    loaded = {}
    try:
        for backend, threads in (("onnxruntime", "1"), ("torch", "2")):
            env = {"BYOC_INFERENCE_BACKEND": backend, "OMP_NUM_THREADS": threads}
            server = ModelServer(replace(ServeSettings.from_env(env), model_dir=model))
            server.load()
            assert server.error is None, server.error
            loaded[backend] = server.model
    finally:
        if threads_before is not None:
            torch.set_num_threads(threads_before)
    assert loaded == {
        "onnxruntime": {"threads": 1, "backend": "onnxruntime"},
        "torch": {"threads": 2, "backend": "torch"},
    }
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert default_pipeline.inference_threads() == 5  # outside a server's load: the environment's, read now


def test_a_job_passes_its_settings_to_main_and_an_older_main_still_runs(job):
    """run_job reads the job's settings once and hands them to main(contract, args, settings); a
    code/train.py written before that (main(contract, args)) is called as it always was."""
    from byoc.training import entry

    job.hyperparameters({"epochs": "1"})
    chosen = TrainingSettings(code_dir=Path("/code"))
    seen = []
    assert entry.run_job(lambda contract, args, settings: seen.append(settings), settings=chosen) == 0
    assert entry.run_job(lambda contract, args: seen.append(args.epochs), settings=chosen) == 0
    assert entry.run_job(lambda *given: seen.append(len(given)), settings=chosen) == 0
    assert seen == [replace(chosen, use_xla=False), 1, 3]  # with the entry's one XLA decision (no Neuron here)


def test_the_contract_reads_its_variables_from_the_mapping_given(tmp_path):
    paths = Paths.from_env({"SAGEMAKER_BASE_DIR": str(tmp_path), "SM_MODEL_DIR": str(tmp_path / "m")})
    assert (paths.base, paths.model_dir, paths.output_data_dir) == (tmp_path, tmp_path / "m", tmp_path / "output/data")
    assert Paths.from_env({"SAGEMAKER_BASE_DIR": "", "SM_OUTPUT_DATA_DIR": ""}) == Paths(Path("/opt/ml"))
    (tmp_path / "input" / "config").mkdir(parents=True)
    contract = read_training_contract(env={"SAGEMAKER_BASE_DIR": str(tmp_path), "TRAINING_JOB_NAME": "job-7"})
    assert (contract.paths.base, contract.job_name) == (tmp_path, "job-7")
    assert (
        read_training_contract(env={"SAGEMAKER_BASE_DIR": str(tmp_path), "TRAINING_JOB_NAME": ""}).job_name == "local"
    )
    assert issubclass(LaunchError, ContractError)


def test_byoc_train_writes_a_bad_variable_to_the_failure_file(job, monkeypatch):
    from byoc.training import entry

    job.hyperparameters({"epochs": "1"})
    monkeypatch.setenv("BYOC_COLLECTIVE_TIMEOUT", "half an hour")
    assert entry.train() == 1
    assert job.failure.startswith("BYOC_COLLECTIVE_TIMEOUT='half an hour': must be a number greater than 0")
    monkeypatch.delenv("BYOC_COLLECTIVE_TIMEOUT")
    (job.root / "output" / "failure").unlink()
    monkeypatch.setenv("BYOC_HOSTS_TIMEOUT", "-5")
    assert entry.train() == 1
    assert job.failure.startswith("BYOC_HOSTS_TIMEOUT='-5': must be a number of at least 1")


# ---------------------------------------------------------------------------------------------
# Who touches os.environ: the reader reads it; a few modules write it for children or libraries


READERS = {"byoc.environment"}  # the one reader
WRITERS = {
    "byoc.environment": "child_environment: a child's environment is this one's and more",
    "byoc.logs": "library defaults (progress bars, telemetry, verbosity) before the libraries load",
    "byoc.launch.launcher": "each rank's variables: torch's elastic agent starts them with this environment",
    "byoc.launch.script": "the toolkit's SM_* and PYTHONPATH, for the user's script",
    "byoc.training.xla": "torch-xla and the Neuron compiler read theirs as they load",
    "byoc.training.compiled_steps": "inductor reads its cache folder from the environment only",
    "byoc.serving.execution.model_server": "OMP_NUM_THREADS, which torch reads at import",
    "byoc.serving.prometheus": "PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads as each worker imports it",
    "byoc.training.tracking": "MLflow's retries and timeouts, shortened where unset: it reads them as it sends",
    "byoc.encoding.encoder": "CUDA_VISIBLE_DEVICES, an encode rank's own GPU, set before torch loads and reads it",
}
_WRITING_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def environment_uses(source: str) -> list[tuple[int, str, str]]:
    """(line, read or write, what) for every use of os.environ, os.getenv, os.putenv in `source`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in ("environ", "environb", "getenv", "putenv", "unsetenv"):
                    uses.append((node.lineno, "read", f"from os import {alias.name}"))
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"):
            continue
        if node.attr in ("getenv", "getenvb"):
            uses.append((node.lineno, "read", f"os.{node.attr}"))
        elif node.attr in ("putenv", "unsetenv"):
            uses.append((node.lineno, "write", f"os.{node.attr}"))
        elif node.attr in ("environ", "environb"):
            parent = parents.get(node)
            writes = (isinstance(parent, ast.Attribute) and parent.attr in _WRITING_METHODS) or (
                isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del))
            )
            uses.append((node.lineno, "write" if writes else "read", f"os.{node.attr}"))
    return sorted(uses)


def package_modules() -> dict[str, Path]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_only_the_reader_reads_the_environment_and_only_the_listed_modules_write_it():
    wrong = []
    for module, path in package_modules().items():
        for line, kind, what in environment_uses(path.read_text()):
            allowed = READERS if kind == "read" else WRITERS
            if module not in allowed:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {what} ({kind})")
    assert not wrong, "read the environment through byoc.environment, in the program's settings:\n" + "\n".join(wrong)


def test_the_environment_check_sees_reads_and_writes():
    """The check above can fail: each way of touching the environment is found, and told apart."""
    source = (
        "import os\nfrom os import getenv\n"
        "a = os.environ.get('A')\nb = os.environ['B']\nc = 'C' in os.environ\nd = os.getenv('D')\n"
        "e = {**os.environ}\nos.environ['F'] = '1'\nos.environ.setdefault('G', '1')\nos.environ.update({})\n"
        "del os.environ['H']\nos.putenv('I', '1')\n"
    )
    kinds = [kind for _, kind, _ in environment_uses(source)]
    assert kinds == ["read"] * 6 + ["write"] * 5


# ---------------------------------------------------------------------------------------------
# docs/settings.md: one row for each variable read, and each row read somewhere

_READER_METHODS = {"raw", "is_set", "text", "path", "integer", "number", "flag", "choice", "parsed"}


def _is_reader(node: ast.expr) -> bool:
    """`read.integer(...)` or `Environment(...).path(...)`: a call on the reader."""
    if isinstance(node, ast.Name):
        return node.id == "read"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Environment"


def variables_read() -> dict[str, set[str]]:
    """Variable name -> the modules that read it: every module that imports the reader, scanned for
    the names it passes to the reader and for its constants naming variables (`*_ENV`, `*_VARIABLES`)."""
    found: dict[str, set[str]] = {}
    for name, path in package_modules().items():
        source = path.read_text()
        if name == "byoc.environment" or not re.search(r"^from byoc\.environment import .*Environment", source, re.M):
            continue
        module = importlib.import_module(name)
        names: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr in _READER_METHODS and _is_reader(node.func.value):
                    try:
                        value = eval(ast.unparse(node.args[0]), vars(module))  # a literal, or a module's constant
                    except NameError:
                        continue  # a local (a loop over the constants below)
                    names.add(value)
        for constant, value in vars(module).items():
            if constant.endswith("_ENV") and isinstance(value, str):
                names.add(value)
            elif constant.endswith("_VARIABLES") and isinstance(value, tuple):
                names.update(value)
        for variable in names:
            found.setdefault(variable, set()).add(name)
    return found


def documented() -> dict[str, list[str]]:
    """docs/settings.md's table: variable -> its cells."""
    rows = {}
    for line in (DOCS / "settings.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells
    return rows


class _Recording(dict):
    """A mapping that notes every name looked up in it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)


def test_every_variable_read_has_a_row_and_every_row_is_read():
    read, rows = variables_read(), documented()
    assert {"BYOC_LOG_LEVEL", "BYOC_COLLECTIVE_TIMEOUT", "SAGEMAKER_BASE_DIR", "OMP_NUM_THREADS"} <= set(read)
    assert not set(read) - set(rows), f"read but not in docs/settings.md: {sorted(set(read) - set(rows))}"
    assert not set(rows) - set(read), f"in docs/settings.md but read nowhere: {sorted(set(rows) - set(read))}"


def test_what_each_program_asks_for_is_documented():
    """Each settings object, built from a recording mapping, asks only for documented variables."""
    rows = documented()
    for build in (LaunchSettings.from_env, TrainingSettings.from_env, ServeSettings.from_env, Paths.from_env):
        env = _Recording()
        build(env)
        assert env.asked and not env.asked - set(rows), (build, sorted(env.asked - set(rows)))


def test_the_table_and_the_serving_page_agree():
    """docs/serving.md keeps its own table of the server's variables: its defaults are these."""
    rows = documented()
    serving = (DOCS / "serving.md").read_text().split("## Settings", 1)[1].split("\n## ", 1)[0]
    compared = 0
    for line in serving.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        names = [name.strip().strip("`") for name in cells[0].split(",")]
        defaults = [default.strip() for default in cells[1].split(",")] if len(names) > 1 else [cells[1]]
        for name, default in zip(names, defaults):
            assert name in rows, f"docs/serving.md names {name}, which docs/settings.md does not"
            assert rows[name][1] == "server" and rows[name][2] == default, (name, rows[name][2], default)
            compared += 1
    assert compared >= 20
