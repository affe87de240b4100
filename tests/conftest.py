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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Many small torch ops on two shared cores: the thread pool thrashes and costs more than it
    gives, so modules that sample token by token opt into one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
