"""MMA's grooves in every meter, with their own instruments, under POP909 melodies, for the
`song` representation.

- Styles: the 4/4 grooves of the groove corpus' catalogue (mma_styles.json) and every groove of
  MMA's library in another meter (waltzes, 6/8 and 12/8 ballads, blues and marches, 5/4 jazz),
  intros, endings, fills and metronomes left out. A groove's meter is read from its library file:
  the `Time` and `TimeSig` in effect where it is defined (`library_meters`).
- MMA's bar is `Time` beats, each a quarter note of its MIDI, whatever `TimeSig` says. Where the
  two disagree the groove notates a compound meter in quarters (6/8 as six beats of an eighth,
  or as two of a dotted quarter; 12/8 as four), and the MIDI is declared again: its ticks per
  quarter and tempos change so that each bar lasts as the meter says and no note moves in
  seconds. A `TimeSig` that fits neither reading (a three-beat waltz declared 4/4) becomes
  `Time`/4.
- Each piece plays BARS_PER_PIECE bars of a POP909 song's chords from one of its downbeats, a
  chord per felt beat (a quarter; a dotted quarter in a compound meter), on songs whose annotated
  bars are whole bars of the groove where there are such (waltzes play POP909's songs in three),
  else on any. The song, the downbeat and MMA's random seed are chosen by hashing, so a
  rerun plans and renders the same pieces. Tempo: the groove's, from its name (mma_styles); a
  compound meter's dotted quarter moves at 2/3 of it, keeping the 4/4 groove's pace of eighths.
- Melody: in a simple meter the song's beat i is the piece's beat i, so the song's MELODY track,
  re-timed beat by beat, sounds over the arrangement of its own chords, on a lead instrument
  chosen by hashing (LEAD_PROGRAMS). In a compound meter a beat of the song has no place (its
  16ths fall off the 6/8 grid), so those pieces are the arrangement alone.
- Otherwise the MIDI is MMA's: every track with its name, channel and program, drums on channel
  10, its tempo. MMA writes no count-in: the first bar starts at tick 0. Where MMA strikes a
  pitch again while it sounds, a note-off is written before, as a synthesiser plays it
  (`ended_restrikes`), so that a MIDI reader keeps both notes.
- Split by groove family, hashed (`fractions`). A rerun resumes: each piece's MIDI is kept under
  `<out>/midi/<style>/<k>.mid` and not rendered again.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import mido
import numpy as np

from musegen.errors import DataError, MusegenError
from musegen.io import write_bytes
from musegen.music.midi import load_score
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import SHARED_DATASETS, Corpus, Item, Listing
from .mma_pieces import BARS_PER_PIECE, beat_chords, stable_hash
from .mma_render import midi_track, mma_text, render_jobs, render_mma
from .mma_styles import LIBRARY, Style, library_grooves, load_styles, tempo_for

# MMA's `Time n/d` forms: its beats per bar and the beats (from 1) where a chord line's chords
# fall, as MMA's own table has them (MMA/tempo.py)
TIME_FORMS = {
    "2/2": (4, (1, 3)),
    "2/4": (2, (1, 2)),
    "3/4": (3, (1, 2, 3)),
    "4/4": (4, (1, 2, 3, 4)),
    "5/4": (5, (1, 2, 3, 4, 5)),
    "6/4": (6, (1, 4)),
    "3/2": (6, (1, 3, 5)),
    "6/8": (6, (1, 4)),
    "9/8": (4.5, (1, 2.5, 4)),
    "12/8": (6, (1, 2.5, 4, 5.5)),
}
TIME_NAMES = {"COMMON": "4/4", "CUT": "2/2"}
METRONOME = re.compile(r"metronome", re.IGNORECASE)  # clicks to count a song in, not a groove
# GM flute, alto sax, trumpet, clarinet, oboe, violin, tenor sax, vibraphone
LEAD_PROGRAMS = (73, 65, 56, 71, 68, 40, 66, 11)
MELODY_TRACK = "MELODY"  # POP909's name for its melody track
EDGE = 1 / 24  # beats: half the song tokens' grid step (a 12th of a quarter)


@dataclass(frozen=True)
class Meter:
    """How a groove fills a bar: `beats` MMA beats (quarter notes of its MIDI), its chords at
    `tabs` (MMA beats from the bar line), notated numerator/denominator."""

    beats: float
    tabs: tuple[float, ...]
    numerator: int
    denominator: int

    @property
    def name(self) -> str:
        return f"{self.numerator}/{self.denominator}"

    @property
    def compound(self) -> bool:
        """Felt in dotted quarters (6/8, 12/8), not in the notated beat."""
        return self.denominator == 8 and self.numerator % 3 == 0

    @property
    def felt(self) -> int:
        """The beats one counts in a bar: a chord (and a beat of a song) each."""
        return self.numerator // 3 if self.compound else self.numerator

    @property
    def quarters_per_beat(self) -> Fraction:
        """Quarter notes of the notated bar per MMA beat (1/2: MMA's beats are eighths)."""
        return Fraction(4 * self.numerator, self.denominator) / Fraction(self.beats)

    def felt_beat(self, tab: float) -> int | None:
        """The felt beat a chord position starts, None when it falls inside one."""
        at = Fraction(tab) * self.felt / Fraction(self.beats)
        return int(at) if at.denominator == 1 else None


FOUR_FOUR = Meter(4, (0, 1, 2, 3), 4, 4)


def groove_meter(beats: float, tabs: tuple[float, ...], signature: tuple[int, int] | None) -> Meter:
    """The meter a groove of `beats` MMA beats, chords at `tabs`, declared `signature`, plays in."""
    n, d = signature or (int(beats), 4)
    bar = Fraction(4 * n, d)
    if bar == Fraction(beats):
        return Meter(beats, tabs, n, d)
    if d == 8 and n % 3 == 0 and beats == int(beats):
        if beats == n:  # a beat an eighth
            return Meter(beats, tabs, n, d)
        if beats % (n // 3) == 0:  # a beat a dotted quarter: 3 eighths each
            return Meter(beats, tabs, 3 * int(beats), 8)
    if beats != int(beats):
        raise DataError(f"a bar of {beats} MMA beats declared {n}/{d} is no meter")
    return Meter(beats, tabs, int(beats), 4)


def library_meters(library: Path = LIBRARY) -> dict[tuple[str, str], Meter]:
    """(family, lower-cased groove) -> its meter, for every DefGroove in MMA's library: the `Time`
    and `TimeSig` its file sets before it (MMA's defaults: 4 beats, signature from Time)."""
    meters = {}
    for path in sorted(library.rglob("*.mma")):
        family = path.relative_to(library).with_suffix("").as_posix()
        beats, tabs, signature = 4.0, tuple(range(4)), None
        for line in path.read_text(errors="replace").splitlines():
            words = line.split("//")[0].split()
            command = words[0].lower() if len(words) >= 2 else ""
            if command == "time":
                form = TIME_NAMES.get(words[1].upper(), words[1])
                if form in TIME_FORMS:
                    beats, starts = TIME_FORMS[form]
                    tabs, signature = tuple(s - 1 for s in starts), tuple(map(int, form.split("/")))
                elif re.fullmatch(r"\d+(\.\d+)?", form):  # (not prose: "Time is set to 4")
                    beats = float(form)
                    tabs = tuple(range(int(beats))) if beats == int(beats) else (0,)
            elif command == "timesig":
                numbers = " ".join(words[1:]).replace("/", " ").split()
                if len(numbers) >= 2 and all(x.isdigit() for x in numbers[:2]):
                    signature = (int(numbers[0]), int(numbers[1]))
            elif command == "defgroove":
                try:
                    meters[(family, words[1].lower())] = groove_meter(beats, tabs, signature)
                except DataError:
                    continue
    return meters


def song_styles() -> list[tuple[Style, Meter]]:
    """The corpus' grooves and their meters: the catalogue's 4/4 ones, then every other meter."""
    meters = library_meters()
    styles = [(st, FOUR_FOUR) for st in load_styles()]
    for family, groove in library_grooves():
        meter = meters.get((family, groove.lower()))
        if meter and meter.name != "4/4" and not METRONOME.search(groove):
            styles.append((Style(family, groove, tempo_for(groove)), meter))
    return styles


@dataclass(frozen=True)
class Chart:
    """A POP909 song's annotated beats (seconds), its chord at each (held over unlabelled beats
    from the first labelled one), the downbeats from there, and its usual beats per bar."""

    song: str
    seconds: np.ndarray
    chords: list[str | None]
    downbeats: list[int]
    bar_beats: int


def song_charts(pop909: Path) -> list[Chart]:
    """Every POP909 song with annotated downbeats and chords."""
    if not pop909.is_dir():
        raise DataError(f"{pop909}: POP909 folder not found (its chords and melodies make the pieces); pass --source")
    charts = []
    for song_dir in sorted(p for p in pop909.iterdir() if (p / "chord_midi.txt").is_file()):
        try:
            seconds, downbeat, chords = beat_chords(song_dir)
        except (OSError, ValueError):
            continue
        labelled = [i for i, c in enumerate(chords) if c is not None]
        downbeats = [i for i, down in enumerate(downbeat) if down]
        if not labelled or len(downbeats) < 2 or not (np.diff(seconds) > 0).all():
            continue
        held = chords[labelled[0]]
        for i in range(labelled[0], len(chords)):
            held = chords[i] = chords[i] or held
        bar_beats = int(np.bincount(np.diff(downbeats)).argmax())
        starts = [d for d in downbeats if d >= labelled[0]]
        charts.append(Chart(song_dir.name, np.array(seconds), chords, starts, bar_beats))
    if not charts:
        raise DataError(f"{pop909}: no POP909 song with beat and chord annotations")
    return charts


@dataclass(frozen=True)
class Piece:
    """Piece k of a groove: BARS_PER_PIECE bars over `chart`'s chords from its beat `start`, at
    `tempo` (MMA beats a minute), its melody on `lead` (None: no melody)."""

    style: Style
    meter: Meter
    k: int
    chart: Chart
    start: int
    tempo: int
    lead: int | None

    @property
    def name(self) -> str:
        return f"{self.style.name}/{self.k}"

    @property
    def beats(self) -> int:
        """The song's beats the piece plays, one per felt beat."""
        return BARS_PER_PIECE * self.meter.felt

    def bars(self) -> list[list[str]]:
        """MMA's chord line of each bar: at each tab the chord of the felt beat it starts, or the
        chord before (which mma_text writes as a hold)."""
        out = []
        for bar in range(BARS_PER_PIECE):
            line, chord = [], None  # (the first tab, at the bar line, always starts a felt beat)
            for tab in self.meter.tabs:
                felt = self.meter.felt_beat(tab)
                if felt is not None:
                    chord = self.chart.chords[self.start + bar * self.meter.felt + felt]
                line.append(chord)
            out.append(line)
        return out


def plan_piece(style: Style, meter: Meter, k: int, charts: list[Chart]) -> Piece:
    """Piece k of a groove, chosen by hashing among the songs long enough, preferring those whose
    annotated bars are whole bars of the groove (POP909 annotates its songs in three as 6-beat bars)."""

    def fits(chart: Chart, start: int) -> bool:  # the piece's beats, and one more: where the last ends
        return start + BARS_PER_PIECE * meter.felt < len(chart.seconds)

    usable = [c for c in charts if any(fits(c, d) for d in c.downbeats)]
    alike = [c for c in usable if c.bar_beats % meter.felt == 0] or usable
    chart = alike[stable_hash(style.name, k, "song") % len(alike)]
    starts = [d for d in chart.downbeats if fits(chart, d)]
    start = starts[stable_hash(style.name, k, "start") % len(starts)]
    if meter.compound:
        tempo, lead = round(style.tempo * Fraction(2, 3) * Fraction(meter.beats) / meter.felt), None
    else:
        tempo, lead = style.tempo, LEAD_PROGRAMS[stable_hash(style.name, k, "lead") % len(LEAD_PROGRAMS)]
    return Piece(style, meter, k, chart, start, tempo, lead)


def piece_midi(rendered: bytes, meter: Meter, melody: np.ndarray | None, lead: int | None) -> bytes:
    """MMA's MIDI in `meter` (ticks per quarter and tempos declared again where MMA's beat is not
    a quarter), with `melody` (rows of onset, offset in MMA beats, pitch, velocity) as a track of
    program `lead` on a channel MMA left free."""
    midi = mido.MidiFile(file=io.BytesIO(rendered))
    per_quarter = midi.ticks_per_beat / meter.quarters_per_beat
    if per_quarter.denominator != 1:
        raise DataError(f"{midi.ticks_per_beat} ticks a beat make no whole ticks a quarter in {meter.name}")
    channels = set()
    for k, track in enumerate(midi.tracks):
        midi.tracks[k] = track = ended_restrikes(track)
        for msg in track:
            if msg.type == "set_tempo":
                msg.tempo = round(msg.tempo * int(per_quarter) / midi.ticks_per_beat)  # the same seconds a tick
            elif msg.type == "time_signature":
                msg.numerator, msg.denominator = meter.numerator, meter.denominator
            elif hasattr(msg, "channel"):
                channels.add(msg.channel)
    beat_ticks = midi.ticks_per_beat
    midi.ticks_per_beat = int(per_quarter)
    if melody is not None and len(melody):
        free = [c for c in range(16) if c != 9 and c not in channels]
        if not free:
            raise DataError("MMA uses every channel: none is left for the melody")
        channel, ticks = free[0], np.round(melody[:, :2] * beat_ticks).astype(np.int64)
        events = [
            (0, mido.MetaMessage("track_name", name="Melody")),
            (0, mido.Message("program_change", channel=channel, program=lead)),
        ]
        for (on, off), (pitch, velocity) in zip(ticks.tolist(), melody[:, 2:].astype(np.int64).tolist()):
            events.append((on, mido.Message("note_on", channel=channel, note=pitch, velocity=velocity)))
            events.append((max(off, on + 1), mido.Message("note_off", channel=channel, note=pitch, velocity=0)))
        midi.tracks.append(midi_track(events))
    buffer = io.BytesIO()
    midi.save(file=buffer)
    return buffer.getvalue()


def ended_restrikes(track: mido.MidiTrack) -> mido.MidiTrack:
    """`track` with a note-off before every note-on of a pitch still sounding on its channel: MMA
    re-strikes strings so, and a synthesiser then ends the first note, but a MIDI reader (symusic)
    would keep only the first note, to the first note-off."""
    out, sounding = mido.MidiTrack(), Counter()
    for msg in track:
        if msg.type == "note_on" and msg.velocity > 0:
            key = (msg.channel, msg.note)
            if sounding[key]:
                out.append(mido.Message("note_off", channel=msg.channel, note=msg.note, time=msg.time))
                msg = msg.copy(time=0)
            sounding[key] = 1
        elif msg.type in ("note_on", "note_off"):
            sounding[(msg.channel, msg.note)] = 0
        out.append(msg)
    return out


def song_melody(song_file: Path, seconds: np.ndarray, start: int, beats: int) -> np.ndarray:
    """The song's MELODY notes that start in its beats start .. start + beats (up to EDGE), as rows
    of (onset, offset, pitch, velocity), times in beats from `start` (each beat spans the annotated
    interval, linearly); a note still sounding at the end ends there."""
    score = load_score(song_file).to("second")
    track = next((t for t in score.tracks if t.name.strip().upper() == MELODY_TRACK), None)
    if track is None:
        raise DataError(f"{song_file}: no {MELODY_TRACK} track")
    notes = track.notes.numpy()
    index = np.arange(len(seconds), dtype=np.float64)
    onset = np.interp(notes["time"], seconds, index) - start
    offset = np.interp(notes["time"] + notes["duration"], seconds, index) - start
    # a note within half a grid step of the window's edge belongs to the bar it rounds to
    keep = (onset >= -EDGE) & (onset < beats - EDGE) & (notes["time"] >= seconds[0])
    rows = np.stack([np.maximum(onset, 0), np.minimum(offset, beats), notes["pitch"], notes["velocity"]], axis=1)
    return rows[keep]


class MmaSong(Corpus):
    name = "mma-song"
    fractions = {"validation": 0.05, "test": 0.05}  # of the groove families, hashed

    def __init__(self, scale: int = 1):
        """`scale`: pieces per groove, each over another song (or another part of one)."""
        if scale < 1:
            raise DataError(f"scale must be at least 1, not {scale}")
        self.scale = scale

    def tokenizer(self, option: str | None) -> Tokenizer:
        if option not in (None, "song"):
            raise DataError(f"{self.name} keeps every track and meter: only --tokenizer song applies, not {option!r}")
        return tokenizer_from_dict({"kind": "song"})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        """The POP909 folder whose chords and melodies the pieces play."""
        return source or SHARED_DATASETS / "pop909"

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The pieces, rendered where they are not yet (a rerun resumes); with `limit`, the
        grooves taken in turn from each meter, so a small trial has them all."""
        charts = song_charts(root)
        pieces = [
            plan_piece(style, meter, k, charts) for k in range(self.scale) for style, meter in by_meter(song_styles())
        ][:limit]
        items, jobs = [], []
        for piece in pieces:
            path = out / "midi" / f"{piece.name}.mid"
            items.append(Item(name=piece.name, path=path, group=piece.style.family))
            if not path.is_file():
                jobs.append((piece, root / piece.chart.song / f"{piece.chart.song}.mid", path))
        failures, rendered, seconds = render_jobs(_render_piece, jobs, len(items), workers, "rendering (mma)")
        failed = dict(line.split(": ", 1) for line in failures)
        kept = [it for it in items if it.path.is_file()]
        refused = [(it.name, failed.get(it.name, "not rendered")) for it in items if not it.path.is_file()]
        planned = {p.name: p for p in pieces}
        report = {
            "corpus": self.name,
            "pieces_per_style": self.scale,
            "bars_per_piece": BARS_PER_PIECE,
            "meters": dict(Counter(planned[it.name].meter.name for it in kept)),
            "with_melody": sum(planned[it.name].lead is not None for it in kept),
            "rendered": rendered,
            "render_seconds": seconds,
        }
        return Listing(kept, refused, report)


prepare = MmaSong().prepare


def by_meter(styles: list[tuple[Style, Meter]]) -> list[tuple[Style, Meter]]:
    """The styles taken in turn from each meter (the rarest first), each meter's in their order."""
    groups: dict[str, list] = {}
    for entry in styles:
        groups.setdefault(entry[1].name, []).append(entry)
    queues = sorted(groups.values(), key=len)
    out = []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def _render_piece(job) -> tuple[str | None, bool]:
    """Render one piece with MMA and write it with its melody. Returns an error line or None, and
    whether MMA ran."""
    piece, song, dest = job
    try:
        text = mma_text(piece.style, piece.bars(), stable_hash(piece.name) % 100_000, piece.tempo)
        melody = None if piece.lead is None else song_melody(song, piece.chart.seconds, piece.start, piece.beats)
        write_bytes(dest, piece_midi(render_mma(text), piece.meter, melody, piece.lead))
        return None, True
    except MusegenError as exc:
        return f"{piece.name}: {exc}", True
