"""The processes that sample the studio's runs. A run's every step does Python work besides the
model (the grammar, the constraints, the notes decoded for its page), which holds the interpreter's
lock: two runs in threads of one process wait for each other, two in processes of their own
each take a core. So each of the server's sampling threads hands its run to a worker process
and relays what the process sends to the page (runs.RunEvents); the page's Stop, or its
leaving, reaches the process on the same pipe, read at every step.

A worker samples one run at a time on one torch thread (generation.resources), loads a model on
its first run that samples it, and is kept for the next run of the same models: the processes
are shared by every studio app in this process and end with it. They are forked from a server
process that has imported the sampler once (a few seconds, on the first run), never from the
studio itself, which holds threads and its clients' sockets."""

from __future__ import annotations

import atexit
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


class StopMessage:
    """A run's Stop as its worker process reads it: the studio sends ("stop", keeps) on the run's
    pipe, read at the run's next step (a select per step: no cost beside the step's)."""

    def __init__(self, connection):
        self.connection, self.stopped, self.keeps = connection, False, False

    def is_set(self) -> bool:
        if not self.stopped and self.connection.poll():
            self.stopped, self.keeps = True, self.connection.recv()[1]
        return self.stopped


class WorkerEnded(Exception):
    """The worker process ended in the middle of a run (killed, or out of memory)."""


class Worker:
    """A worker process for one set of models, and the pipe it takes runs and Stops from."""

    def __init__(self, folders: dict[str, Path]):
        self.connection, theirs = CONTEXT.Pipe()
        self.process = CONTEXT.Process(target=_serve, args=(folders, theirs), daemon=True, name="musegen-studio-worker")
        self.process.start()
        theirs.close()

    def run(self, job: jobs.Request, run: str, folder: Path, send: Callable[[dict[str, Any]], None], stop: Stop):
        """Sample `job` as jobs.run_events does, its events given to `send`, `stop` passed on."""
        try:
            self.connection.send(("run", job, run, folder))
            stop_sent = False
            while True:
                if stop.is_set() and not stop_sent:
                    self.connection.send(("stop", stop.keeps))
                    stop_sent = True
                if self.connection.poll(RELAY_EVERY):
                    if (event := self.connection.recv()) is None:
                        return
                    send(event)
        except (EOFError, OSError) as exc:
            raise WorkerEnded(f"the sampling process ended ({self.process.exitcode})") from exc

    def close(self) -> None:
        self.connection.close()
        self.process.kill()
        self.process.join()


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


@atexit.register  # before multiprocessing's own, which would kill them
def _end_idle() -> None:
    """Idle workers end as the studio does: their pipe closed, each returns, so what the sampler
    made in it (tqdm's lock, a named semaphore) is removed as a process's exit removes it."""
    with _idle_lock:
        ending = [worker for workers in _idle.values() for worker in workers]
        _idle.clear()
    for worker in ending:
        worker.connection.close()
    for worker in ending:
        worker.process.join(5)


def _serve(folders: dict[str, Path], connection) -> None:
    """A worker process: the runs the studio sends, one at a time, each answered by its events
    and None, until the studio goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the studio ends its workers
    torch.set_num_threads(1)  # one core per run: the other runs have theirs
    models = OnDemand(folders)
    try:
        while True:
            message = connection.recv()
            if message[0] == "stop":  # for a run that ended before reading it
                continue
            job, run, folder = message[1:]
            jobs.run_events(models, job, run, folder, connection.send, StopMessage(connection))
            connection.send(None)
    except (EOFError, BrokenPipeError):  # the studio has gone: nobody to sample for
        return
