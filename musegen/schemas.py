"""Every JSON or YAML file musegen reads, declared once: its format, version and schema.

`read(path, format)` is the one way musegen reads such a file, and `check(data, format, where)`
the one way it checks a value parsed elsewhere (a YAML file, a line of a JSON-lines log). The
bytes go through `io.read_json`'s bounds (size, nesting), the value through the format's pydantic
model: strict types, no unknown fields where musegen wrote every field, and bounds that follow
from the representation (a MIDI pitch is 0..127) or from what a machine can hold. An invalid file
is a FormatError: one line naming the file and the first field that is wrong.

The studio's requests and the lines of its stream have their formats here too (`studio request`,
`studio event`).
"""

from __future__ import annotations

import os
import reprlib
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .errors import ConfigError, FormatError
from .io import parse_json, printable, read_input, read_json
from .model.config import ModelConfig
from .music.constants import BEATS_PER_BAR, MAX_BARS, MAX_PROMPT_BARS

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
OPEN = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)  # files that carry free-form extras

Count = Annotated[int, Field(ge=0, le=2**62)]
Name = Annotated[str, Field(max_length=4096)]
Pitch = Annotated[int, Field(ge=0, le=127)]
MAX_ITEMS = 2**24  # pieces in a shard index, records in a summary: far past any corpus


# ---- checkpoints ------------------------------------------------------------------------------------


class CheckpointConfig(BaseModel):
    """A checkpoint's config.json. `model` is the ModelConfig itself, bounds included."""

    model_config = STRICT
    format: Literal["musegen-checkpoint"]
    version: Literal[1]
    model: dict[str, JsonValue]  # checked by ModelConfig (`model_settings`), which knows its defaults
    meta: dict[str, JsonValue] = {}


class RemiSettings(BaseModel):
    model_config = STRICT
    beat_resolution: Annotated[int, Field(ge=1, le=160)] = 4
    pitch_range: Annotated[list[Pitch], Field(min_length=2, max_length=2)] = [22, 107]  # (lowest, highest)
    velocity_range: Annotated[list[Pitch], Field(min_length=3, max_length=3)] = [40, 86, 2]  # (low, high, step)
    # grid steps: 256 bars of 4/4 at the default resolution; each step is a token of the vocabulary
    max_duration: Annotated[int, Field(ge=1, le=4096)] = 16
    tempos: Annotated[list[Annotated[int, Field(ge=1, le=1000)]], Field(min_length=1, max_length=1000)] | None = None
    chords: bool = True


class GrooveSettings(BaseModel):
    model_config = STRICT
    programs: dict[Literal["bass", "other"], Annotated[int, Field(ge=0, le=127)]] = {}
    other_seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None


class TokenizerFile(BaseModel):
    """tokenizer.json: what `Tokenizer.to_dict` writes (just {"kind"} means the defaults)."""

    model_config = STRICT
    kind: Name  # one of Tokenizer.registry (checked by tokenizer_from_dict)
    version: Annotated[int, Field(ge=1, le=1000)] = 1
    settings: dict[str, JsonValue] = {}  # checked by the kind's settings model (TOKENIZER_SETTINGS)
    vocab: Annotated[list[Name], Field(max_length=2**20)] | None = None


class NoSettings(BaseModel):
    model_config = STRICT


# A representation with constructor settings declares them here; one without takes none.
TOKENIZER_SETTINGS: dict[str, type[BaseModel]] = {
    "remi": RemiSettings,
    "groove": GrooveSettings,
    "groove-dur": GrooveSettings,
}


class TrainingState(BaseModel):
    """trainer_state.json beside a run's checkpoint (optimizer and scheduler: structure checked
    against the live objects by run_folder, which knows them)."""

    model_config = OPEN
    step: Count
    nonfinite_total: Count
    nonfinite_streak: Count
    tokens_seen: Count
    optimizer: dict[str, JsonValue]
    scheduler: dict[str, JsonValue]


# ---- data --------------------------------------------------------------------------------------------


class ShardSplit(BaseModel):
    """One split of a shard index: its pieces lie one after another in its .npy file."""

    model_config = STRICT
    file: Annotated[str, Field(pattern=r"^[\w-][\w.-]*\.npy$", max_length=255)] | None = None  # None: `<split>.npy`
    names: Annotated[list[Name], Field(max_length=MAX_ITEMS)]
    offsets: Annotated[list[Count], Field(max_length=MAX_ITEMS)]
    lengths: Annotated[list[Count], Field(max_length=MAX_ITEMS)]

    @model_validator(mode="after")
    def _consecutive(self) -> "ShardSplit":
        counts = len(self.names), len(self.offsets), len(self.lengths)
        if len(set(counts)) > 1:
            raise PydanticCustomError("pieces", "{n} names, {o} offsets and {l} lengths", dict(zip("nol", counts)))
        end = 0
        for i, (offset, length) in enumerate(zip(self.offsets, self.lengths)):
            if offset != end:
                raise PydanticCustomError(
                    "pieces",
                    "offsets.{i} is {o}, not {e}, where the piece before ends",
                    {"i": i, "o": offset, "e": end},
                )
            end += length
        return self


class ShardIndex(BaseModel):
    model_config = STRICT
    format: Literal["musegen-shards"]
    version: Literal[1]
    tokenizer: Name
    splits: dict[Name, ShardSplit]
    report: dict[str, JsonValue] = {}


MIREX_MAX_TIME = MAX_BARS * 4 * BEATS_PER_BAR  # in 16ths: the latest a note may end, as long as a piece may be
# The latest a prompt's note may end: its continuation, counted from the same origin, then has
# MAX_BARS - MAX_PROMPT_BARS bars of room before MIREX_MAX_TIME.
MIREX_PROMPT_MAX_TIME = MAX_PROMPT_BARS * 4 * BEATS_PER_BAR


def _ends_by(note: "MirexNote", limit: int, what: str) -> None:
    if note.start + note.duration > limit:
        bars = limit // (4 * BEATS_PER_BAR)
        raise PydanticCustomError("too_late", f"ends after 16th {limit:,} ({bars:,} bars, {what})")


class MirexNote(BaseModel):
    """A note of a continuation musegen writes (`"generation"`): it ends by `LATEST`."""

    LATEST: ClassVar[tuple[int, str]] = (MIREX_MAX_TIME, "the longest piece")
    model_config = ConfigDict(strict=True, allow_inf_nan=False)  # extra keys (velocity, ...) ignored
    start: Annotated[int, Field(ge=0)]  # 16ths from the task's origin
    pitch: Pitch
    duration: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _in_time(self) -> "MirexNote":
        _ends_by(self, *self.LATEST)
        return self


class MirexPromptNote(MirexNote):
    LATEST = (MIREX_PROMPT_MAX_TIME, "the longest prompt")


class MirexPrompt(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    prompt: Annotated[list[MirexPromptNote], Field(min_length=1, max_length=2**20)]


class MirexGeneration(BaseModel):
    model_config = STRICT
    generation: list[MirexNote]


# ---- what musegen writes and reads back -----------------------------------------------------------


class SampleRecord(BaseModel):
    model_config = OPEN
    midi: Name | None = None
    wav: Name | None = None
    pianoroll: Name | None = None
    json_: Name | None = Field(None, alias="json")


class SampleStats(BaseModel):
    model_config = OPEN
    tokens_per_second: Annotated[float, Field(ge=0)] | None = None
    state_bytes: Count | None = None


class SampleSummary(BaseModel):
    """`<stem>.json` of one prompt's output set and `batch.json` of a folder of prompts."""

    model_config = OPEN
    samples: Annotated[list[SampleRecord], Field(max_length=MAX_ITEMS)]
    stats: SampleStats


class TrainSettings(BaseModel):
    """A `train --config` YAML file: TrainConfig's fields, and `model:` ModelConfig's (both checked,
    bounds included, where the configs are made)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    model: dict[str, JsonValue] = {}


class LogRecord(BaseModel):
    """A line of a run's log.jsonl."""

    model_config = OPEN
    step: Count = 0


class PieceRecord(BaseModel):
    """A line of `evaluate continuation`'s pieces.jsonl."""

    model_config = OPEN
    piece: Name


class MmaStyle(BaseModel):
    model_config = STRICT
    family: Name  # an MMA library file without suffix, e.g. "stdlib/bossanova"
    groove: Name
    tempo: Annotated[int, Field(ge=1, le=1000)]  # bpm
    swings: bool  # whether MMA's swing setting changes what the groove plays


class MmaStyles(BaseModel):
    """data_prep/mma_styles.json: the MMA grooves the groove corpus is rendered from, and each
    family's fill grooves."""

    model_config = STRICT
    mma_version: Name
    styles: Annotated[list[MmaStyle], Field(max_length=100_000)]
    fills: Annotated[dict[Name, Annotated[list[Name], Field(max_length=1_000)]], Field(max_length=100_000)]


class LayoutStamp(BaseModel):
    """g2g/layout.json of a groove corpus: the version of the layout its files were written in."""

    model_config = STRICT
    version: Annotated[int, Field(ge=1, le=1000)]


class PrecisionChoice(BaseModel):
    """One entry of ~/.cache/musegen/precision.json (musegen.precision): the path timed fastest."""

    model_config = STRICT
    path: Literal["fp32", "bf16", "bf16-step.c"]
    seconds: dict[Name, Annotated[float, Field(ge=0)]]
    date: Name


class CopyRow(BaseModel):
    model_config = OPEN
    name: Name
    scored: Count
    mean: float | None


class CopyModel(BaseModel):
    model_config = OPEN
    checkpoint: Name


class CopyResult(BaseModel):
    """copy.json of `evaluate copy` (musegen.evaluation.run_copy), as `evaluate groove-targets` reads it."""

    model_config = OPEN
    settings: dict[str, JsonValue]
    table: Annotated[list[CopyRow], Field(max_length=MAX_ITEMS)]
    models: dict[Name, CopyModel]


class ZenodoFile(BaseModel):
    model_config = OPEN
    key: Name | None = None
    filename: Name | None = None  # (older records)
    checksum: Name = ""  # "md5:<hex>"
    links: dict[str, JsonValue] = {}


class ZenodoRecord(BaseModel):
    """What Zenodo's records API says of a record (data_prep/download.py reads its files' checksums)."""

    model_config = OPEN
    files: Annotated[list[ZenodoFile], Field(max_length=100_000)] = []


@dataclass(frozen=True)
class Format:
    name: str
    version: int | None  # None: the file carries no version of its own (its owner's version rules)
    schema: Any


class StudioEvent(BaseModel):
    """A line of the studio's generation stream (musegen.studio.server), as its clients read it."""

    model_config = OPEN
    event: Literal["queued", "started", "notes", "done", "stopped", "error"]


STUDIO_MAX_BARS = 64  # a page's run: long enough to listen to, short enough to wait for
STUDIO_MAX_SAMPLES = 8


class StudioRequest(BaseModel):
    """The body of the studio's generation request (musegen.studio.jobs). A field left empty
    (null or "") takes its default; temperature, top_p and seed are bounded by SampleSettings,
    which the request becomes."""

    model_config = STRICT
    model: Name = ""  # one of the studio's models (checked by its list)
    prompt: Name | None = None  # a prompt id of the session (checked by the store's pattern)
    bars: Annotated[int, Field(ge=1, le=STUDIO_MAX_BARS)] = 8
    samples: Annotated[int, Field(ge=1, le=STUDIO_MAX_SAMPLES)] = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _empty_fields_take_defaults(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None and v != ""} if isinstance(data, dict) else data


FORMATS = {
    f.name: f
    for f in (
        Format("checkpoint config", 1, CheckpointConfig),
        Format("tokenizer", None, TokenizerFile),
        Format("training state", None, TrainingState),
        Format("shard index", 1, ShardIndex),
        Format("sample summary", None, SampleSummary),
        Format("mirex prompt", None, MirexPrompt),
        Format("mirex generation", None, MirexGeneration),
        Format("train settings", None, TrainSettings),
        Format("log record", None, LogRecord),
        Format("piece record", None, PieceRecord),
        Format("evaluation settings", None, dict[str, JsonValue]),
        Format("zenodo record", None, ZenodoRecord),
        Format("mma styles", None, MmaStyles),
        Format("layout stamp", None, LayoutStamp),
        Format("piece counts", None, dict[Name, int | float]),  # a kept piece's report counts (data_prep.mma_groove)
        Format("precision cache", None, dict[Name, PrecisionChoice]),
        Format("copy result", None, CopyResult),
        Format("studio event", None, StudioEvent),
        Format("studio request", None, StudioRequest),
    )
}
_ADAPTERS: dict[str, TypeAdapter] = {}
Explain = Callable[[ValidationError], str]  # a caller's own one-line wording of what is wrong


def check(data: Any, format: str, where: str | os.PathLike, explain: Explain | None = None) -> Any:
    """`data` validated as `format` (a pydantic model, or the plain value for non-model schemas);
    FormatError naming `where` and the field otherwise (or saying what `explain` makes of it)."""
    adapter = _ADAPTERS.get(format) or _ADAPTERS.setdefault(format, TypeAdapter(FORMATS[format].schema))
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        if explain is not None:
            raise FormatError(explain(exc)) from None
        raise FormatError(f"{printable(where)}: invalid {format}: {first_problem(exc)}") from None


def read(path: str | os.PathLike, format: str, max_bytes: int | None = None) -> Any:
    """The file at `path` parsed and validated as `format`."""
    try:
        data = read_json(path, *([max_bytes] if max_bytes else []))
    except (ValueError, UnicodeDecodeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FormatError(f"{printable(path)}: not valid JSON ({text})") from None
    return check(data, format, path)


MAX_YAML_VALUES = 100_000  # a settings file holds a few dozen; aliases must not make a small file huge


def read_yaml(path: str | os.PathLike, format: str) -> Any:
    """The YAML file at `path` (a settings file, so read through io's bounds) validated as `format`.
    Its values are counted with every alias expanded before any is built: a few lines of nested
    aliases can stand for billions of values, which every walk over the result would visit."""
    import yaml

    try:
        loader = yaml.SafeLoader(read_input(path, "settings file", error=ConfigError).decode("utf-8"))
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_size(node, {}) > MAX_YAML_VALUES:
                raise FormatError(f"{printable(path)}: more than {MAX_YAML_VALUES:,} values with its aliases expanded")
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError:
        raise FormatError(f"{printable(path)}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise FormatError(f"{printable(path)}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise FormatError(f"{printable(path)}: nested too deeply for a settings file") from None
    return check({} if data is None else data, format, path)


def _expanded_size(node: Any, sizes: dict[int, int]) -> int:
    """How many values a YAML node stands for, each alias counted as often as it is used (a node
    shared by aliases is counted once and remembered, so this takes the file's size in time)."""
    if id(node) not in sizes:
        sizes[id(node)] = 1  # (a node that holds itself counts once)
        children = node.value if isinstance(node.value, list) else []
        flat = [n for child in children for n in (child if isinstance(child, tuple) else (child,))]
        sizes[id(node)] = min(1 + sum(_expanded_size(n, sizes) for n in flat), MAX_YAML_VALUES + 1)
    return sizes[id(node)]


def loads(text: str | bytes, format: str, where: str | os.PathLike, explain: Explain | None = None) -> Any:
    """One JSON text (a line of a JSON-lines file, a request's body) parsed and validated as `format`."""
    try:
        data = parse_json(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        detail = str(exc).splitlines()[0] if str(exc) else "nesting"
        raise FormatError(f"{printable(where)}: not valid JSON ({detail[:80]})") from None
    return check(data, format, where, explain)


def model_settings(settings: dict[str, Any], where: str | os.PathLike) -> ModelConfig:
    """A ModelConfig from a file's settings (defaults for those it lacks), as FormatError."""
    try:
        return ModelConfig(**settings)
    except ValidationError as exc:
        raise FormatError(f"{printable(where)}: invalid model config: {first_problem(exc)}") from None
    except (ConfigError, TypeError) as exc:  # the config's own cross-field checks; a key named like `self`
        raise FormatError(f"{printable(where)}: invalid model config: {exc}") from None


def tokenizer_settings(kind: str, settings: dict[str, Any], where: str | os.PathLike) -> dict[str, Any]:
    """`settings` for a tokenizer of `kind`, checked by its schema (only those it states)."""
    try:
        checked = TOKENIZER_SETTINGS.get(kind, NoSettings).model_validate(settings)
    except ValidationError as exc:
        raise FormatError(f"{printable(where)}: invalid {kind} tokenizer settings: {first_problem(exc)}") from None
    return checked.model_dump(include=set(settings))


_UNION_TAGS = {"list", "dict", "str", "int", "float", "bool", "none"}
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 4, 4
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 40


def first_problem(exc: ValidationError) -> str:
    """'field.path: what is wrong (got VALUE)' for the first error pydantic found."""
    error = exc.errors(include_url=False)[0]
    # (a free-form JSON value's loc names the union branch tried, e.g. "tempos.list.0.float")
    parts = [str(part) for part in error["loc"] if str(part) not in _UNION_TAGS]
    field = ".".join(parts) or "(the whole file)"
    value = _SHORT.repr(error.get("input"))  # (bounded: the value may be huge, or shared many times over)
    value = value if len(value) <= 40 else value[:37] + "..."
    return f"{field}: {error['msg'][0].lower() + error['msg'][1:]} (got {printable(value)})"
