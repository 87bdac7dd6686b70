"""byoc.tasks.kinds: every task says the kinds of answer it gives and which request asks for each; each client
route answers kinds, never a task by name."""

from __future__ import annotations

import pytest

from byoc import tasks
from byoc.serving.protocol import clients
from byoc.tasks.kinds import ROUTE_KINDS, Kind


def test_every_task_gives_kinds_of_the_closed_set_and_answers_its_first_by_default():
    for task in tasks.TASKS.values():
        assert task.head.kinds and all(isinstance(kind, Kind) for kind in task.head.kinds), task.name
        assert task.head.kind_of({}) == next(iter(task.head.kinds)), task.name
    kinds = {name: set(task.head.kinds) for name, task in tasks.TASKS.items()}
    assert kinds["embedding"] == {Kind.VECTOR} and kinds["token_classification"] == {Kind.ENTITIES}
    assert kinds["regression"] == {Kind.NUMBER} and kinds["single_label_classification"] == {Kind.LABELS}
    assert kinds["hybrid"] == {Kind.VECTOR, Kind.SPARSE_TERMS, Kind.TOKEN_VECTORS}


@pytest.mark.parametrize(
    "output, kind",
    [("dense", Kind.VECTOR), ("sparse", Kind.SPARSE_TERMS), ("colbert", Kind.TOKEN_VECTORS), (["dense"], Kind.OUTPUTS)],
)
def test_a_hybrid_models_answer_has_the_kind_its_output_asks_for(output, kind):
    assert tasks.TASKS["hybrid"].head.kind_of({"output": output}) == kind


def test_every_client_route_but_rerank_answers_kinds_and_every_kind_is_described():
    assert set(ROUTE_KINDS) == {*clients.TEI_FIELDS, "v1/embeddings"} - {clients.RERANK}
    assert all(kind.described for kind in Kind)
