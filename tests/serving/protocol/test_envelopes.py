"""byoc.serving.protocol.envelopes.cells: the numbers an answer holds, counted from what will be written (each
input's own answer), which decides whether the answer is written on the event loop and whether it is over the
server's limit. Round six found it counted texts x the first text's width: a 324 MB multi-vector answer passed
for small and was written on the event loop."""

from __future__ import annotations

from byoc.serving.protocol.envelopes import Embedded, cells


def test_token_vectors_count_every_text_s_own_tokens():
    short, long = [[0.1] * 128] * 2, [[0.2] * 128] * 500
    assert cells([short, long]) == (2 + 500) * 128  # (the first text's width alone: 2 x 2)
    assert cells([long] * 240) == 240 * 500 * 128


def test_a_hybrid_model_s_outputs_count_each_output():
    text = {"dense": [0.1] * 1024, "colbert": [[0.1] * 1024] * 40, "sparse": [{"index": 1, "value": 0.2}] * 30}
    assert cells([text, text]) == 2 * (1024 + 40 * 1024 + 30 * 2)


def test_vectors_labels_and_envelopes():
    assert cells([[0.1] * 384] * 10) == 3840
    assert cells([{"label": "a", "score": 0.5}] * 3) == 6
    assert cells([[{"label": "a", "score": 0.5}] * 1000] * 800) == 800 * 1000 * 2  # every label of every text
    assert cells({"data": [{"embedding": [0.1] * 384, "index": 0}] * 4}) == 4 * 385
    assert cells([Embedded([0.1] * 384, 3)] * 2) == 768
    assert cells(0.5) == 1 and cells([]) == 1
