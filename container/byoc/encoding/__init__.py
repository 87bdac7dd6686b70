"""`byoc encode`: a corpus encoded into Parquet shards by a model folder `byoc serve` serves, on every rank of
every host, resumable. Its own room over serving's pipeline (the model loads and answers as byoc serve's does)
and the floor; it never imports training or launch.

    entry     the job: contract, settings, corpus check, ranks, manifest, failure
    settings  its hyperparameters (EncodeSettings)
    corpus    the corpus channel's files and fields, read as a stream
    shards    the corpus cut into shards and dealt among ranks and hosts
    encoder   one rank: the model loaded, its shards encoded, each written whole and checkpointed
    columns   answers as Parquet columns, by their kind
"""

import importlib.util


def unavailable() -> str | None:
    """Why `byoc encode` cannot run in this image (pyarrow, its Parquet writer, is missing: the serving image), or
    None. Asked before the room is imported: every module of it writes or reads Parquet."""
    if importlib.util.find_spec("pyarrow") is None:
        return (
            "byoc encode writes Parquet with pyarrow, which this image does not have (the serving image, "
            "Dockerfile.serve, only serves): encode with a full image, Dockerfile.gpu or Dockerfile.neuron"
        )
    return None


# For Estimator(metric_definitions=...): the rate and time left each rank logs (byoc.encoding.encoder.Progress).
METRIC_DEFINITIONS = [
    {"Name": "encode:documents_per_second", "Regex": r"documents_per_second=([0-9.]+)"},
    {"Name": "encode:eta_seconds", "Regex": r"eta_seconds=([0-9.]+)"},
]
