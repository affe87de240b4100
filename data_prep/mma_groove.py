"""A groove corpus synthesised with MMA (Musical MIDI Accompaniment), split by style.

The open counterpart of Groove2Groove's Band-in-a-Box corpus: real chord progressions (from
POP909's chord annotations) are rendered by `mma` in hundreds of its library grooves, each
rendering is reduced to the bass/drums/other trio by the groove tokenizer, and the styles
are split into train/validation/test so that test styles are never seen in training.

- A *style* is one MMA groove (e.g. `stdlib/bossanova/BossaNovaSus`): 4/4, with drums and at
  least two melodic tracks; its variations (`Plus`, `1`/`2`, A-D) and sustained (`Sus`) versions
  are styles too. Intros and endings are left out, as Groove2Groove's charts are one long section
  in one groove (its test files are exactly 16 bars after the count-in); fills are played where
  they belong, in the last bar of a phrase (below). The list, with one tempo per style chosen
  from its name, and the fills of each family are `mma_styles.json`, made by
  `python -m data_prep.mma_groove --catalogue`.
- The split is by style *family* (the library file), so variants of a test groove (its
  `Sus`/`Plus` versions, its fills) are not in training either: families in a fixed
  pseudo-random order (by hash) fill the test split up to HELD_OUT_STYLES styles, then
  validation, and the rest is training. `styles.json` in the output lists the three disjoint
  style sets.
- Each style renders PIECES_PER_STYLE pieces of BARS_PER_PIECE bars, each on a different
  POP909 song's progression (chosen by hashing, so reruns are identical; MMA's random
  humanisation is seeded too). With `scale` > 1 it renders scale x as many: the further pieces
  are variants, each in a key, at a tempo, with MMA treatments (swing, articulation, voicing)
  and a fill chosen by hashing (`piece_plan`); `styles.json` lists each piece's plan.
- A rerun resumes: renderings (`rendered/`), layouts (`g2g/`) and their tokens (kept beside
  each layout) already there are reused, and every file is written atomically, so an
  interrupted run loses at most the pieces in flight.
- Each rendering is written again in Groove2Groove's layout (`to_groove2groove`), so the groove
  tokenizer reads it as it reads the paper's data: tracks named `BB Drums`, `BB Bass` and up to
  three of `BB Guitar` / `BB Piano` / `BB Strings`, after a 2-bar count-in, tempo changes kept.
- Output: token shards, `styles.json`, `rendered/` (the raw MMA MIDI), `g2g/` (the same pieces
  in Groove2Groove's layout) and `references/<style>/<n>.mid`: each test
  piece's trio as the tokens hold it (decoded with the original programs and tempo changes),
  the style reference for evaluation.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mido
import numpy as np
from tqdm import tqdm

from data_prep.common import Item
from data_prep.common import prepare as prepare_shards
from musegen import schemas
from musegen.errors import DataError, MusegenError
from musegen.io import atomic_path, write_bytes, write_json
from musegen.music.loops import LOOP_GROUP, random_loop_piece
from musegen.music.midi import Part, read_parts
from musegen.music.roles import COUNT_IN_BEATS, G2G_BASS, G2G_DRUMS, G2G_HARMONIC, TRACKS
from musegen.tokenizers.base import Encoding, Tokenizer, tokenizer_from_dict

LIBRARY = Path("/usr/share/mma/lib")  # where Debian's `mma` keeps its groove library
STYLES_FILE = Path(__file__).with_name("mma_styles.json")
POP909_DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "pop909"
PIECES_PER_STYLE = 4  # plain pieces per style; `scale` adds variants up to scale x this many
BARS_PER_PIECE = 32
HELD_OUT_STYLES = 50  # at least this many styles each in test and validation, as in the paper
SPLITS = ("test", "validation", "train")
RENDER_TIME_LIMIT_S = 60
LAYOUT_VERSION = 1  # raise it when to_groove2groove changes: reruns then lay every piece out again
LEFT_OUT = re.compile(r"intro|end|fill|break", re.IGNORECASE)  # not grooves one plays a song in
FILL = re.compile(r"fill", re.IGNORECASE)  # a groove for the last bar of a phrase
BASS_TRACK = re.compile(r"(bass|walk)", re.IGNORECASE)  # MMA's bass line tracks: Bass, Bass-8, Walk...
CLICK_PITCH, CLICK_VELOCITY = 37, 80  # the count-in: a side stick on every beat, an eighth note long

# Variants of a groove (see piece_plan). Ways MMA plays a groove differently, as song-file lines;
# a variant takes at most one of each group. Swing comes before the library is read: MMA swings
# a groove's patterns when it compiles them. New instruments are not among them: the trio's
# tokens carry no programs, so they would repeat a piece token for token.
TREATMENTS = {
    "swing": "SwingMode On Skew=66",
    "staccato": "AllTracks Articulate 60",
    "legato": "AllTracks Articulate 100",
    "inverted": "AllTracks Chord Invert 1",
    "higher": "AllTracks Chord Octave +1",
    "strummed": "AllTracks Chord Strum 15",
}
TREATMENT_GROUPS = (("swing",), ("staccato", "legato"), ("inverted", "higher", "strummed"))
BEFORE_USE = {"swing"}
KEY_SHIFTS = range(-5, 7)  # semitones a variant's progression moves by
TEMPO_FACTORS = (0.85, 1.0, 1.15)
FILL_EVERY = 8  # bars in a phrase; with a fill, its last bar plays the fill groove
MAX_LOOPS = 1_000_000  # below musegen.music.loops.HELD_OUT_SEEDS: no evaluation loop is a training one


@dataclass(frozen=True)
class Style:
    family: str  # library file without suffix, e.g. "stdlib/bossanova"
    groove: str  # the groove's name inside it, e.g. "BossaNovaSus"
    tempo: int
    swings: bool = False  # MMA can swing it (TREATMENTS), and it then sounds different

    @property
    def name(self) -> str:
        return f"{self.family}/{self.groove}"


@dataclass(frozen=True)
class Piece:
    """One rendering of a style: BARS_PER_PIECE bars of a POP909 song's progression from
    `first_bar`, moved by `key` semitones, at `tempo`, played with `treatments` (names in
    TREATMENTS) and with the `fill` groove in the last bar of every phrase."""

    style: Style
    k: int
    song: str
    first_bar: int
    tempo: int
    key: int = 0
    treatments: tuple[str, ...] = ()
    fill: str | None = None

    @property
    def name(self) -> str:
        return f"{self.style.name}/{self.k}"

    @property
    def seed(self) -> int:
        """MMA's random seed (its humanisation), so a rerun renders the same notes."""
        return _hash(self.style.name, self.k) % 100_000

    @property
    def variant(self) -> str:
        """What the piece plays beyond its groove ("" for the groove as its library defines it)."""
        return "+".join(self.treatments + ((f"fill:{self.fill}",) if self.fill else ()))


# ---- the style catalogue ----------------------------------------------------------------

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
    with mp.get_context("fork").Pool(workers or os.cpu_count()) as pool:
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
    catalogue = schemas.read(STYLES_FILE, "mma styles")
    return [Style(s.family, s.groove, s.tempo, s.swings) for s in catalogue.styles], catalogue.fills


def load_styles() -> list[Style]:
    return load_catalogue()[0]


# ---- chord progressions from POP909 ------------------------------------------------------

ROOTS = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"]
NATURAL = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
QUALITIES = {  # POP909 (Harte) quality -> MMA chord suffix
    "maj": "",
    "min": "m",
    "sus2": "sus2",
    "sus4": "sus4",
    "min7": "m7",
    "maj7": "M7",
    "7": "7",
    "maj6": "6",
    "min6": "m6",
    "dim": "dim",
    "dim7": "dim7",
    "hdim7": "m7b5",
    "aug": "aug",
    "minmaj7": "mM7",
    "sus4(b7)": "7sus4",
    "9": "9",
    "maj9": "M9",
    "min9": "m9",
}
CHORD_NAME = re.compile(r"([A-G][#b]?)([^/]*)(?:/([A-G][#b]?))?")  # root, quality, bass of an MMA chord
INTERVALS = {
    "b2": 1,
    "2": 2,
    "b3": 3,
    "3": 4,
    "4": 5,
    "b5": 6,
    "5": 7,
    "#5": 8,
    "b6": 8,
    "6": 9,
    "b7": 10,
    "7": 11,
    "9": 2,
}


def mma_chord(label: str) -> str | None:
    """A POP909 chord label (`Bb:min7/b7`) as an MMA chord name (`Bbm7/Ab`); None for N/unknown."""
    root, _, rest = label.partition(":")
    if root in ("N", "X", "") or root[0] not in NATURAL:
        return None
    pc = (NATURAL[root[0]] + root[1:].count("#") - root[1:].count("b")) % 12
    quality, _, bass = rest.partition("/")
    suffix = QUALITIES.get(quality, "m" if quality.startswith("min") else "")
    name = ROOTS[pc] + suffix
    if bass in INTERVALS:
        name += "/" + ROOTS[(pc + INTERVALS[bass]) % 12]
    return name


def song_bars(song_dir: Path) -> list[list[str]]:
    """A song's chords, one per beat, grouped in bars of 4 from its first downbeat. Bars with no
    chord at the start are dropped; a no-chord beat holds the chord before it (or, at the very
    start, the first chord)."""
    beats, downbeat = [], []
    for line in (song_dir / "beat_midi.txt").read_text().splitlines():
        cols = line.split()
        if len(cols) >= 3:
            beats.append(float(cols[0]))
            downbeat.append(float(cols[2]) == 1.0)
    segments = []
    for line in (song_dir / "chord_midi.txt").read_text().splitlines():
        cols = line.split()
        if len(cols) >= 3:
            segments.append((float(cols[0]), float(cols[1]), mma_chord(cols[2])))
    if not beats or not segments or True not in downbeat:
        return []
    chords, k = [], 0
    for t in beats[downbeat.index(True) :]:
        t += 0.05  # annotation boundaries sit on beats up to a few ms
        while k < len(segments) - 1 and segments[k][1] <= t:
            k += 1
        chords.append(segments[k][2] if segments[k][0] <= t < segments[k][1] else None)
    labelled = [i for i, c in enumerate(chords) if c is not None]
    if not labelled:
        return []
    first_bar = labelled[0] // 4 * 4  # keep the bar lines where the annotation has them
    held = chords[labelled[0]]
    for i in range(first_bar, len(chords)):
        held = chords[i] = chords[i] or held
    return [chords[i : i + 4] for i in range(first_bar, len(chords) - 3, 4)]


def progressions(pop909: Path) -> list[tuple[str, list[list[str]]]]:
    """(song, bars) for every POP909 song with at least BARS_PER_PIECE bars of chords."""
    if not pop909.is_dir():
        raise DataError(
            f"{pop909}: POP909 folder not found (its chord annotations drive the "
            f"MMA corpus); pass --source, or prepare pop909 with --download first"
        )
    found = []
    for song_dir in sorted(p for p in pop909.iterdir() if (p / "chord_midi.txt").is_file()):
        try:
            bars = song_bars(song_dir)
        except (OSError, ValueError):
            continue
        if len(bars) >= BARS_PER_PIECE:
            found.append((song_dir.name, bars))
    if not found:
        raise DataError(f"{pop909}: no song with {BARS_PER_PIECE} bars of chord annotations")
    return found


def _hash(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


def piece_plan(
    style: Style, k: int, songs: list[tuple[str, list[list[str]]]], fills: list[str] = ()
) -> tuple[Piece, list[list[str]]]:
    """Piece k of a style and its bars of chords. The first PIECES_PER_STYLE pieces play the
    groove as it is; the others are variants, each chosen by hashing: a key (-5..+6), a tempo
    around the style's, at most one treatment of each group and, for half of them, the fill of
    the groove's family whose name is closest to the groove's."""
    song, bars = songs[_hash(style.name, k) % len(songs)]
    first = _hash(style.name, k, "bar") % (len(bars) - BARS_PER_PIECE + 1)
    bars = bars[first : first + BARS_PER_PIECE]
    if k < PIECES_PER_STYLE:
        return Piece(style, k, song, first, style.tempo), bars
    draw = lambda what, n: _hash(style.name, k, what) % n
    key = KEY_SHIFTS[draw("key", len(KEY_SHIFTS))]
    tempo = round(style.tempo * TEMPO_FACTORS[draw("tempo", len(TEMPO_FACTORS))])
    treatments = tuple(
        group[i]
        for group in TREATMENT_GROUPS
        if (i := draw(group[0], len(group) + 2)) < len(group) and (style.swings or group[i] != "swing")
    )
    fill = None
    if fills and draw("fill", 2):
        fill = max(fills, key=lambda f: len(os.path.commonprefix([f.lower(), style.groove.lower()])))
    return (
        Piece(style, k, song, first, tempo, key, treatments, fill),
        [[transpose_chord(c, key) for c in bar] for bar in bars],
    )


def transpose_chord(name: str, semitones: int) -> str:
    """An MMA chord name moved by `semitones` (`Bbm7/Ab` + 2 -> `Cm7/Bb`); `/` (hold) stays."""

    def move(root: str) -> str:
        pc = NATURAL[root[0]] + root[1:].count("#") - root[1:].count("b")
        return ROOTS[(pc + semitones) % 12]

    match = CHORD_NAME.fullmatch(name)
    if not match:
        return name
    root, quality, bass = match.groups()
    return move(root) + quality + (f"/{move(bass)}" if bass else "")


# ---- rendering ---------------------------------------------------------------------------


def mma_text(
    style: Style,
    bars: list[list[str]],
    seed: int,
    tempo: int | None = None,
    treatments: tuple[str, ...] = (),
    fill: str | None = None,
) -> str:
    """An MMA song file: `bars` (4 chords each) in the style's groove, the treatments after every
    groove change (MMA restores a groove's settings when it is selected), the fill groove for the
    last bar of every FILL_EVERY."""
    settings = [TREATMENTS[t] for t in treatments if t not in BEFORE_USE]
    lines = [TREATMENTS[t] for t in treatments if t in BEFORE_USE] + [f"Use {style.family}"]
    lines += [f"Groove {style.groove}", *settings, f"Tempo {tempo or style.tempo}", f"RndSeed {seed}"]
    for n, bar in enumerate(bars, 1):
        beats = [c if i == 0 or c != bar[i - 1] else "/" for i, c in enumerate(bar)]
        phrase_end = fill is not None and n % FILL_EVERY == 0
        lines += [f"Groove {fill}", *settings] if phrase_end else []
        lines.append(" ".join(beats))
        lines += [f"Groove {style.groove}", *settings] if phrase_end and n < len(bars) else []
    return "\n".join(lines) + "\n"


def render_mma(text: str) -> bytes:
    """Run `mma` on a song file's text and return the MIDI bytes; DataError on failure."""
    with tempfile.TemporaryDirectory(prefix="musegen-mma-") as tmp:
        src, out = Path(tmp) / "song.mma", Path(tmp) / "song.mid"
        src.write_text(text)
        try:
            # relative names: MMA writes the input's name into the file, keep it reproducible
            proc = subprocess.run(
                ["mma", "-w", "-f", out.name, src.name],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=RENDER_TIME_LIMIT_S,
            )
        except FileNotFoundError:
            raise DataError("`mma` not found; install the Debian package mma") from None
        except subprocess.TimeoutExpired:
            raise DataError(f"mma took longer than {RENDER_TIME_LIMIT_S}s") from None
        if proc.returncode != 0 or not out.is_file():
            errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln]
            raise DataError(f"mma failed: {(errors or ['no output'])[0].strip()}")
        return out.read_bytes()


def to_groove2groove(raw: Path, dest: Path) -> None:
    """Write MMA's rendering `raw` in Groove2Groove's layout: the drum tracks as `BB Drums`, the
    busiest of MMA's bass-line tracks (Bass*, Walk*) as `BB Bass`, the other melodic tracks by
    decreasing note count as `BB Guitar`, `BB Piano`, `BB Strings` (any further ones are left
    out), all 2 bars later after a count-in of side-stick clicks; tempo and meter changes move
    with the music. One MIDI track per MMA track, so each keeps its own note pairing; a string that
    MMA re-strikes without a note-off ends where it is struck again."""
    parsed = read_parts(raw, restrike_ends=True)
    groups: dict[str, list[Part]] = {}
    for part in parsed.parts:
        if len(part.notes):
            groups.setdefault(("drums:" if part.is_drum else "") + (part.name or ""), []).append(part)
    count = lambda name: sum(len(p.notes) for p in groups[name])
    drums = [p for name, parts in groups.items() if name.startswith("drums:") for p in parts]
    melodic = [name for name in groups if not name.startswith("drums:")]
    bass = max((n for n in melodic if BASS_TRACK.match(n)), key=count, default=None)
    harmonic = sorted((n for n in melodic if n != bass), key=count, reverse=True)[: len(G2G_HARMONIC)]
    shift = COUNT_IN_BEATS * parsed.tpq
    clicks = np.array(
        [
            (b * parsed.tpq, b * parsed.tpq + parsed.tpq // 8, CLICK_PITCH, CLICK_VELOCITY)
            for b in range(COUNT_IN_BEATS)
        ],
        dtype=np.int64,
    )
    tracks = [(G2G_DRUMS, 9, 0, clicks)] + [(G2G_DRUMS, 9, p.program, _later(p.notes, shift)) for p in drums]
    named = ([(G2G_BASS, bass)] if bass else []) + list(zip(G2G_HARMONIC, harmonic))
    channels = iter(c for c in range(16) if c != 9)
    for g2g_name, mma_name in named:
        tracks += [(g2g_name, next(channels), p.program, _later(p.notes, shift)) for p in groups[mma_name]]
    midi = mido.MidiFile(type=1, ticks_per_beat=parsed.tpq)
    meta = [
        (0 if tick == 0 else tick + shift, mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(qpm)))
        for tick, qpm in parsed.tempos
    ]
    meta += [
        (0 if tick == 0 else tick + shift, mido.MetaMessage("time_signature", numerator=n, denominator=d))
        for tick, n, d in parsed.time_signatures
    ]
    midi.tracks.append(_midi_track(meta))
    for name, channel, program, notes in tracks:
        events = [
            (0, mido.MetaMessage("track_name", name=name)),
            (0, mido.Message("program_change", channel=channel, program=program)),
        ]
        for on, off, pitch, velocity in notes.tolist():
            events.append((on, mido.Message("note_on", channel=channel, note=pitch, velocity=velocity)))
            events.append((off, mido.Message("note_off", channel=channel, note=pitch, velocity=0)))
        midi.tracks.append(_midi_track(events))
    buffer = io.BytesIO()
    midi.save(file=buffer)
    write_bytes(dest, buffer.getvalue())


def _later(notes, shift: int):
    moved = notes.copy()
    moved[:, :2] += shift
    return moved


def _midi_track(events: list[tuple[int, Any]]) -> mido.MidiTrack:
    """Timed messages as a track. At one tick note_ons come before note_offs, so a zero-length
    note is read as a note (first in, first out) and not as the end of an earlier one."""
    order = sorted(range(len(events)), key=lambda i: (events[i][0], events[i][1].type == "note_off", i))
    track, now = mido.MidiTrack(), 0
    for i in order:
        tick, msg = events[i]
        msg.time = tick - now  # (each message is made for this track: set in place, not copied)
        track.append(msg)
        now = tick
    track.append(mido.MetaMessage("end_of_track", time=0))
    return track


def _render_one(job: tuple[str, str, Path, Path]) -> tuple[str | None, bool]:
    """Render a piece unless its raw MIDI is there, and write its Groove2Groove version unless
    that is there. Returns an error line or None, and whether MMA ran."""
    name, text, raw, dest = job
    try:
        rendered = not raw.is_file()
        if rendered:
            write_bytes(raw, render_mma(text))
        if rendered or not dest.is_file():
            to_groove2groove(raw, dest)
        return None, rendered
    except MusegenError as exc:
        return f"{name}: {exc}", False


def _current_layouts(g2g: Path) -> None:
    """Make `g2g` hold layouts of this LAYOUT_VERSION only: files of another version (or of an
    unstamped folder) are removed, to be written again from the raw renderings."""
    stamp = g2g / "layout.json"
    try:
        current = schemas.read(stamp, "layout stamp").version == LAYOUT_VERSION
    except MusegenError:
        current = False
    if not current:
        shutil.rmtree(g2g, ignore_errors=True)
        write_json(stamp, {"version": LAYOUT_VERSION})


def _encode_piece(tokenizer: Tokenizer, item: Item) -> Encoding:
    """A piece's tokens, kept beside its layout (`<k>.<tokenizer>.npz`) so that an interrupted
    encoding resumes: read back when that file is newer than the layout, else encoded and kept.
    What is kept is what the shards need: the ids and the report's counts."""
    settings = json.dumps(tokenizer.to_dict(), sort_keys=True)
    kept = item.path.with_name(f"{item.path.stem}.{tokenizer.kind}-{_hash(settings) % 16**8:08x}.npz")
    try:
        fresh = kept.stat().st_mtime >= item.path.stat().st_mtime
    except OSError:
        fresh = False
    if fresh:
        with np.load(kept) as stored:
            return Encoding(stored["ids"], schemas.loads(str(stored["counts"]), "piece counts", kept))
    enc = tokenizer.encode(item.path)
    counts = {k: v for k, v in enc.report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    with atomic_path(kept) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, ids=enc.ids, counts=json.dumps(counts))
    return enc


# ---- the corpus --------------------------------------------------------------------------


def family_splits(styles: list[Style]) -> dict[str, str]:
    """family -> split, over the whole catalogue (so a trial subset splits the same way)."""
    sizes: dict[str, int] = {}
    for st in styles:
        sizes[st.family] = sizes.get(st.family, 0) + 1
    splits, filled = {}, dict.fromkeys(SPLITS, 0)
    for family in sorted(sizes, key=lambda f: (_hash("split", f), f)):
        split = next(s for s in SPLITS if s == "train" or filled[s] < HELD_OUT_STYLES)
        splits[family] = split
        filled[split] += sizes[family]
    return splits


def choose_styles(styles: list[Style], limit: int | None, per_style: int = PIECES_PER_STYLE) -> list[Style]:
    """All styles, or for `limit` pieces enough styles taken in turn from test, validation and
    train, so a small trial still has every split."""
    if limit is None:
        return styles
    split = family_splits(styles)
    by_split = {s: [st for st in styles if split[st.family] == s] for s in SPLITS}
    chosen, n = [], -(-limit // per_style)
    while len(chosen) < n and any(by_split.values()):
        for split in by_split:
            if by_split[split] and len(chosen) < n:
                chosen.append(by_split[split].pop(0))
    return chosen


def prepare(
    out: Path,
    source: Path | None = None,
    download: bool = False,
    workers: int | None = None,
    limit: int | None = None,
    tokenizer: str | None = None,
    scale: int = 1,
    loops: int = 0,
) -> dict[str, Any]:
    """`scale`: render scale x PIECES_PER_STYLE pieces per style (the plain ones, then variants).
    `loops`: add this many random groove loops to the training split (`musegen.music.loops`).
    A rerun resumes: what is rendered and laid out is reused."""
    trio = [kind for kind, cls in Tokenizer.registry.items() if set(cls.roles) == set(TRACKS.values())]
    if tokenizer not in (None, *trio):
        raise DataError(f"the mma-groove corpus is a trio, tokenised as {' or '.join(trio)}, not {tokenizer!r}")
    if scale < 1:
        raise DataError(f"scale must be at least 1, not {scale}")
    if not 0 <= loops <= MAX_LOOPS:
        raise DataError(f"loops must be from 0 to {MAX_LOOPS:,}, not {loops}")
    out = Path(out)
    tok = tokenizer_from_dict({"kind": tokenizer or "groove"})
    catalogue, fills = load_catalogue()
    family_split = family_splits(catalogue)
    per_style = scale * PIECES_PER_STYLE
    styles = choose_styles(catalogue, limit, per_style)
    songs = progressions(Path(source) if source else POP909_DEFAULT)

    items, jobs, plans, variants = [], [], {}, {s: set() for s in SPLITS}
    _current_layouts(out / "g2g")
    for style in styles:
        for k in range(per_style):
            if limit is not None and len(items) >= limit:
                break
            piece, bars = piece_plan(style, k, songs, fills.get(style.family, []))
            path = out / "g2g" / f"{piece.name}.mid"
            raw = out / "rendered" / f"{piece.name}.mid"
            items.append(Item(name=piece.name, path=path, group=style.family))
            plans[piece.name] = {"song": piece.song, "first_bar": piece.first_bar}
            if k >= PIECES_PER_STYLE:
                plans[piece.name].update(key=piece.key, tempo=piece.tempo, variant=piece.variant)
            variants[family_split[style.family]].add((style.name, piece.variant))
            if not (raw.is_file() and path.is_file()):
                text = mma_text(style, bars, piece.seed, piece.tempo, piece.treatments, piece.fill)
                jobs.append((k, piece.name, text, raw, path))
    # piece 0 of every style first, then piece 1...: a run stopped early leaves every style with
    # its first pieces, which a smaller scale then reuses whole
    jobs = [job[1:] for job in sorted(jobs, key=lambda job: job[0])]

    started = time.perf_counter()
    render_failures, rendered = [], 0
    with tqdm(
        total=len(items), initial=len(items) - len(jobs), desc="rendering (mma) and laying out", unit="piece"
    ) as progress:
        if jobs:
            with mp.get_context("fork").Pool(max(1, workers or os.cpu_count() or 1)) as pool:
                for error, ran in pool.imap_unordered(_render_one, jobs, chunksize=2):
                    progress.update(1)
                    rendered += ran
                    if error:
                        render_failures.append(error)
    render_s = round(time.perf_counter() - started, 1)

    items += _write_loops(out / LOOP_GROUP, loops)
    split_of = lambda group: "train" if group == LOOP_GROUP else family_split[group]  # noqa: E731
    style_sets = {s: sorted(st.name for st in styles if family_split[st.family] == s) for s in SPLITS}
    write_json(
        out / "styles.json",
        {"split_by": "family", "styles": style_sets, "tempo": {st.name: st.tempo for st in styles}, "pieces": plans},
    )
    report = prepare_shards(
        tok,
        items,
        out,
        {"validation": 0.0, "test": 0.0},
        workers,
        split_of=split_of,
        encode=_encode_piece,
        extra_report={
            "styles": {s: len(v) for s, v in style_sets.items()},
            "style_variants": {s: len(v) for s, v in variants.items()},
            "pieces_per_style": per_style,
            "rendered": rendered,
            "render_seconds": render_s,
            "render_failures": render_failures,
            "loops": loops,
        },
    )
    _write_references(out, tok)
    return report


def _write_loops(folder: Path, count: int) -> list[Item]:
    """Loop pieces 0 .. count - 1 as MIDI files in `folder` (those already there are kept)."""
    items = []
    for k in tqdm(range(count), desc="writing random loops", unit="piece", disable=not count):
        path = folder / f"{k:06d}.mid"
        if not path.is_file():
            write_bytes(path, random_loop_piece(k).midi_bytes())
        items.append(Item(name=f"{LOOP_GROUP}/{k:06d}", path=path, group=LOOP_GROUP))
    return items


def _write_references(out: Path, tok) -> None:
    """Each test piece's trio as MIDI, with its original programs and tempo changes."""
    from musegen.shards import Shards

    shards = Shards(out)
    if "test" not in shards.splits:
        return
    for name in shards.names("test"):
        enc = tok.encode(out / "g2g" / f"{name}.mid")
        midi = tok.decode(enc.ids, enc.report["meta"])
        with atomic_path(out / "references" / f"{name}.mid") as tmp:
            midi.dump(str(tmp))


def _mma_version() -> str:
    proc = subprocess.run(["mma", "-v"], capture_output=True, text=True)
    return (proc.stdout.strip().splitlines() or ["unknown"])[-1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogue", action="store_true", help="re-probe MMA's library into mma_styles.json")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    if args.catalogue:
        found = build_catalogue(args.workers)
        print(f"{len(found)} styles written to {STYLES_FILE}")
