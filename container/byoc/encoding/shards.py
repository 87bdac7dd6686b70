"""How a corpus is cut among ranks and hosts: each file into shards of `shard_size` documents, in order, each
shard encoded by exactly one rank and written as one Parquet file, named for its file and place so that every
host and every restart names it the same.

Ranks: `processes_per_host` on each host. Where the corpus channel is `FullyReplicated` every host sees every
file and the shards are dealt among all hosts' ranks; where it is `ShardedByS3Key`, SageMaker gave each host
files of its own, and the shards are dealt among that host's ranks only.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from byoc.encoding import corpus
from byoc.encoding.corpus import Fields
from byoc.encoding.settings import EncodeError, EncodeSettings

logger = logging.getLogger(__name__)

SHOWN_DUPLICATES = 5


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    source: str  # its path in the channel ("parts/part-0.jsonl")
    name: str  # as shard names hold it ("parts__part-0")
    fields: Fields
    documents: int
    digest: str  # of its ids in order: a restart over a file edited or reordered is told apart


@dataclass(frozen=True)
class Shard:
    file: CorpusFile
    index: int  # the shard's place in its file: documents index*shard_size onwards
    documents: int

    @property
    def name(self) -> str:
        return f"{self.file.name}-{self.index:05d}.parquet"


@dataclass(frozen=True)
class Ranks:
    """This host's ranks among all of the job's (`first` .. `first + per_host - 1` of `world`)."""

    per_host: int
    first: int
    world: int

    @classmethod
    def of(cls, per_host: int, hosts: list[str], current_host: str, sharded: bool) -> Ranks:
        if sharded or len(hosts) == 1:
            return cls(per_host, 0, per_host)
        return cls(per_host, hosts.index(current_host) * per_host, per_host * len(hosts))


def read_corpus(
    folder: Path, settings: EncodeSettings, may_be_empty: bool = False, between: Callable[[], None] = lambda: None
) -> list[CorpusFile]:
    """The channel's files, each with its fields and document count, after checking every id is there and
    none is given twice (EncodeError naming the duplicates and their files). `between` runs between two files
    (a stop asked for ends the reading there)."""
    files, hashes = [], []
    for path in corpus.corpus_files(folder, may_be_empty):
        between()
        source = path.relative_to(folder).as_posix()
        fields = corpus.fields_of(path, settings)
        if fields is None:
            logger.info("%s holds no document: nothing to encode in it", source)
            continue
        count, found = corpus.id_hashes(path, fields)
        stem = source[: -len(path.suffix)] if path.suffix else source
        digest = hashlib.sha256(found.tobytes()).hexdigest()[:16]
        files.append(CorpusFile(path, source, stem.replace("/", "__"), fields, count, digest))
        hashes.append(found)
    _check_names(files)
    every = hashes[0] if len(hashes) == 1 else np.concatenate([np.zeros(0, np.uint64), *hashes])
    hashes.clear()
    every.sort()  # (in place: 8 bytes a document in all, and a byte for the comparison below)
    same = every[1:] == every[:-1]
    if same.any():
        repeated = _duplicates(files, set(every[1:][same].tolist()))
        if repeated:  # (else two ids shared a 64-bit hash: nothing is repeated)
            raise EncodeError(repeated)
    return files


def _check_names(files: list[CorpusFile]) -> None:
    """Two files whose shards would share names ("part.jsonl" and "part.csv"; "a/b.jsonl" and "a__b.jsonl")."""
    seen: dict[str, str] = {}
    for file in files:
        if file.name in seen:
            raise EncodeError(
                f"the corpus files {seen[file.name]} and {file.source} would write shards of one name "
                f"({file.name}-NNNNN.parquet): rename one of them"
            )
        seen[file.name] = file.source


def plan(files: Iterable[CorpusFile], shard_size: int) -> list[Shard]:
    """Every shard of the corpus, in order (file by file)."""
    out = []
    for file in files:
        for index, start in enumerate(range(0, file.documents, shard_size)):
            out.append(Shard(file, index, min(shard_size, file.documents - start)))
    return out


def owned(shards: list[Shard], rank: int, world: int) -> list[Shard]:
    """The shards `rank` of `world` encodes: every world-th, from its own place."""
    return [shard for number, shard in enumerate(shards) if number % world == rank]


def _duplicates(files: list[CorpusFile], wanted: set[int]) -> str | None:
    """The message for ids given twice: the first few, with where each is (read again: only now are ids held)."""
    seen: dict[str, list[str]] = {}
    for file in files:
        for doc_id, _ in corpus.documents(file.path, file.fields):
            if corpus.id_hash(doc_id) in wanted:
                seen.setdefault(doc_id, []).append(file.source)
    repeated = {doc_id: where for doc_id, where in seen.items() if len(where) > 1}
    if not repeated:
        return None
    shown = "; ".join(f"{doc_id!r} ({', '.join(where)})" for doc_id, where in list(repeated.items())[:SHOWN_DUPLICATES])
    more = f" and {len(repeated) - SHOWN_DUPLICATES} more" if len(repeated) > SHOWN_DUPLICATES else ""
    return (
        f"{len(repeated)} document id(s) appear more than once in the corpus: {shown}{more}. Each document needs an id "
        "of its own (the index is keyed by it): remove the repeated rows or give them ids of their own"
    )
