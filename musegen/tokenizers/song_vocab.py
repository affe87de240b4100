"""The vocabulary of the `song` representation: every track of a song, its meter and its tempo.

Time is counted in units of a 12th of a quarter note, which holds 16ths (3 units), 8th-note
triplets (4) and 16th triplets (2). Ids are fixed (the representation has no settings):

- `PAD_None`, `Start`, `End`, `Bar_None`;
- `TimeSig_<n>/<d>` after every Bar: the bar's meter, x/4 and x/8 up to 8 quarter notes long,
  x/2 up to 4 half notes;
- `Position_<u>`: a cell's onset in units from the bar line, 0..95 (8 quarter notes);
- `Tempo_<bpm>`: 160 tempos 30..300 BPM, 48 to the octave (a step of 1.45%, so the nearest
  holds any tempo within 0.73%);
- `Program_<p>` (p -1 for drums, 0..127 General MIDI) and `Program_<p>.<s>` for the second to
  fourth track of one program (POP909's melody, bridge and piano are all program 0);
- `Pitch_<p>` 21..108 (the piano's keys) for pitched tracks, `Drum_<p>` 27..87 for drums;
- `Velocity_<v>`: 16 bins of 8;
- `Duration_<u>`: every unit up to 8 quarters, then every quarter up to 16.
"""

from __future__ import annotations

import numpy as np

UNITS_PER_BEAT = 12  # a 12th of a quarter note: 16ths and triplets alike
MAX_BAR_UNITS = 8 * UNITS_PER_BEAT
# every meter whose bar is a whole number of 8ths, at most 8 quarter notes long
METERS = [(n, 4) for n in range(1, 9)] + [(n, 8) for n in range(1, 17)] + [(n, 2) for n in range(1, 5)]
TEMPOS = 30.0 * 2.0 ** (np.arange(160) / 48)  # 30 .. 299 BPM
PITCHES = range(21, 109)
DRUMS = range(27, 88)
VELOCITY_BIN = 8  # 16 bins: 0..7, 8..15, ..., each decoded at its middle
DURATIONS = np.array(list(range(1, MAX_BAR_UNITS + 1)) + list(range(108, 193, 12)))
SLOTS = 4  # tracks of one program told apart; a fifth and later join the fourth
DRUM_PROGRAM = -1
PAD = 0


def bar_units(numerator: int, denominator: int) -> int:
    return numerator * 4 * UNITS_PER_BEAT // denominator


def program_name(program: int, slot: int) -> str:
    return f"Program_{program}" + (f".{slot}" if slot else "")


class SongVocab:
    """Ids and lookup tables of the song tokens."""

    def __init__(self):
        vocab = ["PAD_None", "Start", "End", "Bar_None"]
        vocab += [f"TimeSig_{n}/{d}" for n, d in METERS]
        vocab += [f"Position_{u}" for u in range(MAX_BAR_UNITS)]
        vocab += [f"Tempo_{bpm:.2f}" for bpm in TEMPOS]
        self.programs = [(DRUM_PROGRAM, 0)] + [(p, s) for s in range(SLOTS) for p in range(128)]
        vocab += [program_name(p, s) for p, s in self.programs]
        vocab += [f"Pitch_{p}" for p in PITCHES] + [f"Drum_{p}" for p in DRUMS]
        velocities = [f"Velocity_{v * VELOCITY_BIN + VELOCITY_BIN // 2}" for v in range(128 // VELOCITY_BIN)]
        vocab += velocities
        vocab += [f"Duration_{u}" for u in DURATIONS]
        self.vocab = vocab
        index = {name: i for i, name in enumerate(vocab)}
        self.start_id, self.end_id, self.bar_id = 1, 2, 3  # PAD is 0
        self.meter_ids = np.array([index[f"TimeSig_{n}/{d}"] for n, d in METERS])
        self.position_ids = np.array([index[f"Position_{u}"] for u in range(MAX_BAR_UNITS)])
        self.tempo_ids = np.array([index[f"Tempo_{bpm:.2f}"] for bpm in TEMPOS])
        self.program_ids = np.array([index[program_name(p, s)] for p, s in self.programs])
        self.pitch_ids = np.array([index[f"Pitch_{p}"] for p in PITCHES])
        self.drum_ids = np.array([index[f"Drum_{p}"] for p in DRUMS])
        self.velocity_ids = np.array([index[name] for name in velocities])
        self.duration_ids = np.array([index[f"Duration_{u}"] for u in DURATIONS])
        size = len(vocab)
        # id -> value tables, -1 where the id is of another kind
        self.meter_of = _inverse(self.meter_ids, size)
        self.position_of = _inverse(self.position_ids, size)
        self.tempo_of = _inverse(self.tempo_ids, size)
        self.program_of = _inverse(self.program_ids, size)
        self.pitch_of = _inverse(self.pitch_ids, size, PITCHES[0])
        self.drum_of = _inverse(self.drum_ids, size, DRUMS[0])
        self.velocity_of = _inverse(self.velocity_ids, size)
        self.duration_of = _inverse(self.duration_ids, size)

    def name(self, token: int) -> str:
        return self.vocab[token] if 0 <= token < len(self.vocab) else str(token)

    def program_token(self, program: int, slot: int) -> int:
        """The id of a track's Program token (drums: program -1, slot 0)."""
        return int(self.program_ids[0 if program == DRUM_PROGRAM else 1 + slot * 128 + program])

    def tempo_bin(self, bpm: np.ndarray) -> np.ndarray:
        """The nearest of TEMPOS (in log scale) for each bpm, clipped to the grid's ends."""
        steps = 48 * np.log2(np.maximum(np.asarray(bpm, dtype=np.float64), 1e-3) / TEMPOS[0])
        return np.clip(np.rint(steps), 0, len(TEMPOS) - 1).astype(np.int64)

    bar_units_table = np.array([bar_units(n, d) for n, d in METERS])  # meter index -> units per bar

    @staticmethod
    def meter_index(numerator: int, denominator: int) -> int:
        """The index of a meter in METERS, -1 when the tokens do not have it."""
        try:
            return METERS.index((numerator, denominator))
        except ValueError:
            return -1


def _inverse(ids: np.ndarray, size: int, offset: int = 0) -> np.ndarray:
    out = np.full(size, -1)
    out[ids] = np.arange(len(ids)) + offset
    return out
