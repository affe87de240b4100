"""The `musegen` command line. Thin: it parses options, calls the library, and prints.

Each area registers its commands from its own module. Errors caused by the user's input
arrive as MusegenError and are printed as one line with a non-zero exit (a full disk too,
whichever library was writing); no traceback reaches the user unless MUSEGEN_DEBUG=1 is set.
SIGTERM unwinds like Ctrl-C, so temporary files are removed and child processes stopped.
"""

from __future__ import annotations

import os
import signal
import sys

import typer

from ..errors import MusegenError
from ..io import is_disk_full, printable
from ..signals import StopSignalsTo
from . import terminate
from .terminate import Terminated

app = typer.Typer(
    name="musegen",
    help="Long-context symbolic music generation: Performers with Stochastic Positional Encoding.\n\n"
    "Limits on inputs: MIDI, JSON, checkpoint, shard and soundfont files are read only when they are "
    "regular files (not FIFOs, devices or folders); a MIDI file may have at most 16 MiB, every event "
    "before tick 2^31, at most 160,000 tempo changes and 10,000 time signatures, and (for the tokenizers) "
    "10,000 bars, of which a prompt may hold 5,000; a JSON file 256 MiB and 64 levels of "
    "nesting. `data prepare` skips, counts and lists a file that is bad, takes over 60 s, or whose "
    "worker process is killed (e.g. out of memory). Every JSON and YAML file is checked against the "
    "schema its module declares (read through musegen/schemas.py). Exit codes: 1 a bad input file or "
    "folder, 2 an option or setting out of its bounds, a file that breaks its schema, or a request refused "
    "before allocation (memory, notes), 3 an internal error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    from . import data, evaluate, export, inspect, jam, render, sample, studio, train

    for module in (data, train, export, sample, render, evaluate, inspect, studio, jam):
        module.register(app)


_register_commands()


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit with `code`."""
    typer.echo(f"error: {printable(message)}", err=True)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    _run(app, argv)


def run_command(command, argv: list[str] | None = None) -> None:
    """Run one typer command function as a program of its own (an experiment script), with the
    errors, exit codes and SIGTERM handling of `musegen`."""
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command()(command)
    _run(single, argv)


def _run(typer_app: typer.Typer, argv: list[str] | None) -> None:
    debug = os.environ.get("MUSEGEN_DEBUG") == "1"
    terminate.handler_pid = os.getpid()
    with StopSignalsTo(terminate.on_sigterm, signals=(signal.SIGTERM,)):  # Ctrl-C stays KeyboardInterrupt
        try:
            typer_app(args=argv, standalone_mode=True)
        except MusegenError as exc:
            if debug:
                raise
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Terminated:
            fail("terminated", 143)
        except Exception as exc:
            if debug:
                raise
            fail(*_describe(exc))


def _describe(exc: Exception) -> tuple[str, int]:
    """(one line, exit code) for an exception that is not a MusegenError."""
    if is_disk_full(exc):  # also when a library that writes by itself wraps the OS error
        where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
        return f"disk full{where} (No space left on device)", 1
    if isinstance(exc, OSError):  # permissions, missing folders, ...: the user's environment, not a bug
        return (f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)), 1
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"internal error: {type(exc).__name__}: {text} (set MUSEGEN_DEBUG=1 for the traceback)", 3


if __name__ == "__main__":
    main(sys.argv[1:])
