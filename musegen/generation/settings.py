"""What a sampling run is asked for (`SampleSettings`), the bounds each value is checked against,
and the chain of constraints the settings imply."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import ConfigError
from ..music.constants import MAX_BARS
from ..tokenizers.base import Tokenizer
from .cache import SuffixCache
from .constraints import Constraint, Finish, GrammarMask, HoldEnds, NoteOffMass

MAX_TOKENS_PER_BAR = 1024  # safety cap on --bars generation
MAX_LENGTH = MAX_BARS * MAX_TOKENS_PER_BAR  # --length: what the longest piece can hold
# "token": the temperature divides every logit; "family": it shapes the choice within each token
# family only, whose shares stay the model's (loop.temper_within_families)
TEMPERATURE_SCOPES = ("token", "family")
TEMPERATURE_RANGE = (1e-3, 100.0)  # below, logits / T overflow float32; above, every token is as likely
TOP_P_RANGE = (1e-6, 1.0)  # below, the nucleus is the most likely token alone whatever the value
SEED_MAX = 2**63 - 1  # torch generators take 64 bits; folder prompts count up from the seed, modulo this


def nth_seed(seed: int, i: int) -> int:
    """The seed of the i-th of several runs made from one --seed: counted up, wrapping within the bound."""
    return (seed + i) % (SEED_MAX + 1)


@dataclass
class SampleSettings:
    length: int | None = None  # new tokens after the prompt (closing tokens not counted)
    bars: int | None = None  # or: new bars after the prompt
    temperature: float | None = None  # None: the tokenizer's sampling default
    temperature_by: str | None = None  # one of TEMPERATURE_SCOPES; None: "token", the paper's
    top_p: float | None = None
    top_k: int = 0  # 0: off
    num_samples: int = 1
    seed: int | None = None  # None: drawn at random and recorded
    grammar: bool = True  # the grammar's constraints are applied (GrammarMask, HoldEnds, Finish, NoteOffMass)
    prompt_bars: int | None = None
    precision: str = "auto"  # of the model's steps: "auto" is the fastest here (musegen.precision)
    keep_note_offs: bool = True  # with the grammar: the mask keeps the model's note-off share (NoteOffMass)
    mono_bass: bool = True  # groove: a bass note another began over ends at the next event (Grammar.sampling_prefix)
    cache: float | None = None  # weight of the suffix cache (generation.cache), 0..1; None: the tokenizer's default
    constraints: tuple[Constraint, ...] = ()  # applied after the grammar's, in this order

    def chain(self) -> tuple[Constraint, ...]:
        """The constraints a run applies, in order: the grammar's masks (unless `grammar` is off),
        the suffix cache (with a weight above 0), NoteOffMass (with the grammar), then
        `constraints`. The cache mixes the model's own distribution, before NoteOffMass moves
        the note-off share over the mask the others leave."""
        masks = (GrammarMask(), HoldEnds(), Finish()) if self.grammar else ()
        cache = (SuffixCache(self.cache),) if self.cache else ()
        note_offs = (NoteOffMass(),) if self.grammar and self.keep_note_offs else ()
        return masks + cache + note_offs + tuple(self.constraints)

    def record(self) -> dict[str, Any]:
        """The settings as written in a run's summary JSON (added constraints by their repr)."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "constraints"}
        if self.constraints:
            record["constraints"] = [repr(c) for c in self.constraints]
        return record

    def resolved(self, tokenizer: Tokenizer | None = None) -> "SampleSettings":
        """Defaults filled in (the tokenizer's sampling defaults) and every value checked against
        its bound (ConfigError with one line otherwise)."""
        defaults = (tokenizer or Tokenizer).sampling_defaults
        s = replace(
            self,
            temperature=defaults["temperature"] if self.temperature is None else float(self.temperature),
            temperature_by=self.temperature_by or TEMPERATURE_SCOPES[0],
            top_p=defaults["top_p"] if self.top_p is None else float(self.top_p),
            cache=defaults.get("cache", 0.0) if self.cache is None else float(self.cache),
            seed=random.SystemRandom().randrange(2**31) if self.seed is None else int(self.seed),
        )
        if (s.length is None) == (s.bars is None):
            raise ConfigError("give exactly one of --length (tokens) or --bars")
        (low_t, high_t), low_p = TEMPERATURE_RANGE, TOP_P_RANGE[0]
        checks = [  # option, value, whether it is within bounds, the bounds
            ("--length", s.length, s.length is None or 1 <= s.length <= MAX_LENGTH, f"within 1..{MAX_LENGTH:,}"),
            ("--bars", s.bars, s.bars is None or 1 <= s.bars <= MAX_BARS, f"within 1..{MAX_BARS:,}"),
            ("--temperature", s.temperature, low_t <= s.temperature <= high_t, f"within [{low_t:g}, {high_t:g}]"),
            (
                "--temperature-by",
                s.temperature_by,
                s.temperature_by in TEMPERATURE_SCOPES,
                f"one of {TEMPERATURE_SCOPES}",
            ),
            ("--top-p", s.top_p, low_p <= s.top_p <= 1.0, f"within [{low_p:g}, 1]"),
            ("--top-k", s.top_k, s.top_k >= 0, ">= 0"),
            ("--cache", s.cache, 0.0 <= s.cache <= 1.0, "within [0, 1]"),
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
        if not all(isinstance(c, Constraint) for c in s.constraints):
            raise ConfigError("constraints must be musegen.generation.constraints.Constraint objects")
        return s
