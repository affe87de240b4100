"""What a sampling run is asked for (`SampleSettings`) and the chain of constraints it implies.

Every sampling option is declared once, as a field of SampleSettings with its `Option`: the flag,
the help text, the bound its values must keep, and whether its default is the model's (the
checkpoint's meta, else its tokenizer's `sampling_defaults`). The command line
(`musegen.cli.options`), the runners and the studio build their options, checks and records from
these declarations, so a new option is a field here and, where its default depends on the model,
a value in the tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any, Callable, Mapping, get_type_hints

from ..choices import PRECISIONS
from ..errors import CheckpointError, ConfigError
from ..music.constants import MAX_BARS
from ..music.tracker import GRIDS
from ..tokenizers.base import Tokenizer

MAX_TOKENS_PER_BAR = 1024  # safety cap on --bars generation
MAX_LENGTH = MAX_BARS * MAX_TOKENS_PER_BAR  # --length: what the longest piece can hold
# "token": the temperature divides every logit; "family": it shapes the choice within each token
# family only, whose shares stay the model's (loop.temper_within_families)
TEMPERATURE_SCOPES = ("token", "family")
TEMPERATURE_RANGE = (1e-3, 100.0)  # below, logits / T overflow float32; above, every token is as likely
TOP_P_RANGE = (1e-6, 1.0)  # below, the nucleus is the most likely token alone whatever the value
SUBDIVISION_CHOICES = ("prompt", "any")
TEMPO_CHOICES = ("keep", "free")  # or a tempo in BPM, given as a number
TEMPO_RANGE = (1.0, 1000.0)  # what a tempo token can name (the REMI settings' bound)
SEED_MAX = 2**63 - 1  # torch generators take 64 bits; folder prompts count up from the seed, modulo this


def nth_seed(seed: int, i: int) -> int:
    """The seed of the i-th of several runs made from one --seed: counted up, wrapping within the bound."""
    return (seed + i) % (SEED_MAX + 1)


@dataclass(frozen=True)
class Bound:
    """The values an option may take, and how a message says so ("within 1..10,000")."""

    holds: Callable[[Any], bool]
    text: str


def within(low: float, high: float, text: str | None = None) -> Bound:
    # NaN fails every comparison, so it is refused too
    return Bound(lambda v: isinstance(v, (int, float)) and low <= v <= high, text or f"within {low:,}..{high:,}")


def one_of(values: tuple[str, ...]) -> Bound:
    return Bound(lambda v: v in values, f"one of {', '.join(values)}")


def held_bpm(tempo: Any) -> float | None:
    """The tempo in BPM that a --tempo value names; None for "keep", "free" and anything else."""
    if isinstance(tempo, bool) or tempo in TEMPO_CHOICES:
        return None
    try:
        bpm = float(tempo)
    except (TypeError, ValueError):
        return None
    return bpm if TEMPO_RANGE[0] <= bpm <= TEMPO_RANGE[1] else None  # NaN fails both


TEMPO_BOUND = Bound(
    lambda v: v in TEMPO_CHOICES or held_bpm(v) is not None,
    f"keep, free or a tempo in BPM within {TEMPO_RANGE[0]:g}..{TEMPO_RANGE[1]:g}",
)


@dataclass(frozen=True)
class Option:
    """How one SampleSettings field is offered: `flags` as the command line spells them (the
    first is its name in messages; "--a/--b" for a switch), the help text, its bound, and
    `per_model`: None means the model's default, `fallback` where the model names none."""

    flags: tuple[str, ...]
    help: str
    bound: Bound | None = None
    per_model: bool = False
    fallback: Any = None

    @property
    def flag(self) -> str:
        return self.flags[0].split("/")[0]


def option(default: Any, *flags: str, help: str, bound: Bound | None = None, **how: Any) -> Any:
    """A SampleSettings field declared as an option (its metadata holds the Option)."""
    return field(default=default, metadata={"option": Option(flags, help, bound, **how)})


def model_default(flag: str, help: str, interval: tuple[float, float], fallback: Any = None) -> Any:
    """A number option whose default is the model's (`fallback` where the model names none)."""
    text = f"within [{interval[0]:g}, {interval[1]:g}]"
    return option(None, flag, help=help, bound=within(*interval, text), per_model=True, fallback=fallback)


def options(cls: type | None = None) -> dict[str, Option]:
    """The declared options of `cls` (SampleSettings or a subclass), by field name."""
    return {f.name: f.metadata["option"] for f in fields(cls or SampleSettings) if "option" in f.metadata}


@dataclass
class SampleSettings:
    length: int | None = option(
        None, "--length", help="Tokens to generate after the prompt.", bound=within(1, MAX_LENGTH)
    )
    bars: int | None = option(None, "--bars", help="Or: bars to generate after the prompt.", bound=within(1, MAX_BARS))
    temperature: float | None = model_default(
        "--temperature", "Divides the logits before drawing: below 1 sharper, above 1 flatter.", TEMPERATURE_RANGE
    )
    temperature_by: str = option(
        TEMPERATURE_SCOPES[0],
        "--temperature-by",
        help="token: the temperature divides every logit (the paper's sampling); family: it shapes the "
        "choice within each token family (one track's notes, the time shifts) and leaves each family's "
        "share as the model gives it.",
        bound=one_of(TEMPERATURE_SCOPES),
    )
    top_p: float | None = model_default(
        "--top-p", "Nucleus mass: draw among the most likely tokens that together hold this much.", TOP_P_RANGE
    )
    top_k: int = option(0, "--top-k", help="Keep only the k most likely tokens (0: off).", bound=within(0, 2**31))
    num_samples: int = option(
        1,
        "--num-samples",
        "-n",
        help="Samples generated together in one batch (as many as the memory holds).",
        bound=within(1, 2**31, "at least 1"),
    )
    seed: int | None = option(
        None,
        "--seed",
        help="Random seed (default: drawn and recorded in the JSON).",
        bound=within(0, SEED_MAX, "within 0..2**63-1"),
    )
    grammar: bool = option(
        True,
        "--grammar/--no-grammar",
        help="Apply the grammar's constraints (mask, end hold, finish, note-off mass); --no-grammar samples "
        "without them, for comparison: tokens the grammar rejects are skipped and counted when decoding.",
    )
    prompt_bars: int | None = option(
        None,
        "--prompt-bars",
        help="Keep only N whole bars of the prompt, from --prompt-from (groove protocol: 2).",
        bound=within(1, MAX_BARS),
    )
    prompt_from: int = option(
        1,
        "--prompt-from",
        help="The prompt's first bar (1-based, as the tokenizer counts them): the bars before it are left out, "
        "and a note sounding across it starts there. MIDI prompts only.",
        bound=within(1, MAX_BARS),
    )
    precision: str = option(
        "auto",
        "--precision",
        help="Precision of the model's steps: auto (the fastest of fp32, bf16 and bf16 in C, timed once per "
        "machine and batch and cached; MUSEGEN_PRECISION=measure times again), fp32 or bf16.",
        bound=one_of(PRECISIONS),
    )
    keep_share: bool = option(
        True,
        "--keep-share/--plain-mask",
        help="The grammar mask keeps the model's share of one token type, moved onto its allowed ids: groove's "
        "note-offs (onto the sounding notes), song's bar lines; --plain-mask renormalises over all allowed "
        "tokens, as the paper does.",
    )
    mono_bass: bool = option(
        True,
        "--mono-bass/--poly-bass",
        help="Groove: a bass note still sounding when a later bass note begins ends at the next event (2% of "
        "the MMA corpus's bass notes sound past the next bass onset); --poly-bass writes the bass as drawn.",
    )
    tempo: str = option(
        "keep",
        "--tempo",
        help="keep: the continuation holds the prompt's last tempo (without a prompt, the first it draws); "
        "free: the model changes it as it learnt to; a number: holds that tempo in BPM (the nearest the "
        "tokens can name). The groove tokens hold no tempo: their continuations always keep the prompt's.",
        bound=TEMPO_BOUND,
    )
    subdivision: str = option(
        "prompt",
        "--subdivision",
        help="Song tokens: where in a beat notes may start. prompt: on the subdivisions the prompt's notes use "
        "(16ths, triplets or both; every 12th of a beat where it uses others or has none); any: every 12th of a "
        "beat the tokens hold.",
        bound=one_of(SUBDIVISION_CHOICES),
    )
    keep_tracks: float = option(
        3.0,
        "--keep-tracks",
        help="Song and groove tokens: a track (a groove role) the prompt's last 2 bars play that has then been "
        "silent for a whole bar gets this much added to the logits of its tokens for each further silent bar, "
        "until it plays again; 0: off.",
        bound=within(0.0, 10.0),
    )
    fold_instruments: bool = option(
        True,
        "--fold-instruments/--no-fold",
        help="Song tokens: what the model gives an instrument the prompt lacks (which the sampler does not play) "
        "goes to the prompt's tracks of its General MIDI family (a finger bass's to the prompt's slap bass); "
        "--no-fold drops it, as the mask alone does.",
    )
    grid: str = option(
        "auto",
        "--grid",
        help="Where a MIDI prompt's beats and bars are: auto: found in its notes and the prompt re-timed to them "
        "(a played or offset file), unless the file's own grid fits its notes at least as well (a quantised "
        "file); track: always found in its notes; file: its own grid (quarter notes, its time signatures), "
        "trusted. Found beats become quarter notes; the song tokens keep the bars found (in the meter the file "
        "names, where not 4/4), the other representations get 4/4 bars. What was assumed is printed and "
        "recorded in the JSON.",
        bound=one_of(GRIDS),
    )
    cache: float | None = model_default(
        "--cache",
        "Weight of the suffix cache, mixed with the model before the temperature: it proposes what followed the "
        "piece's last tokens where they occurred before, so a groove keeps repeating what it played "
        "(docs/sampling.md).",
        (0.0, 1.0),
        fallback=0.0,
    )
    window: int = option(
        0,
        "--window",
        help="The most tokens the model reads at once: when it has read this many, it starts again on the "
        "last half of them (the prompt too; the suffix cache, the grammar and the output keep the whole "
        "piece). Past its training length a model predicts worse (docs/sampling.md). 0: it reads it all. "
        "For models whose positions are tokens.",
        bound=within(0, MAX_LENGTH),
    )
    # musegen.generation.constraints.Constraint objects, applied after the grammar's in this order
    # (not an option; typed loosely so that declaring the options needs no torch: the command
    # line builds its help from them)
    constraints: tuple = ()

    def record(self) -> dict[str, Any]:
        """The settings as written in a run's summary JSON (added constraints by their repr)."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "constraints"}
        if self.constraints:
            record["constraints"] = [repr(c) for c in self.constraints]
        return record

    def resolved(self, tokenizer: Tokenizer | None = None, names: Mapping[str, str] | None = None) -> "SampleSettings":
        """Every option the run left unset (None) that is the model's takes the tokenizer's sampling
        default (the checkpoint's, where its meta names one: musegen.checkpoint), a seed is drawn,
        and every value is checked against its bound: a ConfigError of one line naming the option
        otherwise, by its flag or by the name `names` gives its field (the studio's labels); a
        CheckpointError where the model's own default breaks it."""
        name_of = lambda field, flag: (names or {}).get(field, flag)  # noqa: E731
        defaults = model_defaults(tokenizer)
        values: dict[str, Any] = {}
        for name, how in options(type(self)).items():
            value = getattr(self, name)
            if value is None and how.per_model:
                value = defaults.get(name, how.fallback)
                if how.bound and not how.bound.holds(value):
                    raise CheckpointError(f"the model's default {how.flag} must be {how.bound.text}, got {value!r}")
            values[name] = float(value) if float in _types(type(self))[name] and _is_int(value) else value
        if values["seed"] is None:
            values["seed"] = random.SystemRandom().randrange(2**31)
        if (values["length"] is None) == (values["bars"] is None):
            raise ConfigError("give exactly one of --length (tokens) or --bars")
        for name, how in options(type(self)).items():
            value = values[name]
            if value is not None and how.bound and not how.bound.holds(value):
                raise ConfigError(f"{name_of(name, how.flag)} must be {how.bound.text}, got {value}")
        if tokenizer is not None and held_bpm(values["tempo"]) is not None and not len(tokenizer.tempo_token_ids()):
            tempo = name_of("tempo", "--tempo")
            raise ConfigError(f"{tempo} {values['tempo']}: the {tokenizer.kind} tokens hold no tempo (give keep)")
        return replace(self, **values)


@cache
def _types(cls: type) -> dict[str, tuple[type, ...]]:
    """The types each field admits ({"top_p": (float, NoneType)}), to take 1 for 1.0."""
    return {name: getattr(hint, "__args__", (hint,)) for name, hint in get_type_hints(cls).items()}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def model_defaults(tokenizer: Tokenizer | None) -> Mapping[str, Any]:
    """The defaults of the options that are the model's: its tokenizer's `sampling_defaults` (a
    checkpoint's meta may have replaced them on the tokenizer it loaded)."""
    return (tokenizer or Tokenizer).sampling_defaults
