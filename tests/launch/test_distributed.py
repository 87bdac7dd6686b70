"""Distributed training on real processes: ranks on one host, hosts on loopback addresses,
sharded channels, and what happens when a rank or a host goes missing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (
    CPU_ONLY,
    DISTRIBUTED_HP,
    SIGTERM_GRACE_S,
    Job,
    build_job,
    free_port,
    losses,
    sentiment_rows,
    write_csv,
)
from helpers import start_train as _start_train

pytestmark = pytest.mark.integration  # real jobs in processes: not in make test-fast


def start_train(root: Path, env: dict | None = None):
    """Every job here means CPU ranks and CPU hosts (gloo), GPUs present or not."""
    return _start_train(root, {**CPU_ONLY, **(env or {})})


HP = DISTRIBUTED_HP  # every layer trains (a real learning signal to compare), no dropout (the default)
TWO_RANKS = {"BYOC_PROCESSES_PER_HOST": "2"}


def finish(proc: subprocess.Popen, timeout: int = 300) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.fixture(scope="module")
def two_rank_reference(tmp_path_factory, tiny_model_dir) -> Job:
    """An uninterrupted 2-process job, batch 4 per rank."""
    job = build_job(
        tmp_path_factory.mktemp("two-ranks") / "opt-ml", tiny_model_dir, {**HP, "per_device_train_batch_size": "4"}
    )
    code, log = finish(start_train(job.root, TWO_RANKS))
    assert code == 0, log[-3000:]
    return job


def test_two_ranks_train_the_same_model_as_one_with_twice_the_batch(tmp_path, tiny_model_dir, two_rank_reference):
    single = build_job(tmp_path / "opt-ml", tiny_model_dir, {**HP, "per_device_train_batch_size": "8"})
    code, log = finish(start_train(single.root))
    assert code == 0, log[-3000:]
    assert two_rank_reference.metrics["world_size"] == 2 and single.metrics["world_size"] == 1
    ours, theirs = losses(two_rank_reference), losses(single)
    assert set(ours) == set(theirs) == set(range(1, 161))
    # It learned something, so matching losses mean something. Over 20 seeds of the tiny model
    # (scripts/seed_margins.py) loss[160] / loss[1] was at worst 0.052 (torch 2.9 and 2.11).
    assert ours[160] < 0.5 * ours[1]
    for step in ours:
        assert ours[step] == pytest.approx(theirs[step], rel=1e-4, abs=1e-5), step


def test_sigterm_reaches_every_rank_and_the_job_resumes_exactly(tmp_path, tiny_model_dir, two_rank_reference):
    job = build_job(tmp_path / "opt-ml", tiny_model_dir, {**HP, "per_device_train_batch_size": "4"})
    proc = start_train(job.root, TWO_RANKS)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[metrics] step=20 " in line:
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            break
    code, rest = finish(proc)
    elapsed = time.monotonic() - sent
    log = "".join(lines) + rest
    assert code == 143, log[-3000:]
    assert elapsed < SIGTERM_GRACE_S, f"every rank saved and exited {elapsed:.0f} s after SIGTERM: past the grace"
    step = int(job.failure.split("at step ")[1].split()[0])
    assert job.failure.startswith(f"stopped by SIGTERM at step {step} of 160"), job.failure
    folder = job.root / "checkpoints" / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "byoc-complete.json"} <= {p.name for p in folder.iterdir()}
    assert not (job.model_dir / "model.safetensors").exists()

    (job.root / "output" / "failure").unlink()
    code, log = finish(start_train(job.root, TWO_RANKS))
    assert code == 0, log[-3000:]
    assert f"resuming from {folder}" in log
    ours, theirs = losses(job), losses(two_rank_reference)
    for s in range(step + 1, 161):
        assert ours[s] == pytest.approx(theirs[s], rel=1e-4, abs=1e-5), s


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def test_a_killed_rank_stops_the_job_with_its_name_and_exit_code(tmp_path, tiny_model_dir):
    job = build_job(
        tmp_path / "opt-ml", tiny_model_dir, {**HP, "per_device_train_batch_size": "4", "max_steps": "100000"}
    )
    proc = start_train(job.root, TWO_RANKS)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "[metrics] step=20 " in line:
            break
    victim = next(pid for pid in _children(proc.pid) if _rank_of(pid) == 1)
    os.kill(victim, signal.SIGKILL)
    code, rest = finish(proc)  # the surviving rank is stopped, not left waiting for its peer
    assert code == 137, ("".join(lines) + rest)[-3000:]
    assert job.failure.startswith("rank 1 on algo-1 failed: the process was killed by SIGKILL"), job.failure
    assert not (job.model_dir / "model.safetensors").exists()


def _host_job(root: Path, model: Path, me: str, hosts: list[str], rows: list[tuple[str, str]], sharded: bool) -> Job:
    job = Job(root).resources(current=me, hosts=hosts, interface="lo")
    job.hyperparameters({**HP, "max_steps": "30", "per_device_train_batch_size": "4"})
    job.model_channel(model)
    write_csv(job.channel("train", distribution="ShardedByS3Key" if sharded else "FullyReplicated") / "t.csv", rows)
    return job


HOSTS = ["127.0.0.1", "127.0.0.2"]  # two loopback addresses: two "instances" on this machine


def test_two_hosts_with_sharded_data_form_one_job(tmp_path, tiny_model_dir):
    """Each host trains on its own shard (different sizes, a label only one host has); rank 0 writes the model."""
    neutral = [(f"it is a table number {i}", "neutral") for i in range(8)]
    shards = {HOSTS[0]: sentiment_rows(48), HOSTS[1]: sentiment_rows(24) + neutral}
    env = {"BYOC_MASTER_PORT": str(free_port()), "BYOC_HOSTS_TIMEOUT": "60"}
    jobs = {h: _host_job(tmp_path / h / "opt-ml", tiny_model_dir, h, HOSTS, shards[h], sharded=True) for h in HOSTS}
    procs = {h: start_train(jobs[h].root, env) for h in HOSTS}
    results = {h: finish(p) for h, p in procs.items()}
    for host, (code, log) in results.items():
        assert code == 0, f"{host}: {log[-3000:]}"
    first, second = jobs[HOSTS[0]], jobs[HOSTS[1]]
    assert (first.model_dir / "model.safetensors").exists()
    assert not (second.model_dir / "model.safetensors").exists()  # rank 0 alone writes model/ and output/
    assert not (second.root / "output" / "data" / "metrics.json").exists()
    assert first.metrics["world_size"] == 2
    assert first.metrics["labels"] == ["negative", "neutral", "positive"]  # the union of both shards
    log = results[HOSTS[0]][1]
    assert "trains on its own shard (32 rows used; shards hold [32, 48])" in log
    assert len(losses(first)) == 30


def test_a_failing_host_fails_the_whole_job(tmp_path, tiny_model_dir):
    env = {"BYOC_MASTER_PORT": str(free_port()), "BYOC_HOSTS_TIMEOUT": "60"}
    good = _host_job(tmp_path / "a" / "opt-ml", tiny_model_dir, HOSTS[0], HOSTS, sentiment_rows(32), sharded=True)
    bad = _host_job(tmp_path / "b" / "opt-ml", tiny_model_dir, HOSTS[1], HOSTS, [], sharded=True)
    write_csv(bad.channel("train", distribution="ShardedByS3Key") / "t.csv", [("only text",)], header=("text",))
    procs = [start_train(j.root, env) for j in (good, bad)]
    codes = [finish(p)[0] for p in procs]
    assert codes[0] != 0 and codes[1] == 1
    assert bad.failure.startswith(f"rank 1 on {HOSTS[1]} failed:") and "label" in bad.failure, bad.failure
    # The good host fails with its peer, not after waiting out BYOC_HOSTS_TIMEOUT for it.
    assert good.failure.startswith("rank 0 on") and "did not all join" not in good.failure, good.failure


def test_a_host_that_never_appears_fails_clearly(tmp_path, tiny_model_dir):
    job = _host_job(
        tmp_path / "opt-ml",
        tiny_model_dir,
        "127.0.0.1",
        ["127.0.0.1", "algo-9.invalid"],
        sentiment_rows(16),
        sharded=False,
    )
    code, log = finish(start_train(job.root, {"BYOC_HOSTS_TIMEOUT": "3"}))
    assert code == 1, log[-2000:]
    assert job.failure.startswith("host(s) algo-9.invalid did not resolve within 3 s"), job.failure


def test_a_host_that_resolves_but_never_joins_fails_clearly(tmp_path, tiny_model_dir):
    job = _host_job(tmp_path / "opt-ml", tiny_model_dir, HOSTS[0], HOSTS, sentiment_rows(16), sharded=False)
    env = {"BYOC_HOSTS_TIMEOUT": "5", "BYOC_MASTER_PORT": str(free_port())}
    code, log = finish(start_train(job.root, env))
    assert code == 1, log[-2000:]
    assert "did not all join within 5 s" in job.failure, job.failure  # it gave up at its timeout
