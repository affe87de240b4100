"""The sampling options of the command line, made from their one declaration
(musegen.generation.settings.SampleSettings): a command decorated with `sampling_options` takes a
`settings` argument and gets every declared option as a flag, with its help, bound and default."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, get_type_hints

import typer

from .. import home
from ..checkpoint_format import read_config, sampling_defaults
from ..errors import MusegenError
from ..generation.settings import Option, SampleSettings, options
from ..tokenizers import Tokenizer


def sampling_options(exclude: tuple[str, ...] = (), cls: type = SampleSettings) -> Callable:
    """Decorate a command whose parameter `settings` is to be a `cls` built from the flags: every
    declared option but `exclude` becomes a flag (the excluded keep their declared defaults)."""

    def decorate(command: Callable) -> Callable:
        hints = get_type_hints(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in _parameters(command)]
        offered = {name: how for name, how in options(cls).items() if name not in exclude}
        types = get_type_hints(cls)
        added = [_parameter(name, how, types[name], _default(cls, name)) for name, how in offered.items()]

        def run(**given: Any) -> Any:
            return command(settings=cls(**{name: given.pop(name) for name in offered}), **given)

        run.__name__, run.__doc__, run.__module__ = command.__name__, command.__doc__, command.__module__
        parameters = own + added
        run.__signature__ = inspect.Signature(parameters)
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate


def help_text(name: str, how: Option) -> str:
    """An option's help: what it does, its bound, and where its default comes from."""
    text = how.help
    if how.bound is not None:
        text += f" {how.bound.text[0].upper()}{how.bound.text[1:]}."
    if how.per_model:
        by_kind = ", ".join(f"{kind} {_shown(c.sampling_defaults.get(name, how.fallback))}" for kind, c in _kinds())
        shipped = _shipped_defaults(name)
        own = f": the shipped {shipped}" if shipped else ""
        text += f" Default: the model's (by representation: {by_kind}; a checkpoint may name its own{own})."
    return text


def _shipped_defaults(name: str) -> str:
    """The shipped models that name their own default for option `name` ("song 0.95"), as their
    config.json says; one that cannot be read is left out (help must not fail on a stray MUSEGEN_HOME)."""
    named = []
    try:
        models = home.models()
    except OSError:  # an unreadable MUSEGEN_HOME: the commands that load a model say so
        return ""
    for model, folder in models.items():
        try:
            own = sampling_defaults(read_config(folder).meta, folder)
        except MusegenError:
            continue
        if name in own:
            named.append(f"{model} {_shown(own[name])}")
    return ", ".join(named)


def _kinds() -> list[tuple[str, type[Tokenizer]]]:
    return sorted(Tokenizer.registry.items())


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _parameters(command: Callable) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(command).parameters.values() if p.name != "settings"]


def _default(cls: type, name: str) -> Any:
    return cls.__dataclass_fields__[name].default


def _parameter(name: str, how: Option, hint: Any, default: Any) -> inspect.Parameter:
    base = next((t for t in getattr(hint, "__args__", (hint,)) if t is not type(None)), str)
    annotation = base if isinstance(default, bool) else Optional[base]
    info = typer.Option(default, *how.flags, help=help_text(name, how), show_default=default is not None)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
