"""The `musegen` command line. Thin: it parses options, calls the library, and prints.

Each area registers its commands from its own module. Errors caused by the user's input
arrive as MusegenError and are printed as one line with a non-zero exit; no traceback
reaches the user unless MUSEGEN_DEBUG=1 is set.
"""

from __future__ import annotations

import os
import sys

import typer

from ..errors import MusegenError

app = typer.Typer(
    name="musegen",
    help="Long-context symbolic music generation: Performers with Stochastic Positional Encoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    from . import data, evaluate, export, inspect, sample, train

    for module in (data, train, export, sample, evaluate, inspect):
        module.register(app)


_register_commands()


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    debug = os.environ.get("MUSEGEN_DEBUG") == "1"
    try:
        app(args=argv, standalone_mode=True)
    except MusegenError as exc:
        if debug:
            raise
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except OSError as exc:  # disk full, permissions, ...: the user's environment, not a bug
        if debug:
            raise
        fail(f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc))
    except Exception as exc:  # a bug: still one line, with a pointer to the traceback
        if debug:
            raise
        fail(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
             "(set MUSEGEN_DEBUG=1 for the traceback)", 3)


if __name__ == "__main__":
    main(sys.argv[1:])
