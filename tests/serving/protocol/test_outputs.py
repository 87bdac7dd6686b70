"""byoc.serving.protocol.outputs: an answer written by its kind, whatever task gave it, each writer writing the kinds
its table says; a plain list's kind read from its contents (a predict_fn of code that says none); the numbers an
answer holds counted from what will be written."""

from __future__ import annotations

import pytest

from byoc.serving import default_pipeline
from byoc.serving.protocol.outputs import (
    WRITERS,
    Answers,
    Embedded,
    cells,
    cohere,
    csv_text,
    kind_of,
    read_kind,
    tei_predict,
)
from byoc.serving.protocol.request_errors import InvalidAnswer, NotAcceptable
from byoc.tasks.kinds import ROUTE_KINDS, Kind

ONE_OF_EACH = {
    Kind.LABELS: {"label": "joy", "score": 0.75},
    Kind.NUMBER: {"score": 2.5},
    Kind.ENTITIES: [{"entity_group": "LOC", "score": 0.9, "word": "Paris", "start": 0, "end": 5}],
    Kind.VECTOR: [0.5, -1.25],
    Kind.TOKEN_VECTORS: [[0.5, 0.25]],
    Kind.SPARSE_TERMS: [{"index": 3, "value": 0.5}],
    Kind.RELEVANCE: 0.25,
    Kind.OUTPUTS: {"dense": [0.5], "sparse": []},
}


def test_each_kind_that_fits_a_row_is_written_its_own_way():
    assert csv_text(Answers([[0.5, -1.25]], Kind.VECTOR)) == "0.5,-1.25\n"
    labels = Answers([{"label": "joy", "score": 0.75}, [{"label": "a", "score": 0.5}, {"label": "b", "score": 0.25}]])
    labels.kind = Kind.LABELS
    assert csv_text(labels) == "joy,0.750000\na,0.500000,b,0.250000\n"
    assert csv_text(Answers([[]], Kind.LABELS)) == '""\n'  # a multi-label input with no label: an empty field
    assert csv_text(Answers([{"score": 2.5}], Kind.NUMBER)) == "2.500000\n"
    assert csv_text(Answers([0.25, 0.5], Kind.RELEVANCE)) == "0.250000\n0.500000\n"  # (a pair's relevance)
    with pytest.raises(InvalidAnswer):
        csv_text(Answers([[float("nan")]], Kind.VECTOR))


@pytest.mark.parametrize(
    "kind, answer, named",
    [
        (Kind.ENTITIES, [], "entities"),
        (Kind.TOKEN_VECTORS, [[0.5, 0.25]], "token vectors"),
        (Kind.SPARSE_TERMS, [{"index": 3, "value": 0.5}], "sparse terms"),
        (Kind.OUTPUTS, {"dense": [0.5], "sparse": []}, "several outputs"),
    ],
)
def test_a_kind_no_csv_row_holds_is_refused_by_its_name(kind, answer, named):
    with pytest.raises(NotAcceptable, match=f"this answer \\({named}.*application/json"):
        default_pipeline.output_fn(Answers([answer], kind), "text/csv")


def test_a_token_classifiers_answer_without_entities_is_refused_as_with_them():
    """Read from its contents, an input without entities ([]) looked like a multi-label input without labels: the
    CSV answer was a 200 of empty lines when no input had an entity, a 406 when one had. By its kind: a 406 both."""
    with pytest.raises(NotAcceptable, match="entities"):
        default_pipeline.output_fn(Answers([[], []], Kind.ENTITIES), "text/csv")
    with_one = [[{"entity_group": "LOC", "score": 0.9, "word": "Paris", "start": 0, "end": 5}], []]
    with pytest.raises(NotAcceptable, match="entities"):
        default_pipeline.output_fn(Answers(with_one, Kind.ENTITIES), "text/csv")


def test_a_plain_lists_kind_is_read_from_each_answer():
    assert kind_of([[0.5]]) is None and kind_of(Answers([], Kind.VECTOR)) == Kind.VECTOR
    assert read_kind([0.5, 1]) == Kind.VECTOR
    assert read_kind({"label": "a", "score": 0.5}) == Kind.LABELS
    assert read_kind([{"index": 1, "score": 0.5}]) == Kind.RELEVANCE
    assert read_kind([{"entity_group": "LOC", "score": 0.9, "start": 0, "end": 5}]) == Kind.ENTITIES
    assert read_kind([{"index": 3, "value": 0.5}]) is None  # (no CSV row holds it)
    assert default_pipeline.output_fn([[0.5, 1.0], {"label": "a", "score": 0.5}], "text/csv") == (
        "0.5,1\na,0.500000\n",
        "text/csv",
    )
    with pytest.raises(NotAcceptable, match="entries without a score"):
        default_pipeline.output_fn([[{"index": 3, "value": 0.5}]], "text/csv")


@pytest.mark.parametrize("kind", list(Kind))
def test_csv_writes_exactly_the_kinds_its_table_names(kind):
    """The table is what the CSV writer reads: a kind it lists is written, any other refused by its name."""
    answers = Answers([ONE_OF_EACH[kind]], kind)
    if kind in WRITERS["csv"]:
        assert csv_text(answers).count("\n") == 1
    else:
        with pytest.raises(NotAcceptable, match=kind.described.split(" (")[0]):
            csv_text(answers)


def test_each_client_route_answers_the_kinds_its_writer_writes():
    assert ROUTE_KINDS["predict"] == WRITERS["tei_predict"]
    assert ROUTE_KINDS["v1/embeddings"] == WRITERS["openai"]
    assert set(WRITERS["json"]) == set(WRITERS["jsonlines"]) == set(Kind)
    assert all(set(kinds) <= set(Kind) for kinds in WRITERS.values())


def test_tei_predict_lists_each_inputs_labels_and_a_single_inputs_alone():
    labels = [{"label": "a", "score": 0.75}, {"label": "b", "score": 0.25}]
    assert tei_predict([labels], single=True) == labels
    assert tei_predict([labels, {"score": 2.5}], single=False) == [labels, [{"score": 2.5}]]  # (a number: one entry)


def test_cohere_answers_from_tei_s_rerank_list():
    ranked = [{"index": 1, "score": 0.9, "text": "b"}, {"index": 0, "score": 0.1, "text": "a"}]
    one = cohere(ranked, 1, True, "m")
    assert one["results"] == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
        {"index": 0, "relevance_score": 0.1, "document": {"text": "a"}},
    ]
    assert one["meta"]["api_version"] == {"version": "1"} and one["model"] == "m" and one["id"]
    two = cohere(ranked, 2, False, None)
    assert two["results"][0] == {"index": 1, "relevance_score": 0.9} and two["meta"]["api_version"]["version"] == "2"


# cells: Round six found it counted texts x the first text's width: a 324 MB multi-vector answer passed for
# small and was written on the event loop.


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
