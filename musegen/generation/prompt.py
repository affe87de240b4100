"""A prompt to continue: encoded by the checkpoint's tokenizer and cut to whole bars.

The prompt may begin at a later bar (`first`): the piece is decoded, the bars before are left out
and the rest is encoded again, as a file that begins there would be (`NoteTable.from_tick`).

The kept bars are closed as a piece of their own and opened again, so the continuation starts in
a new bar (REMI keeps the `Bar` that opens it) and never writes into the prompt's last bar. The
prompt is walked by the grammar once and decoded once; `Prompt` carries its end state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import mirex
from ..errors import ConfigError, MidiError, MusegenError, TokenError
from ..io import check_regular, printable
from ..music.constants import MAX_PROMPT_BARS
from ..music.meter import bar_start, signature_changes
from ..music.midi import load_score
from ..music.notes import NoteTable
from ..music.tracker import regrid
from ..tokenizers.base import Encoding, Grammar, Tokenizer


@dataclass
class Prompt:
    """A token sequence to continue, open at its end (its closing tokens removed)."""

    ids: np.ndarray
    report: dict[str, Any] = field(default_factory=dict)  # the tokenizer's encoding report
    source: str | None = None
    state: Any = None  # the grammar state after `ids`; None: walked when first needed
    bars: int | None = None  # whole bars before the continuation; None: counted when first needed
    piece: NoteTable | None = None  # the prompt alone, closed and decoded
    mirex_offset: int | None = None  # JSON prompts: added to a decoded 16th to get the JSON's time

    @property
    def meta(self) -> dict[str, Any]:
        """What decoding needs beyond the tokens (the encoding report's `meta`)."""
        return self.report.get("meta") or {}


def load_prompt(
    tokenizer: Tokenizer,
    source: str | os.PathLike | bytes | None,
    bars: int | None = None,
    grid: str = "file",
    first: int = 1,
) -> Prompt:
    """Encode a prompt (MIDI file or bytes, or a MIREX task .json) with the checkpoint's tokenizer,
    keep `bars` whole bars from its bar `first` (all by default) and open its end. A MIDI file is
    first put on the grid `grid` names (`musegen.music.tracker.regrid`), recorded as the report's
    "grid"."""
    if source is None:
        return Prompt(np.zeros(0, dtype=np.int64))
    if isinstance(source, (bytes, bytearray)):
        encoding = tokenizer.encode(source)
        return prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report, first=first)
    path = Path(source)
    check_regular(path, "prompt")  # a FIFO would block the read
    if path.suffix.lower() != ".json":
        encoding = encode_on_grid(tokenizer, path, grid)
        return prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report, str(path), first)
    if first > 1:  # the task's times count from its own origin, which a later first bar would move
        raise ConfigError(f"{path}: a MIREX task prompt is continued from its first bar; --prompt-from is for MIDI")
    notes = mirex.read_prompt(path)
    try:
        encoding = tokenizer.encode(mirex.prompt_midi(notes))
    except MusegenError as exc:  # the tokenizer names the MIDI it was given "<bytes>"
        raise type(exc)(str(exc).replace("<bytes>", str(path), 1)) from None
    prompt = prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report, str(path))
    return replace(prompt, mirex_offset=mirex.origin_offset(notes, prompt.piece))


def encode_on_grid(tokenizer: Tokenizer, path: Path, grid: str) -> Encoding:
    """A MIDI file encoded on the grid `grid` names (`musegen.music.tracker.regrid`); its report
    records that grid as "grid"."""
    # a trusted grid needs no parse of its own: the tokenizer reads the file once
    score, beats = None, None
    if grid != "file":
        score = load_score(path)  # its errors name the file
        try:
            score, beats = regrid(score, grid, tokenizer.holds_meters)
        except MidiError as exc:
            raise MidiError(f"{printable(path)}: {exc}") from None
    on_file = beats is None or beats.source == "file"
    encoding = tokenizer.encode(path) if on_file else _encoded(tokenizer, score, path)
    return replace(encoding, report={**encoding.report, "grid": beats.record() if beats else {"source": "file"}})


def _encoded(tokenizer: Tokenizer, score, path: Path):
    """A re-timed score encoded; an error names the prompt's file, not the bytes written for it."""
    try:
        return tokenizer.encode(NoteTable.from_score(score).midi_bytes())
    except MusegenError as exc:
        raise type(exc)(str(exc).replace("<bytes>", str(path), 1)) from None


def prompt_from_ids(
    tokenizer: Tokenizer,
    ids,
    bars: int | None = None,
    report: dict[str, Any] | None = None,
    source: str | None = None,
    first: int = 1,
) -> Prompt:
    """A prompt from an encoded piece: `bars` bars from its bar `first` (1-based; all by default),
    closed as a piece of their own and opened again, so that the continuation begins a new bar."""
    name = source or "the prompt"
    grammar = tokenizer.grammar()
    ids = [int(t) for t in tokenizer.check_ids(ids)]
    try:
        states = grammar.states(ids)
    except TokenError as exc:
        raise TokenError(f"{name}: the tokenizer produced tokens its own grammar rejects ({exc})") from None
    content = _content_end(grammar, ids, states)
    starts = tokenizer.bar_starts(ids[:content])
    if first > len(starts):
        raise MidiError(f"{name}: the prompt has {len(starts)} bars, so it cannot begin at bar {first}")
    if first > 1:
        later, report = _from_bar(tokenizer, ids, dict(report or {}), first, name)
        return prompt_from_ids(tokenizer, later, bars, report, source)
    whole = len(starts) if bars is None else min(bars, len(starts))
    if whole > MAX_PROMPT_BARS:  # the continuation needs room within a piece's MAX_BARS
        raise MidiError(
            f"{name}: the prompt has {whole:,} bars, more than a prompt may have ({MAX_PROMPT_BARS:,}; "
            "--prompt-bars keeps fewer)"
        )
    if whole < len(starts):  # cut at a bar line: time moves to it, and what sounds ends there
        kept = ids[: starts[whole]]
        kept += tokenizer.to_bar_line(states[starts[whole]], whole)
        state = grammar.states(kept[starts[whole] :], states[starts[whole]])[-1]
    else:
        kept, state = ids[:content], states[content]
    opened, state, closed = _reopen(grammar, kept, state)
    report = dict(report or {})
    piece = tokenizer.decode(closed, report.get("meta"))
    if not len(piece):
        raise MidiError(_no_notes(tokenizer, name, ids, report, bars))
    return Prompt(np.asarray(opened, dtype=np.int64), report, source, state, whole, piece)


def _from_bar(
    tokenizer: Tokenizer, ids: list[int], report: dict[str, Any], first: int, name: str
) -> tuple[np.ndarray, dict[str, Any]]:
    """The piece from its bar `first` on, encoded again as a piece of its own, and its report (the
    re-encoding's, over the first one's: the grid stays recorded)."""
    piece = tokenizer.decode(ids, report.get("meta"))
    later = piece.from_tick(bar_start(signature_changes(piece.time_signatures), piece.tpq, first))
    if not len(later):
        raise MidiError(f"{name}: the prompt holds no notes from bar {first} on")
    try:
        encoding = tokenizer.encode(later.midi_bytes())
    except MusegenError as exc:  # the tokenizer names the MIDI it was given "<bytes>"
        raise type(exc)(str(exc).replace("<bytes>", name, 1)) from None
    return encoding.ids, {**report, **encoding.report}


def _no_notes(tokenizer: Tokenizer, name: str, ids: list[int], report: dict[str, Any], bars: int | None) -> str:
    """Why a prompt holds no notes: none the tokenizer could represent, or none before the cut."""
    whole = tokenizer.decode(ids, report.get("meta"))
    if bars is None or not len(whole):
        return f"{name}: the prompt holds no notes the {tokenizer.kind} tokenizer can represent"
    first = whole.first_bar() + 1
    return (
        f"{name}: the prompt's first {bars} bars hold no notes; its first note comes in bar {first} "
        f"(--prompt-bars {first} or more)"
    )


def _content_end(grammar: Grammar, ids: list[int], states: list) -> int:
    """Where the piece's music ends: before the longest tail of `ids` that is (the start of) the
    grammar's closing tokens at that point. A closing is short (one note-off per sounding note
    at most), so only the last vocab_size + 1 tokens are searched."""
    end = len(ids)
    for k in range(len(ids) - 1, max(len(ids) - grammar.vocab_size - 2, -1), -1):
        if grammar.can_close(states[k]):
            closing = [int(t) for t in grammar.close(states[k])]
            if ids[k:] == closing[: len(ids) - k]:
                end = k
    return end


def _reopen(grammar: Grammar, ids: list[int], state) -> tuple[list[int], Any, list[int]]:
    """`ids` closed as a piece, then opened by its shortest closing tail: (open ids, their
    state, closed ids). Where the piece cannot close there, it stays as it is."""
    if not grammar.can_close(state):
        return ids, state, ids
    tail = [int(t) for t in grammar.close(state)]
    trail = grammar.states(tail, state)
    for j in range(len(tail) - 1, -1, -1):
        if grammar.can_close(trail[j]) and [int(t) for t in grammar.close(trail[j])] == tail[j:]:
            return ids + tail[:j], trail[j], ids + tail
    return ids, state, ids + tail


def walked(tokenizer: Tokenizer, prompt: Prompt) -> Prompt:
    """The prompt with its end state and bar count (for a Prompt built from bare ids)."""
    if prompt.state is not None and prompt.bars is not None:
        return prompt
    grammar = tokenizer.grammar()
    ids = [int(t) for t in tokenizer.check_ids(prompt.ids)]
    states = grammar.states(ids)
    bars = len(tokenizer.bar_starts(ids[: _content_end(grammar, ids, states)])) if ids else 0
    return replace(prompt, state=states[-1], bars=bars)


def with_ending(grammar: Grammar, ids) -> list[int]:
    """`ids` followed by the grammar's closing tokens, where the piece can close there."""
    state = grammar.states(ids)[-1]
    return [int(t) for t in ids] + ([int(t) for t in grammar.close(state)] if grammar.can_close(state) else [])


def with_piece(tokenizer: Tokenizer, prompt: Prompt) -> Prompt:
    """The prompt with its decoded piece (for a Prompt built from bare ids)."""
    if prompt.piece is not None or not len(prompt.ids):
        return prompt
    return replace(prompt, piece=tokenizer.decode(with_ending(tokenizer.grammar(), prompt.ids), prompt.meta))
