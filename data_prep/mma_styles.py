"""MMA's groove library as the corpus' style catalogue (`mma_styles.json`): which grooves are
styles (4/4, drums and two melodic tracks, probed by rendering 4 bars of each), a tempo for each
from its name, and the fill grooves of each family. Rebuilt by
`python -m data_prep.mma_groove --catalogue` after an MMA upgrade.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field
from tqdm import tqdm

from musegen import schemas
from musegen.errors import MusegenError
from musegen.io import write_json

from .common import worker_pool
from .mma_render import mma_text, render_mma

LIBRARY = Path("/usr/share/mma/lib")  # where Debian's `mma` keeps its groove library
STYLES_FILE = Path(__file__).with_name("mma_styles.json")
LEFT_OUT = re.compile(r"intro|end|fill|break", re.IGNORECASE)  # not grooves one plays a song in
FILL = re.compile(r"fill", re.IGNORECASE)  # a groove for the last bar of a phrase


class MmaStyle(BaseModel):
    model_config = schemas.STRICT
    family: schemas.Name  # an MMA library file without suffix, e.g. "stdlib/bossanova"
    groove: schemas.Name
    tempo: Annotated[int, Field(ge=1, le=1000)]  # bpm
    swings: bool  # whether MMA's swing setting changes what the groove plays


class MmaStyles(BaseModel):
    """data_prep/mma_styles.json: the MMA grooves the groove corpus is rendered from, and each
    family's fill grooves."""

    model_config = schemas.STRICT
    mma_version: schemas.Name
    styles: Annotated[list[MmaStyle], Field(max_length=100_000)]
    fills: Annotated[
        dict[schemas.Name, Annotated[list[schemas.Name], Field(max_length=1_000)]], Field(max_length=100_000)
    ]


MMA_STYLES = schemas.Format("mma styles", None, MmaStyles)


@dataclass(frozen=True)
class Style:
    family: str  # library file without suffix, e.g. "stdlib/bossanova"
    groove: str  # the groove's name inside it, e.g. "BossaNovaSus"
    tempo: int
    swings: bool = False  # MMA can swing it (mma_render.TREATMENTS), and it then sounds different

    @property
    def name(self) -> str:
        return f"{self.family}/{self.groove}"


# First matching keyword of a groove's lower-cased name decides its tempo (quarter notes/min).
TEMPO_KEYWORDS = [
    ("fast", 190),
    ("slow", 72),
    ("ballad", 72),
    ("lullaby", 66),
    ("soft", 84),
    ("bebop", 210),
    ("bluegrass", 180),
    ("dixie", 176),
    ("charleston", 200),
    ("quickstep", 200),
    ("jive", 170),
    ("boogie", 160),
    ("boggie", 160),
    ("swing", 144),
    ("jazz", 132),
    ("samba", 104),
    ("bossa", 132),
    ("salsa", 180),
    ("mambo", 180),
    ("merengue", 140),
    ("rhumba", 108),
    ("rumba", 108),
    ("chacha", 120),
    ("beguine", 120),
    ("bolero", 96),
    ("tango", 120),
    ("calypso", 124),
    ("reggae", 80),
    ("ska", 150),
    ("hiphop", 92),
    ("rap", 92),
    ("techno", 128),
    ("disco", 120),
    ("house", 124),
    ("funk", 104),
    ("soul", 96),
    ("gospel", 84),
    ("blues", 96),
    ("shuffle", 116),
    ("march", 116),
    ("polka", 120),
    ("country", 120),
    ("folk", 100),
    ("rock", 120),
    ("pop", 112),
    ("latin", 118),
    ("hawaii", 100),
    ("love", 76),
    ("trance", 136),
]
DEFAULT_TEMPO = 112


def tempo_for(groove: str) -> int:
    lowered = groove.lower()
    return next((bpm for word, bpm in TEMPO_KEYWORDS if word in lowered), DEFAULT_TEMPO)


def library_grooves(library: Path = LIBRARY, wanted: re.Pattern | None = None) -> list[tuple[str, str]]:
    """(family, groove) for every DefGroove in MMA's library, intros/endings/fills left out; or,
    with `wanted`, those whose name matches it. A name defined twice in one file counts once."""
    found, seen = [], set()
    for path in sorted(library.rglob("*.mma")):
        family = path.relative_to(library).with_suffix("").as_posix()
        for line in path.read_text(errors="replace").splitlines():
            words = line.split()
            if len(words) < 2 or words[0].lower() != "defgroove" or (family, words[1].lower()) in seen:
                continue
            if wanted.search(words[1]) if wanted else not LEFT_OUT.search(words[1]):
                seen.add((family, words[1].lower()))
                found.append((family, words[1]))
    return found


def _probe_render(family: str, groove: str, treatments: tuple[str, ...] = ()) -> bytes | None:
    """4 bars of a groove as MIDI, or None if MMA cannot render them."""
    bars = [["C", "/", "Am", "/"], ["F", "/", "G7", "/"]] * 2
    try:
        return render_mma(mma_text(Style(family, groove, 120), bars, seed=1, treatments=treatments))
    except MusegenError:
        return None


def _four_four_score(data: bytes | None):
    """A rendering read by symusic when it is all in 4/4, else None."""
    import symusic

    score = None if data is None else symusic.Score.from_midi(data)
    if score is None or any((ts.numerator, ts.denominator) != (4, 4) for ts in score.time_signatures):
        return None
    return score


def _probe(entry: tuple[str, str]) -> dict[str, Any] | None:
    """Render 4 bars of a groove; keep it when it is 4/4 with drums and two melodic tracks."""
    family, groove = entry
    plain = _probe_render(family, groove)
    score = _four_four_score(plain)
    if score is None:
        return None
    onsets = [n.time for t in score.tracks for n in t.notes]
    drums = sum(len(t.notes) for t in score.tracks if t.is_drum)
    melodic = sum(1 for t in score.tracks if not t.is_drum and len(t.notes))
    if not onsets or drums == 0 or melodic < 2:
        return None
    if not 12 * score.tpq <= max(onsets) < 16 * score.tpq:  # 4 bars of 4 beats, not 3 or 6
        return None
    # swing is a variant only where MMA can swing the groove and it then plays differently
    swung = _probe_render(family, groove, ("swing",))
    swings = swung is not None and swung != plain
    return {"family": family, "groove": groove, "tempo": tempo_for(groove), "swings": swings}


def _probe_fill(entry: tuple[str, str]) -> tuple[str, str] | None:
    """Keep a fill groove that renders in 4/4 with notes (a fill may be drums alone)."""
    score = _four_four_score(_probe_render(*entry))
    return entry if score is not None and any(len(t.notes) for t in score.tracks) else None


def build_catalogue(workers: int | None = None) -> list[dict[str, Any]]:
    """Probe every library groove and fill (a few minutes) and write mma_styles.json."""
    grooves, fills = library_grooves(), library_grooves(wanted=FILL)
    with worker_pool(workers) as pool:
        probed = list(tqdm(pool.imap(_probe, grooves, chunksize=4), total=len(grooves), desc="probing grooves"))
        fills_ok = list(tqdm(pool.imap(_probe_fill, fills, chunksize=4), total=len(fills), desc="probing fills"))
    styles = [p for p in probed if p]
    families = {s["family"] for s in styles}
    fills_of: dict[str, list[str]] = {}
    for family, fill in filter(None, fills_ok):
        if family in families:
            fills_of.setdefault(family, []).append(fill)
    write_json(STYLES_FILE, {"mma_version": _mma_version(), "styles": styles, "fills": fills_of})
    return styles


def load_catalogue() -> tuple[list[Style], dict[str, list[str]]]:
    """The styles of mma_styles.json, and the fill grooves of each family."""
    catalogue = schemas.read(STYLES_FILE, MMA_STYLES)
    return [Style(s.family, s.groove, s.tempo, s.swings) for s in catalogue.styles], catalogue.fills


def load_styles() -> list[Style]:
    return load_catalogue()[0]


def _mma_version() -> str:
    proc = subprocess.run(["mma", "-v"], capture_output=True, text=True)
    return (proc.stdout.strip().splitlines() or ["unknown"])[-1]
