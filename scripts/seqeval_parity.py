"""byoc's entity scores against seqeval's on real tag sequences (make-free, run by hand where seqeval is
installed: `pip install seqeval`; it pulls scikit-learn and SciPy, which the test venvs do not carry).

The gold sequences are wnut17's test split (../shared/data/wnut17); the predictions are the gold ones
with a share of the tags replaced at random (any tag: I- without B-, type switches, lone I-), seeded,
at several rates. Both scorers read the same sequences; every figure must agree to 1e-12.

    python scripts/seqeval_parity.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "container"), str(REPO / "benchmarks")]


def read_conll(path: Path) -> list[list[str]]:
    sentences, tags = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if not parts:
            if tags:
                sentences.append(tags)
            tags = []
        else:
            tags.append(parts[-1])
    return sentences + ([tags] if tags else [])


def main() -> int:
    import shared_data
    from seqeval.metrics import f1_score, precision_score, recall_score

    from byoc.tasks.token_classification import token_metrics

    gold = read_conll(shared_data.folder("wnut17") / "emerging.test.annotated")
    names = sorted({t for s in gold for t in s})
    worst = 0.0
    for rate in (0.0, 0.05, 0.2, 0.5, 0.9):
        for seed in range(5):
            rng = random.Random(seed)
            guess = [[rng.choice(names) if rng.random() < rate else t for t in s] for s in gold]
            ours = token_metrics(gold, guess)[0]
            theirs = {
                "precision": precision_score(gold, guess),
                "recall": recall_score(gold, guess),
                "f1": f1_score(gold, guess),
            }
            gap = max(abs(ours[k] - theirs[k]) for k in theirs)
            worst = max(worst, gap)
            if seed == 0:
                print(f"rate {rate:.2f}: byoc f1 {ours['f1']:.6f}, seqeval {theirs['f1']:.6f}, largest gap {gap:.2e}")
    print(f"{len(gold)} sentences, 25 prediction sets: the largest difference is {worst:.2e}")
    return 0 if worst < 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
