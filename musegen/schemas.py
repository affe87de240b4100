"""How musegen reads and checks every JSON or YAML file: the machinery and the registry of formats.

Each format is declared next to the code that owns it, as a `Format` constant (e.g.
`shards.SHARD_INDEX`, `tokenizers.base.TOKENIZER_FILE`): its name, version and pydantic schema.
A Format registers itself in `FORMATS` when its module is imported.

`read(path, format)` is the one way musegen reads such a file, and `check(data, format, where)`
the one way it checks a value parsed elsewhere (a YAML file, a line of a JSON-lines log). The
bytes go through `io.read_json`'s bounds (size, nesting), the value through the format's pydantic
model: strict types, no unknown fields where musegen wrote every field, and bounds that follow
from the representation (a MIDI pitch is 0..127) or from what a machine can hold. An invalid file
is a FormatError: one line naming the file and the first field that is wrong.

This module imports nothing of musegen but `errors` and `io`, so any module may declare a format.
"""

from __future__ import annotations

import functools
import os
import reprlib
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from .errors import ConfigError, FormatError
from .io import parse_json, printable, read_input, read_json

STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
OPEN = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)  # files that carry free-form extras

Count = Annotated[int, Field(ge=0, le=2**62)]
Name = Annotated[str, Field(max_length=4096)]
Pitch = Annotated[int, Field(ge=0, le=127)]
MAX_ITEMS = 2**24  # pieces in a shard index, records in a summary: far past any corpus


@dataclass(frozen=True, eq=False)
class Format:
    """A file format: its name (in errors), its version (None: the file carries none of its own,
    its owner's version rules) and its schema (a pydantic model, or a type such as a dict of them)."""

    name: str
    version: int | None
    schema: Any

    def __post_init__(self) -> None:
        if FORMATS.setdefault(self.name, self) is not self:
            raise ValueError(f"format {self.name!r} is declared twice")

    @functools.cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.schema)


FORMATS: dict[str, Format] = {}  # name: format, for every format whose module is imported
Explain = Callable[[ValidationError], str]  # a caller's own one-line wording of what is wrong


def check(data: Any, format: Format, where: str | os.PathLike, explain: Explain | None = None) -> Any:
    """`data` validated as `format` (a pydantic model, or the plain value for non-model schemas);
    FormatError naming `where` and the field otherwise (or saying what `explain` makes of it)."""
    try:
        return format.adapter.validate_python(data)
    except ValidationError as exc:
        if explain is not None:
            raise FormatError(explain(exc)) from None
        raise FormatError(f"{printable(where)}: invalid {format.name}: {first_problem(exc)}") from None


def read(path: str | os.PathLike, format: Format, max_bytes: int | None = None) -> Any:
    """The file at `path` parsed and validated as `format`."""
    try:
        data = read_json(path, *([max_bytes] if max_bytes else []))
    except (ValueError, UnicodeDecodeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FormatError(f"{printable(path)}: not valid JSON ({text})") from None
    return check(data, format, path)


MAX_YAML_VALUES = 100_000  # a settings file holds a few dozen; aliases must not make a small file huge


def read_yaml(path: str | os.PathLike, format: Format) -> Any:
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


def loads(text: str | bytes, format: Format, where: str | os.PathLike, explain: Explain | None = None) -> Any:
    """One JSON text (a line of a JSON-lines file, a request's body) parsed and validated as `format`."""
    try:
        data = parse_json(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        detail = str(exc).splitlines()[0] if str(exc) else "nesting"
        raise FormatError(f"{printable(where)}: not valid JSON ({detail[:80]})") from None
    return check(data, format, where, explain)


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
