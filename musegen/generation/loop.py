"""The sampling loop: a batch of samples advanced together, one token per step, each drawn under
the settings' chain of constraints (musegen.generation.constraints), then temperature, top-k and
nucleus (top-p).

Generation runs the model in recurrent mode (a `model.session`): the SPE noise, gate noise and
random features are drawn once per batch and held fixed, so every step costs the same whatever
the length. Each sample is tracked by one `Row` (its tokens, its grammar state, what the grammar
allows next). With the grammar on, the mask removes what the grammar rejects before sampling
(never rejection), and the end tokens are held back until the requested length. When the length
is reached in the middle of a note, sampling goes on under the finishing mask until the grammar
says the piece can close, then the grammar's closing tokens are appended. With `--bars`, a sample
stops where the tokenizer's `bar_starts` lists the first bar past the requested ones, and is
closed there. A model whose positions are beats gets each token's onset with it, the prompt's
and every new token's, from one `Tokenizer.onset_clock` per sample. Nothing here knows a
tokenizer's kind: the sampling defaults, end tokens and decoding facts come from the `Tokenizer`
API.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from ..errors import ConfigError, NumericError
from ..model.torch_step import PreparedWeights
from ..tokenizers.base import Grammar, Tokenizer
from .cache import SuffixCache
from .constraints import (
    Constraint,
    Finish,
    FoldInstruments,
    GrammarMask,
    HoldEnds,
    HoldTempo,
    KeepSubdivision,
    KeepTracks,
    KeptShare,
    Row,
    Run,
)
from .precision import step_choice
from .prompt import Prompt, walked
from .resources import DEFAULT_CPU_THREADS, check_memory, check_threads, checked_device, cpu_threads
from .settings import MAX_TOKENS_PER_BAR, SampleSettings, held_bpm

FINISH_LIMIT = 256  # most tokens sampled past the length while waiting for a note to end


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


@dataclass
class Resumed:
    """A session that has consumed a prompt's tokens already, and its logits after the last: a
    run sampled from it feeds nothing again (live play keeps one per player)."""

    session: Any  # a model's Session
    logits: torch.Tensor  # [batch, vocab]


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


def temper_within_families(logits: torch.Tensor, families: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """Log-probabilities where each family of ids (index tensors) keeps the probability the model
    gives it, and the temperature shapes only the choice inside it: p'(t) = p(F) p(t)^(1/T) /
    sum_{u in F} p(u)^(1/T) for t in family F.

    Why: a token-wise temperature below 1 also moves mass between families. A family whose mass
    is spread over many ids (a bass line's pitches) loses it to one whose mass sits on a few (a
    time shift), so T = 0.6 halved the groove models' bass notes (docs/sampling.md)."""
    logp = logits.float().log_softmax(-1)
    out = torch.full_like(logp, -math.inf)
    for ids in families:
        part = logp[:, ids]
        mass = part.logsumexp(-1, keepdim=True)
        tempered = part / temperature
        shaped = tempered - tempered.logsumexp(-1, keepdim=True) + mass
        out[:, ids] = torch.where(torch.isfinite(mass), shaped, -math.inf)  # a family all masked stays so
    return out


def constraint_chain(s: SampleSettings, under_grammar: bool = False) -> tuple[Constraint, ...]:
    """The constraints a run applies, in order: the grammar's mask (unless `grammar` is off), the
    tempo hold (unless `tempo` is "free"), the prompt's subdivision of the beat (`subdivision`
    "prompt", with the grammar), the grammar's end hold and finish, FoldInstruments (with the
    grammar, unless `fold_instruments` is off), the suffix cache (with a weight above 0),
    KeptShare (with the grammar), KeepTracks (`keep_tracks` above 0: after KeptShare, so a silent
    track's boost takes from the bar line too), then the settings' own `constraints`. The cache
    mixes the model's own distribution (instruments folded), before KeptShare moves the kept
    type's share (groove's note-offs, song's bar lines) over the mask the others leave.
    `under_grammar`: the model was trained under the grammar (ModelConfig.loss_over): its
    distribution over what the mask leaves is its own, so neither KeptShare nor FoldInstruments
    has mass to move, and without the mask it would draw ids its training never scored."""
    if not all(isinstance(c, Constraint) for c in s.constraints):
        raise ConfigError("constraints must be musegen.generation.constraints.Constraint objects")
    if under_grammar and not s.grammar:
        raise ConfigError("the model was trained under the grammar (loss_over 'grammar'): sample it with the grammar")
    masks = (GrammarMask(), HoldEnds(), Finish()) if s.grammar else ()
    tempo = () if s.tempo == "free" else (HoldTempo(held_bpm(s.tempo)),)
    subdivision = (KeepSubdivision(),) if s.grammar and s.subdivision == "prompt" else ()
    cache = (SuffixCache(s.cache),) if s.cache else ()
    share = (KeptShare(),) if s.grammar and s.keep_share and not under_grammar else ()
    tracks = (KeepTracks(s.keep_tracks),) if s.keep_tracks else ()
    fold = (FoldInstruments(),) if s.grammar and s.fold_instruments and not under_grammar else ()
    return masks[:1] + tempo + subdivision + masks[1:] + fold + cache + share + tracks + tuple(s.constraints)


def generate(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompt: Prompt,
    settings: SampleSettings,
    device: str | torch.device = "cpu",
    progress: bool = True,
    threads: int | None = None,
    on_step: Callable[[list[list[int]]], None] | None = None,
    on_ingest: Callable[[], None] | None = None,
    weights: PreparedWeights | None = None,
    resumed: Resumed | None = None,
) -> tuple[list[Sample], dict[str, Any]]:
    """Sample `settings.num_samples` continuations of `prompt` in one batch.

    `threads`: torch CPU threads while sampling (default DEFAULT_CPU_THREADS on CPU).
    `on_step`: called after each step with every row's tokens so far (prompt included; not to be
    modified), e.g. to show a continuation while it is drawn; what it raises ends the run.
    `on_ingest`: called before each chunk of the prompt is fed to the model (a long prompt takes
    minutes); what it raises ends the run, e.g. when nobody waits for it any more.
    `weights`: the model's prepared weights, shared with other runs (each run prepares its own
    without); the model is only read, so threads may sample from one model at once.
    `resumed`: a session that has consumed `prompt` already (of the batch's size), continued in
    place instead of a new one.
    Returns the samples and run statistics (tokens/s of the sampling loop, counts).
    """
    check_threads(threads)
    device = checked_device(device)
    if threads is None and device.type == "cpu":
        threads = DEFAULT_CPU_THREADS
    if weights is None:
        weights = PreparedWeights(model)
    with cpu_threads(threads):
        resolved = settings.resolved(tokenizer)
        return _generate(model, tokenizer, prompt, resolved, device, progress, on_step, on_ingest, weights, resumed)


@dataclass
class _Rows:
    """How the rows of one run move: a token written, the grammar stepped, the row ended."""

    run: Run
    prefixed: bool = False  # the grammar's sampling prefixes are written (SampleSettings.mono_bass)

    @property
    def grammar(self) -> Grammar:
        return self.run.grammar

    def start(self, ids: list[int], state, target_bar: int | None) -> Row:
        allowed = self.grammar.sampling_mask(state)
        row = Row(list(ids), len(ids), state, target_bar, state, allowed)
        row.done = row.closed = not allowed.any()  # a prompt that is a whole piece, end included
        return row

    def written(self, row: Row, drawn: int) -> int:
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

    def advance(self, row: Row, token: int) -> None:
        """Append a drawn token and decide whether the row is done."""
        row.ids.append(token)
        row.new += 1
        grammar = self.grammar
        if row.state is not None and grammar.accepts(row.state, token):
            row.state = grammar.step(row.state, token)
        elif row.state is not None:
            row.state, row.violation = None, len(row.ids) - 1
        if row.state is None:
            row.done = row.new >= self.run.budget  # a broken sample runs to the length, for comparison
            return
        allowed = grammar.sampling_mask(row.state)
        if not allowed.any():  # the piece has ended
            row.done = row.closed = True
        elif row.target_bar is not None and len(self.run.tokenizer.bar_starts(row.ids)) > row.target_bar:
            self.stop_at_bar(row)
        elif row.new >= self.run.budget and grammar.can_close(row.state):
            self.close(row)
        else:
            row.allowed = allowed

    def stop_at_bar(self, row: Row) -> None:
        """Cut the row where its target bar starts and close it. Where the piece cannot close at
        the cut (it ends in silence or on a bare position), cut back to the last place it can,
        never into the given tokens (walking the new tokens only)."""
        cut = max(self.run.tokenizer.bar_starts(row.ids)[row.target_bar], row.base)
        trail = self.grammar.states(row.ids[row.base : cut], row.base_state)
        closable = next((k for k in range(len(trail) - 1, -1, -1) if self.grammar.can_close(trail[k])), None)
        keep = len(trail) - 1 if closable is None else closable
        del row.ids[row.base + keep :]
        row.state, row.done = trail[keep], True
        if closable is not None:
            self.close(row)

    def close(self, row: Row) -> None:
        """End the row with the grammar's closing tokens (its state stays the one they follow)."""
        row.ids.extend(int(t) for t in self.grammar.close(row.state))
        row.done = row.closed = True


def _start(grammar: Grammar, prompt: Prompt, seed: int) -> tuple[list[int], Any]:
    """The tokens sampling starts from and their grammar state: the prompt, or without one the
    grammar's first token (drawn uniformly when there is a choice)."""
    ids = [int(t) for t in prompt.ids]
    if ids:
        return ids, prompt.state
    first = np.flatnonzero(grammar.allowed(grammar.start()))
    token = int(first[torch.randint(len(first), (1,), generator=torch.Generator().manual_seed(seed))])
    return [token], grammar.step(grammar.start(), token)


def _generate(
    model,
    tokenizer: Tokenizer,
    prompt: Prompt,
    s: SampleSettings,
    device: torch.device,
    progress: bool,
    on_step,
    on_ingest,
    weights: PreparedWeights,
    resumed: Resumed | None = None,
):
    """The batch loop. Each row carries its own given tokens, their grammar state and its target
    bar, so rows could come from different prompts; what is missing for that is ingesting each
    row's prompt into its own streaming state (rows at different positions)."""
    grammar = tokenizer.grammar()
    prompt = walked(tokenizer, prompt)
    start_ids, start_state = _start(grammar, prompt, s.seed)
    onsets = _Onsets(tokenizer, start_ids, s.num_samples) if model.config.positions == "beats" else None
    if s.window and onsets is not None:
        raise ConfigError("--window is for models whose positions are tokens; this one's are beats")
    budget = s.length if s.length else s.bars * MAX_TOKENS_PER_BAR
    model.config.check_length(len(start_ids) + (s.length or 0), "the prompt plus --length")
    check_memory(model, s.num_samples, len(start_ids) + budget + FINISH_LIMIT, device, weights)
    run = Run(tokenizer, grammar, budget, device)
    chain = constraint_chain(s, under_grammar=model.config.loss_over == "grammar")
    moves = _Rows(run, prefixed=s.grammar and s.mono_bass)
    target = None if s.bars is None else prompt.bars + s.bars
    rows = [moves.start(start_ids, start_state, target) for _ in range(s.num_samples)]
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
    with bar, torch.inference_mode():  # (the bar is cleared on errors too)
        keep, restarts = s.window // 2 or 1, 0  # what a fresh session reads of a piece longer than the window
        opened = partial(_opened, model, choice.path, weights, len(rows), device)
        if resumed is None:
            read = start_ids[-keep:] if s.window and len(start_ids) > s.window else start_ids
            session, logits = opened(s.seed, read, on_ingest, None if onsets is None else onsets.prompt)
        else:
            session, logits = resumed.session, resumed.logits
        reading = time.perf_counter() - started  # the prompt's share of the time (a long file's is most of it)
        for _ in range(budget + FINISH_LIMIT):
            active = [row for row in rows if not row.done]
            if not active:
                break
            tokens = _draw(logits, rows, run, chain, s, gen)
            for b, row in enumerate(rows):
                if not row.done:
                    tokens[b] = token = moves.written(row, int(tokens[b]))
                    moves.advance(row, token)
                    if onsets is not None:
                        onsets.advance(b, token)
            bar.update(len(active))
            if on_step is not None:
                on_step([row.ids for row in rows])
            if limit is not None and session.position >= limit and all(r.done or r.new >= budget for r in rows):
                break  # only notes to finish are left, past the last position: they stay unfinished
            if s.window and session.position >= s.window:  # a fresh session on the last half, this token included
                restarts += 1
                session, logits = opened(s.seed + restarts, _tails(rows, keep))
                continue
            beats = None if onsets is None else onsets.now(device)
            logits = session.step(tokens.to(device), beats)  # past the last position: a ConfigError
        state_bytes = session.state_bytes // len(rows)
    elapsed = time.perf_counter() - started
    samples = [
        Sample(np.array(r.ids, dtype=np.int64), len(prompt.ids), r.new, r.closed and r.violation is None, r.violation)
        for r in rows
    ]
    return samples, {**_stats(samples, elapsed, reading, state_bytes), "precision": choice.record()}


def _draw(
    logits: torch.Tensor,
    rows: list[Row],
    run: Run,
    chain: tuple[Constraint, ...],
    s: SampleSettings,
    gen: torch.Generator,
) -> torch.Tensor:
    """One token per row: the chain's masks (rows that are done may draw anything: the token is
    ignored), the chain's reweighting, then temperature, top-k and top-p."""
    allow = np.ones(tuple(logits.shape), dtype=bool)  # the model may have more ids than the vocabulary (PAD)
    for b, row in enumerate(rows):
        if not row.done:
            for constraint in chain:
                allow[b] = constraint.allow(run, row, allow[b])
    allowed = torch.from_numpy(allow).to(logits.device)
    for constraint in chain:
        logits = constraint.reweight(run, rows, logits, allowed)
    logits, temperature = logits.masked_fill(~allowed, -math.inf), s.temperature
    if s.temperature_by == "family":
        logits, temperature = temper_within_families(logits, run.families(logits.shape[-1]), temperature), 1.0
    filtered = filter_logits(logits, temperature, s.top_k, s.top_p)
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


def _stats(samples: list[Sample], elapsed: float, reading: float, state_bytes: int) -> dict[str, Any]:
    new = sum(x.new_tokens for x in samples)
    return {
        "seconds": round(elapsed, 3),
        "prompt_seconds": round(reading, 3),  # of `seconds`
        "new_tokens": int(new),
        "tokens_per_second": round(new / max(elapsed, 1e-9), 1),
        "state_bytes": int(state_bytes),  # per sample, at the end: what each step reads and updates
        "invalid": sum(not x.valid for x in samples),
        "grammar_violations": sum(x.violation is not None for x in samples),
        "unfinished": sum(x.violation is None and not x.closed for x in samples),
        "repeats": repeats(samples),
    }


def repeats(samples: list[Sample]) -> int:
    """How many samples continue their prompt token for token as an earlier one does: where the
    piece repeats, the suffix cache with a nucleus can leave every draw a single token."""
    seen = {tuple(x.ids[x.prompt_len :].tolist()) for x in samples}
    return len(samples) - len(seen)


class _Onsets:
    """Each row's onset in beats, for a model whose positions are beats: the prompt's, then the
    onset of every token a row writes, from one `OnsetClock` per row (a row that is done keeps
    its last onset: what it is fed then is ignored)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], batch: int):
        clock = tokenizer.onset_clock()
        self.prompt = [clock.advance(token) for token in prompt_ids]
        self.clocks = [copy.copy(clock) for _ in range(batch)]
        self.last = [self.prompt[-1]] * batch

    def advance(self, row: int, token: int) -> None:
        self.last[row] = self.clocks[row].advance(token)

    def now(self, device) -> torch.Tensor:
        return torch.tensor(self.last, dtype=torch.float64, device=device)


def _opened(model, path: str, weights, batch: int, device, seed: int, ids: list, between=None, onsets=None):
    """A new streaming session on step path `path` that has read `ids` (as `_ingest` takes them),
    and its logits after them."""
    session = model.session(batch, path, seed=seed, weights=weights)
    return session, _ingest(session, ids, batch, device, between, onsets)


def _tails(rows: list[Row], keep: int) -> list[list[int]]:
    """Each row's last `keep` tokens: what a fresh session reads in place of the whole piece. A row
    that is done may have fewer (what it is fed is ignored): its first token fills them up."""
    return [([row.ids[0]] * keep + row.ids)[-keep:] for row in rows]


def _ingest(
    model, prompt_ids: list, batch: int, device, between=None, onsets: list[float] | None = None, chunk: int = 512
) -> torch.Tensor:
    """Feed the prompt (one for every row, or a list of each row's) to the streaming model in
    parallel chunks; the logits after its last token. `between` is called before each chunk
    (generate's `on_ingest`); `onsets`: each prompt token's onset, for a model whose positions are beats."""
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device).expand(batch, -1)
    beats = None if onsets is None else torch.tensor(onsets, dtype=torch.float64, device=device).expand(batch, -1)
    for t0 in range(0, ids.shape[1], chunk):
        if between is not None:
            between()
        logits = model.step(ids[:, t0 : t0 + chunk], None if beats is None else beats[:, t0 : t0 + chunk])
    return logits[:, -1]
