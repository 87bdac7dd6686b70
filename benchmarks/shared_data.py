"""Where the shared sample data is, for the benchmarks and the tests: `../shared/data` beside the
checkout (as CI clones it), or `shared/data` inside it (as the device machine receives it). Each
dataset is a folder with a README (emotion, uci-sentiment, semeval2018-ec, sick, rte, wnut17); it is
never committed into the project."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO.parent / "shared" / "data", REPO / "shared" / "data")


def find(name: str) -> Path | None:
    """The folder of dataset `name`, or None where it is not here."""
    return next((root / name for root in ROOTS if (root / name).is_dir()), None)


def missing(name: str) -> str:
    """What to say where dataset `name` is not here."""
    return (
        f"the shared sample data {name!r} is not here: looked in {', '.join(str(root) for root in ROOTS)}. "
        "Clone the project beside the shared/ folder (so that ../shared/data resolves, as in CI)."
    )


def folder(name: str) -> Path:
    """The folder of dataset `name`; FileNotFoundError, saying where it was looked for, if it is not here."""
    found = find(name)
    if found is None:
        raise FileNotFoundError(missing(name))
    return found
