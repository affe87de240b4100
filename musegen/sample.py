"""Prompt -> tokens -> recurrent generation -> MIDI (and WAV, piano roll, settings JSON).

Generation runs the model in recurrent mode (`model.streaming`): the SPE noise, gate noise and
random features are drawn once per batch and held fixed, so every step costs the same whatever
the length. All samples of a batch advance together. The tokenizer's grammar masks the logits
before sampling (never rejection), so with the mask on every sample is grammatical; the piece's
end token is also masked until the requested length is reached (the reference code's "no EOS
before the requested length"). When the length is reached in the middle of a note, sampling goes
on under the mask until the grammar says the piece can close, then the grammar's closing tokens
are appended.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import miditoolkit
import numpy as np
import torch
from tqdm import tqdm

from .device import resolve_device
from .errors import ConfigError, MidiError, MusegenError, TokenError
from .io import atomic_path, write_json
from .midi import find_midi_files
from .render import PROMPT_END_MARKER, pianoroll_png, render_wav
from .tokenizers.base import Grammar, Tokenizer

# The paper's sampling settings per tokenizer kind (PAPER_NOTES §3 and §4).
PAPER_DEFAULTS = {"remi": {"temperature": 1.2, "top_p": 0.9}, "groove": {"temperature": 0.6, "top_p": 1.0}}
FALLBACK_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}
FINISH_LIMIT = 256  # most tokens sampled past the length while waiting for a note to end
MAX_TOKENS_PER_BAR = 1024  # safety cap on --bars generation
# CPU threads while sampling, unless asked otherwise. A step is hundreds of tiny ops; on a busy
# machine extra threads oversubscribe the cores and a paper-pop step got 10x slower with 2 threads
# than with 1 (docs/performance.md). One thread also keeps a seed's output independent of the
# machine's core count.
DEFAULT_CPU_THREADS = 1


@dataclass
class SampleSettings:
    length: int | None = None  # new tokens after the prompt (closing tokens not counted)
    bars: int | None = None  # or: new bars after the prompt
    temperature: float | None = None  # None: the paper's value for the tokenizer kind
    top_p: float | None = None
    top_k: int = 0  # 0: off
    num_samples: int = 1
    seed: int | None = None  # None: drawn at random and recorded
    grammar: bool = True
    prompt_bars: int | None = None

    def resolved(self, kind: str) -> "SampleSettings":
        """Defaults filled in and every value checked (ConfigError with one line otherwise)."""
        defaults = PAPER_DEFAULTS.get(kind, FALLBACK_DEFAULTS)
        s = replace(self,
                    temperature=defaults["temperature"] if self.temperature is None else float(self.temperature),
                    top_p=defaults["top_p"] if self.top_p is None else float(self.top_p),
                    seed=random.SystemRandom().randrange(2**31) if self.seed is None else int(self.seed))
        if (s.length is None) == (s.bars is None):
            raise ConfigError("give exactly one of --length (tokens) or --bars")
        checks = [
            (s.length is None or s.length > 0, f"--length must be at least 1, got {s.length}"),
            (s.bars is None or s.bars > 0, f"--bars must be at least 1, got {s.bars}"),
            (0.0 < s.top_p <= 1.0, f"--top-p must be in (0, 1], got {s.top_p}"),
            (s.temperature > 0 and math.isfinite(s.temperature), f"--temperature must be > 0, got {s.temperature}"),
            (s.top_k >= 0, f"--top-k must be >= 0, got {s.top_k}"),
            (s.num_samples >= 1, f"--num-samples must be at least 1, got {s.num_samples}"),
            (s.prompt_bars is None or s.prompt_bars > 0, f"--prompt-bars must be at least 1, got {s.prompt_bars}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return s


@dataclass
class Prompt:
    ids: np.ndarray  # open token sequence: the piece's end tokens removed so it can go on
    report: dict[str, Any] = field(default_factory=dict)  # the tokenizer's encoding report
    source: str | None = None


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


def load_prompt(tokenizer: Tokenizer, source: str | os.PathLike | bytes | None,
                bars: int | None = None) -> Prompt:
    """Encode a prompt with the checkpoint's tokenizer, keep its first `bars` bars, open its end."""
    if source is None:
        return Prompt(np.zeros(0, dtype=np.int64))
    encoding = tokenizer.encode(source)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    name = "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)
    grammar = tokenizer.grammar()
    if grammar.first_violation(ids) is not None:
        raise TokenError(f"{name}: the tokenizer produced tokens its own grammar rejects")
    ids = open_end(grammar, ids)
    if bars is not None:
        starts = tokenizer.bar_starts(ids)
        if len(starts) > bars:
            ids = ids[:starts[bars]]
    prompt = Prompt(ids, dict(encoding.report), None if isinstance(source, (bytes, bytearray)) else str(source))
    if not any(inst.notes for inst in decode(tokenizer, with_ending(grammar, ids), prompt.report).instruments):
        raise MidiError(f"{name}: the prompt holds no notes the {tokenizer.kind} tokenizer can represent")
    return prompt


def open_end(grammar: Grammar, ids: np.ndarray) -> np.ndarray:
    """`ids` without the shortest ending that equals the grammar's closing tokens at that point."""
    states = _states(grammar, ids)
    for k in range(len(ids) - 1, -1, -1):
        state = states[k]
        if grammar.can_close(state) and [int(t) for t in ids[k:]] == [int(t) for t in grammar.close(state)]:
            return ids[:k]
    return ids


def with_ending(grammar: Grammar, ids) -> list[int]:
    """`ids` followed by the grammar's closing tokens, where the piece can close there."""
    state = _states(grammar, ids)[-1]
    return [int(t) for t in ids] + ([int(t) for t in grammar.close(state)] if grammar.can_close(state) else [])


def _states(grammar: Grammar, ids) -> list:
    states = [grammar.start()]
    for tok in ids:
        states.append(grammar.step(states[-1], int(tok)))
    return states


def end_token(grammar: Grammar) -> int:
    """The token that ends a piece: the last of the grammar's closing tokens."""
    for pick in (0, -1):  # walk on the first allowed token, else the last (REMI's first is always Bar)
        state = grammar.start()
        for _ in range(64):
            if grammar.can_close(state):
                return int(grammar.close(state)[-1])
            state = grammar.step(state, int(np.flatnonzero(grammar.allowed(state))[pick]))
    raise TokenError("the tokenizer's grammar never allows the piece to end")


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


def generate(model: torch.nn.Module, tokenizer: Tokenizer, prompt: Prompt, settings: SampleSettings,
             device: str | torch.device = "cpu", progress: bool = True,
             threads: int | None = None) -> tuple[list[Sample], dict[str, Any]]:
    """Sample `settings.num_samples` continuations of `prompt` in one batch.

    `threads`: torch CPU threads while sampling (default DEFAULT_CPU_THREADS on CPU).
    Returns the samples and run statistics (tokens/s of the sampling loop, counts).
    """
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    if threads is None and torch.device(device).type == "cpu":
        threads = DEFAULT_CPU_THREADS
    with _cpu_threads(threads):
        return _generate(model, tokenizer, prompt, settings, device, progress)


def _generate(model, tokenizer, prompt, settings, device, progress):
    s = settings.resolved(tokenizer.kind)
    grammar = tokenizer.grammar()
    end = end_token(grammar)
    batch, device = s.num_samples, torch.device(device)
    gen = torch.Generator(device=device).manual_seed(s.seed)

    prompt_ids = [int(t) for t in prompt.ids]
    if not prompt_ids:  # from scratch: the grammar's first token, drawn uniformly when there is a choice
        first = np.flatnonzero(grammar.allowed(grammar.start()))
        prompt_ids = [int(first[torch.randint(len(first), (1,), generator=torch.Generator().manual_seed(s.seed))])]
    prompt_state = _states(grammar, prompt_ids)[-1]
    prompt_bar_count = len(tokenizer.bar_starts(prompt_ids)) if s.bars else 0
    budget = s.length if s.length else s.bars * MAX_TOKENS_PER_BAR
    model.config.check_length(len(prompt_ids) + (s.length or 0), "the prompt plus --length")
    limit = model.config.max_positions  # synthesizer attention reads at most max_len positions

    seqs = [list(prompt_ids) for _ in range(batch)]
    states: list[Any] = [prompt_state] * batch  # None once a sample breaks the grammar
    closed = [False] * batch
    done = [False] * batch
    new = [0] * batch
    masks = np.tile(grammar.allowed(prompt_state), (batch, 1))  # row b: what may follow sample b

    bar = tqdm(total=batch * budget if s.length else None, unit="tok", unit_scale=True,
               desc="sampling", disable=not progress, leave=False)
    started = time.perf_counter()
    with torch.inference_mode(), model.streaming(batch, seed=s.seed):
        logits = _ingest(model, prompt_ids, batch, device)
        for _ in range(budget + FINISH_LIMIT):
            active = [b for b in range(batch) if not done[b]]
            if not active:
                break
            allow = torch.zeros(logits.shape, dtype=torch.bool)  # the model may have more ids (PAD)
            if s.grammar:
                allow[:, :grammar.vocab_size] = torch.from_numpy(masks)
                for b in active:  # no end before the requested length (unless nothing else is allowed)
                    if new[b] < budget and states[b] is not None and masks[b].sum() > 1:
                        allow[b, end] = False
                for b in range(batch):  # finished or broken rows: anything, the token is ignored
                    if done[b] or states[b] is None:
                        allow[b] = True
            else:
                allow[:] = True
            filtered = filter_logits(logits.masked_fill(~allow.to(logits.device), -math.inf),
                                     s.temperature, s.top_k, s.top_p)
            tokens = torch.multinomial(filtered.softmax(-1), 1, generator=gen).squeeze(1)
            picked = tokens.tolist()
            for b in active:
                tok = picked[b]
                seqs[b].append(tok)
                new[b] += 1
                state = states[b]
                if state is not None and tok < grammar.vocab_size and masks[b, tok]:
                    state = grammar.step(state, tok)
                    masks[b] = grammar.allowed(state)
                    if new[b] >= budget and not grammar.can_close(state):
                        masks[b] = finishing_mask(grammar, state, masks[b])
                else:
                    state = None
                states[b] = state
                if state is None:
                    done[b] = new[b] >= budget  # a broken sample runs to the length, for comparison
                elif not masks[b].any():  # the piece has ended
                    done[b] = closed[b] = True
                elif s.bars and new[b] % 16 == 0:
                    _stop_at_bar(tokenizer, grammar, seqs, states, closed, done, b, prompt_bar_count + s.bars,
                                 len(prompt_ids))
                if not done[b] and new[b] >= budget and state is not None and grammar.can_close(state):
                    seqs[b].extend(int(t) for t in grammar.close(state))
                    done[b] = closed[b] = True
            bar.update(len(active))
            finishing = all(done[b] or new[b] >= budget for b in range(batch))
            if limit is not None and model.position >= limit and finishing:
                break  # only notes to finish are left, past the last position: they stay unfinished
            logits = model.step(tokens.to(device))  # past the last position: a ConfigError
        state_bytes = model.state_bytes // batch
    elapsed = time.perf_counter() - started
    bar.close()

    samples = []
    for b in range(batch):
        ids = np.array(seqs[b], dtype=np.int64)
        violation = None if states[b] is not None else grammar.first_violation(ids)
        samples.append(Sample(ids, len(prompt.ids), new[b], closed[b] and violation is None, violation))
    stats = {"seconds": round(elapsed, 3), "new_tokens": int(sum(new)),
             "tokens_per_second": round(sum(new) / max(elapsed, 1e-9), 1),
             "state_bytes": int(state_bytes),  # per sample, at the end: what each step reads and updates
             "invalid": sum(not x.valid for x in samples),
             "grammar_violations": sum(x.violation is not None for x in samples),
             "unfinished": sum(x.violation is None and not x.closed for x in samples)}
    return samples, stats


def _ingest(model, prompt_ids: list[int], batch: int, device, chunk: int = 512) -> torch.Tensor:
    """Feed the prompt to the streaming model in parallel chunks; the logits after its last token."""
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device).expand(batch, -1)
    for t0 in range(0, len(prompt_ids), chunk):
        logits = model.step(ids[:, t0:t0 + chunk])
    return logits[:, -1]


def finishing_mask(grammar: Grammar, state, allowed: np.ndarray) -> np.ndarray:
    """Past the requested length: of the allowed tokens, those after which the piece can close,
    when there are any (e.g. a note's last token), so the sample ends as soon as it cleanly can."""
    closing = np.zeros_like(allowed)
    for tok in np.flatnonzero(allowed):
        closing[tok] = grammar.can_close(grammar.step(state, int(tok)))
    return closing if closing.any() else allowed


def _stop_at_bar(tokenizer, grammar, seqs, states, closed, done, b: int, bars: int, keep: int) -> None:
    """With --bars: once bar number `bars` has begun, cut the sample there and close it. Where the
    piece cannot close at the cut (it ends in silence or on a bare position), cut back to the last
    place it can, never into the first `keep` (prompt) tokens."""
    starts = tokenizer.bar_starts(seqs[b])
    if len(starts) <= bars:
        return
    del seqs[b][starts[bars]:]
    trail = _states(grammar, seqs[b])
    cut = next((k for k in range(len(seqs[b]), keep - 1, -1) if grammar.can_close(trail[k])), len(seqs[b]))
    del seqs[b][cut:]
    states[b] = trail[cut]
    done[b] = True
    if grammar.can_close(trail[cut]):
        seqs[b].extend(int(t) for t in grammar.close(trail[cut]))
        closed[b] = True


# ---- writing the outputs ------------------------------------------------------------------------


def decode(tokenizer: Tokenizer, ids, report: dict[str, Any] | None = None) -> miditoolkit.MidiFile:
    """Decode `ids`, handing the prompt's encoding facts (programs, tempo) to decoders that take them."""
    import inspect

    meta = (report or {}).get("meta") or {}
    accepted = inspect.signature(tokenizer.decode).parameters
    extra = {}
    if "programs" in accepted and meta:
        extra["programs"] = meta
    if "tempo" in accepted and meta.get("tempo"):
        extra["tempo"] = float(meta["tempo"])
    return tokenizer.decode(ids, **extra)


def prompt_end_tick(tokenizer: Tokenizer, prompt: Prompt, full: miditoolkit.MidiFile) -> int | None:
    """Where the continuation begins: the earliest of the prompt's last note end and the first
    note onset that the prompt alone does not have (a long prompt note may overlap the cut)."""
    if not len(prompt.ids):
        return None
    alone = decode(tokenizer, with_ending(tokenizer.grammar(), prompt.ids), prompt.report)
    prompt_notes = {(i, n.start, n.pitch) for i, inst in enumerate(alone.instruments) for n in inst.notes}
    ends = [n.end for inst in alone.instruments for n in inst.notes]
    fresh = [n.start for i, inst in enumerate(full.instruments) for n in inst.notes
             if (i, n.start, n.pitch) not in prompt_notes]
    candidates = ([max(ends)] if ends else []) + ([min(fresh)] if fresh else [])
    return min(candidates) if candidates else 0


def write_samples(samples: list[Sample], tokenizer: Tokenizer, prompt: Prompt, out_dir: str | os.PathLike,
                  stem: str, audio: bool = False, pianoroll: bool = False) -> list[dict[str, Any]]:
    """One MIDI per sample (prompt kept at the start, prompt end marked); optional WAV and PNG."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i, sample in enumerate(samples):
        record = {"index": i, "tokens": int(len(sample.ids)), "new_tokens": sample.new_tokens,
                  "valid": sample.valid, "closed": sample.closed, "first_violation": sample.violation}
        try:
            midi = decode(tokenizer, sample.ids, prompt.report)
        except TokenError as exc:
            record["error"] = f"cannot decode: {exc}"
            records.append(record)
            continue
        tick = prompt_end_tick(tokenizer, prompt, midi)
        if tick is not None:
            midi.markers.append(miditoolkit.Marker(PROMPT_END_MARKER, int(tick)))
        path = out_dir / f"{stem}_{i:03d}.mid"
        with atomic_path(path) as tmp:
            midi.dump(str(tmp))
        record["midi"] = path.name
        if not any(inst.notes for inst in midi.instruments):
            record["error"] = "no notes"  # nothing to listen to or draw
        else:
            if audio:
                record["wav"] = render_wav(path, path.with_suffix(".wav")).name
            if pianoroll:
                record["pianoroll"] = pianoroll_png(path, path.with_suffix(".png")).name
        records.append(record)
    return records


def sample_to_folder(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, settings: SampleSettings,
                     prompt_path: str | os.PathLike | None = None, audio: bool = False, pianoroll: bool = False,
                     device: str = "auto", progress: bool = True, threads: int | None = None) -> dict[str, Any]:
    """The whole `musegen sample` run: returns (and writes as <prompt stem>.json) what was done and how.

    A folder of prompts continues every MIDI file under it with one loaded model, into the same
    sub-folders of `out_dir`; prompt i gets seed `seed + i`. A prompt that cannot be used is
    skipped, counted and listed (in the returned summary and `out_dir/batch.json`).
    """
    from .checkpoint import load_checkpoint

    if audio:  # fail before spending minutes sampling
        import shutil

        from .render import INSTALL_HINT, find_soundfont

        if shutil.which("fluidsynth") is None:
            raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
        find_soundfont()
    device = resolve_device(device)
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    settings = settings.resolved(tokenizer.kind)
    run = dict(model=model, tokenizer=tokenizer, checkpoint=checkpoint, device=device, audio=audio,
               pianoroll=pianoroll, threads=threads)
    if prompt_path is None or not Path(prompt_path).is_dir():
        return _sample_prompt(**run, out_dir=Path(out_dir), settings=settings, prompt_path=prompt_path,
                              progress=progress)

    prompt_dir = Path(prompt_path)
    files = find_midi_files(prompt_dir)
    done, skipped = [], {}
    for i, path in enumerate(tqdm(files, desc="prompts", unit="prompt", disable=not progress)):
        rel = path.relative_to(prompt_dir)
        try:
            done.append(_sample_prompt(**run, out_dir=Path(out_dir) / rel.parent, prompt_path=path,
                                       settings=replace(settings, seed=settings.seed + i), progress=False))
        except MusegenError as exc:
            skipped[str(rel)] = str(exc).splitlines()[0]
    if not done:
        first = next(iter(skipped.items()))
        raise MidiError(f"{prompt_dir}: none of its {len(files)} prompts could be continued ({first[0]}: {first[1]})")
    seconds = sum(d["stats"]["seconds"] for d in done)
    new_tokens = sum(d["stats"]["new_tokens"] for d in done)
    summary = {"checkpoint": str(checkpoint), "prompts": str(prompt_dir), "continued": len(done),
               "skipped": skipped, "settings": asdict(settings),
               "stats": {"seconds": round(seconds, 3), "new_tokens": new_tokens,
                         "tokens_per_second": round(new_tokens / max(seconds, 1e-9), 1),
                         "state_bytes": max(d["stats"]["state_bytes"] for d in done),
                         **{k: sum(d["stats"][k] for d in done)
                            for k in ("invalid", "grammar_violations", "unfinished")}},
               "samples": [r for d in done for r in d["samples"]]}
    write_json(Path(out_dir) / "batch.json", summary)
    return summary


def _sample_prompt(model, tokenizer, checkpoint, device, out_dir: Path, settings: SampleSettings, prompt_path,
                   audio: bool, pianoroll: bool, threads: int | None, progress: bool) -> dict[str, Any]:
    """Continue one prompt (or none) with a loaded model; write the samples and <stem>.json."""
    prompt = load_prompt(tokenizer, prompt_path, settings.prompt_bars)
    samples, stats = generate(model, tokenizer, prompt, settings, device=device, progress=progress,
                              threads=threads)
    stem = Path(prompt_path).stem if prompt_path else "sample"
    records = write_samples(samples, tokenizer, prompt, out_dir, stem, audio, pianoroll)
    summary = {
        "checkpoint": str(checkpoint), "tokenizer": tokenizer.kind, "device": str(device),
        "prompt": str(prompt_path) if prompt_path else None, "prompt_tokens": int(len(prompt.ids)),
        "prompt_report": _jsonable(prompt.report),
        "settings": asdict(settings), "stats": stats, "samples": records,
    }
    write_json(out_dir / f"{stem}.json", summary)
    return summary


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
