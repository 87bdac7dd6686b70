"""The serving image (Dockerfile.serve) against issue 23's targets, with one MiniLM-size model.

Builds the image as the container tests do (tests/container/images.py: on the stand-in for the slim
Python base, offline from wheels/, since neither python:3.12-slim nor PyPI can be reached from a
container here), serves the all-MiniLM-L6-v2 emotion classifier `make bench-serve` trains
(fixtures.train_model, kept in /tmp/byoc-bench-serve), and measures:
- environment: du of the image's /opt/byoc/venv (byoc and everything it serves with);
- image: its size as `docker image inspect` reports it;
- first answer: from just before `docker run -d` to the first 200 from /invocations, polled every
  10 ms; the median and the slowest of --starts starts;
- memory: the server's resident memory (VmRSS of PID 1, byoc itself: the entry point execs it) once
  it has answered, after --seconds of --per-request-sentence requests at --concurrency (VmRSS and its
  peak, VmHWM), and after one request of --large tweets (as batch transform or asynchronous inference
  send: its seconds too); the container's memory as `docker stats` counts it (what a memory limit
  applies to).
--cpus and --memory pass the same options to `docker run` (--memory 1024m: the smallest serverless size).

    .venv/bin/python benchmarks/bench_serve_image.py [--json benchmarks/results/serve-image.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import harness  # (benchmarks/: every results file with its provenance)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests" / "container"))
import fixtures  # noqa: E402  (the shared models and data)
import images  # noqa: E402
import servers  # noqa: E402  (byoc serve started, the load generator, memory)

TARGETS = {"environment_mb": 400, "image_mb": 700, "first_answer_s": 1.5, "rss_mb": 250}


def docker(*args: str) -> str:
    return images.docker(*args, timeout=600).stdout.strip()


def environment_mb(image: str) -> float:
    return int(docker("run", "--rm", "--entrypoint", "du", image, "-sk", "/opt/byoc/venv").split()[0]) / 1024


def _answers(port: int, body: bytes) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/invocations", body, {"Content-Type": "application/json"})
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):  # not listening yet (docker's proxy accepts, then resets)
        return False


def start(image: str, model: Path, port: int, options: list[str]) -> tuple[str, float]:
    """A serving container on `port`; (its name, seconds from `docker run` to its first answer)."""
    name = f"byoc-bench-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"inputs": ["i feel wonderful today"]}).encode()
    started = time.monotonic()
    docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8080", "-v", f"{model}:/opt/ml/model", *options, image)
    while not _answers(port, body):
        if time.monotonic() - started > 120:
            raise RuntimeError(f"no answer in 120 s: {images.docker('logs', name, check=False).stderr[-2000:]}")
        time.sleep(0.01)
    return name, time.monotonic() - started


def stop(name: str) -> None:
    images.docker("rm", "-f", name, check=False)


def memory(name: str) -> dict[str, float]:
    """The server's VmRSS and VmHWM, and the container's memory as `docker stats` counts it, in MB."""
    status = dict(line.split(":", 1) for line in docker("exec", name, "cat", "/proc/1/status").splitlines())
    kib = lambda key: int(status[key].split()[0]) / 1024
    used = docker("stats", "--no-stream", "--format", "{{.MemUsage}}", name).split("/")[0].strip()
    units = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024, "B": 1 / 2**20}
    unit = next(u for u in units if used.endswith(u))
    return {
        "rss_mb": kib("VmRSS"),
        "peak_rss_mb": kib("VmHWM"),
        "docker_stats_mb": float(used[: -len(unit)]) * units[unit],
    }


def large_request(port: int, texts: list[str], count: int) -> dict:
    """One request of `count` texts (the test tweets, cycled): seconds to its answer, and its size."""
    body = json.dumps({"inputs": [texts[i % len(texts)] for i in range(count)]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    started = time.monotonic()
    conn.request("POST", "/invocations", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return {"inputs": count, "body_bytes": len(body), "status": response.status, "seconds": time.monotonic() - started}


def measure(image: str, model: Path, args: argparse.Namespace) -> dict:
    options = [f"--cpus={args.cpus}"] if args.cpus else []
    options += [f"--memory={args.memory}"] if args.memory else []
    firsts = []
    for _ in range(args.starts):
        name, seconds = start(image, model, servers.free_port(), options)
        firsts.append(seconds)
        stop(name)
    port = servers.free_port()
    queue = max(args.large, 16384)  # BYOC_MAX_INPUTS_PER_REQUEST may not exceed BYOC_MAX_QUEUED_INPUTS
    limits = [f"--env=BYOC_MAX_INPUTS_PER_REQUEST={args.large}", f"--env=BYOC_MAX_QUEUED_INPUTS={queue}"]
    name, seconds = start(image, model, port, [*options, *limits, "--env=SAGEMAKER_MODEL_SERVER_TIMEOUT=900"])
    texts = fixtures.sentences()
    try:
        loaded = memory(name)
        load = servers.run_load(port, texts, args.per_request, args.concurrency, warmup=2, seconds=args.seconds)
        after = memory(name)
        large = large_request(port, texts, args.large)
        after_large = memory(name)
    finally:
        stop(name)
    return {
        "first_answer_s": {"median": statistics.median(firsts), "max": max(firsts), "all": firsts},
        "memory_once_answered": loaded,
        "memory_after_load": after,
        "load": {"sentences_per_request": args.per_request, "concurrency": args.concurrency, **load},
        "large_request": large,
        "memory_after_large_request": after_large,
        "docker_run_options": options,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="cold starts timed (default 5)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds of load before the memory is read")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in the load phase (default 8)")
    parser.add_argument("--per-request", type=int, default=16, help="sentences a request in the load phase")
    parser.add_argument("--large", type=int, default=16384, help="tweets in the one large request (default 16384)")
    parser.add_argument("--cpus", help="docker run --cpus")
    parser.add_argument("--memory", help="docker run --memory (e.g. 1024m)")
    parser.add_argument("--no-build", action="store_true", help="measure the image as it is")
    parser.add_argument("--json", type=Path, help="write the results here")
    harness.add_rounds(parser)
    args = parser.parse_args()
    if error := images.engine_error():
        sys.exit(error)
    if fixtures.EMOTION is None:
        sys.exit("the emotion dataset is missing (fixtures.EMOTION): see docs/benchmarks.md")
    build = {} if args.no_build else images.build_serve()
    model = fixtures.train_model()
    results = {
        "image": images.SERVE,
        "base": images.SLIM_BASE,
        "model": str(model),
        "build_s": build,
        "environment_mb": environment_mb(images.SERVE),
        "image_mb": images.size_mb(images.SERVE),
        "base_mb": images.size_mb(images.SLIM_BASE),
        "rounds": args.rounds,
        # One scenario (the image: cold starts, load, a large request), repeated over rounds.
        **harness.scenarios({"image": lambda: measure(images.SERVE, model, args)}, args.rounds)["image"],
    }
    report(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        harness.write_results(args.json, results)
    return 0


def report(results: dict) -> None:
    got = {
        "environment_mb": results["environment_mb"],
        "image_mb": results["image_mb"],
        "first_answer_s": results["first_answer_s"]["max"],
        "rss_mb": results["memory_after_load"]["rss_mb"],
    }
    for key, value in got.items():
        print(f"{key:16} {value:8.2f}  (target {TARGETS[key]}: {'met' if value <= TARGETS[key] else 'MISSED'})")
    load, large = results["load"], results["large_request"]
    print(
        f"load: {load['sentences_per_request']} sentences a request at concurrency {load['concurrency']}: "
        f"{load['sentences_per_second']:.0f} sentences/s, p50 {load['p50_ms']:.0f} ms, {load['errors']} errors"
    )
    print(f"large request: {large['inputs']} tweets ({large['body_bytes'] / 1e6:.1f} MB) in {large['seconds']:.1f} s")
    shown = ("first_answer_s", "memory_once_answered", "memory_after_load", "memory_after_large_request")
    print(json.dumps({k: results[k] for k in shown}))


if __name__ == "__main__":
    sys.exit(main())
