"""The REMI vocabulary: the settings that shape it, every event name, and the id tables (event ->
id, id -> value) that encoding, decoding, transposing and the grammar read. Ids are positions in
the alphabetical sort of the event names; PAD comes last."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from .. import schemas
from ..errors import ConfigError
from ..music.chords import QUALITIES, ROOT_NAMES
from ..music.constants import BEATS_PER_BAR, TICKS_PER_BEAT

# The tempos that occur in Pop1K7: the step-3 grid from 32 to 224 bpm, kept where a value occurred.
POP1K7_TEMPOS = (*range(32, 150, 3), 155, 158, 161, 167, 170, 176, 182, 188, 194, 200, 206, 215, 221, 224)
REFERENCE_TEMPO_GRID = np.arange(32, 225, 3)  # the reference bins tempos to this grid first
NO_CHORD = "N_N"


class RemiSettings(BaseModel):
    """A REMI vocabulary's settings, their defaults and bounds. `beat_resolution`: grid positions
    per beat; `pitch_range`: lowest and highest pitch, others are folded in by octaves;
    `velocity_range`: (lowest, highest, step) of the velocity bins; `max_duration`: longest
    duration in grid steps; `tempos`: the tempo bins (bpm); `chords`: write Chord tokens."""

    model_config = schemas.STRICT
    # at most 160: decoding keeps the note order inside a cell by starting notes a tick apart,
    # which needs 3 ticks per cell at 480 ticks per beat
    beat_resolution: Annotated[int, Field(ge=1, le=160)] = 4
    pitch_range: Annotated[list[schemas.Pitch], Field(min_length=2, max_length=2)] = [22, 107]
    velocity_range: Annotated[list[schemas.Pitch], Field(min_length=3, max_length=3)] = [40, 86, 2]
    # grid steps: 256 bars of 4/4 at the default resolution; each step is a token of the vocabulary
    max_duration: Annotated[int, Field(ge=1, le=4096)] = 16
    tempos: Annotated[list[Annotated[int, Field(ge=1, le=1000)]], Field(min_length=1, max_length=1000)] = list(
        POP1K7_TEMPOS
    )
    chords: bool = True


class RemiVocab:
    """The vocabulary of a REMI tokenizer with these settings (RemiTokenizer is one)."""

    def __init__(self, **settings: Any):
        """`settings`: RemiSettings' fields (its defaults for those left out); ConfigError when
        they break its bounds or disagree with each other."""
        try:
            checked = RemiSettings.model_validate(settings, strict=False)  # (tuples as well as lists)
        except ValidationError as exc:
            raise ConfigError(f"invalid REMI settings: {schemas.first_problem(exc)}") from None
        (lo, hi), (vmin, vmax, vstep) = checked.pitch_range, checked.velocity_range
        if TICKS_PER_BEAT % checked.beat_resolution:
            raise ConfigError(f"beat_resolution must divide {TICKS_PER_BEAT}, got {checked.beat_resolution}")
        if hi - lo < 11:
            raise ConfigError(f"pitch_range must span an octave, got {checked.pitch_range}")
        if not (0 < vstep and vmin <= vmax and (vmax - vmin) % vstep == 0):
            raise ConfigError(f"velocity_range must be (low, high, step) within 0..127, got {checked.velocity_range}")
        if checked.tempos != sorted(set(checked.tempos)):
            raise ConfigError("tempos must be increasing bpm values")
        beat_resolution = self.beat_resolution = checked.beat_resolution
        self.pitch_range = (lo, hi)
        self.velocity_range = (vmin, vmax, vstep)
        self.max_duration = checked.max_duration
        self.tempos = tuple(checked.tempos)
        self.chords = checked.chords
        self.positions_per_bar = BEATS_PER_BAR * beat_resolution
        self.ticks_per_position = TICKS_PER_BEAT // beat_resolution
        # notes of one cell may start this many ticks after the cell and still round into it
        self.max_note_offset = (self.ticks_per_position - 1) // 2
        self.velocities = list(range(vmin, vmax + 1, vstep))
        self._build_vocab()

    def _build_vocab(self) -> None:
        lo, hi = self.pitch_range
        chord_names = [f"{r}_{q}" for r in ROOT_NAMES for q in QUALITIES] + [NO_CHORD]
        names = (
            ["Bar_None", "EOS_None"]
            + [f"Beat_{k}" for k in range(self.positions_per_bar)]
            + [f"Chord_{c}" for c in chord_names]
            + [f"Tempo_{t}" for t in self.tempos]
            + [f"Note_Pitch_{p}" for p in range(lo, hi + 1)]
            + [f"Note_Velocity_{v}" for v in self.velocities]
            + [f"Note_Duration_{d * self.ticks_per_position}" for d in range(self.max_duration + 1)]
        )
        self.vocab = sorted(names) + ["PAD_None"]
        ids = {name: i for i, name in enumerate(self.vocab)}
        self.bar_id, self.eos_id = ids["Bar_None"], ids["EOS_None"]
        self._pad_id = ids["PAD_None"]
        self.beat_ids = np.array([ids[f"Beat_{k}"] for k in range(self.positions_per_bar)])
        self.tempo_ids = np.array([ids[f"Tempo_{t}"] for t in self.tempos])
        self.pitch_ids = np.array([ids[f"Note_Pitch_{p}"] for p in range(lo, hi + 1)])
        self.velocity_ids = np.array([ids[f"Note_Velocity_{v}"] for v in self.velocities])
        self.duration_ids = np.array(
            [ids[f"Note_Duration_{d * self.ticks_per_position}"] for d in range(self.max_duration + 1)]
        )
        # chord_ids[root, quality]; the no-chord token sits at [12, 0]
        self.chord_ids = np.full((13, len(QUALITIES)), -1)
        for r, root in enumerate(ROOT_NAMES):
            for q, quality in enumerate(QUALITIES):
                self.chord_ids[r, q] = ids[f"Chord_{root}_{quality}"]
        self.no_chord_id = self.chord_ids[12, 0] = ids[f"Chord_{NO_CHORD}"]
        self.chord_of_name = {name[len("Chord_") :]: i for name, i in ids.items() if name.startswith("Chord_")}

        # Reverse tables: id -> value (or -1), used by decode, transpose and the grammar.
        size = len(self.vocab)
        self.beat_of = _inverse(self.beat_ids, size)
        self.pitch_of = _inverse(self.pitch_ids, size, offset=lo)
        self.velocity_of = _inverse(self.velocity_ids, size)
        self.duration_of = _inverse(self.duration_ids, size)
        self.tempo_of = _inverse(self.tempo_ids, size)
        self.chord_root_of = np.full(size, -1)
        self.chord_quality_of = np.full(size, -1)
        for r in range(12):
            self.chord_root_of[self.chord_ids[r]] = r
            self.chord_quality_of[self.chord_ids[r]] = np.arange(len(QUALITIES))
        self.is_chord = self.chord_root_of >= 0
        self.is_chord[self.no_chord_id] = True

    def name(self, token: int) -> str:
        """The event name of an id, or the id itself when it is outside the vocabulary."""
        return self.vocab[token] if 0 <= token < len(self.vocab) else str(token)

    def tempo_bins(self, bpm: np.ndarray) -> np.ndarray:
        """Index of the Tempo token for each bpm: as the reference, to the nearest step of its
        3-bpm grid (32..224), then to the nearest tempo of the vocabulary (ties go down). A
        vocabulary off that grid skips the first step."""
        bpm = np.asarray(bpm, dtype=np.float64)
        if np.isin(self.tempos, REFERENCE_TEMPO_GRID).all():
            bpm = REFERENCE_TEMPO_GRID[_nearest(REFERENCE_TEMPO_GRID, bpm)]
        return _nearest(np.array(self.tempos, dtype=np.float64), bpm)


def _inverse(ids: np.ndarray, size: int, offset: int = 0) -> np.ndarray:
    """id -> index in `ids` (+ offset), -1 for ids not in the table."""
    out = np.full(size, -1)
    out[ids] = np.arange(len(ids)) + offset
    return out


def _nearest(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest of the sorted `values` for each x (ties go to the lower value), in
    memory proportional to len(x): a file may hold millions of tempos."""
    x = np.asarray(x, dtype=np.float64)
    if len(values) == 1:
        return np.zeros(len(x), dtype=np.int64)
    above = np.clip(np.searchsorted(values, x), 1, len(values) - 1)  # x's neighbours: above - 1 and above
    return above - (x - values[above - 1] <= values[above] - x)
