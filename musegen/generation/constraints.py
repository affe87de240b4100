"""Constraints on what the sampler may draw: each is one object in the chain the settings carry
(`loop.constraint_chain`), applied by the loop in order at every step.

A constraint has two hooks (`Constraint.allow`: narrow one sample's mask; `Constraint.reweight`:
reshape the batch's logits once the masks are known); after them come temperature, top-k and
top-p (`loop.filter_logits`) and the draw. The grammar's rules are four such constraints
(GrammarMask, HoldEnds, Finish, KeptShare); the suffix cache (`cache.SuffixCache`) is one
too. A new one is a subclass of `Constraint`, here or anywhere, given as
`SampleSettings(constraints=(...))`; to be on by default it is also an entry in
`loop.constraint_chain`. Without a prompt the first token is the grammar's opening one, drawn
before the chain runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..music.roles import GM_FAMILIES
from ..tokenizers.base import Grammar, Tokenizer
from ..tokenizers.tracking import OnsetClock, TrackMarks


@dataclass
class Run:
    """What every row of one sampling run follows: the tokenizer, its grammar and the length."""

    tokenizer: Tokenizer
    grammar: Grammar
    budget: int  # new tokens before a piece may end
    device: torch.device
    _types: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _families: dict[int, list[torch.Tensor]] = field(default_factory=dict, init=False, repr=False)

    def families(self, width: int) -> list[torch.Tensor]:
        """The model's `width` ids grouped by token family (`Tokenizer.token_family_ids`), as index
        tensors on the run's device; ids past the vocabulary (PAD) form a family of their own."""
        if width not in self._families:
            family = np.full(width, -1, dtype=np.int64)
            of = self.tokenizer.token_family_ids()
            family[: len(of)] = of[:width]
            groups = [np.flatnonzero(family == f) for f in np.unique(family)]
            self._families[width] = [torch.from_numpy(g).to(self.device) for g in groups]
        return self._families[width]

    def type_ids(self, token_type: str, width: int) -> torch.Tensor:
        """bool over the model's `width` ids, on the run's device: the ids of one token type."""
        if (token_type, width) not in self._types:
            ids = np.zeros(width, dtype=bool)
            type_of = self.tokenizer.token_type_ids()
            ids[: len(type_of)] = type_of == list(self.tokenizer.token_types).index(token_type)
            self._types[token_type, width] = torch.from_numpy(ids).to(self.device)
        return self._types[token_type, width]


@dataclass
class Row:
    """One sample being written: what constraints read (`ids`, `state`, `new`, `allowed`) and the
    loop's bookkeeping."""

    ids: list[int]  # the tokens given (prompt, or the first token) and those sampled
    base: int  # how many of `ids` were given
    base_state: Any  # the grammar state after the given tokens
    target_bar: int | None  # --bars: the bar whose start ends the sample
    state: Any = None  # the grammar state after `ids`; None once the grammar rejected a token
    allowed: np.ndarray | None = None  # bool over the vocabulary: what the grammar allows next
    new: int = 0  # tokens sampled after the given ones
    done: bool = False
    closed: bool = False
    violation: int | None = None  # index of the first token the grammar rejected
    queued: list[int] = field(default_factory=list)  # written at the next steps instead of the drawn tokens


class Constraint:
    """One link of the sampling chain; the default hooks leave everything as it is."""

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        """The ids `row` may draw next, narrowed from `allowed` (bool over the model's ids): a new
        array, or `allowed` itself when nothing changes. Called for the rows not yet done, in
        chain order, each constraint on the previous one's mask, the first on every id."""
        return allowed

    def reweight(self, run: Run, rows: list[Row], logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """The batch's logits (one row per entry of `rows`, x the model's ids) reshaped once every
        row's mask is known (`allowed`, the same shape); the ids left out of `allowed` are dropped
        after the chain."""
        return logits


@dataclass
class Forbid(Constraint):
    """Never these ids (e.g. the tracks of an instrument someone else plays)."""

    ids: np.ndarray

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        narrowed = allowed.copy()
        narrowed[self.ids] = False
        return narrowed


class GrammarMask(Constraint):
    """Only what the grammar allows after the row's tokens (never ids past the vocabulary: PAD)."""

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        narrowed = np.zeros_like(allowed)
        narrowed[: len(row.allowed)] = allowed[: len(row.allowed)] & row.allowed
        return narrowed


@dataclass
class HoldTempo(Constraint):
    """Tempo tokens (`Tokenizer.tempo_token_ids`) keep one tempo: the one nearest `bpm`, or else
    the piece's last (the prompt's; the first drawn where the prompt has none). Another tempo is
    drawn only where nothing else is allowed."""

    bpm: float | None = None
    _last: dict[int, tuple[int, int | None]] = field(default_factory=dict, compare=False, repr=False)

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        tempos = run.tokenizer.tempo_token_ids()
        if not len(tempos) or not allowed[tempos].any():
            return allowed
        held = run.tokenizer.tempo_token(self.bpm) if self.bpm is not None else self._last_tempo(row, tempos)
        if held is None:
            return allowed
        narrowed = allowed.copy()
        narrowed[tempos] = False
        narrowed[held] = allowed[held]
        return narrowed if narrowed.any() else allowed

    def _last_tempo(self, row: Row, tempos: np.ndarray) -> int | None:
        """The row's last tempo token, read on from where the previous step stopped (a piece's
        tempo may lie thousands of tokens back)."""
        read, last = self._last.get(id(row), (0, None))
        found = np.flatnonzero(np.isin(row.ids[read:], tempos))
        if len(found):
            last = row.ids[read + int(found[-1])]
        self._last[id(row)] = (len(row.ids), last)
        return last


TAIL_BARS = 2  # the prompt's last bars whose tracks KeepTracks keeps playing

# The beat's subdivisions a prompt may keep, as phases in 12ths of a quarter note (the coarsest
# that holds every onset of the prompt is kept): 16ths, triplet 8ths, both.
SUBDIVISIONS = (frozenset({0, 3, 6, 9}), frozenset({0, 4, 8}), frozenset({0, 3, 4, 6, 8, 9}))


@dataclass
class KeepSubdivision(Constraint):
    """Positions only on the subdivisions of the beat the prompt's notes use: 16ths, triplets or
    both (`SUBDIVISIONS`), every position where the prompt uses others or has none. Why: a model
    unsure where in the bar it is spreads its mass over all twelve positions of a beat; on
    Freedoom's straight tunes the song model put 31% of its onsets off their 16ths (60% early in
    its training)."""

    _kept: dict[int, np.ndarray | None] = field(default_factory=dict, compare=False, repr=False)

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        off = self._off_grid(run, row)
        if off is None or not allowed[off].any():
            return allowed
        narrowed = allowed.copy()
        narrowed[off] = False
        return narrowed if narrowed.any() else allowed

    def _off_grid(self, run: Run, row: Row) -> np.ndarray | None:
        """The position ids off the prompt's subdivision (None: none are), found once a row."""
        if id(row) not in self._kept:
            phases = run.tokenizer.position_phases()
            off = None
            if phases is not None:
                ids, phase = phases
                used = set(phase[np.isin(ids, row.ids[: row.base])].tolist())
                kept = next((grid for grid in SUBDIVISIONS if used and used <= grid), None)
                off = None if kept is None else ids[~np.isin(phase, list(kept))]
            self._kept[id(row)] = off
        return self._kept[id(row)]


@dataclass
class KeepTracks(Constraint):
    """A track that plays in the prompt's last `TAIL_BARS` bars and has then been silent for a
    whole bar gets `boost` added to the logits of the tokens that name it
    (`Tokenizer.track_marks`: song's track token, every note of a groove role) for each further
    silent bar, until it plays again. Why: on Freedoom's band music the song model let a fifth of
    the prompt's tracks fall silent for all 8 continued bars (distorted guitars, synth leads, slap
    bass: instruments its training data seldom holds), where the real continuations keep every
    one of them playing; the groove model with its suffix cache left a tenth of the bass bars of
    Freedoom's songs silent (the real songs 4%)."""

    boost: float = 3.0
    _rows: dict[int, TrackReading] = field(default_factory=dict, compare=False, repr=False)

    def reweight(self, run: Run, rows: list[Row], logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        marks = run.tokenizer.track_marks
        if marks is None:
            return logits
        track_of = marks.track_of[: logits.shape[-1]]  # indices, not a mask: logits may be wider (PAD)
        bias = np.zeros(tuple(logits.shape), dtype=np.float32)
        for i, row in enumerate(rows):
            reading = self._follow(run, marks, row)
            for track, played in reading.last.items():
                if reading.bar - played > 1:
                    bias[i, np.flatnonzero(track_of == track)] = self.boost * (reading.bar - played - 1)
        if not bias.any():
            return logits
        return logits + torch.from_numpy(bias).to(logits.device, logits.dtype)

    def _follow(self, run: Run, marks: TrackMarks, row: Row) -> TrackReading:
        """The row's reading, on from where the previous step stopped; at its first step the
        prompt's, keeping the tracks of its last bars."""
        if id(row) not in self._rows:
            reading = TrackReading(clock=run.tokenizer.onset_clock() if marks.bar_id is None else None)
            reading.read(marks, row.ids[: row.base])
            tail = max(reading.last.values(), default=0) - TAIL_BARS + 1
            reading.last = {t: b for t, b in reading.last.items() if b >= tail}
            reading.kept = set(reading.last)
            self._rows[id(row)] = reading
        reading = self._rows[id(row)]
        reading.read(marks, row.ids[reading.done :])
        return reading


@dataclass
class TrackReading:
    """KeepTracks' reading of one row: tokens read, the current bar (counted from 0), and the bar
    each track was last heard in (of the `kept` tracks, once they are chosen)."""

    clock: OnsetClock | None  # bars by the clock where the tokens have no bar line
    done: int = 0
    bar: int = 0
    last: dict[int, int] = field(default_factory=dict)
    kept: set[int] | None = None

    def read(self, marks: TrackMarks, ids) -> None:
        for token in ids:
            token = int(token)
            if self.clock is not None:
                self.bar = int(self.clock.advance(token) // marks.beats_per_bar)
            elif token == marks.bar_id:
                self.bar += 1
            track = int(marks.track_of[token]) if token < len(marks.track_of) else -1
            if track >= 0 and (self.kept is None or track in self.kept):
                self.last[track] = self.bar
        self.done += len(ids)


class HoldEnds(Constraint):
    """Before the requested length, no end token (the reference code's "no EOS before the
    length"), unless nothing else is allowed."""

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        ends = list(run.tokenizer.end_ids)
        if row.new >= run.budget or not allowed[ends].any():
            return allowed
        held = allowed.copy()
        held[ends] = False
        return held if held.any() else allowed


class Finish(Constraint):
    """Past the requested length: of the allowed tokens, those after which the piece can close,
    when there are any (e.g. a note's last token), so the sample ends as soon as it cleanly can."""

    def allow(self, run: Run, row: Row, allowed: np.ndarray) -> np.ndarray:
        if row.new < run.budget:
            return allowed
        grammar, closing = run.grammar, np.zeros_like(allowed)
        for tok in np.flatnonzero(allowed):
            closing[tok] = grammar.can_close(grammar.step(row.state, int(tok)))
        return closing if closing.any() else allowed


class KeptShare(Constraint):
    """The mask keeps the model's share of the tokenizer's `kept_share_type` (`keep_type_mass`):
    groove's note-offs, song's bar lines. The bar line also takes the share of the positions
    past the bar's end (`Grammar.past_the_bar`): in a 3/4 or 6/8 bar a model that half expects a
    fourth beat put that mass on the bar's last allowed positions (on a Freedoom tune in 6/8, 60%
    of the onsets on the bar's last 16th)."""

    def reweight(self, run: Run, rows: list[Row], logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        if run.tokenizer.kept_share_type is None:
            return logits
        kept = run.type_ids(run.tokenizer.kept_share_type, logits.shape[-1]).expand_as(allowed).clone()
        for i, row in enumerate(rows):
            past = run.grammar.past_the_bar(row.state) if row.state is not None else None
            if past is not None:
                kept[i, torch.from_numpy(past[past < kept.shape[1]]).to(kept.device)] = True
        return keep_type_mass(logits, allowed, kept)


class FoldInstruments(Constraint):
    """What the model gives an instrument the mask forbids goes to the allowed tracks of that
    instrument's General MIDI family (`Tokenizer.instrument_families`), in the proportions the
    model gives them (equally where it gives them nothing); a family with no allowed track keeps
    its mass, for the mask to drop. Why: the band mask lets only the prompt's tracks play, and a
    model that seldom met the prompt's instruments names others: teacher-forced on Freedoom's
    songs, the song model's track tokens cost 6.1 nats (0.9 on its own validation songs), and its
    samples let a slap bass playing in every bar of the prompt fall silent while it asked for
    another bass. Before KeptShare, which then moves the bar line's share over what is left."""

    def reweight(self, run: Run, rows: list[Row], logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        families = run.tokenizer.instrument_families
        if families is None:
            return logits
        ids, family = (torch.as_tensor(a, device=logits.device) for a in families)
        keep = ids < logits.shape[-1]
        ids, family = ids[keep], family[keep]
        probs = logits.float().softmax(-1)
        named, ok = probs[:, ids], allowed[:, ids].to(logits.device)
        one_hot = torch.nn.functional.one_hot(family, GM_FAMILIES).to(probs.dtype)  # [tracks, family]
        forbidden = (named * ~ok) @ one_hot  # [rows, family]: mass the mask would drop
        kept, open_tracks = (named * ok) @ one_hot, ok.to(probs.dtype) @ one_hot
        landing = open_tracks[:, family] > 0  # the family has an allowed track
        if not (landing & ~ok).any():
            return logits
        share = torch.where(
            kept[:, family] > 0, named / kept[:, family].clamp_min(1e-38), 1 / open_tracks[:, family].clamp_min(1)
        )
        moved = torch.where(ok, named + forbidden[:, family] * share, torch.zeros_like(named))
        probs[:, ids] = torch.where(landing, moved, named)
        return probs.log().to(logits.dtype)


def keep_type_mass(logits: torch.Tensor, allowed: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Logits whose masked softmax gives the `kept` ids (bool over the ids, or per row: one token
    type) the probability the model gave all of them, spread over its allowed ids as the model spreads
    it, and the other allowed ids the rest, in their own proportions. Rows where no id of the type
    is allowed, or nothing else is, come back as they are.

    Why: a model can know that a note ends here without knowing which notes sound. Teacher-forced
    on test pieces, the groove model gives note-offs 30% of its mass where they are 28% of the
    tokens, but much of it on pitches that are not sounding; the plain mask hands that to
    note-ons and shifts (16% left), so samples hold notes for beats. And a model can know that a
    bar ends here without knowing where in it the piece is: teacher-forced on POP909 songs, the
    song model gives Bar 89% of its frequency, but after a note 44% of its mass goes to earlier
    positions, tracks or pitches that the mask forbids; renormalised, Bar's share doubles at every
    note and samples play a third of the real notes per bar (6.3 against 16.6; kept: 17.6)."""
    logp = logits.float().log_softmax(-1)
    kept = kept.to(logits.device)

    def log_mass(where: torch.Tensor) -> torch.Tensor:
        return logp.masked_fill(~where, -math.inf).logsumexp(-1, keepdim=True)

    share = log_mass(kept.expand_as(allowed))  # log p(type)
    ours, others = log_mass(allowed & kept), log_mass(allowed & ~kept)
    rest = torch.log1p(-share.exp().clamp_max(1.0))  # log (1 - p(type))
    moved = torch.where(kept, logp + share - ours, logp + rest - others)
    return torch.where(torch.isfinite(ours) & torch.isfinite(others), moved, logp)
