"""What the page needs to play a result itself: a General MIDI synthesiser that runs in the browser
(spessasynth_lib, an AudioWorklet, with the two packages it imports), installed by
`scripts/setup.sh` with npm into the clone's node_modules/ (pinned by package-lock.json), and the
soundfont the server's WAVs are rendered with (render.find_soundfont). Either may be missing: a
wheel carries no node_modules, a machine may have no soundfont. The page then plays the server's
WAV instead, and says why in one line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from ..errors import MusegenError
from ..render import find_soundfont

NODE_MODULES = Path(__file__).resolve().parents[2] / "node_modules"  # where setup.sh's `npm ci` puts them
# the synthesiser and what it imports, each served from its own dist/ folder at /vendor/<package>/
PACKAGES = ("spessasynth_lib", "spessasynth_core", "stb-vorbis")


class SoundfontResponse(FileResponse):
    """The soundfont (FluidR3 is 148 MB) in 1 MiB chunks: in Starlette's 64 KiB, each read a hop to a
    worker thread, it took 6 s on two busy cores; 1 s so."""

    chunk_size = 1024 * 1024


@dataclass(frozen=True)
class Sound:
    library: Path | None  # node_modules holding every package of PACKAGES
    soundfont: Path | None

    @classmethod
    def find(cls, node_modules: Path = NODE_MODULES) -> Sound:
        complete = all((node_modules / package / "dist" / "index.js").is_file() for package in PACKAGES)
        try:
            soundfont = find_soundfont()
        except MusegenError:
            soundfont = None
        return cls(node_modules if complete else None, soundfont)

    def missing(self) -> str | None:
        """Why the page cannot play sound itself, in one line; None when it can."""
        if self.library is None:
            return "the in-page synthesiser is not installed (scripts/setup.sh runs npm for it)"
        if self.soundfont is None:
            return "no General MIDI soundfont is installed (apt-get install fluid-soundfont-gm)"
        return None

    def routes(self) -> list[BaseRoute]:
        """The library's files, each package at /vendor/<package>/ (none when it is missing)."""
        if self.library is None:
            return []
        return [Mount(f"/vendor/{p}", StaticFiles(directory=self.library / p / "dist")) for p in PACKAGES]
