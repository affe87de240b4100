"""Matplotlib without a display, and figures written atomically: the one place every PNG goes through."""

from __future__ import annotations

import os
from pathlib import Path

from .io import atomic_path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (imported late: it is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Write `fig` to `path` atomically and free it."""

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    pyplot().close(fig)
    return path
