"""`musegen studio`: serve the local web page (musegen/studio/)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import List, Optional

import typer


def studio(
    checkpoint: Optional[List[Path]] = typer.Option(
        None,
        "--checkpoint",
        "-c",
        help="A checkpoint folder to offer besides the shipped ones (repeatable; MUSEGEN_HOME says where those are).",
    ),
    out: Path = typer.Option(
        Path("studio-out"),
        "--out",
        "-o",
        help="Folder for uploads and results (each run as `musegen sample` writes it).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (127.0.0.1: this machine only)."),
    port: int = typer.Option(8765, help="Port to listen on, 1..65535 (0: any free port)."),
):
    """Try a prompt, watch the notes arrive and listen, in a local web page."""
    import uvicorn

    from musegen import home
    from musegen.cli.terminate import Terminated
    from musegen.errors import ConfigError
    from musegen.studio.guard import LOOPBACK
    from musegen.studio.models import Models, shipped_checkpoints
    from musegen.studio.server import create_app

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be within 0..65535, got {port}")
    folders = shipped_checkpoints() + list(checkpoint or [])
    if not folders:
        raise ConfigError(f"no checkpoint to offer: give one with --checkpoint, or {home.not_found()}")
    out.mkdir(parents=True, exist_ok=True)
    app = create_app(out, Models(folders), host)
    try:  # bound here, so that the address printed is the one served (any free port for --port 0)
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"musegen studio: http://{shown}:{sock.getsockname()[1]}/  (results in {out}; Ctrl-C to stop)")
    if host not in LOOPBACK:
        typer.echo(
            f"warning: --host {host!r} opens the studio to the network: anyone who can reach this "
            "machine can use it, read its results and fill its --out folder",
            err=True,
        )
    try:
        _server_class()(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    except (KeyboardInterrupt, Terminated):  # how a server is stopped: uvicorn has shut it down and passes it on
        typer.echo("musegen studio: stopped")


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """Ends the runs going before it waits for their streams to close: a stopping studio would
        otherwise wait for each to finish (minutes)."""

        async def shutdown(self, sockets=None) -> None:
            self.config.app.state.end_runs()
            await super().shutdown(sockets)

    return Server


def register(app: typer.Typer) -> None:
    app.command("studio")(studio)
