"""Random groove loops: training pieces that can only be predicted by copying.

A piece is one random pattern of drums, bass and accompaniment, one or two bars long, played on
for BARS bars over a chord progression that loops as well. Bass and accompaniment pitches are
written relative to the bar's chord, as an arranger's groove is, so a progression longer than the
pattern moves them while the rhythm repeats. No two pieces share a pattern, so none can be learnt
by heart: once the pattern has been played, what comes next is found only by looking back and
copying. This is the skill a groove continuation needs and the MMA corpus, 721 grooves each heard
many times, does not force.

The loops join the training split of a groove corpus (`musegen data prepare mma-groove --loops N`;
validation and test stay MMA's held-out styles), and unseen ones measure whether a model copies
(`musegen evaluate copy`). The pieces are written in musegen's own layout
(tracks `Bass`, `Drums`, `Other`), which every groove tokenizer reads by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from musegen.music.constants import BEATS_PER_BAR, TICKS_PER_BEAT
from musegen.music.notes import NoteTable, Track
from musegen.music.roles import BASS, DRUMS, OTHER, ROLE_NAMES

BARS = 16  # enough for a 512-token crop after the training's bar skips
LOOP_GROUP = "loops"  # the group (and name prefix) of loop pieces; always in the training split
HELD_OUT_SEEDS = 10**9  # loops from this seed on are for evaluation; corpora take seeds below it

# General MIDI drum notes a pattern draws its kit from, by part of the kit.
KICKS = (35, 36)
BACKBEATS = (38, 40, 37, 39)  # snares, side stick, clap
PULSES = (42, 44, 51, 70, 54, 46)  # closed / pedal hi-hat, ride, shaker, tambourine, open hi-hat
COLOURS = (45, 47, 50, 56, 62, 63, 64, 75, 76)  # toms, cowbell, congas, claves, wood block
BASS_PROGRAMS = range(32, 40)
OTHER_PROGRAMS = (0, 1, 2, 4, 5, 16, 17, 24, 25, 26, 27, 48, 49, 50, 88, 89)

MAJOR_SCALE = (0, 2, 4, 5, 7, 9, 11)
TRIADS = {0: (0, 4, 7), 1: (0, 3, 7), 2: (0, 3, 7), 3: (0, 4, 7), 4: (0, 4, 7), 5: (0, 3, 7), 6: (0, 3, 6)}
SEVENTHS = {0: 11, 1: 10, 2: 10, 3: 11, 4: 10, 5: 10, 6: 10}  # the diatonic seventh over each degree


@dataclass(frozen=True)
class Chord:
    root: int  # pitch class
    tones: tuple[int, ...]  # intervals above the root, ascending


@dataclass
class Pattern:
    """One loop, in ticks from the pattern's start. Bass notes name a chord tone (an index into the
    bar's chord, octave above per len(tones)); accompaniment hits name which voices of the voicing
    sound (all of them: a chord; one: an arpeggio's note)."""

    bars: int
    drums: list[tuple[int, int, int, int]]  # onset, length, drum note, velocity
    bass: list[tuple[int, int, int, int]]  # onset, length, chord-tone index, velocity
    other: list[tuple[int, int, tuple[int, ...], int]]  # onset, length, voices, velocity


def random_loop_piece(seed: int, bars: int = BARS) -> NoteTable:
    """Loop piece number `seed`: the same piece for the same seed on every machine."""
    rng = random.Random(f"{LOOP_GROUP}:{seed}")
    unit = TICKS_PER_BEAT // rng.choice((4, 4, 4, 3))  # a sixteenth grid, or a triplet one
    pattern = _pattern(rng, rng.choice((1, 2, 2, 2)), unit)
    progression = _progression(rng, pattern.bars * rng.choice((1, 1, 2, 4)))
    bass_floor = rng.randint(28, 40)  # the lowest note the bass may play
    voicing_floor = rng.randint(48, 62)
    bar_ticks = BEATS_PER_BAR * TICKS_PER_BEAT
    loop_ticks = pattern.bars * bar_ticks

    drums, bass, other = [], [], []
    for bar in range(bars):
        start = bar * bar_ticks
        chord = progression[bar % len(progression)]
        loop_start = start - start % loop_ticks
        in_bar = lambda onset: start <= loop_start + onset < start + bar_ticks  # noqa: E731
        for onset, length, note, velocity in pattern.drums:
            if in_bar(onset):
                drums.append((loop_start + onset, loop_start + onset + length, note, velocity))
        for onset, length, tone, velocity in pattern.bass:
            if in_bar(onset):
                pitch = _chord_tone(chord, tone, bass_floor)
                bass.append((loop_start + onset, loop_start + onset + length, pitch, velocity))
        voicing = _voicing(chord, voicing_floor)
        for onset, length, voices, velocity in pattern.other:
            if in_bar(onset):
                for voice in voices:
                    pitch = voicing[voice % len(voicing)]
                    other.append((loop_start + onset, loop_start + onset + length, pitch, velocity))
    tracks = [
        (Track(ROLE_NAMES[BASS], rng.choice(BASS_PROGRAMS), False, "bass"), bass),
        (Track(ROLE_NAMES[DRUMS], 0, True, "drums"), drums),
        (Track(ROLE_NAMES[OTHER], rng.choice(OTHER_PROGRAMS), False, "other"), other),
    ]
    tempo = float(rng.randrange(70, 176, 2))
    return NoteTable.of_tracks(TICKS_PER_BEAT, tracks, [(0, tempo)], [(0, BEATS_PER_BAR, 4)])


# ---- the pattern ---------------------------------------------------------------------------------


def _pattern(rng: random.Random, bars: int, unit: int) -> Pattern:
    steps = bars * BEATS_PER_BAR * TICKS_PER_BEAT // unit
    per_beat = TICKS_PER_BEAT // unit
    return Pattern(
        bars, _drums(rng, steps, per_beat, unit), _bass(rng, steps, per_beat, unit), _other(rng, steps, per_beat, unit)
    )


def _weights(steps: int, per_beat: int, on_beat: float, off_beat: float, between: float) -> list[float]:
    """A probability per grid step: on a beat, on an off-beat eighth (straight grids), elsewhere."""
    eighth = per_beat // 2 if per_beat % 2 == 0 else None
    return [
        on_beat if s % per_beat == 0 else off_beat if eighth and s % per_beat == eighth else between
        for s in range(steps)
    ]


def _hits(rng: random.Random, weights: list[float]) -> list[int]:
    return [s for s, p in enumerate(weights) if rng.random() < p]


def _drums(rng: random.Random, steps: int, per_beat: int, unit: int) -> list[tuple[int, int, int, int]]:
    hit_length = max(unit // 2, TICKS_PER_BEAT // 8)
    kit = []
    kick = _hits(rng, _weights(steps, per_beat, rng.uniform(0.4, 0.9), rng.uniform(0.1, 0.5), rng.uniform(0.0, 0.2)))
    kit.append((rng.choice(KICKS), [0, *kick]))
    backbeat = rng.choice(BACKBEATS)
    beats = [s for s in range(steps) if s % per_beat == 0]
    if rng.random() < 0.75:  # on two and four, with some ghost notes
        ghosts = _hits(rng, [rng.uniform(0.0, 0.1)] * steps)
        kit.append((backbeat, [b for b in beats if (b // per_beat) % 2 == 1] + ghosts))
    else:
        kit.append((backbeat, _hits(rng, [rng.uniform(0.1, 0.4)] * steps)))
    pulse_every = rng.choice([s for s in (1, 2, per_beat) if per_beat % s == 0])
    kept = rng.uniform(0.7, 1.0)
    kit.append((rng.choice(PULSES), [s for s in range(0, steps, pulse_every) if rng.random() < kept]))
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        kit.append((rng.choice(COLOURS), _hits(rng, [rng.uniform(0.05, 0.3)] * steps)))
    notes = []
    for pitch, hits in kit:
        loud = rng.randint(70, 115)
        for s in sorted(set(hits)):
            accent = 10 if s % per_beat == 0 else 0
            notes.append((s * unit, hit_length, pitch, min(127, loud + accent - rng.randint(0, 12))))
    return notes


def _durations(rng: random.Random, onsets: list[int], steps: int, unit: int, most: int) -> list[int]:
    """Each note held to the next onset (the last to the loop's end) times one articulation."""
    articulation = rng.choice((0.5, 0.75, 0.95, 1.0))
    gaps = [(b - a) for a, b in zip(onsets, [*onsets[1:], steps])]
    return [max(unit // 2, min(most, round(gap * unit * articulation))) for gap in gaps]


def _bass(rng: random.Random, steps: int, per_beat: int, unit: int) -> list[tuple[int, int, int, int]]:
    onsets = sorted(
        {
            0,
            *_hits(
                rng, _weights(steps, per_beat, rng.uniform(0.3, 0.9), rng.uniform(0.1, 0.6), rng.uniform(0.0, 0.25))
            ),
        }
    )
    lengths = _durations(rng, onsets, steps, unit, 2 * TICKS_PER_BEAT)
    loud = rng.randint(70, 110)
    tones = [0] + [rng.choice((0, 0, 1, 2, 2, 3, 4)) for _ in onsets[1:]]  # root, third, fifth, (seventh), octave
    return [(s * unit, length, tone, loud - rng.randint(0, 10)) for s, length, tone in zip(onsets, lengths, tones)]


def _other(rng: random.Random, steps: int, per_beat: int, unit: int) -> list[tuple[int, int, tuple[int, ...], int]]:
    loud = rng.randint(55, 100)
    voices = rng.choice((3, 4))
    style = rng.choice(("pad", "comp", "comp", "arpeggio"))
    if style == "pad":  # a held chord every bar or half bar
        every = rng.choice((2, 4)) * per_beat
        onsets = list(range(0, steps, every))
    elif style == "comp":  # chord stabs in a rhythm of their own
        onsets = sorted(
            {
                *_hits(
                    rng, _weights(steps, per_beat, rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.7), rng.uniform(0.0, 0.3))
                )
            }
        )
        onsets = onsets or [0]
    else:  # one voice at a time, in a figure that repeats
        every = rng.choice([s for s in (1, 2, per_beat) if per_beat % s == 0])
        onsets = list(range(0, steps, every))
    lengths = _durations(rng, onsets, steps, unit, 4 * TICKS_PER_BEAT)
    if style == "arpeggio":
        figure = [rng.randrange(voices + 1) for _ in range(rng.choice((3, 4, 6, 8)))]
        played = [(figure[k % len(figure)],) for k in range(len(onsets))]
    else:
        played = [tuple(range(voices))] * len(onsets)
    return [(s * unit, length, p, loud - rng.randint(0, 12)) for s, length, p in zip(onsets, lengths, played)]


# ---- harmony -------------------------------------------------------------------------------------


def _progression(rng: random.Random, bars: int) -> list[Chord]:
    """`bars` diatonic chords in a random key, the first on the tonic, sevenths now and then."""
    key = rng.randrange(12)
    sevenths = rng.random() < 0.4
    chords = []
    for bar in range(bars):
        degree = 0 if bar == 0 else rng.choice((0, 1, 2, 3, 3, 4, 4, 5, 5))
        tones = TRIADS[degree] + ((SEVENTHS[degree],) if sevenths and rng.random() < 0.6 else ())
        chords.append(Chord((key + MAJOR_SCALE[degree]) % 12, tones))
    return chords


def _chord_tone(chord: Chord, index: int, floor: int) -> int:
    """Chord tone `index` (past the last: the root an octave up) at or above `floor`."""
    interval = chord.tones[index] if index < len(chord.tones) else 12
    root = floor + (chord.root - floor) % 12
    return root + interval


def _voicing(chord: Chord, floor: int) -> list[int]:
    """The chord's tones upward from the first at or above `floor`, with the root doubled on top."""
    root = floor + (chord.root - floor) % 12
    return [root + t for t in chord.tones] + [root + 12]
