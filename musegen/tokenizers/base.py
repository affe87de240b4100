"""What every tokenizer offers: a vocabulary, encode/decode, a grammar, JSON persistence.

Tokenizers know nothing about torch: ids are numpy int arrays. The grammar is a small state
machine the sampler uses to mask logits and the tests use to check validity. Everything the
sampler and the trainer need from a representation is declared here, so they never ask which
kind a tokenizer is: a new representation is one module in this package (it is registered
when the package is imported) that subclasses `Tokenizer` with its `kind`, `version` and
`sampling_defaults`.
"""

from __future__ import annotations

import abc
import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Mapping

import numpy as np
from pydantic import BaseModel, Field, JsonValue, ValidationError

from .. import schemas
from ..errors import ConfigError, FormatError, TokenError
from ..io import write_json
from ..music.notes import NoteTable
from .tracking import OnsetClock, TrackMarks


@dataclass
class Encoding:
    """The result of encoding one MIDI file."""

    ids: np.ndarray  # int32 token ids, start to end of the piece
    report: dict[str, Any] = field(default_factory=dict)  # counts of folded/dropped notes etc.

    @property
    def meta(self) -> dict[str, Any]:
        """What `decode` needs to restore beyond the tokens (e.g. programs, tempo): report["meta"]."""
        return self.report.get("meta") or {}


class Grammar(abc.ABC):
    """Which tokens may come next. States are small immutable-by-convention objects."""

    vocab_size: int

    @abc.abstractmethod
    def start(self) -> Any:
        """The state before the first token."""

    @abc.abstractmethod
    def allowed(self, state: Any) -> np.ndarray:
        """Boolean mask of shape (vocab_size,): the tokens that may follow `state`."""

    @abc.abstractmethod
    def step(self, state: Any, token: int) -> Any:
        """The state after `token`; raises TokenError when `token` is not allowed."""

    @abc.abstractmethod
    def can_close(self, state: Any) -> bool:
        """True where the piece may be ended now (no half-written note)."""

    @abc.abstractmethod
    def close(self, state: Any) -> list[int]:
        """Tokens that end the piece cleanly from a state where `can_close` holds."""

    def sampling_mask(self, state: Any) -> np.ndarray:
        """`allowed`, less what the data may hold but a sampler should not write (by default,
        nothing more)."""
        return self.allowed(state)

    def past_the_bar(self, state: Any) -> np.ndarray | None:
        """The ids that would put the next event past the end of the current bar (a position the
        meter does not have), whose mass a sampler gives the bar line; None where there are none."""
        return None

    def sampling_prefix(self, state: Any, token: int) -> list[int]:
        """Tokens a sampler writes before a drawn `token` (none by default); it writes `token`
        after them where the grammar still allows it, else draws again."""
        return []

    def first_violation(self, ids) -> int | None:
        """Index of the first token the grammar rejects, or None when all are accepted."""
        state = self.start()
        for i, tok in enumerate(ids):
            if not self.accepts(state, int(tok)):
                return i
            state = self.step(state, int(tok))
        return None

    def accepts(self, state: Any, token: int) -> bool:
        """Whether `token` may follow `state` (any int: ids outside the vocabulary are refused)."""
        return 0 <= token < self.vocab_size and bool(self.allowed(state)[token])

    def states(self, ids, state: Any = None) -> list:
        """The state before each token and after the last (len(ids) + 1 states), walking from
        `state` (default: the start). Raises TokenError at the first token it rejects."""
        out = [self.start() if state is None else state]
        for i, tok in enumerate(ids):
            if not self.accepts(out[-1], int(tok)):
                raise TokenError(f"token {i} ({int(tok)}) is not allowed there by the grammar")
            out.append(self.step(out[-1], int(tok)))
        return out

    def allowed_after(self, ids, start: int, count: int) -> np.ndarray:
        """bool [count, vocab_size]: what may follow ids[:start + 1 + k] for each k < count, walked
        from the piece's start: the next-token targets of a crop of `ids` beginning at `start`,
        which a model trained under the grammar (ModelConfig.loss_over) is scored among. Every id
        is allowed past the piece's end and from a token the grammar rejects on."""
        masks = np.ones((count, self.vocab_size), dtype=bool)
        state = self.start()
        allowed = self.allowed(state)
        for i, token in enumerate(int(t) for t in ids[: start + count]):
            if not allowed[token]:
                break
            state = self.step(state, token)
            allowed = self.allowed(state)
            if i >= start and allowed.any():
                masks[i - start] = allowed
        return masks

    def repair(self, ids) -> tuple[list[int], int]:
        """A piece this grammar accepts, made of `ids` as far as they go: every token it rejects
        is dropped, then the piece is closed (or cut back to the last point where it can close).
        Returns the ids and how many tokens were dropped. Unmasked samples decode this way."""
        kept, states = [], [self.start()]
        for tok in (int(t) for t in ids):
            if self.accepts(states[-1], tok):
                kept.append(tok)
                states.append(self.step(states[-1], tok))
        if not self.allowed(states[-1]).any():  # the piece has ended by itself
            return kept, len(ids) - len(kept)
        end = next((k for k in range(len(kept), 0, -1) if self.can_close(states[k])), 0)
        return kept[:end] + ([int(t) for t in self.close(states[end])] if end else []), len(ids) - end


class FramedGrammar(Grammar):
    """A grammar of pieces framed by a Start and an End token. Its states are dataclasses with a
    `phase` (0 before Start, 1 in the piece, 2 after End); before Start only Start may come and
    after End nothing. Subclasses say what may come inside (`allowed_inside`) and how a token
    inside moves the state (`step_inside`)."""

    start_id: int
    end_id: int

    @abc.abstractmethod
    def allowed_inside(self, state: Any, mask: np.ndarray) -> None:
        """Set `mask` (all False on entry) where a token may follow `state` in the piece."""

    @abc.abstractmethod
    def step_inside(self, state: Any, token: int) -> Any:
        """The state after `token` (accepted, neither Start nor End)."""

    def allowed(self, state: Any) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        if state.phase == 1:
            self.allowed_inside(state, mask)
        else:
            mask[self.start_id] = state.phase == 0
        return mask

    def step(self, state: Any, token: int) -> Any:
        if not self.accepts(state, token):
            raise TokenError(f"token {token} is not allowed here")
        return self.advance(state, token)

    def advance(self, state: Any, token: int) -> Any:
        """The state after `token`, which the caller has checked with `accepts` (`step` checks)."""
        if token == self.start_id:
            return replace(self.start(), phase=1)
        if token == self.end_id:
            return replace(state, phase=2)
        return self.step_inside(state, token)


class RepresentationError(TokenError):
    """Tokens made by another version of a representation than the one this musegen reads."""


class TokenizerFile(BaseModel):
    """tokenizer.json: what `Tokenizer.to_dict` writes (just {"kind"} means the defaults)."""

    model_config = schemas.STRICT
    kind: schemas.Name  # one of Tokenizer.registry (checked by tokenizer_from_dict)
    version: Annotated[int, Field(ge=1, le=1000)] = 1
    settings: dict[str, JsonValue] = {}  # checked by the kind's `settings_schema`
    vocab: Annotated[list[schemas.Name], Field(max_length=2**20)] | None = None


TOKENIZER_FILE = schemas.Format("tokenizer", None, TokenizerFile)


class NoSettings(BaseModel):
    model_config = schemas.STRICT


class Tokenizer(abc.ABC):
    """One symbolic representation. Subclasses register themselves under `kind`."""

    kind: ClassVar[str]
    # The representation's version, stored in tokenizer.json (so with shards and checkpoints).
    # Raise it whenever the same music would get other ids: older data is then refused.
    version: ClassVar[int]
    # The sampler's temperature and nucleus (top-p) when the user gives none, and the weight of
    # its suffix cache where the representation sets one (0 otherwise: generation.cache).
    sampling_defaults: ClassVar[Mapping[str, float]] = {"temperature": 1.0, "top_p": 1.0}
    # A token type whose share the grammar's mask must not move (`generation.constraints.KeptShare`):
    # one the model may put on a forbidden id while meaning the type (groove's note-offs on silent
    # pitches), or whose share the renormalised mask would inflate (song's bar lines).
    kept_share_type: ClassVar[str | None] = None
    registry: ClassVar[dict[str, type["Tokenizer"]]] = {}
    # The schema of the constructor's settings as tokenizer.json holds them (bounds included).
    settings_schema: ClassVar[type[BaseModel]] = NoSettings
    # Training augmentation: keyword arguments of musegen.data.Augmenter (none: the data as it is).
    # Each key needs the methods AUGMENTATION_NEEDS names for it (checked when the class is made).
    augmentation: ClassVar[dict[str, Any]] = {}
    # Where training crops start under `crop=auto`: a "random" window or the piece's "start".
    default_crop: ClassVar[str] = "random"
    # The roles its tracks play (e.g. bass, drums, other), which evaluation scores one by one;
    # () for a single stream of notes.
    roles: ClassVar[tuple[str, ...]] = ()
    # Cells per quarter note where every onset lies, in every bar (a bar line is a cell's start);
    # None where time is not such a grid. Live play (generation.live) places a player's notes on it.
    onset_grid: ClassVar[int | None] = None
    # Whether its bars may have any length its vocabulary names, changing where the file's time
    # signatures do; False: 4/4 bars only (a tracked grid then keeps 4 beats a bar: regrid).
    holds_meters: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            if not isinstance(cls.__dict__.get("version"), int):
                raise TypeError(f"tokenizer kind {cls.kind!r} must declare an int `version`")
            for key in cls.augmentation:
                if key not in AUGMENTATION_NEEDS:
                    raise TypeError(f"tokenizer kind {cls.kind!r}: unknown augmentation {key!r}")
                missing = methods_lacking(cls, key)
                if missing:
                    raise TypeError(f"tokenizer kind {cls.kind!r}: augmentation {key!r} needs {', '.join(missing)}")
            Tokenizer.registry[cls.kind] = cls

    vocab: list[str]  # id -> event name
    # Token types for per-type metrics: type name -> event-name prefix, in order (an id has the
    # first type whose prefix starts its name; PAD has none). `position_type` moves time in a bar.
    token_types: ClassVar[dict[str, str]] = {}
    position_type: ClassVar[str | None] = None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    def token_type_ids(self) -> np.ndarray:
        """For every id, the index of its type in `list(token_types)`, or -1 when it has none."""
        prefixes = list(self.token_types.values())
        return np.array(
            [next((k for k, p in enumerate(prefixes) if name.startswith(p)), -1) for name in self.vocab], dtype=np.int64
        )

    def token_family_ids(self) -> np.ndarray:
        """For every id, the index of its family: the tokens whose names differ only in their last
        `_` field (`Note_1_40` and `Note_1_43`, one track's notes; the time shifts of one scale).
        The sampler's `--temperature-by family` sharpens choices within a family only."""
        families: dict[str, int] = {}
        return np.array([families.setdefault(name.rpartition("_")[0] or name, len(families)) for name in self.vocab])

    def tempo_token_ids(self) -> np.ndarray:
        """The ids of the tokens that set a tempo; none where the tokens hold no tempo (the groove
        tokenizers keep it in an encoding's meta, so a continuation plays on in the prompt's)."""
        return np.zeros(0, dtype=np.int64)

    def tempo_token(self, bpm: float) -> int:
        """The tempo token nearest `bpm`, for a tokenizer that has tempo tokens."""
        raise TokenError(f"the {self.kind} tokens hold no tempo")

    @functools.cached_property
    def track_marks(self) -> TrackMarks | None:
        """Which tokens name which track and how bars are counted, for `KeepTracks` and the
        suffix cache's bar guard (`generation.cache.loop_ends`, where bars have a token); None
        where the tokens name no tracks. Cached: the sampler reads it at every step."""
        return None

    @functools.cached_property
    def instrument_families(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(the tokens that name a pitched track, each one's General MIDI family 0..15), for a
        sampler that hands an instrument the prompt lacks to the prompt's track of its family;
        None where the tokens name no instruments. Cached: the sampler reads it at every step."""
        return None

    @functools.cached_property
    def cache_match(self) -> tuple[np.ndarray | None, int]:
        """How the sampler's suffix cache (`generation.cache`) matches these tokens: (a key for
        each id, compared in place of the ids; None: the ids themselves) and the shortest match it
        trusts. By default every token counts and a match of one token will do (chosen on the
        groove tokens' validation NLL, scripts/experiments/cache_nll.py)."""
        return None, 1

    def position_phases(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, phases): each position token and where in its beat it falls, in 12ths of a quarter
        note (16ths are multiples of 3, triplet 8ths of 4), for a sampler that keeps the prompt's
        subdivision; None where the positions hold one subdivision only (REMI's 16ths)."""
        return None

    @functools.cached_property
    def end_ids(self) -> tuple[int, ...]:
        """The tokens that end a piece (the sampler holds them back until the requested length).
        By default: the last of the grammar's closing tokens, found by walking the grammar."""
        grammar = self.grammar()
        for pick in (0, -1):  # walk on the first allowed token, else the last
            state = grammar.start()
            for _ in range(64):
                if grammar.can_close(state):
                    return (int(grammar.close(state)[-1]),)
                state = grammar.step(state, int(np.flatnonzero(grammar.allowed(state))[pick]))
        raise TokenError(f"the {self.kind} grammar never lets a piece end")

    def check_ids(self, ids) -> np.ndarray:
        """`ids` as a 1-D int64 array, or a TokenError when they are not integer ids of this vocabulary."""
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise TokenError("token ids must be a 1-D sequence of integers")
        arr = arr.astype(np.int64, copy=False)
        bad = np.flatnonzero((arr < 0) | (arr >= self.vocab_size))
        if len(bad):
            raise TokenError(f"token {bad[0]} has id {arr[bad[0]]}, outside the vocabulary (0..{self.vocab_size - 1})")
        return arr

    @abc.abstractmethod
    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        """Encode a MIDI file (path or bytes). Raises MidiError for unusable input."""

    @abc.abstractmethod
    def decode(self, ids, meta: Mapping[str, Any] | None = None) -> NoteTable:
        """Decode ids to a piece (`midi_bytes()` writes it as MIDI). `meta`: an encoding's `meta`
        (what the tokens do not hold, e.g. programs or tempo), to restore it; None: the
        tokenizer's defaults. Raises TokenError when the ids cannot be decoded."""

    def decode_or_skip(self, ids) -> tuple[NoteTable | None, str]:
        """`decode(ids)` for a batch job that skips a piece it cannot use: (the piece, "") or (None,
        why it is skipped: its ids do not decode, or they decode to no notes)."""
        try:
            piece = self.decode(ids)
        except TokenError as exc:
            return None, f"cannot decode: {str(exc).splitlines()[0]}"
        return (piece, "") if len(piece) else (None, "decodes to no notes")

    @abc.abstractmethod
    def grammar(self) -> Grammar: ...

    @abc.abstractmethod
    def transpose(self, ids: np.ndarray, shift: int) -> np.ndarray | None:
        """The ids transposed by `shift` semitones, or None when a pitch would leave the range."""

    @abc.abstractmethod
    def bar_starts(self, ids) -> list[int]:
        """For each bar that holds a token of the piece, where its tokens start: ids[:starts[b]]
        is the piece before bar b. A bar is listed once a token of it is there, so the list
        grows as a sampler writes. The sampler relies on this, and on the grammar closing
        ids[:starts[b]] as a piece of b bars (`Grammar.close`)."""

    def onsets(self, ids) -> np.ndarray:
        """Each token's onset in beats from the piece's start (float64, non-decreasing): the
        positions of a model whose positions are beats (ModelConfig.positions), for training
        crops (musegen.data.CropDataset) and evaluation. A tokenizer that gives them gives
        `onset_clock` too, for the sampler."""
        raise self._no_onsets()

    def onset_clock(self) -> OnsetClock:
        """A clock at the start of a piece that gives, token by token, the onsets `onsets` gives
        a sequence the grammar accepts: what a sampler feeds a model of beats, one step at a time."""
        raise self._no_onsets()

    def _no_onsets(self) -> ConfigError:
        return ConfigError(f"the {self.kind} tokenizer gives no onsets: positions 'beats' needs one that does")

    # ---- piece-level augmentation (musegen.data.Augmenter), for the keys of `augmentation` ----

    def notes(self, ids) -> np.ndarray:
        """The notes of a token sequence as int rows whose first column is the track (the numbers
        `drop_tracks` takes); the other columns are the representation's own. Needed for
        `track_dropout`; a representation without tracks does not provide it."""
        raise NotImplementedError(f"the {self.kind} tokenizer has no tracks to list")

    def skip_bars(self, ids, n: int) -> np.ndarray | None:
        """The piece without its first `n` bars, notes sounding across the cut started again at
        the new beginning; None when the piece has no more than `n` bars. Needed for
        `max_skip_bars`."""
        raise NotImplementedError(f"the {self.kind} tokenizer cannot skip bars")

    def drop_tracks(self, ids, tracks) -> np.ndarray:
        """The piece without any note of `tracks` (track numbers as in `notes`). Needed for
        `track_dropout`."""
        raise NotImplementedError(f"the {self.kind} tokenizer has no tracks to drop")

    def map_drums(self, ids, kit: np.ndarray) -> np.ndarray:
        """The piece with each drum note of pitch p played on pitch kit[p] (`kit`: a permutation
        of 0..127), in the order the representation writes. Needed for `kit_shuffle`."""
        raise NotImplementedError(f"the {self.kind} tokenizer has no drum kit to shuffle")

    def double_bass(self, ids, interval: int) -> np.ndarray:
        """The piece with each bass note doubled `interval` semitones above. Needed for
        `bass_doubling`."""
        raise NotImplementedError(f"the {self.kind} tokenizer has no bass to double")

    def map_programs(self, ids, programs: np.ndarray) -> np.ndarray:
        """The piece with each pitched track of General MIDI program p played on program
        programs[p] (`programs`: a permutation of 0..127), in the order the representation
        writes. Needed for `instrument_shuffle`."""
        raise NotImplementedError(f"the {self.kind} tokenizer has no instruments to shuffle")

    def program_token_ids(self, program: int) -> np.ndarray:
        """The ids that name a track of GM `program` (every track of it), for a sampler that leaves
        that instrument to someone else (live accompaniment). Only a representation with tracks."""
        raise ConfigError(f"the {self.kind} tokenizer has no tracks of their own instrument")

    def to_bar_line(self, state, bar: int) -> list[int]:
        """Tokens to append to a piece cut where bar `bar` starts (`ids[:bar_starts(...)[bar]]`,
        whose grammar state is `state`) so that time stands at that bar line with nothing
        sounding from before it, and a continuation begins exactly at the bar. None are needed
        where the grammar's closing already does it (REMI's Bar)."""
        return []

    @abc.abstractmethod
    def settings(self) -> dict[str, Any]:
        """The constructor keyword arguments; `type(self)(**settings())` rebuilds the tokenizer."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "settings": self.settings(), "vocab": list(self.vocab)}

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, self.to_dict())


# The methods each key of `Tokenizer.augmentation` calls beyond the abstract ones (`transpose`).
AUGMENTATION_NEEDS: dict[str, tuple[str, ...]] = {
    "max_shift": (),
    "max_skip_bars": ("skip_bars",),
    "track_dropout": ("notes", "drop_tracks"),
    "kit_shuffle": ("map_drums",),
    "instrument_shuffle": ("map_programs",),
    "bass_doubling": ("double_bass",),
}


def methods_lacking(cls: type[Tokenizer], augmentation: str) -> list[str]:
    """The methods `augmentation` calls that the tokenizer class `cls` does not provide."""
    return [m for m in AUGMENTATION_NEEDS[augmentation] if getattr(cls, m) is getattr(Tokenizer, m)]


# What to do about data of another representation version, by what holds it.
REMEDY = "re-prepare the data / retrain"


def tokenizer_from_dict(data: dict[str, Any], source: str = "the tokenizer", remedy: str = REMEDY) -> Tokenizer:
    """Build a tokenizer from `to_dict()` output (or just {"kind": ...} for the defaults),
    checked against its schema (`TokenizerFile`, then the kind's `settings_schema`), then its
    representation version (when stored) and vocabulary."""
    checked = schemas.check(data, TOKENIZER_FILE, source)
    kind = checked.kind
    if kind not in Tokenizer.registry:
        raise FormatError(f"{source}: unknown tokenizer kind {kind!r} (known: {', '.join(Tokenizer.registry)})")
    cls = Tokenizer.registry[kind]
    if "version" in data and checked.version != cls.version:
        raise RepresentationError(
            f"{source} was made with {kind.upper()} representation v{checked.version}; "
            f"this musegen reads v{cls.version}: {remedy} or use an older musegen"
        )
    try:
        stated = cls.settings_schema.model_validate(checked.settings).model_dump(include=set(checked.settings))
    except ValidationError as exc:
        raise FormatError(f"{source}: invalid {kind} tokenizer settings: {schemas.first_problem(exc)}") from None
    try:
        tok = cls(**stated)
    except ConfigError as exc:  # settings that disagree with each other
        raise FormatError(f"{source}: invalid {kind} tokenizer settings: {exc}") from None
    if checked.vocab is not None and checked.vocab != list(tok.vocab):
        raise TokenError(f"stored {kind} vocabulary does not match the one its settings produce")
    return tok


def load_tokenizer(path: str | os.PathLike, remedy: str = REMEDY) -> Tokenizer:
    """The tokenizer stored in a tokenizer.json. Files from before representation versions
    count as version 1, so they are refused like any other version this musegen does not read."""
    path = Path(path)
    if not path.is_file():
        raise TokenError(f"{path}: tokenizer file not found")
    data = schemas.read(path, TOKENIZER_FILE)
    return tokenizer_from_dict({"version": 1, **data.model_dump(exclude_unset=True)}, str(path), remedy)
