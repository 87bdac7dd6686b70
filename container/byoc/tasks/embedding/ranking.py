"""Rank metrics of an embedding model's evaluation rows (each query's own document the one relevant), as
sentence-transformers' InformationRetrievalEvaluator computes them: shared by the families that rank rows."""

from __future__ import annotations

import numpy as np


def retrieval_metrics(queries: np.ndarray, documents: np.ndarray, block: int = 1024) -> dict[str, float]:
    """Row i's query against every row's document, its own the one relevant: MRR@10, NDCG@10, recall@1 and
    @10, as sentence-transformers' InformationRetrievalEvaluator computes them with one relevant document a
    query and the rows' positions here as its corpus ids: its cosine (torch's, as its `cos_sim`; numpy's
    matrix product can score two identical documents apart), documents by score, ties by corpus id. So a
    document scoring exactly as the relevant one ranks before it when it is an earlier row: of texts
    identical after truncation only one is a hit at rank 1, not every one. Blocks of queries keep memory
    at block x rows."""
    import torch  # training's (serving imports this module without torch)
    from torch.nn.functional import normalize

    unit_queries = normalize(torch.as_tensor(np.asarray(queries), dtype=torch.float32), p=2, dim=-1)
    unit_documents = normalize(torch.as_tensor(np.asarray(documents), dtype=torch.float32), p=2, dim=-1)
    position = torch.arange(len(unit_documents))
    found = []
    for start in range(0, len(unit_queries), block):
        similarity = torch.mm(unit_queries[start : start + block], unit_documents.transpose(0, 1))
        rows = torch.arange(start, start + len(similarity))
        own = similarity[torch.arange(len(similarity)), rows][:, None]
        before = (similarity > own) | ((similarity == own) & (position[None, :] < rows[:, None]))
        found.append(before.sum(dim=1) + 1)  # 1 = first
    return rank_metrics(torch.cat(found).numpy() if found else np.zeros(0, dtype=np.int64))


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """MRR@10, NDCG@10, recall@1 and @10 of each query's one relevant document at `ranks` (1 = first)."""
    if not len(ranks):
        return {"mrr_at_10": 0.0, "ndcg_at_10": 0.0, "recall_at_1": 0.0, "recall_at_10": 0.0}
    top = ranks <= 10
    return {
        "mrr_at_10": float(np.where(top, 1.0 / ranks, 0.0).mean()),
        "ndcg_at_10": float(np.where(top, 1.0 / np.log2(ranks + 1.0), 0.0).mean()),
        "recall_at_1": float((ranks == 1).mean()),
        "recall_at_10": float(top.mean()),
    }
