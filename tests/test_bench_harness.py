"""The benchmarks' harness (benchmarks/harness.py): every results file carries the provenance of its figures
(commit, date, machine, library versions) and no path of the machine; scenarios alternate round by round."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import harness  # noqa: E402


def test_a_results_file_names_its_commit_date_machine_and_versions(tmp_path):
    out = harness.write_results(
        tmp_path / "r.json", {"rate": 12.5}, argv=["benchmarks/bench_x.py", f"--json={tmp_path}/r.json", "--n", "3"]
    )
    written = json.loads(out.read_text())
    assert written["results"] == {"rate": 12.5}
    stamp = written["provenance"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert stamp["commit"] and head.startswith(stamp["commit"]) and isinstance(stamp["work_tree_changed"], bool)
    assert stamp["date"].startswith("20") and stamp["date"].endswith("+00:00")
    assert stamp["machine"]["cores"] >= 1 and stamp["machine"]["cpu"] and isinstance(stamp["machine"]["gpus"], list)
    assert {"python", "torch", "transformers", "onnxruntime"} <= set(stamp["versions"])
    assert stamp["command"] == "benchmarks/bench_x.py --json=r.json --n 3"  # (no path of this machine)


def test_the_machine_names_its_vector_instructions_as_proc_cpuinfo_lists_them(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni avx512ifma amx_tile amx_bf16\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    real = Path

    def read(path, *args, **kwargs):  # (only /proc/cpuinfo is this fake's)
        return real(cpuinfo if str(path) == "/proc/cpuinfo" else path)

    monkeypatch.setattr(harness, "Path", read)
    assert harness.cpu_features() == [
        "amx_bf16",
        "amx_tile",
        "avx2",
        "avx512_bf16",
        "avx512_vnni",
        "avx512bw",
        "avx512f",
        "fma",
    ]
    assert harness.machine()["cpu_features"] == harness.cpu_features()
    cpuinfo.unlink()
    assert harness.cpu_features() == []  # (no /proc/cpuinfo: a Mac)


def test_a_machine_path_in_the_results_is_written_as_its_last_part_and_reported(tmp_path, capsys):
    results = {
        "runs": [{"model_dir": str(tmp_path / "model"), "note": f"see {tmp_path}/docs/a.md"}],
        "url": "http://h/x",
    }
    written = json.loads(harness.write_results(tmp_path / "r.json", results).read_text())
    assert written["results"] == {"runs": [{"model_dir": "model", "note": "see a.md"}], "url": "http://h/x"}
    said = capsys.readouterr().out
    assert 'results["runs"][0]["model_dir"]' in said and 'results["runs"][0]["note"]' in said
    assert str(tmp_path) not in (tmp_path / "r.json").read_text().split('"results"')[1]


def test_scenarios_alternate_in_an_order_that_rotates_each_round():
    calls = []
    runs = harness.alternate({name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}, 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert runs == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}
    assert harness.medians({"a": [{"x": 1, "y": "s"}, {"x": 5, "y": "t"}, {"x": 3}]}) == {"a": {"x": 3}}


def test_every_benchmark_writes_its_results_through_the_harness():
    """A script that writes a results file (--json, or benchmarks/results/) stamps it: never a JSON dump of its own."""
    writers, own_dumps = [], []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.name == "harness.py":
            continue
        source = path.read_text()
        if '"--json"' in source or '"results"' in source and "benchmarks/results" in source:
            writers.append(path.name)
            assert "harness.write_results(" in source, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "write_text" and node.args:
                text = ast.unparse(node)
                if "json.dumps(results" in text or "json.dumps(result," in text:
                    own_dumps.append(f"{path.name}:{node.lineno}")
    assert len(writers) >= 18 and own_dumps == []


# bench_gpu.py's serving half, kept in a module of its own (the GPU run's two parts): the one script imported.
SCRIPT_PARTS = {"bench_gpu.py": {"bench_gpu_serve"}}


def test_scenario_scripts_share_the_harness_modules_never_each_other():
    """The set-up every script needs (servers and load, models and data, results) lives in the shared modules, not
    inside one script that a dozen others import: a script imports no other bench_* script."""
    shared = {path.stem for path in (REPO / "benchmarks").glob("*.py") if not path.name.startswith("bench_")}
    assert {"harness", "servers", "fixtures"} <= shared
    for path in sorted((REPO / "benchmarks").glob("bench_*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        scripts = {name for name in imported if name.startswith("bench_")}
        assert scripts <= SCRIPT_PARTS.get(path.name, set()), (path.name, scripts)


def test_every_script_declares_its_scenarios_to_the_harness_and_takes_rounds():
    """Every benchmark hands its scenarios to the harness (harness.scenarios, or harness.alternate), whose order
    rotates each round, and takes --rounds: none runs its measurements in a sequence of its own. bench_gpu.py's
    serving half is a part of bench_gpu.py (its scenarios declared there)."""
    scripts = sorted(
        p for p in (REPO / "benchmarks").glob("bench_*.py") if p.stem not in set().union(*SCRIPT_PARTS.values())
    )
    assert len(scripts) >= 20
    undeclared = [
        path.name
        for path in scripts
        if not any(f"harness.{call}(" in path.read_text() for call in ("scenarios", "alternate"))
        or not any(flag in path.read_text() for flag in ('"--rounds"', "harness.add_rounds(parser"))
    ]
    assert undeclared == []


def test_scenarios_give_each_figure_the_median_of_its_rounds_and_one_round_as_it_came():
    calls = iter(
        [
            {"rate": 10.0, "load": {"p50": 5, "ok": True}, "rows": [1]},
            {"rate": 30.0, "load": {"p50": 7}},
            {"rate": 20.0, "load": {"p50": 6, "ok": False}, "rows": [3]},
        ]
    )
    figures = harness.scenarios({"a": lambda: next(calls)}, 3)
    assert figures == {"a": {"rate": 20.0, "load": {"p50": 6, "ok": True}, "rows": [1]}}
    counts = iter([{"requests": 7, "status": 200}, {"requests": 4, "status": 200}])
    assert harness.scenarios({"a": lambda: next(counts)}, 2) == {"a": {"requests": 4, "status": 200}}
    once = {"rate": 12.345678, "answers": [{"label": "joy"}]}
    assert harness.scenarios({"a": lambda: once}, 1) == {"a": once}  # (not rounded, not copied)
    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        harness.scenarios({"a": lambda: once}, 0)


# The day results files began to carry their provenance: a file recorded before it may hold a stamp rebuilt from
# git log (the commit that recorded it, and its date); one recorded since carries the harness's own.
HARNESS_DAY = "2026-11-29"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def test_every_results_file_is_stamped_with_its_provenance():
    """Each tracked results file says where its figures come from: the harness's stamp (commit, date, machine,
    versions, command), or, for one written before the harness, the commit that recorded it (a commit of the
    file's own history) and its date. No file holds the figures alone."""
    files = sorted((REPO / "benchmarks" / "results").glob("*.json"))
    assert len(files) >= 30
    history_known = _git("rev-parse", "--is-shallow-repository") == "false"
    unstamped, wrong = [], []
    for path in files:
        written = json.loads(path.read_text())
        stamp = written.get("provenance") if isinstance(written, dict) else None
        if not stamp or "results" not in written:
            unstamped.append(path.name)
        elif "reconstructed" in stamp:
            recorded = stamp["recorded_in"]
            if not stamp["date"] < HARNESS_DAY or not stamp["date"].endswith("+00:00"):
                wrong.append(f"{path.name}: a rebuilt stamp is for files recorded before {HARNESS_DAY}")
            elif history_known and recorded not in _git("log", "--format=%H", "--", str(path.relative_to(REPO))):
                wrong.append(f"{path.name}: {recorded} is not in the file's history")
        elif not (stamp["commit"] and stamp["date"] >= HARNESS_DAY and stamp["machine"]["cpu"] and stamp["versions"]):
            wrong.append(f"{path.name}: {stamp}")
    assert unstamped == [] and wrong == []


def test_a_process_a_benchmark_starts_reads_its_own_peak_memory_not_the_benchmarks():
    """Linux keeps ru_maxrss across fork and exec: bench-encode's jobs read the benchmark's peak (733 MiB) as theirs."""
    ballast = bytearray(400 * 2**20)
    ballast[:: 2**12] = b"\1" * len(range(0, len(ballast), 2**12))  # (every page touched: resident)
    assert harness.peak_rss_mib() > 400
    child = subprocess.run(
        [sys.executable, "-c", "import harness; print(harness.peak_rss_mib())"],
        cwd=REPO / "benchmarks",
        capture_output=True,
        text=True,
        check=True,
    )
    assert 0 < float(child.stdout) < 200, child.stdout  # a bare interpreter: tens of MiB
    del ballast
