"""`musegen jam`: play along live with a model through MIDI ports (musegen/generation/jam.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..generation.settings import TEMPO_RANGE, SampleSettings
from .options import sampling_options

# sampling options the jam decides itself (bars, prompt, tempo) or that are for another model
NOT_JAM_OPTIONS = (
    "length",
    "bars",
    "num_samples",
    "prompt_bars",
    "prompt_from",
    "grid",
    "tempo",
    "mono_bass",
    "grammar",
)
DEFAULT_BPM = 100.0
MAX_BARS = 10_000


@sampling_options(exclude=NOT_JAM_OPTIONS)
def jam(
    model: Path = typer.Option(
        Path("pop"),
        "--model",
        "-m",
        help="Checkpoint folder, or the name of a shipped model: pop (piano, 4/4) or song (every track, any meter).",
    ),
    in_port: Optional[str] = typer.Option(None, "--in", help="MIDI input port to play on (default: the first)."),
    out_port: Optional[str] = typer.Option(
        None, "--out", help="MIDI output port the model (and the click) sound on (default: the first)."
    ),
    list_ports: bool = typer.Option(False, "--list-ports", help="List the MIDI ports and exit."),
    mode: str = typer.Option(
        "answer",
        help="answer: the model answers each phrase you play, from the bar line after a bar you leave silent; "
        "play again during an answer to take the turn back from the next bar line. accompany: each bar, the "
        "model plays the --prompt's other instruments under you.",
    ),
    bpm: Optional[float] = typer.Option(None, help="Tempo in BPM (default: the --prompt's, else 100)."),
    meter: Optional[str] = typer.Option(
        None, help="Meter, e.g. 4/4 or 6/8 (default: the --prompt's, else 4/4; pop plays 4/4 only)."
    ),
    program: int = typer.Option(0, help="Your instrument, a General MIDI program 0..127 (0: piano)."),
    answer_bars: Optional[int] = typer.Option(
        None, help="Bars in each answer (default: as many as your phrase had, at most 4)."
    ),
    prompt: Optional[Path] = typer.Option(
        None,
        help="MIDI file whose bars begin the piece: the model has heard them when you start (the band "
        "--mode accompany plays on with). A bare name that is no file here names a shipped example prompt.",
    ),
    click: bool = typer.Option(
        True, "--click/--no-click", help="A metronome on channel 10 (the count-in clicks always)."
    ),
    count_in: int = typer.Option(1, help="Bars of click before you start, 0..16."),
    echo: bool = typer.Option(
        False,
        "--echo/--no-echo",
        help="Also send what you play to --out (channel 1, as --program): for a keyboard that makes no sound itself.",
    ),
    bars: Optional[int] = typer.Option(None, help="End the jam after this many bars (default: when you press Ctrl-C)."),
    save: Optional[Path] = typer.Option(
        None, help="Write the jam to this MIDI file when it ends (Ctrl-C too): your notes as played, the model's."
    ),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto (CUDA when present)."),
    settings: Optional[SampleSettings] = None,  # made by @sampling_options from the flags
):
    """Play along live with a model through MIDI ports: it answers your phrases, or plays the band under you.

    Connect a keyboard and a synthesizer (docs/jam.md); MIDI ports need python-rtmidi (the jam extra)."""
    import time

    from musegen.cli.terminate import Terminated
    from musegen.generation import jam as jamming
    from musegen.generation.resources import cpu_threads

    if list_ports:
        _list_ports()
        return
    _check_bounds(program, count_in, answer_bars, bars, save)
    live = _live(model, device, settings, prompt, meter, bpm, program)
    jamming.check_mode(live, mode)
    inport, outport = jamming.open_ports(in_port, out_port)
    options = {"mode": mode, "answer_bars": answer_bars, "click": click, "count_in": count_in, "echo": echo}
    session = jamming.Jam(
        live, inport, outport, time.monotonic, time.sleep, jamming.ThreadWorker(), bars=bars, **options
    )
    typer.echo(
        f"musegen jam: {mode} with {model} at {live.bpm:g} BPM in {live.meter[0]}/{live.meter[1]}, seed "
        f"{live.settings.seed}, from {inport.name} to {outport.name}; Ctrl-C to stop"
    )
    try:
        with cpu_threads(1):
            session.run(save)
    except (KeyboardInterrupt, Terminated):  # how a jam ends
        pass
    typer.echo("musegen jam: stopped" + (f"; written to {save}" if save is not None else ""))


def _list_ports() -> None:
    from musegen.generation.jam import port_names

    inputs, outputs = port_names()
    typer.echo("inputs:\n" + "".join(f"  {name}\n" for name in inputs) + "outputs:")
    typer.echo("".join(f"  {name}\n" for name in outputs), nl=False)


def _check_bounds(program: int, count_in: int, answer_bars, bars, save) -> None:
    """A one-line ConfigError for an option out of its bounds, before a model is loaded."""
    from musegen.errors import ConfigError

    for name, value, low, high in (("--program", program, 0, 127), ("--count-in", count_in, 0, 16)):
        if not low <= value <= high:
            raise ConfigError(f"{name} must be within {low}..{high}, got {value}")
    for name, value in (("--answer-bars", answer_bars), ("--bars", bars)):
        if value is not None and not 1 <= value <= MAX_BARS:
            raise ConfigError(f"{name} must be within 1..{MAX_BARS:,}, got {value}")
    if save is not None and not save.resolve().parent.is_dir():  # found now, not when the jam is over
        raise ConfigError(f"--save {save}: no folder {save.resolve().parent}")


def _live(model: str, device: str, settings: SampleSettings, prompt, meter, bpm, program: int):
    """The live engine the options ask for: the model, the --prompt's bars as its backing, the
    meter and tempo given or the prompt's."""
    from musegen import home
    from musegen.checkpoint import load_checkpoint
    from musegen.errors import ConfigError
    from musegen.generation.jam import backing_from
    from musegen.generation.live import Live
    from musegen.generation.resources import checked_device
    from musegen.music.notes import NoteTable

    table = NoteTable.read(home.prompt(prompt), by_role=False) if prompt is not None else None
    numerator, denominator = _meter(meter, table)
    tempo = bpm if bpm is not None else table.tempos[0][1] if table is not None and table.tempos else DEFAULT_BPM
    if not TEMPO_RANGE[0] <= tempo <= TEMPO_RANGE[1]:
        raise ConfigError(f"--bpm must be within {TEMPO_RANGE[0]:g}..{TEMPO_RANGE[1]:g}, got {tempo:g}")
    loaded, tokenizer, _, _ = load_checkpoint(model, device=checked_device(device))
    backing, backing_bars = backing_from(table, (numerator, denominator)) if table else ([], 0)
    try:
        return Live(loaded, tokenizer, settings, (numerator, denominator), tempo, program, None, backing, backing_bars)
    except ConfigError as exc:  # a meter the tokens cannot play in, named as the option that gave it
        raise ConfigError(f"--meter {numerator}/{denominator}: {exc}") from None


def _meter(given: str | None, table) -> tuple[int, int]:
    """--meter as (numerator, denominator); without it, the prompt's first, else 4/4."""
    from musegen.errors import ConfigError

    if given is None:
        return tuple(table.time_signatures[0][1:]) if table is not None and table.time_signatures else (4, 4)
    numerator, _, denominator = given.partition("/")
    if not (numerator.isdigit() and denominator.isdigit()):
        raise ConfigError(f"--meter must be beats/beat value, e.g. 4/4 or 6/8, got {given!r}")
    if not 1 <= int(numerator) <= 32 or int(denominator) not in (1, 2, 4, 8, 16, 32):
        raise ConfigError(f"--meter {given}: beats must be within 1..32 and the beat value one of 1, 2, 4, 8, 16, 32")
    return int(numerator), int(denominator)


def register(app: typer.Typer) -> None:
    app.command("jam")(jam)
