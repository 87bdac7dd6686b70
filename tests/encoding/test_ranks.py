"""byoc.encoding.ranks: ranks as processes of their own; a rank that fails fails the job naming it and why."""

from __future__ import annotations

import pytest
import serve_helpers

from byoc.encoding import ranks, shards
from byoc.encoding.encoder import RankJob
from byoc.encoding.settings import EncodeError, EncodeSettings

pytestmark = pytest.mark.integration  # processes of their own


def test_a_rank_that_fails_fails_the_job_with_its_own_message(tmp_path_factory, tiny_model_dir, tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "c.jsonl").write_text("".join(f'{{"id": "{n}", "text": "t {n}"}}\n' for n in range(4)))
    every = shards.plan(shards.read_corpus(tmp_path / "corpus", EncodeSettings()), 2)
    classifier = serve_helpers.tiny_classifier(tmp_path_factory, tiny_model_dir)  # (answers labels: no vectors)
    jobs = [
        RankJob(EncodeSettings(), classifier, tuple(shards.owned(every, r, 2)), tmp_path / "state", tmp_path / "out", r)
        for r in range(2)
    ]
    (tmp_path / "state").mkdir()
    with pytest.raises(EncodeError, match=r"rank [01]: the model in tiny-classifier is a .*classifier"):
        ranks.run(jobs)


def test_a_rank_that_dies_is_named_with_its_signal():
    assert ranks._ended(3, -9) == "rank 3 was killed by SIGKILL (the kernel ends a process so when memory runs out)"
    assert ranks._ended(1, 2).startswith("rank 1 ended with exit code 2 without saying why")


def test_gpus_are_named_as_cuda_visible_devices_names_them(monkeypatch, tmp_path):
    class Dev:
        def __init__(self, *names):
            self.names = names

        def glob(self, pattern):
            return [tmp_path / n for n in self.names]

    monkeypatch.setattr(ranks, "Path", lambda _: Dev("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert ranks.gpu_ids() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert ranks.gpu_ids() == ["1"]
    monkeypatch.setattr(ranks, "Path", lambda _: Dev())
    assert ranks.gpu_ids() == []  # (no device: CUDA_VISIBLE_DEVICES names nothing there is)
