"""The batcher in process, with a fake model: many clients share it, and none can hurt the others
(a poisoned request, a wrong answer, a huge request, a full queue, a client that leaves)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from byoc.serving.execution import batching
from byoc.serving.execution.batching import Batcher, adaptive_delay
from byoc.serving.protocol.request_errors import InputError

WAIT = 120  # seconds, a hang guard: a request the batcher lost would wait forever; these tests fail instead


class Model:
    """Upper-cases its inputs; `poison` is an input fault, `none`/`dict`/`exit` are faults of the
    handler code, `block` waits for `gate`. Records the inputs of every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()

    def __call__(self, inputs, parameters, shape=None):
        self.calls.append(list(inputs))
        if "block" in inputs:
            assert self.gate.wait(WAIT)
        if "poison" in inputs:
            raise InputError("input 0 is poison")
        if "none" in inputs:
            return None
        if "dict" in inputs:
            return {"label": "x"}
        if "short" in inputs:
            return []
        if "exit" in inputs:
            raise SystemExit(3)
        time.sleep(0.001)
        return [f"{x.upper()}{parameters.get('suffix', '')}" for x in inputs]


def run(main, model: Model, **options):
    async def wrapper():
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(model, executor, **options)
            batcher.start()
            try:
                return await asyncio.wait_for(main(batcher), WAIT)
            finally:
                model.gate.set()
                await batcher.stop()

    return asyncio.run(wrapper())


async def outcome(batcher: Batcher, inputs, parameters=None):
    try:
        return await batcher.submit(inputs, parameters or {})
    except Exception as err:
        return err


def test_a_poisoned_request_fails_alone_with_its_own_error():
    """12 ordinary requests batched with one the model rejects: it used to fail all 13."""
    model = Model()

    async def main(batcher):
        requests = [[f"text {i}"] for i in range(6)] + [["poison"]] + [[f"text {i}"] for i in range(6, 12)]
        return await asyncio.gather(*(outcome(batcher, r) for r in requests))

    answers = run(main, model, max_batch=128, max_delay=0)
    assert len(model.calls[0]) == 13  # they were merged
    assert isinstance(answers[6], InputError) and "poison" in str(answers[6])
    assert answers[:6] + answers[7:] == [[f"TEXT {i}"] for i in range(12)]


@pytest.mark.parametrize("fault", ["none", "dict", "short", "exit"])
def test_a_wrong_answer_or_a_base_exception_fails_its_request_and_the_batcher_lives(fault):
    """A batchable predict_fn returning None, a dict or too few answers, or raising SystemExit, used to
    end the batching task: every later request waited for its timeout."""
    model = Model()

    async def main(batcher):
        first = await asyncio.gather(outcome(batcher, ["a"]), outcome(batcher, [fault]), outcome(batcher, ["b"]))
        later = await outcome(batcher, ["c", "d"])
        return first, later, batcher.alive

    (a, bad, b), later, alive = run(main, model, max_batch=8, max_delay=0)
    assert (a, b, later, alive) == (["A"], ["B"], ["C", "D"], True)
    assert isinstance(bad, RuntimeError) and not isinstance(bad, InputError)  # the handler's fault: a 500
    if fault == "exit":
        assert "SystemExit" in str(bad)


def test_answers_that_say_their_kind_keep_it_request_by_request():
    """A merged batch's answers are split back into requests: each keeps the kind the predict_fn gave them, so
    output_fn writes them by kind (byoc.serving.protocol.outputs), not by guessing from their contents."""
    from byoc.serving.protocol.outputs import Answers
    from byoc.tasks.kinds import Kind

    def entities(inputs, parameters, shape=None):
        return Answers([[] for _ in inputs], Kind.ENTITIES)  # (no entity in any of them)

    async def main(batcher):
        return await asyncio.gather(outcome(batcher, ["a", "b"]), outcome(batcher, ["c"]))

    async def wrapper():
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(entities, executor, max_batch=8, max_delay=0.01)
            batcher.start()
            try:
                return await asyncio.wait_for(main(batcher), WAIT)
            finally:
                await batcher.stop()

    first, second = asyncio.run(wrapper())
    assert (first, second) == ([[], []], [[]])
    assert first.kind == second.kind == Kind.ENTITIES


def test_a_big_request_cannot_hold_small_ones_behind_it():
    """Chunks of different requests take turns: a small request waits for one chunk of the big one,
    not for all 100 of them."""
    model = Model()

    async def main(batcher):
        big = asyncio.ensure_future(batcher.submit([f"b{i}" for i in range(400)], {}))
        while not model.calls:
            await asyncio.sleep(0.001)
        calls_before = len(model.calls)  # the last one is running (or the next one just handed to the thread)
        small = await batcher.submit(["small"], {})
        return calls_before, small, big.done(), await big

    calls_before, small, big_done_first, big = run(main, model, max_batch=4, max_delay=0)
    assert small == ["SMALL"] and not big_done_first and big == [f"B{i}" for i in range(400)]
    # After the running chunk (and one handed to the thread but not started), the big request's next chunk
    # (it was waiting first), then the small one: not behind the ~100 chunks of the big request.
    assert next(n for n, call in enumerate(model.calls) if "small" in call) <= calls_before + 2 < 10


def test_the_queue_is_bounded():
    model = Model()

    async def main(batcher):
        running = asyncio.ensure_future(batcher.submit(["block"], {}))  # holds the inference thread
        while not model.calls:
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(batcher.submit(list("abcdef"), {}))
        await asyncio.sleep(0)
        refused = await outcome(batcher, list("ghijk"))  # 6 + 5 > 10
        fits = asyncio.ensure_future(batcher.submit(list("ghij"), {}))  # 6 + 4 = 10
        await asyncio.sleep(0)
        queued = batcher.queued
        model.gate.set()
        return refused, queued, await running, await waiting, await fits

    refused, queued, *answers = run(main, model, max_batch=128, max_delay=0, max_queued=10)
    assert type(refused).__name__ == "QueueFull" and queued == 10
    assert answers == [["BLOCK"], list("ABCDEF"), list("GHIJ")]


def test_a_request_that_leaves_gives_back_its_place():
    """A request that times out (or whose client leaves) is dropped: its inputs never run."""
    model = Model()

    async def main(batcher):
        running = asyncio.ensure_future(batcher.submit(["block"], {}))
        while not model.calls:
            await asyncio.sleep(0.001)
        leaving = asyncio.ensure_future(batcher.submit([f"gone{i}" for i in range(8)], {}))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        queued = batcher.queued
        model.gate.set()
        return queued, await running, await batcher.submit(list("abcdefghij"), {})

    queued, running, after = run(main, model, max_batch=4, max_delay=0, max_queued=10)
    assert queued == 0 and running == ["BLOCK"] and after == list("ABCDEFGHIJ")
    assert not any(x.startswith("gone") for call in model.calls for x in call)


def test_requests_merge_only_with_equal_parameters():
    model = Model()

    async def main(batcher):
        return await asyncio.gather(
            outcome(batcher, ["a"], {"suffix": "!"}),
            outcome(batcher, ["b"], {"suffix": "?"}),
            outcome(batcher, ["c"], {"suffix": "!"}),
            outcome(batcher, ["d"], {1: "unsortable", "suffix": "."}),
        )

    answers = run(main, model, max_batch=128, max_delay=0)
    assert answers == [["A!"], ["B?"], ["C!"], ["D."]]
    assert sorted(map(sorted, model.calls)) == [["a", "c"], ["b"], ["d"]]


def test_ordinary_batching_is_unchanged():
    """Small requests that arrive together share one call; a big one alone is cut into max_batch chunks."""
    model = Model()

    async def main(batcher):
        small = await asyncio.gather(*(batcher.submit([f"r{i}-{k}" for k in range(16)], {}) for i in range(8)))
        big = await batcher.submit([f"x{i}" for i in range(150)], {})
        return small, big

    small, big = run(main, model, max_batch=32, max_delay=0)
    assert small == [[f"R{i}-{k}" for k in range(16)] for i in range(8)]
    assert big == [f"X{i}" for i in range(150)]
    assert [len(call) for call in model.calls] == [32] * 4 + [32] * 4 + [22]


def test_a_dead_batcher_fails_its_requests_at_once_and_says_so():
    """If the batching task ends other than by stop() (a bug in byoc), its requests fail at once
    instead of waiting for their timeout, later ones are refused, and the server is told."""
    model, deaths = Model(), []

    async def main(batcher):
        running = asyncio.ensure_future(outcome(batcher, ["block"]))
        while not model.calls:
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(outcome(batcher, ["later"]))
        await asyncio.sleep(0)
        batcher.task.cancel()
        answers = await asyncio.gather(running, waiting)
        return answers, batcher.alive, await outcome(batcher, ["after"])

    answers, alive, after = run(main, model, max_batch=8, max_delay=0, on_death=deaths.append)
    assert [type(a).__name__ for a in answers + [after]] == ["BatcherStopped"] * 3
    assert not alive and deaths == ["the batching task ended"]


class Watcher:
    """An observer (byoc.serving.prometheus.ModelMetrics' side of the batcher), recording what it is told."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.runs: list[int] = []
        self.depths: list[int] = []

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def ran(self, inputs: int, seconds: float) -> None:
        assert seconds >= 0
        self.runs.append(inputs)

    def queued(self, inputs: int) -> None:
        self.depths.append(inputs)


def test_the_observer_hears_each_wait_each_call_and_the_queue_depth():
    """One wait per request (its first chunk's), one call per predict with its inputs, and the queue
    depth as it grows and drains, ending at 0: what /metrics reports."""
    model, watcher = Model(), Watcher()

    async def main(batcher):
        blocker = asyncio.ensure_future(batcher.submit(["block"], {}))
        while not model.calls:
            await asyncio.sleep(0.001)
        waiting = [
            asyncio.ensure_future(batcher.submit(list("abc"), {})),
            asyncio.ensure_future(batcher.submit(["d"], {})),
        ]
        while batcher.queued < 4:
            await asyncio.sleep(0.001)
        model.gate.set()
        return await asyncio.gather(blocker, *waiting)

    assert run(main, model, max_batch=8, observer=watcher) == [["BLOCK"], ["A", "B", "C"], ["D"]]
    assert len(watcher.waits) == 3 and all(w >= 0 for w in watcher.waits)
    assert watcher.runs == [1, 4]  # the blocker alone, then the two waiting requests merged
    assert max(watcher.depths) == 4 and watcher.depths[-1] == 0


def test_the_adaptive_wait_is_a_share_of_the_last_batch_only_under_concurrent_load():
    assert adaptive_delay(1, 10.0) == 0  # a lone client never waits
    assert adaptive_delay(0, 0.0) == 0  # the first batch
    assert adaptive_delay(4, 0.002) == 0  # 0.6 ms: too short to catch a client's next request
    assert adaptive_delay(4, 0.010) == pytest.approx(0.003)
    assert adaptive_delay(8, 0.250) == batching.WAIT_MAX


@pytest.fixture
def long_waits(monkeypatch):
    """An adaptive wait of 600 s after any merged batch: whether the batcher waits shows in which
    requests share a call, never in how long anything took."""
    monkeypatch.setattr(batching, "WAIT_SHARE", 1e9)
    monkeypatch.setattr(batching, "WAIT_MAX", 600.0)


async def _taken(batcher: Batcher) -> None:
    """Until the batcher has taken every queued input into the batch it is forming (it then waits
    for more, or has handed the batch to the model)."""
    while batcher.queued or batcher.waiting:
        await asyncio.sleep(0.001)


def test_after_a_merged_batch_a_short_batch_waits_for_the_next_request(long_waits):
    """Closed-loop clients: two requests shared the last call, so the next lone request waits for
    another to share its call (the batch fills at max_batch=2 and runs at once)."""
    model = Model()

    async def main(batcher):
        first = await asyncio.gather(batcher.submit(["a"], {}), batcher.submit(["b"], {}))
        c = asyncio.ensure_future(batcher.submit(["c"], {}))
        await asyncio.sleep(0)  # c's task runs to its wait: c is queued
        await _taken(batcher)  # c is held for company, not run alone
        d = await batcher.submit(["d"], {})
        return first, await c, d

    assert run(main, model, max_batch=2) == ([["A"], ["B"]], ["C"], ["D"])
    assert model.calls == [["a", "b"], ["c", "d"]]


def test_after_a_merged_batch_the_next_waits_only_until_the_clients_in_flight_are_back(long_waits):
    """Closed-loop clients: the batch [block, b] ended with c waiting, so 3 requests were in flight.
    The next batch holds c for company until it has 3 requests, then runs at once: neither the
    window (600 s) nor a full batch (max_batch=100) is waited for."""
    model = Model()

    async def main(batcher):
        running = [asyncio.ensure_future(batcher.submit([x], {})) for x in ("block", "b")]
        while not model.calls:  # [block, b] is in the model, blocked
            await asyncio.sleep(0.001)
        c = asyncio.ensure_future(batcher.submit(["c"], {}))
        while not batcher.waiting:
            await asyncio.sleep(0.001)
        model.gate.set()
        await asyncio.gather(*running)
        await _taken(batcher)  # c is held: 1 of the 3
        d = asyncio.ensure_future(batcher.submit(["d"], {}))
        await asyncio.sleep(0)
        await _taken(batcher)  # c and d are held: 2 of the 3
        e = await batcher.submit(["e"], {})
        return await c, await d, e

    assert run(main, model, max_batch=100) == (["C"], ["D"], ["E"])
    assert model.calls == [["block", "b"], ["c", "d", "e"]]


def test_a_lone_client_never_waits_and_a_set_delay_of_zero_never_waits(long_waits):
    model = Model()

    async def lone(batcher):  # one request at a time: each runs at once (else 600 s: WAIT fails the test)
        return [await batcher.submit([x], {}) for x in "abc"]

    assert run(lone, model, max_batch=2) == [["A"], ["B"], ["C"]]

    async def merged_then_lone(batcher):
        await asyncio.gather(batcher.submit(["a"], {}), batcher.submit(["b"], {}))
        return await batcher.submit(["c"], {})

    model = Model()
    assert run(merged_then_lone, model, max_batch=2, max_delay=0) == ["C"]
    assert model.calls == [["a", "b"], ["c"]]
