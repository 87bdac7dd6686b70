"""byoc.serving.protocol.outputs: an answer written by its kind, whatever task gave it; a plain list's kind read
from its contents (a predict_fn of code that says none)."""

from __future__ import annotations

import pytest

from byoc.serving import default_pipeline
from byoc.serving.protocol.outputs import Answers, csv_text, kind_of, read_kind
from byoc.serving.protocol.request_errors import InvalidAnswer, NotAcceptable
from byoc.tasks.kinds import Kind


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
