"""Beats and downbeats found in the notes themselves, for a MIDI file whose grid is not the music's.

A played or offset file (notes off its tick grid, a first beat not at tick 0) puts every bar line
and 16th of a representation in the wrong place. `track_beats` finds the music's beats and bars
from the notes alone, in the form `beats.synchronise` takes (times in seconds, downbeat flags):

1. an onset envelope on the file's own time axis (its beats, so that a tempo map the musician
   played to keeps the beat period constant): every note onset adds its velocity, bass notes
   twice as much;
2. the beat period by autocorrelation of the envelope, weighted by a prior on tempo (around
   100 BPM) that also favours the file's own beat when it is a strong period;
3. the beats by dynamic programming (Ellis 2007): the path through the envelope's peaks whose
   intervals stay close to the period, so the tempo may drift slowly;
4. the downbeats by where the bars' cues fall: harmony changing (the pitch classes of the two
   beats after against the two before), bass notes, long notes and accents. A Viterbi path over
   the position in the bar, which may skip or repeat a beat at a cost (a bar of 2 or 6 beats),
   picks them for 3 and for 4 beats per bar; the meter whose downbeats stand out most wins
   (`regrid` tries only 4 for a representation of 4/4 bars, and only the file's own meter where
   the file names one other than 4/4: `named_meter`).

Where the file's own grid fits the onsets as well as the tracked one, `--grid auto` (the default)
keeps the file.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import symusic

from ..errors import MidiError
from .beats import synchronise
from .constants import DEFAULT_BPM, MAX_BARS
from .meter import main_signature, signature_changes
from .notes import NoteTable

FRAME_SECONDS = 0.02  # the envelope's resolution, at the file's median tempo
MAX_SECONDS = 6 * 3600.0  # longer (at the median tempo) is a broken file, and its envelope would not fit in memory
TEMPO_PRIOR_BPM = 100.0  # the centre of the prior on tempo (log-normal, an octave wide)
TIGHTNESS = 400.0  # how much a beat interval may stray from the period (Ellis's alpha)
METERS = (4, 3)  # beats per bar tried, in order of preference on a tie
SKIP_COST = 8.0  # a bar of other than the meter's length, in log-odds of the downbeat cues
# the log-odds of a downbeat from `bar_features` (bias first), fitted by
# scripts/experiments/tracker_regular.py --fit on POP909's annotated downbeats and on played pieces
# of music21's corpus, half each: POP909's alone left chorales and fiddle tunes on the wrong beat
CUE_WEIGHTS = np.array(
    [-1.49]
    + [-0.02, 0.34, 0.43, 0.21, 0.03, 0.35, 0.16, 0.14]
    + [0.03, -0.12, -0.35, -0.26, -0.1, -0.45, -0.46, 0.37]
    + [0.09, -0.3, -0.22, -0.04, 0.09, -0.16, 0.21, -0.3]
)


@dataclass(frozen=True)
class Beats:
    """Beat times in seconds with downbeat flags, and what finding them assumed."""

    seconds: np.ndarray
    downbeat: np.ndarray
    source: str  # "tracked": found in the notes; "file": the file's own grid
    bpm: float
    beats_per_bar: int
    confidence: float  # the weighted share of onsets within a 32nd of the grid's 16ths
    meter_from: str = "notes"  # what set beats_per_bar: the "notes", or the "file"'s time signatures

    @property
    def first_downbeat(self) -> float:
        return float(self.seconds[np.argmax(self.downbeat)])

    def record(self) -> dict[str, Any]:
        """What the grid assumed, as a sample's JSON records it (`describe` reads it back)."""
        return {
            "source": self.source,
            "bpm": round(self.bpm, 2),
            "beats_per_bar": self.beats_per_bar,
            "first_downbeat_seconds": round(self.first_downbeat, 3),
            "onsets_on_grid": round(self.confidence, 3),
            "meter_from": self.meter_from,
        }


def describe(record: dict[str, Any]) -> str:
    """One line saying what a grid (`Beats.record`) assumed."""
    where = "tracked beats" if record["source"] == "tracked" else "the file's own grid"
    if "bpm" not in record:  # the file's grid, trusted without measuring it
        return f"grid: {where}"
    named = record["source"] == "tracked" and record.get("meter_from") == "file"
    meter = " (the file's time signature)" if named else ""
    return (
        f"grid: {where}, {record['bpm']:.1f} BPM, {record['beats_per_bar']} beats per bar{meter}, first downbeat at "
        f"{record['first_downbeat_seconds']:.2f} s, {record['onsets_on_grid']:.0%} of onsets on its 16ths"
    )


def as_table(piece: symusic.Score | NoteTable) -> NoteTable:
    return piece if isinstance(piece, NoteTable) else NoteTable.from_score(piece, by_role=False)


def length_in_beats(table: NoteTable) -> float:
    """Where the last note ends, in the file's beats; a MidiError past the longest piece (MAX_BARS
    bars of 8 beats), whose grid would not fit in memory (a tick 2^31 at 1 tick a beat)."""
    beats = float(table.end.max()) / table.tpq
    if beats > 8 * MAX_BARS:
        raise MidiError(f"its notes last {beats:,.0f} beats, more than the longest piece ({MAX_BARS:,} bars)")
    return beats


def seconds_of(table: NoteTable, beats: np.ndarray) -> np.ndarray:
    """The time in seconds at each position in the file's beats (its ticks / tpq), by its tempo map."""
    tempos = [(0, DEFAULT_BPM)] + [(t, q) for t, q in table.tempos if q > 0]
    at = np.array([t for t, _ in tempos], dtype=np.float64) / table.tpq
    qpm = np.array([q for _, q in tempos], dtype=np.float64)
    at, qpm = at[::-1], qpm[::-1]  # the last tempo given at a tick wins: keep it, drop earlier ones
    at, first = np.unique(at, return_index=True)
    qpm = qpm[first]
    clock = np.r_[0.0, np.cumsum(np.diff(at) * 60.0 / qpm[:-1])]
    k = np.maximum(np.searchsorted(at, beats, side="right") - 1, 0)
    return clock[k] + (beats - at[k]) * 60.0 / qpm[k]


def mean_bpm(seconds: np.ndarray) -> float:
    return 60.0 * (len(seconds) - 1) / float(seconds[-1] - seconds[0])


def grid_fit(onsets: np.ndarray, weights: np.ndarray, beats: np.ndarray) -> float:
    """The weighted share of onsets within a 32nd note of a 16th of `beats` (positions on one axis)."""
    index = np.interp(onsets, beats, np.arange(len(beats)), left=np.nan, right=np.nan)
    inside = ~np.isnan(index)
    if not inside.any():
        return 0.0
    off = np.abs((4 * index[inside] + 0.5) % 1 - 0.5)
    return float(np.sum(weights[inside] * (off <= 0.5 / 2)) / np.sum(weights[inside]))


# ---- beats ---------------------------------------------------------------------------------------


def onset_weights(table: NoteTable) -> np.ndarray:
    """Each note's strength as an onset: its velocity, twice for bass (the lowest fifth of the pitches)."""
    drums = np.array([t.is_drum for t in table.tracks], dtype=bool)[table.track]
    pitched = table.pitch[~drums]
    low = np.percentile(pitched, 20) if len(pitched) else 0
    return table.velocity / 127.0 * np.where(~drums & (table.pitch <= low), 2.0, 1.0)


def envelope(onsets: np.ndarray, weights: np.ndarray, frame: float) -> np.ndarray:
    """Onset strength per frame (onsets in file beats), compressed and slightly smoothed."""
    n = int(np.ceil(onsets.max() / frame)) + 2
    env = np.bincount(np.round(onsets / frame).astype(np.int64), weights, minlength=n)
    env = np.convolve(np.log1p(4 * env), [0.25, 0.5, 0.25], mode="same")
    return env / (env.std() + 1e-9)


def beat_period(env: np.ndarray, frame: float, beat_seconds: float) -> float:
    """The beat period in frames: the autocorrelation's strongest lag under a tempo prior, with
    the file's own beat (1 / frame) favoured where it is a strong period."""
    n = len(env)
    spectrum = np.fft.rfft(env - env.mean(), 2 * n)
    ac = np.fft.irfft(spectrum * np.conj(spectrum))[:n] / np.arange(n, 0, -1)
    lags = np.arange(1, n)
    bpm = 60.0 / (lags * frame * beat_seconds)
    usable = (bpm >= 40) & (bpm <= 220)
    if not usable.any():
        raise MidiError("its notes span too short a time to find a beat in")
    score = ac[1:] * np.exp(-0.5 * np.log2(bpm / TEMPO_PRIOR_BPM) ** 2)
    own = np.abs(lags * frame - 1.0) <= frame  # the file's beat
    score = np.where(own, ac[1:] * 2.0, score)
    best = lags[usable][np.argmax(score[usable])]
    # refine to a fraction of a frame by a parabola through the peak
    a, b, c = ac[best - 1], ac[best], ac[min(best + 1, n - 1)]
    shift = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) < 0 else 0.0
    return best + float(np.clip(shift, -0.5, 0.5))


def beat_frames(env: np.ndarray, period: float) -> np.ndarray:
    """Ellis's dynamic programme: the frames of the beats that best fit the envelope's peaks
    with intervals near `period`."""
    n = len(env)
    lags = np.arange(max(1, int(period / 2)), int(np.ceil(2 * period)) + 1)
    penalty = -TIGHTNESS * np.log(lags / period) ** 2
    score = env.astype(np.float64).copy()
    back = np.full(n, -1, dtype=np.int64)
    shortest = int(lags[0])
    # the frames of a block shorter than the shortest lag depend only on frames before it
    for first in range(shortest, n, shortest):
        t = np.arange(first, min(first + shortest, n))
        before = t[:, None] - lags[None, :]
        candidates = np.where(before >= 0, score[np.maximum(before, 0)] + penalty, -np.inf)
        best = candidates.argmax(1)
        rows = np.arange(len(t))
        score[t] += candidates[rows, best]
        back[t] = before[rows, best]
    # end on the best-scoring frame among the last period's peaks
    tail = np.arange(max(0, n - int(np.ceil(period)) - 1), n)
    t = int(tail[np.argmax(score[tail])])
    path = [t]
    while back[t] >= 0:
        t = int(back[t])
        path.append(t)
    return np.array(path[::-1], dtype=np.float64)


def extend(beats: np.ndarray, start: float, stop: float) -> np.ndarray:
    """Beats extended at their first and last interval to cover [start, stop]."""
    if len(beats) < 2:
        raise MidiError("too few notes to find a beat in")
    first, last = beats[1] - beats[0], beats[-1] - beats[-2]
    before = beats[0] - first * np.arange(int(np.ceil((beats[0] - start) / first)), 0, -1)
    after = beats[-1] + last * np.arange(1, int(np.ceil((stop - beats[-1]) / last)) + 1)
    return np.r_[before, beats, after]


# ---- downbeats -----------------------------------------------------------------------------------


def bar_features(table: NoteTable, beats: np.ndarray) -> np.ndarray:
    """Per beat, the cues that a bar starts there, z-scored over the piece: the harmony changing
    (over 1, 2 and 4 beats), bass notes struck (held long, new pitch), long notes, accents, notes
    struck; and each cue one beat before and after, for the contrast."""
    drums = np.array([t.is_drum for t in table.tracks], dtype=bool)[table.track]
    n = len(beats)
    where = lambda ticks: np.interp(ticks / table.tpq, beats, np.arange(n))  # noqa: E731
    start, end = where(table.start), where(table.end)
    struck = np.round(start).astype(np.int64)
    hit = (np.abs(start - struck) <= 0.125) & (struck >= 0) & (struck < n)  # within a 32nd of a beat
    lasting = np.minimum(end - start, 4.0)
    pitched = ~drums
    low = np.percentile(table.pitch[pitched], 20) if pitched.any() else 0
    bass = hit & pitched & (table.pitch <= low)
    cues = np.zeros((n, 8))
    np.add.at(cues[:, 3], struck[bass], lasting[bass])
    lowest = np.full(n, 128)
    np.minimum.at(lowest, struck[hit & pitched], table.pitch[hit & pitched])
    held = np.maximum.accumulate(np.where(lowest < 128, np.arange(n), 0))
    cues[1:, 4] = (lowest[1:] < 128) & (lowest[1:] != lowest[held[:-1]])
    np.add.at(cues[:, 5], struck[hit & pitched], lasting[hit & pitched] ** 2)
    np.add.at(cues[:, 6], struck[hit], table.velocity[hit] / 127.0)
    np.add.at(cues[:, 7], struck[hit], 1.0)
    chroma = pitch_classes(start[pitched], end[pitched], table.pitch[pitched], n)
    for column, width in enumerate((1, 2, 4)):
        cues[:, column] = harmony_change(chroma, width)
    cues = (cues - cues.mean(0)) / (cues.std(0) + 1e-9)
    return np.hstack([cues, np.roll(cues, 1, 0), np.roll(cues, -1, 0)])


def bar_cues(table: NoteTable, beats: np.ndarray) -> np.ndarray:
    """Per beat, the log-odds that a bar starts there (CUE_WEIGHTS on `bar_features`)."""
    return bar_features(table, beats) @ CUE_WEIGHTS[1:] + CUE_WEIGHTS[0]


def pitch_classes(start: np.ndarray, end: np.ndarray, pitch: np.ndarray, n: int) -> np.ndarray:
    """How long each pitch class sounds in each beat (times in beats)."""
    chroma = np.zeros((n, 12))
    for s, e, p in zip(start.tolist(), end.tolist(), (pitch % 12).tolist()):
        for k in range(max(0, int(s)), min(n, int(np.ceil(e)))):
            chroma[k, p] += min(e, k + 1) - max(s, k)
    return chroma


def harmony_change(chroma: np.ndarray, width: int) -> np.ndarray:
    """Per beat, the cosine distance between the pitch classes sounding in the `width` beats
    after it and in the `width` before."""
    summed = np.r_[np.zeros((1, 12)), np.cumsum(chroma, 0)]
    n = len(chroma)
    k = np.arange(n)
    after = summed[np.minimum(k + width, n)] - summed[k]
    before = summed[k] - summed[np.maximum(k - width, 0)]
    norms = np.linalg.norm(after, axis=1) * np.linalg.norm(before, axis=1)
    return np.where(norms > 0, 1 - np.sum(after * before, 1) / np.maximum(norms, 1e-9), 0.0)


def bar_path(cue: np.ndarray, meter: int) -> np.ndarray:
    """Each beat's position in its bar (0: a downbeat): the Viterbi path most likely under the
    cue's log-odds, a bar of another length costing SKIP_COST."""
    n = len(cue)
    is_downbeat = -np.logaddexp(0, -cue)  # log sigmoid
    not_downbeat = -np.logaddexp(0, cue)
    gain = lambda i: np.where(np.arange(meter) == 0, is_downbeat[i], not_downbeat[i])  # noqa: E731
    score = gain(0)
    back = np.zeros((n, meter), dtype=np.int64)
    for i in range(1, n):
        step = np.roll(score, 1)  # position p comes from p - 1
        jump = score.max() - SKIP_COST
        back[i] = np.where(step >= jump, (np.arange(meter) - 1) % meter, int(score.argmax()))
        score = np.maximum(step, jump) + gain(i)
    position = np.zeros(n, dtype=np.int64)
    position[-1] = int(score.argmax())
    for i in range(n - 1, 0, -1):
        position[i - 1] = back[i, position[i]]
    return position


def downbeats(cue: np.ndarray, meters: tuple[int, ...] = METERS) -> tuple[np.ndarray, int]:
    """(downbeat flags, beats per bar): of `meters`, the one whose downbeats' cue stands out most
    from the other beats'."""
    best = None
    for meter in meters:
        flags = bar_path(cue, meter) == 0
        contrast = cue[flags].mean() - cue[~flags].mean() if flags.any() and (~flags).any() else -np.inf
        if best is None or contrast > best[0] + 1e-9:
            best = (contrast, flags, meter)
    return best[1], best[2]


# ---- the two grids -------------------------------------------------------------------------------


def track_beats(piece: symusic.Score | NoteTable, meters: tuple[int, ...] = METERS) -> Beats:
    """The beats and downbeats the notes imply (see the module's docstring), in bars of one of
    `meters` beats (or of another length where the cues say the bar phase moves)."""
    table = as_table(piece)
    if len(table) < 8:
        raise MidiError("too few notes to find a beat in (8 or more needed)")
    length = length_in_beats(table)
    onsets = table.start / table.tpq  # in the file's beats
    weights = onset_weights(table)
    qpm = float(np.median([q for _, q in table.tempos])) if table.tempos else DEFAULT_BPM
    beat_seconds = 60.0 / qpm
    if length * beat_seconds > MAX_SECONDS:
        raise MidiError(
            f"its notes last {length * beat_seconds / 3600:,.1f} hours at its median tempo: too long to track"
        )
    frame = FRAME_SECONDS / beat_seconds  # in the file's beats
    env = envelope(onsets - onsets.min(), weights, frame)
    period = beat_period(env, frame, beat_seconds)
    found = beat_frames(env, period) * frame + onsets.min()
    beats = extend(found, 0.0, length)
    beats = beats[beats >= 0]  # nothing before the file's start
    flags, meter = downbeats(bar_cues(table, beats), meters)
    seconds = seconds_of(table, beats)
    return Beats(
        seconds,
        flags,
        "tracked",
        mean_bpm(seconds),
        meter,
        grid_fit(onsets, weights, beats),
    )


def file_beats(piece: symusic.Score | NoteTable) -> Beats:
    """The file's own grid: a beat every quarter note, bars by its time signatures (4/4 without)."""
    table = as_table(piece)
    if not len(table):
        raise MidiError("the file holds no notes")
    beats = np.arange(0, int(np.ceil(length_in_beats(table))) + 2, dtype=np.float64)
    flags = np.zeros(len(beats), dtype=bool)
    # a signature of no beats (0/4, 4/0: a broken file) places no bar line; the tokenizer says what it makes of it
    meters = signatures(table) or [(0, 4, 4)]
    for k, (tick, numerator, denominator) in enumerate(meters):
        stop = meters[k + 1][0] / table.tpq if k + 1 < len(meters) else beats[-1] + 1
        inside = (beats >= tick / table.tpq) & (beats < stop)
        flags |= inside & np.isclose((beats - tick / table.tpq) % (numerator * 4 / denominator), 0)
    seconds = seconds_of(table, beats)
    numerator, denominator = file_signature(table)
    return Beats(
        seconds,
        flags,
        "file",
        mean_bpm(seconds),
        round(numerator * 4 / denominator),
        grid_fit(table.start / table.tpq, onset_weights(table), beats),
        meter_from="file",
    )


def file_signature(table: NoteTable) -> tuple[int, int]:
    """The time signature the file spends most of its notes' length in (4/4 without one)."""
    return main_signature(signature_changes(table.time_signatures), int(table.end.max()) if len(table) else 0)


def signatures(table: NoteTable) -> list[tuple[int, int, int]]:
    """The file's time signature changes as its tokenizers read them (`signature_changes`), less
    any of no beats (0/4, 4/0: a broken file; they place no bar line, and the tokenizer says what
    it makes of them)."""
    return [m for m in signature_changes(table.time_signatures) if m[1] > 0 and m[2] > 0]


# ---- measuring -----------------------------------------------------------------------------------


def within_a_16th(found: np.ndarray, wanted: np.ndarray, beats: np.ndarray) -> float:
    """The share of `wanted` times with one of `found` within a 16th note, a quarter of the
    beat interval of `beats` (annotated beats, in seconds) where it lies."""
    if not len(wanted):
        return 1.0
    if not len(found):
        return 0.0
    local = np.interp(wanted, beats[:-1], np.diff(beats))
    k = np.clip(np.searchsorted(found, wanted), 1, len(found) - 1)
    nearest = np.minimum(np.abs(found[k - 1] - wanted), np.abs(found[k] - wanted))
    return float(np.mean(nearest <= local / 4))


def downbeat_agreement(found: Beats, seconds: np.ndarray, downbeat: np.ndarray) -> tuple[float, float]:
    """(recall, precision) of `found`'s downbeats against annotated ones (`seconds`, `downbeat`),
    each within a 16th; found downbeats outside the annotated beats' span are not counted."""
    mine = found.seconds[found.downbeat]
    span = np.median(np.diff(seconds)) / 2
    mine = mine[(mine >= seconds[0] - span) & (mine <= seconds[-1] + span)]
    theirs = seconds[downbeat]
    return within_a_16th(mine, theirs, seconds), within_a_16th(theirs, mine, seconds)


# ---- choosing ------------------------------------------------------------------------------------

GRIDS = ("auto", "track", "file")
# the time signatures a representation of 4/4 bars takes as 4/4 (REMI re-bars 1/4 and 2/4)
FOUR_FOUR = {(4, 4), (2, 4), (2, 2), (1, 4)}


def named_meter(signature: tuple[int, int]) -> int | None:
    """The beats a bar a file's main time signature (`file_signature`) names,
    where it is a meter of quarter or half notes other than 4 quarters (2/4, 3/4, 5/4, 6/4, 3/2:
    counted in quarters); else None: 4/4 (what most played files say, whatever they hold), or a
    meter of 8th notes (6/8, 7/8), whose beat the tracker may hear as the 8th or a dotted quarter."""
    numerator, denominator = signature
    quarters = numerator * 4 / denominator
    return int(quarters) if denominator in (2, 4) and quarters in (2, 3, 5, 6, 7, 8) else None


def regular_bars(beats: Beats) -> Beats:
    """`beats` with a downbeat every `beats_per_bar` beats, on the phase that holds most of its own
    downbeats: what a representation of one bar length can take of a path whose bar phase moves."""
    k = np.arange(len(beats.downbeat))
    phase = np.bincount(k[beats.downbeat] % beats.beats_per_bar, minlength=beats.beats_per_bar).argmax()
    return replace(beats, downbeat=k % beats.beats_per_bar == phase)


def regrid(score: symusic.Score, grid: str, meters: bool = False) -> tuple[symusic.Score, Beats | None]:
    """`score` on the grid `grid` names, and that grid: "file" keeps the file's own; "track"
    re-times the score to the tracked beats (`beats.synchronise`), each beat a quarter note;
    "auto" tracks and keeps the file's own grid where it fits the onsets at least as well (a
    quantised file), or where there are too few notes to track. With `meters` (a representation
    with time signatures) the tracked bars are kept as found: in the meter the file names
    (`named_meter`), else 3 beats a bar or 4, and any bar of another length between; without,
    the bars are 4/4 from start to end (never a 3-beat bar stretched over four), and a file in
    another meter keeps its own grid, for the tokenizer to refuse in one line that names the bar."""
    if grid == "file":  # trusted as it is: nothing to measure (an absurd file is the tokenizer's to refuse)
        return score, None
    table = as_table(score)
    own = file_beats(table)
    signature = file_signature(table)
    if not meters and signature not in FOUR_FOUR:
        return score, own
    named = named_meter(signature) if meters else None
    try:
        tracked = track_beats(table, (named,) if named else METERS if meters else (4,))
    except MidiError:
        if grid == "track":
            raise
        return score, own
    if grid == "auto" and own.confidence >= tracked.confidence:
        return score, own
    if meters:
        tracked = replace(tracked, meter_from="file") if named else tracked
        return synchronise(score, tracked.seconds, tracked.downbeat, meters=True), tracked
    tracked = regular_bars(tracked)
    return synchronise(score, tracked.seconds, tracked.downbeat), tracked
