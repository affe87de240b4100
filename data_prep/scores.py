"""music21 scores written as MIDI, for the corpora drawn from music21's bundled corpus (chorales,
music21-song): one track per part with its General MIDI program, the score's time signatures and
metronome marks, ties merged, a velocity from the dynamics marks (a default where there are none).

A pickup bar can be written two ways (`pickup`):
- "pad": silence fills it to a whole bar, so every bar has the meter of its time signature (REMI
  holds one meter);
- "bar": every measure is a bar of its own length, as music21 measured it: a pickup of one beat
  in 3/4 is a 1/4 bar followed by the 3/4 bars, and so is a measure cut short before a repeat.
  The bar lines are then music21's own, which the `song` tokens keep (a meter per bar).
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from musegen.io import write_bytes
from musegen.music.constants import TICKS_PER_BEAT as TPQ
from musegen.music.notes import NoteTable, Track

VELOCITY = 80  # where a part has no dynamics marks
CHOIR = 52  # GM 53 "Choir Aahs", for every sung part
# part names of sung voices, from chorales to Renaissance masses and madrigals
VOICE_NAME = re.compile(
    r"soprano|alto|tenor|bass|cantus|altus|bassus|superius|discantus|contratenor|quintus|sextus|triplum|"
    r"motetus|canto|voice|voce|choir|chor",
    re.IGNORECASE,
)


def part_program(part, default: int) -> int:
    """A part's GM program: CHOIR for a sung voice, else the instrument its name says ("Violin II",
    "Cello"), else the instrument the file gives it, else `default`. The name comes first: the
    files' own programs are often their editor's default (Haydn's quartets say piano, Mozart's
    string ensemble)."""
    from music21 import instrument

    given = part.getInstrument(returnDefault=False)
    try:
        named = instrument.fromString(part.partName or "")
    except instrument.InstrumentException:
        named = None
    if named is not None and named.midiProgram is not None and not isinstance(named, instrument.Vocalist):
        return named.midiProgram  # (a "Contrabass" is no bass voice)
    names = " ".join(filter(None, [part.partName, given and given.instrumentName]))
    if isinstance(named or given, instrument.Vocalist) or VOICE_NAME.search(names):
        return CHOIR
    return given.midiProgram if given is not None and given.midiProgram is not None else default


def bar_meters(part) -> list[tuple[float, int, int]]:
    """(offset, numerator, denominator) wherever the meter of `part`'s measures changes, each
    measure in the meter of its real length: a full one in its time signature, a short one (a
    pickup, a measure split at a repeat) as that many beats of the signature's unit (8ths, 16ths
    when the beats do not fit). Whole-note meters are written in halves."""
    from music21 import meter

    measures = list(part.getElementsByClass("Measure"))
    out, signature = [], meter.TimeSignature("4/4")
    for k, measure in enumerate(measures):
        signature = measure.timeSignature or signature
        end = measures[k + 1].offset if k + 1 < len(measures) else measure.offset + measure.quarterLength
        length = Fraction(end - measure.offset).limit_denominator(64)
        if length <= 0:
            continue
        full = Fraction(signature.barDuration.quarterLength).limit_denominator(64)
        numerator, denominator = signature.numerator, signature.denominator
        while denominator < 2:  # (a 2/1 bar is a 4/2 bar: MIDI and music21 have both, the song tokens only x/2)
            numerator, denominator = numerator * 2, denominator * 2
        if length != full:
            count = length * denominator / 4
            while count.denominator != 1 and denominator < 64:
                denominator, count = denominator * 2, count * 2
            if count.denominator != 1:  # a tuplet too many or too few: the score is wrong there
                raise ValueError(f"measure {measure.number} lasts {length} quarter notes, no meter has that")
            numerator = count.numerator
        if not out or out[-1][1:] != (numerator, denominator):
            out.append((float(measure.offset), numerator, denominator))
    return out


def to_midi(score, dest: Path, bpm: float, program: int, pickup: str = "bar", instruments: bool = True) -> None:
    """Write a music21 `score` to `dest` (module docstring). `bpm`: the tempo where no metronome
    mark says one; `program`: the GM program of a part that names no instrument nor voice, or of
    every part unless `instruments`."""
    from music21 import dynamics, harmony, meter, tempo

    score = score.stripTies()
    first_part = score.parts[0]
    measures = first_part.getElementsByClass("Measure")
    pad = float(measures[0].paddingLeft or 0.0) if pickup == "pad" and measures else 0.0
    ticks = lambda quarters: int(round((float(quarters) + pad) * TPQ))  # noqa: E731
    if pickup == "bar" and measures:
        signatures = [(ticks(at), n, d) for at, n, d in bar_meters(first_part)]
    else:  # one event per change of the written signature; the first also covers the pickup's padding
        signatures, previous = [], None
        for ts in first_part.flatten().getElementsByClass(meter.TimeSignature):
            if (ts.numerator, ts.denominator) != previous:
                signatures.append((0 if previous is None else ticks(ts.offset), ts.numerator, ts.denominator))
                previous = (ts.numerator, ts.denominator)
    marks = {}  # offset -> quarter BPM, of the marks that say one ("playback only" ones count too)
    for mark in score.flatten().getElementsByClass(tempo.MetronomeMark):
        if mark.getQuarterBPM():
            marks.setdefault(float(mark.offset), float(mark.getQuarterBPM()))  # each part may repeat it
    tempos = [(ticks(at) if k else 0, q) for k, (at, q) in enumerate(sorted(marks.items()))]  # the first opens it
    tracks = []
    for part in score.parts:
        flat = part.flatten()
        loudness = [(d.offset, _velocity(d)) for d in flat.getElementsByClass(dynamics.Dynamic) if d.volumeScalar]
        notes = []
        for element in flat.notes:
            if isinstance(element, harmony.Harmony) or element.quarterLength == 0:
                continue  # chord symbols and analyses do not sound; grace notes have no length
            velocity = next((v for at, v in reversed(loudness) if at <= element.offset), VELOCITY)
            start, end = ticks(element.offset), ticks(element.offset + element.quarterLength)
            notes += [(start, end, p.midi, velocity) for p in element.pitches]
        gm = part_program(part, program) if instruments else program
        tracks.append((Track(part.partName or ("voice" if gm == CHOIR else "part"), gm, False), notes))
    write_bytes(dest, NoteTable.of_tracks(TPQ, tracks, tempos or [(0, float(bpm))], signatures).midi_bytes())


def _velocity(mark) -> int:
    return max(1, min(127, round(127 * mark.volumeScalar)))


def parse(source: Path, number: int | None = None):
    """The score in `source` (tune `number` of a file holding several); a file of several
    tunes read whole is one piece whose tunes are its parts (Josquin's voices are so written)."""
    from music21 import converter, stream

    score = converter.parse(str(source), number=number)
    return score.mergeScores() if isinstance(score, stream.Opus) else score


def convert(job: tuple[Path, int | None, Path, dict]) -> tuple[Path, str | None]:
    """A worker's job `(source, number, dest, to_midi keywords)`: the score `parse`d and written
    to `dest` unless it is there already (so a rerun resumes). Returns (dest, why it failed or None)."""
    source, number, dest, options = job
    try:
        if not dest.is_file():
            to_midi(parse(source, number), dest, **options)
        return dest, None
    except Exception as exc:  # music21 raises many types on odd scores; the piece is skipped and reported
        return dest, f"{dest.stem}: could not convert ({type(exc).__name__}: {exc})".splitlines()[0]
