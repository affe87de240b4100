"""Where the shipped models and example prompts are, wherever musegen runs from.

They live in one `checkpoints/` folder (a model per sub-folder, the example prompts in `prompts/`),
looked for in this order:
1. `$MUSEGEN_HOME/checkpoints` when MUSEGEN_HOME is set, and nowhere else: what the user names wins;
2. `checkpoints/` beside the package, in a clone of the repository (an editable install too), so
   that a model trained or changed there is the one used;
3. `<prefix>/share/musegen/checkpoints`, where `pip install .` puts them (pyproject.toml: data-files),
   for this interpreter's prefix (a virtual environment's, or the system's) and then the user's
   (`pip install --user`: ~/.local/share/musegen/checkpoints on Linux).
Nothing is downloaded: the models travel in the package (the wheel is about 47 MB).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from .errors import CheckpointError, InputFileError
from .io import printable

ENV = "MUSEGEN_HOME"
PROMPTS = "prompts"
_PACKAGE = Path(__file__).resolve().parent


def places() -> list[Path]:
    """Each folder that may hold the shipped checkpoints, in the order they are looked at."""
    home = os.environ.get(ENV)
    if home:
        return [Path(home).expanduser() / "checkpoints"]
    found = []
    if (_PACKAGE.parent / "pyproject.toml").is_file():  # a clone, not site-packages
        found.append(_PACKAGE.parent / "checkpoints")
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        found.append(Path(sysconfig.get_path("data", scheme)) / "share" / "musegen" / "checkpoints")
    return list(dict.fromkeys(found))


def shipped_folder() -> Path | None:
    """The first of `places()` that exists, or None."""
    return next((p for p in places() if p.is_dir()), None)


def not_found() -> str:
    """Why there are no shipped models, as one line: where they were looked for, and the remedy."""
    looked = ", ".join(printable(p) for p in places())
    return (
        f"no shipped models found (looked in {looked}); set {ENV} to a folder that holds checkpoints/ "
        "(a clone of musegen, for one)"
    )


def models() -> dict[str, Path]:
    """The shipped models by name (their folder's): each sub-folder with a config.json."""
    folder = shipped_folder()
    if folder is None:
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if (p / "config.json").is_file()}


def examples() -> dict[str, Path]:
    """The example prompts by file name."""
    folder = shipped_folder()
    if folder is None or not (folder / PROMPTS).is_dir():
        return {}
    return {p.name: p for p in sorted((folder / PROMPTS).glob("*.mid"))}


def _is_name(path: Path) -> bool:
    return len(path.parts) == 1 and not path.exists() and not path.is_symlink()


def checkpoint(path: str | os.PathLike) -> Path:
    """`path` itself, or the shipped model it names when it is a bare name (`pop`) that is no folder
    here. A bare name that is neither raises CheckpointError, saying which models there are."""
    path = Path(path)
    if not _is_name(path):
        return path
    shipped = models()
    if path.name in shipped:
        return shipped[path.name]
    if not shipped:
        raise CheckpointError(f"{printable(path)}: checkpoint folder not found, and {not_found()}")
    raise CheckpointError(
        f"{printable(path)}: checkpoint folder not found, nor a shipped model of that name "
        f"(shipped: {', '.join(shipped)})"
    )


def prompt(path: str | os.PathLike) -> Path:
    """`path` itself, or the example prompt it names (with or without .mid) when it is a bare name
    that is no file here."""
    path = Path(path)
    if not _is_name(path):
        return path
    shipped = examples()
    for name in (path.name, f"{path.name}.mid"):
        if name in shipped:
            return shipped[name]
    if not shipped:
        raise InputFileError(f"{printable(path)}: no such file, and {not_found()}")
    raise InputFileError(f"{printable(path)}: no such file, nor an example prompt (examples: {', '.join(shipped)})")
