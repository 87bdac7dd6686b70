"""What an answer is, whatever task gave it: the closed set of output kinds on the wire.

A task's head says which kinds it answers and which request parameters ask for each (`Head.kinds`), and which
kind a request's answer has (`Head.kind_of`); the server writes an answer by its kind
(byoc.serving.protocol.outputs: CSV rows, the client routes' answers), never by the task's name, and maps each
client route to the kinds it answers (`ROUTE_KINDS`). A user's own predict_fn may say its answer's kind too
(byoc.serving.protocol.outputs.Answers).
"""

from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    """One input's answer, as it goes on the wire."""

    LABELS = "labels"  # {"label", "score"}, or a list of them (top_k, a multi-label model's labels)
    NUMBER = "number"  # {"score": value}: a regression model's value, a pair's score
    ENTITIES = "entities"  # a token classifier's entities: [{"entity_group", "score", "word", "start", "end"}]
    VECTOR = "vector"  # a list of floats: a text's embedding
    TOKEN_VECTORS = "token_vectors"  # a vector a token: a multi-vector model's
    SPARSE_TERMS = "sparse_terms"  # [{"index", "value"(, "token")}]: a sparse model's active terms
    RELEVANCE = "relevance"  # a pair's relevance, a number (a rerank body's entries: {"index", "score"})
    OUTPUTS = "outputs"  # several of the above a text, each under its name (a hybrid model asked for several)

    @property
    def described(self) -> str:
        return _DESCRIBED[self]


_DESCRIBED = {
    Kind.LABELS: "labels with their scores",
    Kind.NUMBER: "a number",
    Kind.ENTITIES: "entities (a token classifier's, with their offsets, several an input)",
    Kind.VECTOR: "a vector",
    Kind.TOKEN_VECTORS: "token vectors (a vector a token)",
    Kind.SPARSE_TERMS: "sparse terms (a sparse embedding's)",
    Kind.RELEVANCE: "relevance scores",
    Kind.OUTPUTS: "several outputs a text, by name",
}

# Each client route and the kinds it answers, in the order a model's kinds are tried (TEI's /predict answers
# a classifier's labels, or a regression model's number as TEI's one-score list).
ROUTE_KINDS: dict[str, tuple[Kind, ...]] = {
    "embed": (Kind.VECTOR,),
    "embed_sparse": (Kind.SPARSE_TERMS,),
    "embed_all": (Kind.TOKEN_VECTORS,),
    "predict": (Kind.LABELS, Kind.NUMBER),
    "v1/embeddings": (Kind.VECTOR,),
}
