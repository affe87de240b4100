"""Prompt -> tokens -> recurrent generation -> MIDI (and WAV, piano roll, settings JSON).

Generation runs the model in recurrent mode (`model.streaming`): the SPE noise, gate noise and
random features are drawn once per batch and held fixed, so every step costs the same whatever
the length. All samples of a batch advance together, each tracked by one record (`_Row`: its
tokens, its grammar state, what it may draw next). The tokenizer's grammar masks the logits
before sampling (never rejection), so with the mask on every sample is grammatical; the piece's
end tokens are also masked until the requested length is reached (the reference code's "no EOS
before the requested length"). When the length is reached in the middle of a note, sampling goes
on under the mask until the grammar says the piece can close, then the grammar's closing tokens
are appended. With `--bars`, a sample stops where the tokenizer's `bar_starts` lists the first
bar past the requested ones, and is closed there.

A prompt is cut after whole bars: the kept bars are closed as a piece of their own and opened
again, so the continuation starts in a new bar (REMI keeps the `Bar` that opens it) and never
writes into the prompt's last bar. The prompt is walked by the grammar once and decoded once;
`Prompt` carries its end state. Nothing here knows a tokenizer's kind: the sampling defaults,
end tokens and decoding facts come from the `Tokenizer` API.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import miditoolkit
import numpy as np
import torch
from tqdm import tqdm

from . import mirex, schemas
from .device import check_fits, device_memory, resolve_device
from .errors import ConfigError, MidiError, MusegenError, NumericError, TokenError
from .io import atomic_path, check_regular, write_json
from .music.constants import MAX_BARS
from .music.midi import MIDI_SUFFIXES
from .precision import Choice, step_choice
from .render import PROMPT_END_MARKER, pianoroll_png, render_wav
from .tokenizers.base import Grammar, Tokenizer

FINISH_LIMIT = 256  # most tokens sampled past the length while waiting for a note to end
MAX_TOKENS_PER_BAR = 1024  # safety cap on --bars generation
MAX_LENGTH = MAX_BARS * MAX_TOKENS_PER_BAR  # --length: what the longest piece can hold
TEMPERATURE_RANGE = (1e-3, 100.0)  # below, logits / T overflow float32; above, every token is as likely
TOP_P_RANGE = (1e-6, 1.0)  # below, the nucleus is the most likely token alone whatever the value
SEED_MAX = 2**63 - 1  # torch generators take 64 bits; folder prompts count up from the seed, modulo this
MAX_THREADS = 256
# CPU threads while sampling, unless asked otherwise. A step is hundreds of tiny ops; on a busy
# machine extra threads oversubscribe the cores and a paper-pop step got 10x slower with 2 threads
# than with 1 (docs/performance.md). One thread also keeps a seed's output independent of the
# machine's core count.
DEFAULT_CPU_THREADS = 1
SCRATCH_PREFIX = ".musegen-sample-"  # hidden folders an output set is written into before it is moved in
JOURNAL = ".publishing.json"  # in a scratch folder: the set is complete and being moved in (see output_set)


@dataclass
class SampleSettings:
    length: int | None = None  # new tokens after the prompt (closing tokens not counted)
    bars: int | None = None  # or: new bars after the prompt
    temperature: float | None = None  # None: the tokenizer's sampling default
    top_p: float | None = None
    top_k: int = 0  # 0: off
    num_samples: int = 1
    seed: int | None = None  # None: drawn at random and recorded
    grammar: bool = True
    prompt_bars: int | None = None
    precision: str = "auto"  # of the model's steps: "auto" is the fastest here (musegen.precision)
    keep_note_offs: bool = True  # the mask keeps the model's note-off share (`keep_type_mass`); False: the paper's
    mono_bass: bool = True  # groove: a bass note another began over ends at the next event (Grammar.sampling_prefix)

    def resolved(self, tokenizer: Tokenizer | None = None) -> "SampleSettings":
        """Defaults filled in (the tokenizer's sampling defaults) and every value checked against
        its bound (ConfigError with one line otherwise)."""
        defaults = (tokenizer or Tokenizer).sampling_defaults
        s = replace(
            self,
            temperature=defaults["temperature"] if self.temperature is None else float(self.temperature),
            top_p=defaults["top_p"] if self.top_p is None else float(self.top_p),
            seed=random.SystemRandom().randrange(2**31) if self.seed is None else int(self.seed),
        )
        if (s.length is None) == (s.bars is None):
            raise ConfigError("give exactly one of --length (tokens) or --bars")
        (low_t, high_t), low_p = TEMPERATURE_RANGE, TOP_P_RANGE[0]
        checks = [  # option, value, whether it is within bounds, the bounds
            ("--length", s.length, s.length is None or 1 <= s.length <= MAX_LENGTH, f"within 1..{MAX_LENGTH:,}"),
            ("--bars", s.bars, s.bars is None or 1 <= s.bars <= MAX_BARS, f"within 1..{MAX_BARS:,}"),
            ("--temperature", s.temperature, low_t <= s.temperature <= high_t, f"within [{low_t:g}, {high_t:g}]"),
            ("--top-p", s.top_p, low_p <= s.top_p <= 1.0, f"within [{low_p:g}, 1]"),
            ("--top-k", s.top_k, s.top_k >= 0, ">= 0"),
            ("--num-samples", s.num_samples, s.num_samples >= 1, "at least 1"),
            ("--seed", s.seed, 0 <= s.seed <= SEED_MAX, f"within 0..{SEED_MAX} (2**63 - 1)"),
            (
                "--prompt-bars",
                s.prompt_bars,
                s.prompt_bars is None or 1 <= s.prompt_bars <= MAX_BARS,
                f"within 1..{MAX_BARS:,}",
            ),
        ]
        for option, value, ok, bounds in checks:
            if not ok:  # NaN fails every comparison, so it lands here too
                raise ConfigError(f"{option} must be {bounds}, got {value}")
        return s


@dataclass
class Prompt:
    """A token sequence to continue, open at its end (its closing tokens removed)."""

    ids: np.ndarray
    report: dict[str, Any] = field(default_factory=dict)  # the tokenizer's encoding report
    source: str | None = None
    state: Any = None  # the grammar state after `ids`; None: walked when first needed
    bars: int | None = None  # whole bars before the continuation; None: counted when first needed
    piece: miditoolkit.MidiFile | None = None  # the prompt alone, closed and decoded
    mirex_offset: int | None = None  # JSON prompts: added to a decoded 16th to get the JSON's time

    @property
    def meta(self) -> dict[str, Any]:
        """What decoding needs beyond the tokens (the encoding report's `meta`)."""
        return self.report.get("meta") or {}


@dataclass
class Sample:
    ids: np.ndarray  # prompt + continuation (+ closing tokens)
    prompt_len: int
    new_tokens: int  # sampled after the prompt, including any sampled while finishing a note
    closed: bool  # ended by the grammar's closing tokens or the model's own end
    violation: int | None  # index of the first token the grammar rejects (only without the mask)

    @property
    def valid(self) -> bool:
        return self.violation is None and self.closed


# ---- prompts ------------------------------------------------------------------------------------


def load_prompt(tokenizer: Tokenizer, source: str | os.PathLike | bytes | None, bars: int | None = None) -> Prompt:
    """Encode a prompt (MIDI file or bytes, or a MIREX task .json) with the checkpoint's tokenizer,
    keep its first `bars` whole bars (all by default) and open its end."""
    if source is None:
        return Prompt(np.zeros(0, dtype=np.int64))
    if isinstance(source, (bytes, bytearray)):
        encoding = tokenizer.encode(source)
        return prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report)
    path = Path(source)
    check_regular(path, "prompt")  # a FIFO would block the read
    if path.suffix.lower() != ".json":
        encoding = tokenizer.encode(path)
        return prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report, str(path))
    notes = mirex.read_prompt(path)
    try:
        encoding = tokenizer.encode(mirex.prompt_midi(notes))
    except MusegenError as exc:  # the tokenizer names the MIDI it was given "<bytes>"
        raise type(exc)(str(exc).replace("<bytes>", str(path), 1)) from None
    prompt = prompt_from_ids(tokenizer, encoding.ids, bars, encoding.report, str(path))
    return replace(prompt, mirex_offset=mirex.origin_offset(notes, prompt.piece))


def prompt_from_ids(
    tokenizer: Tokenizer, ids, bars: int | None = None, report: dict[str, Any] | None = None, source: str | None = None
) -> Prompt:
    """A prompt from an encoded piece: its first `bars` bars (all by default), closed as a piece
    of their own and opened again, so that the continuation begins a new bar."""
    name = source or "the prompt"
    grammar = tokenizer.grammar()
    ids = [int(t) for t in tokenizer.check_ids(ids)]
    try:
        states = grammar.states(ids)
    except TokenError as exc:
        raise TokenError(f"{name}: the tokenizer produced tokens its own grammar rejects ({exc})") from None
    content = _content_end(grammar, ids, states)
    starts = tokenizer.bar_starts(ids[:content])
    whole = len(starts) if bars is None else min(bars, len(starts))
    if whole < len(starts):  # cut at a bar line: time moves to it, and what sounds ends there
        kept = ids[: starts[whole]]
        kept += tokenizer.to_bar_line(states[starts[whole]], whole)
        state = grammar.states(kept[starts[whole] :], states[starts[whole]])[-1]
    else:
        kept, state = ids[:content], states[content]
    opened, state, closed = _reopen(grammar, kept, state)
    report = dict(report or {})
    piece = tokenizer.decode(closed, report.get("meta"))
    if not any(inst.notes for inst in piece.instruments):
        raise MidiError(_no_notes(tokenizer, name, ids, report, bars))
    return Prompt(np.asarray(opened, dtype=np.int64), report, source, state, whole, piece)


def _no_notes(tokenizer: Tokenizer, name: str, ids: list[int], report: dict[str, Any], bars: int | None) -> str:
    """Why a prompt holds no notes: none the tokenizer could represent, or none before the cut."""
    whole = tokenizer.decode(ids, report.get("meta"))
    onsets = [n.start for inst in whole.instruments for n in inst.notes]
    if bars is None or not onsets:
        return f"{name}: the prompt holds no notes the {tokenizer.kind} tokenizer can represent"
    first = min(onsets) // (4 * whole.ticks_per_beat) + 1
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


def _walked(tokenizer: Tokenizer, prompt: Prompt) -> Prompt:
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


# ---- sampling -----------------------------------------------------------------------------------


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then nucleus (top-p): dropped tokens get -inf. The most likely
    token always survives, so a row with any finite logit stays sampleable."""
    logits = logits.float() / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        sorted_logits = sorted_logits.masked_fill(before >= top_p, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(-1, order, sorted_logits)
    return logits


@contextlib.contextmanager
def _cpu_threads(threads: int | None):
    """Run the block with `threads` torch CPU threads (None: leave as is), then restore."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def generate(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompt: Prompt,
    settings: SampleSettings,
    device: str | torch.device = "cpu",
    progress: bool = True,
    threads: int | None = None,
) -> tuple[list[Sample], dict[str, Any]]:
    """Sample `settings.num_samples` continuations of `prompt` in one batch.

    `threads`: torch CPU threads while sampling (default DEFAULT_CPU_THREADS on CPU).
    Returns the samples and run statistics (tokens/s of the sampling loop, counts).
    """
    check_threads(threads)
    device = checked_device(device)
    if threads is None and device.type == "cpu":
        threads = DEFAULT_CPU_THREADS
    model.for_inference(settings.precision)  # a ConfigError for an unknown precision
    with _cpu_threads(threads):
        return _generate(model, tokenizer, prompt, settings.resolved(tokenizer), device, progress)


def check_threads(threads: int | None) -> None:
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be within 1..{MAX_THREADS}, got {threads}")


def checked_device(device: str | torch.device | None) -> torch.device:
    """The device to sample on: auto, cpu, cuda or cuda:N (ConfigError for anything else)."""
    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {str(resolved)!r} is not supported for sampling; use auto, cpu, cuda or cuda:N")
    return resolved


@dataclass
class _Row:
    """One sample being written."""

    ids: list[int]  # the tokens given (prompt, or the first token) and those sampled
    base: int  # how many of `ids` were given
    base_state: Any  # the grammar state after the given tokens
    target_bar: int | None  # --bars: the bar whose start ends the sample
    state: Any = None  # the grammar state after `ids`; None once the grammar rejected a token
    mask: np.ndarray | None = None  # what may be drawn next, with the grammar on
    new: int = 0
    done: bool = False
    closed: bool = False
    violation: int | None = None  # index of the first token the grammar rejected
    queued: list[int] = field(default_factory=list)  # written at the next steps instead of the drawn tokens


@dataclass
class _Rules:
    """What every row of one run follows: the grammar, the length, the end tokens."""

    tokenizer: Tokenizer
    grammar: Grammar
    budget: int  # new tokens before a piece may end
    ends: np.ndarray  # bool over the vocabulary: the end tokens
    prefixed: bool = False  # the grammar's sampling prefixes are written (SampleSettings.mono_bass)

    def start(self, ids: list[int], state, target_bar: int | None) -> _Row:
        row = _Row(list(ids), len(ids), state, target_bar, state)
        allowed = self.grammar.sampling_mask(state)
        row.mask = self.next_mask(row, allowed)
        row.done = row.closed = not allowed.any()  # a prompt that is a whole piece, end included
        return row

    def next_mask(self, row: _Row, allowed: np.ndarray) -> np.ndarray:
        """Before the length: no end token (unless nothing else is allowed). After it: the tokens
        after which the piece can close, when there are any, so it ends as soon as it cleanly can."""
        if row.new < self.budget:
            held = allowed & ~self.ends
            return held if held.any() else allowed
        return finishing_mask(self.grammar, row.state, allowed)

    def written(self, row: _Row, drawn: int) -> int:
        """The token a row writes now: the next queued one while the grammar allows it, else the
        drawn one, or the first of the tokens the grammar puts before it (`sampling_prefix`; the
        rest and the drawn token are queued)."""
        if row.state is None:
            return drawn
        if row.queued:
            token = row.queued.pop(0)
            if self.grammar.allowed(row.state)[token]:
                return token
            row.queued.clear()  # the drawn token no longer fits after its prefix: this step's draw stands
        prefix = self.grammar.sampling_prefix(row.state, drawn) if self.prefixed else []
        if not prefix:
            return drawn
        row.queued = prefix[1:] + [drawn]
        return prefix[0]

    def advance(self, row: _Row, token: int) -> None:
        """Append a drawn token and decide whether the row is done."""
        row.ids.append(token)
        row.new += 1
        grammar = self.grammar
        if row.state is not None and grammar.accepts(row.state, token):
            row.state = grammar.step(row.state, token)
        elif row.state is not None:
            row.state, row.violation = None, len(row.ids) - 1
        if row.state is None:
            row.done = row.new >= self.budget  # a broken sample runs to the length, for comparison
            return
        allowed = grammar.sampling_mask(row.state)
        if not allowed.any():  # the piece has ended
            row.done = row.closed = True
        elif row.target_bar is not None and len(self.tokenizer.bar_starts(row.ids)) > row.target_bar:
            self.stop_at_bar(row)
        elif row.new >= self.budget and grammar.can_close(row.state):
            self.close(row)
        else:
            row.mask = self.next_mask(row, allowed)

    def stop_at_bar(self, row: _Row) -> None:
        """Cut the row where its target bar starts and close it. Where the piece cannot close at
        the cut (it ends in silence or on a bare position), cut back to the last place it can,
        never into the given tokens (walking the new tokens only)."""
        cut = max(self.tokenizer.bar_starts(row.ids)[row.target_bar], row.base)
        trail = self.grammar.states(row.ids[row.base : cut], row.base_state)
        closable = next((k for k in range(len(trail) - 1, -1, -1) if self.grammar.can_close(trail[k])), None)
        keep = len(trail) - 1 if closable is None else closable
        del row.ids[row.base + keep :]
        row.state, row.done = trail[keep], True
        if closable is not None:
            self.close(row)

    def close(self, row: _Row) -> None:
        """End the row with the grammar's closing tokens (its state stays the one they follow)."""
        row.ids.extend(int(t) for t in self.grammar.close(row.state))
        row.done = row.closed = True


def finishing_mask(grammar: Grammar, state, allowed: np.ndarray) -> np.ndarray:
    """Past the requested length: of the allowed tokens, those after which the piece can close,
    when there are any (e.g. a note's last token), so the sample ends as soon as it cleanly can."""
    closing = np.zeros_like(allowed)
    for tok in np.flatnonzero(allowed):
        closing[tok] = grammar.can_close(grammar.step(state, int(tok)))
    return closing if closing.any() else allowed


def _start(grammar: Grammar, prompt: Prompt, seed: int) -> tuple[list[int], Any]:
    """The tokens sampling starts from and their grammar state: the prompt, or without one the
    grammar's first token (drawn uniformly when there is a choice)."""
    ids = [int(t) for t in prompt.ids]
    if ids:
        return ids, prompt.state
    first = np.flatnonzero(grammar.allowed(grammar.start()))
    token = int(first[torch.randint(len(first), (1,), generator=torch.Generator().manual_seed(seed))])
    return [token], grammar.step(grammar.start(), token)


def _generate(model, tokenizer: Tokenizer, prompt: Prompt, s: SampleSettings, device: torch.device, progress: bool):
    """The batch loop. Each row carries its own given tokens, their grammar state and its target
    bar, so rows could come from different prompts; what is missing for that is ingesting each
    row's prompt into its own streaming state (rows at different positions)."""
    grammar = tokenizer.grammar()
    prompt = _walked(tokenizer, prompt)
    start_ids, start_state = _start(grammar, prompt, s.seed)
    budget = s.length if s.length else s.bars * MAX_TOKENS_PER_BAR
    model.config.check_length(len(start_ids) + (s.length or 0), "the prompt plus --length")
    check_memory(model, s.num_samples, len(start_ids) + budget + FINISH_LIMIT, device)
    ends = np.zeros(grammar.vocab_size, dtype=bool)
    ends[list(tokenizer.end_ids)] = True
    rules = _Rules(tokenizer, grammar, budget, ends, prefixed=s.grammar and s.mono_bass)
    target = None if s.bars is None else prompt.bars + s.bars
    rows = [rules.start(start_ids, start_state, target) for _ in range(s.num_samples)]
    limit = model.config.max_positions  # synthesizer attention reads at most max_len positions
    gen = torch.Generator(device=device).manual_seed(s.seed)
    bar = tqdm(
        total=len(rows) * budget if s.length else None,
        unit="tok",
        unit_scale=True,
        desc="sampling",
        disable=not progress,
        leave=False,
    )
    choice = step_choice(s.precision, model, len(rows))  # timed before the clock starts, where not cached
    started = time.perf_counter()
    with (
        bar,
        torch.inference_mode(),
        model.streaming(len(rows), seed=s.seed, choice=choice),
    ):  # (the bar is cleared on errors too)
        logits = _ingest(model, start_ids, len(rows), device)
        kept = _note_off_ids(tokenizer, logits.shape[-1], device) if s.keep_note_offs else None
        for _ in range(budget + FINISH_LIMIT):
            active = [row for row in rows if not row.done]
            if not active:
                break
            tokens = _draw(logits, rows, grammar.vocab_size, s, gen, kept)
            for b, row in enumerate(rows):
                if not row.done:
                    tokens[b] = token = rules.written(row, int(tokens[b]))
                    rules.advance(row, token)
            bar.update(len(active))
            if limit is not None and model.position >= limit and all(r.done or r.new >= budget for r in rows):
                break  # only notes to finish are left, past the last position: they stay unfinished
            logits = model.step(tokens.to(device))  # past the last position: a ConfigError
        state_bytes = model.state_bytes // len(rows)
    elapsed = time.perf_counter() - started
    samples = [
        Sample(np.array(r.ids, dtype=np.int64), len(prompt.ids), r.new, r.closed and r.violation is None, r.violation)
        for r in rows
    ]
    return samples, {**_stats(samples, elapsed, state_bytes), "precision": choice.record()}


def _draw(
    logits: torch.Tensor,
    rows: list[_Row],
    vocab_size: int,
    s: SampleSettings,
    gen: torch.Generator,
    kept: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row: the grammar mask (rows that are done or broken may draw anything: the
    token is ignored; `kept`: the ids whose share the mask keeps), then temperature, top-k and
    top-p."""
    allow = np.ones(tuple(logits.shape), dtype=bool)  # the model may have more ids (PAD)
    if s.grammar:
        for b, row in enumerate(rows):
            if not row.done and row.state is not None:
                allow[b, :vocab_size] = row.mask
                allow[b, vocab_size:] = False
    allowed = torch.from_numpy(allow).to(logits.device)
    if s.grammar and kept is not None:
        logits = keep_type_mass(logits, allowed, kept)
    filtered = filter_logits(logits.masked_fill(~allowed, -math.inf), s.temperature, s.top_k, s.top_p)
    probs = filtered.softmax(-1)
    no_mass = ~torch.isfinite(probs).all(-1) | ~(probs.sum(-1) > 0)
    live = torch.tensor([not row.done for row in rows], device=probs.device)
    if (no_mass & live).any():
        b = int((no_mass & live).nonzero()[0])
        raise NumericError(
            f"the model's next-token distribution for sample {b} after {len(rows[b].ids)} "
            f"tokens has no finite mass (its logits are {_logit_kinds(logits[b])}): the "
            "checkpoint's weights make its activations overflow; nothing drawn"
        )
    probs[no_mass] = 1.0  # rows already done draw a token that is ignored
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


def _logit_kinds(logits: torch.Tensor) -> str:
    kinds = [name for name, found in (("NaN", logits.isnan().any()), ("inf", logits.isinf().any())) if found]
    return " and ".join(kinds) or "all masked"


def _note_off_ids(tokenizer: Tokenizer, width: int, device) -> torch.Tensor | None:
    """bool over the model's `width` ids: the tokenizer's note-offs (None where it has none)."""
    if tokenizer.note_off_type is None:
        return None
    ids = np.zeros(width, dtype=bool)
    type_of = tokenizer.token_type_ids()
    ids[: len(type_of)] = type_of == list(tokenizer.token_types).index(tokenizer.note_off_type)
    return torch.from_numpy(ids).to(device)


def keep_type_mass(logits: torch.Tensor, allowed: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Logits whose masked softmax gives the `kept` ids (bool over the ids: one token type) the
    probability the model gave the whole type, spread over its allowed ids as the model spreads
    it, and the other allowed ids the rest, in their own proportions. Rows where no id of the type
    is allowed, or nothing else is, come back as they are.

    Why: a model can know that a note ends here without knowing which notes sound. Teacher-forced
    on test pieces, the groove model gives note-offs 30% of its mass where they are 28% of the
    tokens, but much of it on pitches that are not sounding; the plain mask hands that to
    note-ons and shifts (16% left), so samples hold notes for beats."""
    logp = logits.float().log_softmax(-1)
    kept = kept.to(logits.device)

    def log_mass(where: torch.Tensor) -> torch.Tensor:
        return logp.masked_fill(~where, -math.inf).logsumexp(-1, keepdim=True)

    share = log_mass(kept.expand_as(allowed))  # log p(type)
    ours, others = log_mass(allowed & kept), log_mass(allowed & ~kept)
    rest = torch.log1p(-share.exp().clamp_max(1.0))  # log (1 - p(type))
    moved = torch.where(kept, logp + share - ours, logp + rest - others)
    return torch.where(torch.isfinite(ours) & torch.isfinite(others), moved, logp)


def _stats(samples: list[Sample], elapsed: float, state_bytes: int) -> dict[str, Any]:
    new = sum(x.new_tokens for x in samples)
    return {
        "seconds": round(elapsed, 3),
        "new_tokens": int(new),
        "tokens_per_second": round(new / max(elapsed, 1e-9), 1),
        "state_bytes": int(state_bytes),  # per sample, at the end: what each step reads and updates
        "invalid": sum(not x.valid for x in samples),
        "grammar_violations": sum(x.violation is not None for x in samples),
        "unfinished": sum(x.violation is None and not x.closed for x in samples),
    }


def _ingest(model, prompt_ids: list[int], batch: int, device, chunk: int = 512) -> torch.Tensor:
    """Feed the prompt to the streaming model in parallel chunks; the logits after its last token."""
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device).expand(batch, -1)
    for t0 in range(0, len(prompt_ids), chunk):
        logits = model.step(ids[:, t0 : t0 + chunk])
    return logits[:, -1]


def check_memory(model, num_samples: int, tokens: int, device: torch.device) -> None:
    """ConfigError when `num_samples` sequences of `tokens` tokens cannot fit in the device's
    memory: per sample, the model's streaming state (measured on two steps, so a cache that
    grows per token is counted at full length), the logits' working copies and the tokens.
    The state is the same size on every precision path, so fp32 is used untimed: the session's
    own choice is timed later, at its batch size, only once the batch is known to fit."""
    untimed = Choice("fp32", "memory estimate")
    with torch.inference_mode(), model.streaming(1, seed=0, choice=untimed):
        one = torch.zeros(1, dtype=torch.long, device=device)
        model.step(one)
        first = model.state_bytes
        model.step(one)
        growth = model.state_bytes - first
    per_sample = first + growth * tokens + 64 * model.config.vocab_size + 64 * tokens
    memory = device_memory(device) or 0
    check_fits(
        num_samples * per_sample,
        f"--num-samples {num_samples}",
        device,
        f"{per_sample / 2**20:,.2f} MiB per sample: at most {memory // per_sample:,} fit",
    )


# ---- writing the outputs ------------------------------------------------------------------------


def new_notes(prompt: Prompt, full: miditoolkit.MidiFile) -> list[miditoolkit.Note]:
    """The notes of a decoded sample that the prompt alone does not have (by track, onset, pitch)."""
    alone = prompt.piece.instruments if prompt.piece is not None else []
    own = {(i, n.start, n.pitch) for i, inst in enumerate(alone) for n in inst.notes}
    return [n for i, inst in enumerate(full.instruments) for n in inst.notes if (i, n.start, n.pitch) not in own]


def prompt_end_tick(prompt: Prompt, full: miditoolkit.MidiFile) -> int | None:
    """Where the continuation begins: the earliest of the prompt's last note end and the first
    note onset that the prompt alone does not have (a long prompt note may overlap the cut)."""
    if not len(prompt.ids):
        return None
    ends = [n.end for inst in prompt.piece.instruments for n in inst.notes]
    fresh = [n.start for n in new_notes(prompt, full)]
    candidates = ([max(ends)] if ends else []) + ([min(fresh)] if fresh else [])
    return min(candidates) if candidates else 0


def _with_piece(tokenizer: Tokenizer, prompt: Prompt) -> Prompt:
    """The prompt with its decoded piece (for a Prompt built from bare ids)."""
    if prompt.piece is not None or not len(prompt.ids):
        return prompt
    return replace(prompt, piece=tokenizer.decode(with_ending(tokenizer.grammar(), prompt.ids), prompt.meta))


def write_samples(
    samples: list[Sample],
    tokenizer: Tokenizer,
    prompt: Prompt,
    out_dir: str | os.PathLike,
    stem: str,
    audio: bool = False,
    pianoroll: bool = False,
) -> list[dict[str, Any]]:
    """One MIDI per sample (prompt kept at the start, prompt end marked); optional WAV and PNG;
    for a MIREX .json prompt also the continuation's notes as `<stem>_<i>.json`. A sample the
    grammar rejects (sampled without the mask) is decoded leniently: the tokens the grammar
    rejects are dropped and counted (`dropped_tokens`), and the piece is closed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompt = _with_piece(tokenizer, prompt)
    records = []
    for i, sample in enumerate(samples):
        record = {
            "index": i,
            "tokens": int(len(sample.ids)),
            "new_tokens": sample.new_tokens,
            "valid": sample.valid,
            "closed": sample.closed,
            "first_violation": sample.violation,
        }
        ids = sample.ids
        if not sample.valid:
            ids, record["dropped_tokens"] = tokenizer.grammar().repair(sample.ids)
        midi = tokenizer.decode(ids, prompt.meta)
        tick = prompt_end_tick(prompt, midi)
        if tick is not None:
            midi.markers.append(miditoolkit.Marker(PROMPT_END_MARKER, int(tick)))
        path = out_dir / f"{stem}_{i:03d}.mid"
        with atomic_path(path) as tmp:
            midi.dump(str(tmp))
        record["midi"] = path.name
        if prompt.mirex_offset is not None:
            notes = mirex.generation(new_notes(prompt, midi), midi.ticks_per_beat, prompt.mirex_offset)
            mirex.write_generation(path.with_suffix(".json"), notes)
            record["json"] = path.with_suffix(".json").name
        if not any(inst.notes for inst in midi.instruments):
            record["error"] = "no notes"  # nothing to listen to or draw
        else:
            if audio:
                record["wav"] = render_wav(path, path.with_suffix(".wav")).name
            if pianoroll:
                record["pianoroll"] = pianoroll_png(path, path.with_suffix(".png")).name
        records.append(record)
    return records


@contextlib.contextmanager
def output_set(out_dir: Path, manifest: str) -> Iterator[Path]:
    """A hidden scratch folder for one prompt's files. When the block succeeds (its last act is to
    write the manifest, `<stem>.json`) the set is published: a journal naming the old set and the
    new one is written in the scratch folder, then the old manifest and the old set's files go,
    the new files come in, and the new manifest comes in last. A kill before the journal leaves
    the old set; a kill after it, an old or new set without its manifest (never files of two
    runs side by side), which the next run into the folder completes from the journal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _recover_dead_scratch(out_dir)
    scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        yield scratch
        journal = {
            "manifest": manifest,
            "old": sorted(_set_files(out_dir / manifest)),
            "new": sorted(p.name for p in scratch.iterdir()),
        }
        write_json(scratch / JOURNAL, journal)
        _publish(scratch, out_dir, schemas.check(journal, "publish journal", scratch / JOURNAL))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(scratch: Path, out_dir: Path, journal) -> None:
    """Replace the journal's old set by the new one; done again after a kill, it ends the same.
    Every old file goes before a new one comes in: a file of the old set that is still there
    when the new one has moved in would sit beside it as if of one run."""
    (out_dir / journal.manifest).unlink(missing_ok=True)
    for name in journal.old:
        if name not in journal.new or (scratch / name).exists():  # (else the new file is already in)
            (out_dir / name).unlink(missing_ok=True)
    for name in journal.new:
        if name != journal.manifest and (scratch / name).exists():
            os.replace(scratch / name, out_dir / name)
    if (scratch / journal.manifest).exists():
        os.replace(scratch / journal.manifest, out_dir / journal.manifest)


def _set_files(manifest: Path) -> set[str]:
    """The files an earlier run's manifest lists as its set (only names the set's pattern allows)."""
    try:
        records = schemas.read(manifest, "sample summary").samples
    except MusegenError:  # no summary of ours: no set to replace
        return set()
    names = {name for r in records for name in (r.midi, r.wav, r.pianoroll, r.json_) if name}
    return {name for name in names if writes(manifest.stem, name, mirex_prompt=True)}


def _recover_dead_scratch(out_dir: Path) -> None:
    """Scratch folders of runs that are gone: a journaled set is published, the rest removed."""
    for folder in out_dir.glob(f"{SCRATCH_PREFIX}*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(MusegenError):  # a journal cut short: its set was never published
                _publish(folder, out_dir, schemas.read(folder / JOURNAL, "publish journal"))
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def writes(stem: str, name: str, mirex_prompt: bool) -> bool:
    """Whether `name` is a file of the output set named `stem` (MIREX prompts add `.json` per sample)."""
    kinds = "mid|wav|png" + ("|json" if mirex_prompt else "")
    return name == f"{stem}.json" or re.fullmatch(re.escape(stem) + rf"_\d{{3,}}\.({kinds})", name) is not None


def sample_to_folder(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: SampleSettings,
    prompt_path: str | os.PathLike | None = None,
    audio: bool = False,
    pianoroll: bool = False,
    device: str = "auto",
    progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """The whole `musegen sample` run: returns (and writes as <prompt stem>.json) what was done and how.

    A folder of prompts continues every MIDI (and MIREX .json) file under it with one loaded
    model, into the same sub-folders of `out_dir`; prompt i gets seed `seed + i`. A prompt that
    cannot be used, or whose outputs would overwrite another prompt's or an input file, is
    skipped, counted and listed (in the returned summary and `out_dir/batch.json`).
    """
    from .checkpoint import load_checkpoint

    if audio:  # fail before spending minutes sampling
        from .render import INSTALL_HINT, find_soundfont

        if shutil.which("fluidsynth") is None:
            raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
        find_soundfont()
    settings.resolved()  # every bound checked before the model is loaded (the defaults come with it)
    check_threads(threads)
    device = checked_device(device)
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    settings = settings.resolved(tokenizer)
    run = dict(
        model=model,
        tokenizer=tokenizer,
        checkpoint=checkpoint,
        device=device,
        audio=audio,
        pianoroll=pianoroll,
        threads=threads,
    )
    out_dir = Path(out_dir)
    if prompt_path is None or not Path(prompt_path).is_dir():
        stem = "sample"
        if prompt_path is not None:
            check_regular(prompt_path, "prompt")  # before any path is resolved (a link loop, a FIFO)
            prompt_path, stem = Path(prompt_path), Path(prompt_path).stem
            if out_dir.resolve() == prompt_path.resolve().parent and writes(
                stem, prompt_path.name, prompt_path.suffix.lower() == ".json"
            ):
                raise ConfigError(
                    f"{prompt_path}: its output {prompt_path.name} would overwrite the input "
                    f"{prompt_path.name}; choose another --out"
                )
        return _sample_prompt(
            **run, out_dir=out_dir, stem=stem, settings=settings, prompt_path=prompt_path, progress=progress
        )
    return _sample_folder(run, Path(prompt_path), out_dir, settings, progress)


def _sample_folder(
    run: dict[str, Any], prompt_dir: Path, out_dir: Path, settings: SampleSettings, progress: bool
) -> dict[str, Any]:
    files, skipped = _prompt_files(prompt_dir)
    jobs = [(path, out_dir / path.relative_to(prompt_dir).parent) for path in files]
    stems = output_stems(jobs, files, out_dir / "batch.json")
    renamed = {str(path.relative_to(prompt_dir)): stem for path, stem in stems.items() if stem != path.stem}
    done = []
    for i, (path, folder) in enumerate(tqdm(jobs, desc="prompts", unit="prompt", disable=not progress)):
        rel = str(path.relative_to(prompt_dir))
        if rel in skipped:
            continue
        try:
            done.append(
                _sample_prompt(
                    **run,
                    out_dir=folder,
                    stem=stems[path],
                    prompt_path=path,
                    progress=False,
                    settings=replace(settings, seed=(settings.seed + i) % (SEED_MAX + 1)),
                )
            )
        except MusegenError as exc:
            skipped[rel] = str(exc).splitlines()[0]
    if not done:
        if not skipped:
            raise MidiError(f"{prompt_dir}: no MIDI or MIREX .json files found")
        first = next(iter(skipped.items()))
        raise MidiError(f"{prompt_dir}: none of its {len(skipped)} prompts could be continued ({first[0]}: {first[1]})")
    stats = [d["stats"] for d in done]
    seconds, new_tokens = sum(x["seconds"] for x in stats), sum(x["new_tokens"] for x in stats)
    summary = {
        "checkpoint": str(run["checkpoint"]),
        "prompts": str(prompt_dir),
        "continued": len(done),
        "skipped": dict(sorted(skipped.items())),
        "renamed": renamed,
        "settings": asdict(settings),
        "stats": {
            "seconds": round(seconds, 3),
            "new_tokens": new_tokens,
            "tokens_per_second": round(new_tokens / max(seconds, 1e-9), 1),
            "state_bytes": max(x["state_bytes"] for x in stats),
            **{k: sum(x[k] for x in stats) for k in ("invalid", "grammar_violations", "unfinished")},
        },
        "samples": [r for d in done for r in d["samples"]],
    }
    write_json(out_dir / "batch.json", summary)
    return summary


def _prompt_files(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The prompt files under `folder` (MIDI and .json, hidden ones left out), sorted, and
    those that are not regular files (FIFOs, devices: reading them would block) with why."""
    files, skipped = [], {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or path.is_dir():
            continue
        if path.suffix in MIDI_SUFFIXES or path.suffix.lower() == ".json":
            files.append(path)
            if not path.is_file():
                skipped[str(rel)] = "not a regular file"
    return files, skipped


def output_stems(jobs: list[tuple[Path, Path]], inputs: list[Path], reserved: Path) -> dict[Path, str]:
    """The name of each prompt's output set (its files are `<stem>.json`, `<stem>_NNN.mid`, ...),
    decided before anything is written: the prompt's own stem unless that set would overwrite an
    input file, `reserved` (the batch summary) or an earlier prompt's set in the same folder
    (`song.mid` and `song.midi`); then `<stem>-<suffix>` (`song-midi`), or `<stem>-2`, `-3`, ..."""
    protected: dict[Path, set[str]] = {}
    for path in [*inputs, reserved]:
        protected.setdefault(path.parent.resolve(), set()).add(path.name)
    claimed: dict[Path, list[tuple[str, bool]]] = {}
    stems = {}
    for path, folder in jobs:
        folder = folder.resolve()
        mirex_prompt = path.suffix.lower() == ".json"
        others = claimed.setdefault(folder, [])
        candidates = [
            path.stem,
            f"{path.stem}-{path.suffix.lstrip('.').lower()}",
            *(f"{path.stem}-{k}" for k in range(2, len(jobs) + 3)),
        ]
        stems[path] = next(
            stem
            for stem in candidates
            if not any(writes(stem, name, mirex_prompt) for name in protected.get(folder, ()))
            and not any(
                stem == other or writes(other, f"{stem}.json", mirex) or writes(stem, f"{other}.json", mirex_prompt)
                for other, mirex in others
            )
        )
        others.append((stems[path], mirex_prompt))
    return stems


def _sample_prompt(
    model,
    tokenizer,
    checkpoint,
    device,
    out_dir: Path,
    stem: str,
    settings: SampleSettings,
    prompt_path,
    audio: bool,
    pianoroll: bool,
    threads: int | None,
    progress: bool,
) -> dict[str, Any]:
    """Continue one prompt (or none) with a loaded model; write its output set and <stem>.json."""
    prompt = load_prompt(tokenizer, prompt_path, settings.prompt_bars)
    samples, stats = generate(model, tokenizer, prompt, settings, device=device, progress=progress, threads=threads)
    with output_set(out_dir, f"{stem}.json") as scratch:
        records = write_samples(samples, tokenizer, prompt, scratch, stem, audio, pianoroll)
        summary = {
            "checkpoint": str(checkpoint),
            "tokenizer": tokenizer.kind,
            "device": str(device),
            "prompt": str(prompt_path) if prompt_path else None,
            "prompt_tokens": int(len(prompt.ids)),
            "prompt_bars": prompt.bars,
            "prompt_report": _jsonable(prompt.report),
            "settings": asdict(settings),
            "stats": stats,
            "samples": records,
        }
        write_json(scratch / f"{stem}.json", summary)
    return summary


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
