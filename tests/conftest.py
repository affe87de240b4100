"""Shared fixtures: the real POP909 songs in ../shared/datasets, and temporary folders."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
POP909 = REPO.parent / "shared" / "datasets" / "pop909"


def pop909_files(limit: int | None = None) -> list[Path]:
    files = sorted(POP909.glob("*/*.mid"))
    return files[:limit] if limit else files


@pytest.fixture(scope="session")
def pop909_dir() -> Path:
    if not POP909.is_dir():
        pytest.skip(f"POP909 not found at {POP909}")
    return POP909


@pytest.fixture(scope="session")
def pop909_songs(pop909_dir) -> list[Path]:
    """The first 20 songs: enough for real behaviour, small enough for CI."""
    return pop909_files(20)
