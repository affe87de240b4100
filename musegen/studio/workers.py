"""The processes that sample the studio's runs. A run's every step does Python work besides the
model (the grammar, the constraints, the notes decoded for its page), which holds the interpreter's
lock: two runs in threads of one process wait for each other, two in processes of their own
each take a core. So each of the server's sampling threads hands its run to a worker process
and relays what the process sends to the page (runs.RunEvents); the page's Stop, or its
leaving, reaches the process through two flags it reads at every step.

A worker samples one run at a time on one torch thread (generation.resources), loads a model on
its first run that samples it, and is kept for the next run of the same models: the processes
are shared by every studio app in this process and end with it. They are forked from a server
process that has imported the sampler once (a few seconds, on the first run), never from the
studio itself, which holds threads and its clients' sockets."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from . import jobs
from .models import OnDemand
from .runs import Stop

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload([__name__])
RELAY_EVERY = 0.05  # seconds between two looks at the page's Stop while the run sends nothing


class Flags:
    """A run's Stop as its worker process reads it (the flags are shared with the studio)."""

    def __init__(self, stop, keep):
        self.stop, self.keep = stop, keep

    def is_set(self) -> bool:
        return self.stop.is_set()

    @property
    def keeps(self) -> bool:
        return self.keep.is_set()


class WorkerEnded(Exception):
    """The worker process ended in the middle of a run (killed, or out of memory)."""


class Worker:
    """A worker process for one set of models, and the flags that stop its run."""

    def __init__(self, folders: dict[str, Path]):
        self.connection, theirs = CONTEXT.Pipe()
        self.flags = Flags(CONTEXT.Event(), CONTEXT.Event())
        self.process = CONTEXT.Process(
            target=_serve, args=(folders, theirs, self.flags), daemon=True, name="musegen-studio-worker"
        )
        self.process.start()
        theirs.close()

    def run(self, job: jobs.Request, run: str, folder: Path, send: Callable[[dict[str, Any]], None], stop: Stop):
        """Sample `job` as jobs.run_events does, its events given to `send`, `stop` passed on."""
        self.flags.stop.clear()
        self.flags.keep.clear()
        try:
            self.connection.send((job, run, folder))
            while True:
                if stop.is_set() and not self.flags.is_set():
                    if stop.keeps:  # before the stop itself: the process reads them in that order
                        self.flags.keep.set()
                    self.flags.stop.set()
                if self.connection.poll(RELAY_EVERY):
                    if (event := self.connection.recv()) is None:
                        return
                    send(event)
        except (EOFError, OSError) as exc:
            raise WorkerEnded(f"the sampling process ended ({self.process.exitcode})") from exc

    def close(self) -> None:
        self.connection.close()
        self.process.kill()


_idle: dict[tuple[tuple[str, Path], ...], list[Worker]] = {}  # by the models they hold
_idle_lock = threading.Lock()


def sample(folders: dict[str, Path], job: jobs.Request, run: str, folder: Path, send, stop: Stop) -> None:
    """Sample `job` in an idle worker for these models, or a new one, and keep the worker for
    another run unless it ended; see Worker.run."""
    key = tuple(folders.items())
    with _idle_lock:
        worker = _idle[key].pop() if _idle.get(key) else None
    worker = worker or Worker(folders)
    try:
        worker.run(job, run, folder, send, stop)
    except BaseException:
        worker.close()
        raise
    with _idle_lock:
        _idle.setdefault(key, []).append(worker)


def _serve(folders: dict[str, Path], connection, flags: Flags) -> None:
    """A worker process: the runs the studio sends, one at a time, each answered by its events
    and None, until the studio goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the studio ends its workers
    torch.set_num_threads(1)  # one core per run: the other runs have theirs
    models = OnDemand(folders)
    while True:
        try:
            job, run, folder = connection.recv()
        except EOFError:
            return
        jobs.run_events(models, job, run, folder, connection.send, flags)
        connection.send(None)
