"""The metrics of a continuation span (`musegen evaluate continuation`; docs/evaluation.md).

Bars are the piece's own (its time signatures; 4 beats without); steps are 16th notes; *pitched*
notes are the non-drum ones; a note *sounds* at a step or beat it overlaps for a positive time.
`SpanMetrics` (needs the prompt's pitch classes):
- notes per bar: pitched notes with their onset in the span, divided by the span's bars;
- mean duration: the mean duration (beats) of those notes, whole even past the span's end;
- polyphony: the mean number of distinct pitched pitches sounding, over the span's steps where at
  least one sounds (muspy's `polyphony`, on the 16th grid of the span);
- polyphony rate: the share of those sounding steps where more than one pitch sounds;
- polyphony rate (muspy): the share of all the span's steps where more than two pitches sound
  (muspy's `polyphony_rate` with its default threshold, over the span);
- silent beats: the share of the span's beats where no note (drums included) sounds;
- mean pitch: the mean MIDI pitch of the pitched onsets;
- bars with a low note: the share of the span's bars holding the onset of a pitched note below
  G3 (MIDI 55);
- pitch-class entropy: Shannon entropy (bits) of the pitch-class histogram of the pitched onsets
  (muspy's `pitch_class_entropy`);
- pitch-class cosine: cosine similarity of that histogram with the prompt's; 0 for a span
  without pitched notes;
- scale consistency: the largest share of pitched onsets in one major or minor scale (muspy);
- groove consistency: 1 - the mean Hamming distance between neighbouring bars' 16-step onset
  vectors (all tracks) over 16 (muspy's `groove_consistency`, over exactly the span's bars; in
  another meter a bar has its own number of 16ths, and a distance is over the longer bar's).
`RoleMetrics` (needs the real piece's roles), per role: <role> notes per bar, and <role> median
duration (beats; pitched roles). Metrics that need notes are NaN for a span without them.
"""

from __future__ import annotations

import math

import numpy as np

from ..music.notes import NoteTable
from .metric import Metric, Span, cosine

STEPS_PER_BEAT = 4  # 16th notes
LOW_PITCH = 55  # G3: "bars with a low note" counts bars where a note below it starts


def sounding(notes: NoteTable, first_bar: int, bars: int, per_beat: int = STEPS_PER_BEAT) -> np.ndarray:
    """(steps, 128) booleans over the span's grid of `per_beat` steps a beat: which pitches sound.
    A note sounds at a step it overlaps for a positive time."""
    origin = notes.beats(notes.bar_tick(first_bar)) * per_beat
    steps = round(notes.beats(notes.bar_tick(first_bar + bars)) * per_beat - origin)
    roll = np.zeros((steps, 128), dtype=bool)
    first = np.floor(notes.beats(notes.start) * per_beat - origin).astype(np.int64)
    last = (
        np.ceil(notes.beats(notes.end) * per_beat - origin).astype(np.int64) - 1
    )  # the last step starting before the end
    for lo, hi, pitch in zip(np.maximum(first, 0), np.minimum(last, steps - 1), notes.pitch):
        if lo <= hi:
            roll[lo : hi + 1, pitch] = True
    return roll


def pitch_classes(notes: NoteTable) -> np.ndarray:
    """Counts of the 12 pitch classes among `notes`."""
    return np.bincount(notes.pitch % 12, minlength=12).astype(np.float64)


def _muspy_music(notes: NoteTable):
    """A muspy.Music of `notes` for its pitch metrics (which read only the pitches)."""
    import muspy

    return muspy.Music(tracks=[muspy.Track(notes=[muspy.Note(0, int(p), 1) for p in notes.pitch])])


def groove_consistency(notes: NoteTable, first_bar: int, bars: int) -> float:
    """1 - mean Hamming distance of neighbouring bars' binary 16-step onset vectors / 16 (in
    other meters: the bars' own steps, over the longer bar's)."""
    if bars < 2:
        return math.nan
    step = notes.tpq / STEPS_PER_BEAT
    nearest = np.floor(notes.start / step + 0.5) * step  # each onset on its nearest 16th
    lines = np.array([notes.bar_tick(b) for b in range(first_bar, first_bar + bars + 1)])
    bar = notes.bar_of(nearest) - first_bar  # within the span
    onsets = [set(np.rint((nearest[bar == b] - lines[b]) / step).tolist()) for b in range(bars)]
    lengths = np.rint(np.diff(lines) / step)
    distances = [len(a ^ b) / max(la, lb) for a, b, la, lb in zip(onsets, onsets[1:], lengths, lengths[1:])]
    return float(1 - np.mean(distances))


def span_metrics(notes: NoteTable, first_bar: int, bars: int, prompt_classes: np.ndarray) -> dict[str, float]:
    """The metrics of the module docstring on bars first_bar .. first_bar + bars - 1 of `notes`."""
    import muspy

    pitched = notes.pitched()
    onsets = pitched.onsets_in(first_bar, bars)
    roll = sounding(pitched, first_bar, bars)
    voices = roll.sum(1)
    heard = voices[voices > 0]
    beats = sounding(notes, first_bar, bars, per_beat=1).any(1)
    low_bars = np.unique(onsets.bar_of(onsets.start[onsets.pitch < LOW_PITCH]))
    durations = onsets.beats(onsets.end) - onsets.beats(onsets.start)
    classes = pitch_classes(onsets)
    music = _muspy_music(onsets) if len(onsets) else None
    return {
        "notes per bar": len(onsets) / bars,
        "mean duration": float(durations.mean()) if len(onsets) else math.nan,
        "polyphony": float(heard.mean()) if len(heard) else math.nan,
        "polyphony rate": float((heard > 1).mean()) if len(heard) else math.nan,
        "polyphony rate (muspy)": float((voices > 2).mean()),
        "silent beats": float(1 - beats.mean()),
        "mean pitch": float(onsets.pitch.mean()) if len(onsets) else math.nan,
        "bars with a low note": len(low_bars) / bars,
        "pitch-class entropy": float(muspy.pitch_class_entropy(music)) if music else math.nan,
        "pitch-class cosine": 0.0 if not len(onsets) else _nan_to(cosine(classes, prompt_classes), 0.0),
        "scale consistency": float(muspy.scale_consistency(music)) if music else math.nan,
        "groove consistency": groove_consistency(notes, first_bar, bars),
    }


def _nan_to(value: float, fallback: float) -> float:
    return fallback if math.isnan(value) else value


def role_metrics(notes: NoteTable, first_bar: int, bars: int, roles: list[str]) -> dict[str, float]:
    """Per role of `roles`: notes per bar; for pitched roles the median duration (beats)."""
    out = {}
    for role in roles:
        mine = notes.in_role(role).onsets_in(first_bar, bars)
        out[f"{role} notes per bar"] = len(mine) / bars
        if role != "drums":
            out[f"{role} median duration"] = (
                float(np.median(mine.beats(mine.end) - mine.beats(mine.start))) if len(mine) else math.nan
            )
    return out


class SpanMetrics(Metric):
    needs = ("prompt_classes",)

    def compute(self, span: Span) -> dict[str, float]:
        return span_metrics(span.notes, span.first_bar, span.bars, span.context["prompt_classes"])


class RoleMetrics(Metric):
    needs = ("roles",)

    def compute(self, span: Span) -> dict[str, float]:
        return role_metrics(span.notes, span.first_bar, span.bars, span.context["roles"])
