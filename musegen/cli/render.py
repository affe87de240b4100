"""`musegen render`: MIDI -> WAV (FluidSynth) and/or piano-roll PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from musegen.render import MAX_MINUTES


def render(
    midi: Path = typer.Argument(
        ..., help="A MIDI file (at most 16 MiB, every event before tick 2^31, as every musegen input)."
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="WAV file to write (never the MIDI file itself, nor an existing file that is not a WAV).",
    ),
    pianoroll: Optional[Path] = typer.Option(None, help="Piano-roll PNG to write (same rule)."),
    soundfont: Optional[Path] = typer.Option(
        None, help="A General MIDI SoundFont 2 (.sf2) file (default: FluidR3_GM, else TimGM6mb)."
    ),
    max_minutes: float = typer.Option(
        MAX_MINUTES,
        min=0.01,
        max=600.0,
        help="Refuse pieces longer than this: bounds the WAV at 10.6 MB a minute (44.1 kHz stereo 16-bit).",
    ),
):
    """Render a MIDI file to WAV (FluidSynth) and/or a piano-roll PNG. A file of more than 127
    tracks, which FluidSynth's player cannot read, is rendered with its tracks merged by instrument;
    a WAV is refused for a file of more than 250,000 notes (FluidSynth's time grows with them)."""
    from musegen.errors import MusegenError
    from musegen.io import printable
    from musegen.render import pianoroll_png, render_wav

    if out is None and pianoroll is None:
        raise MusegenError("nothing to do: give --out file.wav and/or --pianoroll file.png")
    if out is not None:
        typer.echo(f"wrote {printable(render_wav(midi, out, soundfont, max_minutes=max_minutes))}")
    if pianoroll is not None:
        typer.echo(f"wrote {printable(pianoroll_png(midi, pianoroll))}")


def register(app: typer.Typer) -> None:
    app.command("render")(render)
