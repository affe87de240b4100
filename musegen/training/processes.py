"""The processes of a run: torchrun's ranks and their process group, and the signals that ask a
run to stop between two updates."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..device import resolve_device
from ..signals import StopSignalsTo


@dataclass
class Processes:
    """This process's place among the run's (torchrun's ranks), and the collective operations the
    loop needs: each is a no-op in a run of one process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def main_flag(self, flag: bool, device: torch.device) -> bool:
        """The main process's `flag` on every process (the others' `flag` is ignored)."""
        if self.world == 1:
            return flag
        shared = torch.tensor([int(flag) if self.main else 0], dtype=torch.int32, device=device)
        dist.broadcast(shared, src=0)
        return bool(shared)

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def setup_processes(device_setting: str) -> tuple[Processes, torch.device]:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; NCCL on GPUs, gloo on CPU."""
    procs = Processes(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )
    device = resolve_device(device_setting)
    if device.type == "cuda":
        if procs.world > 1:
            device = torch.device("cuda", procs.local_rank)
        torch.cuda.set_device(device)
    if procs.world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return procs, device


def ignore_interrupts(_worker_id: int) -> None:
    """Data workers leave Ctrl-C and SIGTERM to the trainer, which checkpoints before it stops
    them: both reach the whole process group (a terminal, a job scheduler), and a worker that
    died of one would end the run with a DataLoader error instead of a checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class StopRequest(StopSignalsTo):
    """SIGINT/SIGTERM set `requested`, which the loop reads between updates (never half an
    update). The first one also hands the signals back to their previous handlers, so that a
    second one stops the process at once, the usual way."""

    def __init__(self):
        super().__init__(self._handle)
        self.requested = False

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.restore()
