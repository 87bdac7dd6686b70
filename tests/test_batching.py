"""The batcher on its own: lanes run side by side, requests are split and merged, answers go home."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from byoc.batching import Batcher


class Recorder:
    """A predict function that records its calls and how many ran at the same time."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay, self.calls, self.running, self.most = delay, [], 0, 0
        self.lock = threading.Lock()

    def __call__(self, inputs, parameters):
        with self.lock:
            self.calls.append(list(inputs))
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
        return [f"{x}:{parameters.get('tag', '')}" for x in inputs]


def run(predict, lanes: int, requests: list[tuple[list, dict]], max_batch: int = 8) -> list:
    async def main():
        executor = ThreadPoolExecutor(lanes)
        batcher = Batcher(predict, executor, max_batch=max_batch, max_delay=0.0, lanes=lanes)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(inputs, params) for inputs, params in requests))
        finally:
            await batcher.stop()
            executor.shutdown()

    return asyncio.run(main())


def test_two_lanes_run_batches_side_by_side():
    predict = Recorder()
    requests = [([f"r{i}"], {}) for i in range(6)]
    answers = run(predict, 2, requests, max_batch=1)
    assert answers == [[f"r{i}:"] for i in range(6)]
    assert predict.most == 2


def test_one_lane_runs_one_batch_at_a_time():
    predict = Recorder(delay=0.01)
    run(predict, 1, [([f"r{i}"], {}) for i in range(6)], max_batch=1)
    assert predict.most == 1


def test_a_request_alone_is_split_across_the_lanes():
    predict = Recorder()
    texts = [f"t{i}" for i in range(6)]
    (answer,) = run(predict, 2, [(texts, {})], max_batch=64)
    assert answer == [f"{t}:" for t in texts]  # in order, whole
    assert sorted(len(c) for c in predict.calls) == [3, 3]
    assert predict.most == 2


def test_requests_are_merged_by_parameters_and_answered_in_order():
    predict = Recorder(delay=0.0)
    requests = [([f"a{i}", f"b{i}"], {"tag": i % 2}) for i in range(10)]
    answers = run(predict, 1, requests, max_batch=64)
    assert answers == [[f"a{i}:{i % 2}", f"b{i}:{i % 2}"] for i in range(10)]
    for call in predict.calls:  # never a batch mixing parameters
        assert len({int(x[1:]) % 2 for x in call}) == 1
