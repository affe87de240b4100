"""Timing and peak-memory helpers shared by the benchmarks (Linux).

Peak memory on CPU: PyTorch keeps no CPU allocator statistics, so we measure the process's
resident set. Before a phase we return freed heap to the OS (malloc_trim) and reset the
kernel's high-water mark (/proc/self/clear_refs, "5"); the phase's peak is then
VmHWM - VmRSS(before). Large tensors are mmap-allocated and released on free, so this tracks
live tensor memory closely. On CUDA we use torch.cuda's own peak counters.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import time
from pathlib import Path

import torch

from musegen.device import cpu_name, resolve_device


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_mib(fn, device: torch.device) -> float:
    """Extra memory (MiB) at the peak of one call of `fn`, above what was live before it."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def seconds(fn, device: torch.device) -> float:
    """Wall time of one call of `fn` (waiting for the GPU on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def timed_peak(fn, device: torch.device) -> tuple[float, float]:
    """(seconds, peak MiB) of one and the same call of `fn`: for calls too slow to run twice."""
    taken = []
    mib = peak_memory_mib(lambda: taken.append(seconds(fn, device)), device)
    return taken[0], mib


class CopyBandwidth:
    """Memory bandwidth measured on the spot: one copy of a `mib`-MiB tensor, counted as bytes
    read plus bytes written per second (what a STREAM-style copy reports). Call `measure()` in
    the same rounds as the timings it is compared with."""

    def __init__(self, device: torch.device, mib: int = 512):
        self.device = device
        self.source = torch.ones(mib * 2**20 // 4, device=device)
        self.target = torch.empty_like(self.source)
        self.rates: list[float] = []

    def measure(self) -> None:
        taken = seconds(lambda: self.target.copy_(self.source), self.device)
        self.rates.append(2 * self.source.nbytes / taken)

    def median(self) -> float:
        return sorted(self.rates)[len(self.rates) // 2]


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def add_machine_options(parser: argparse.ArgumentParser, threads_help: str) -> None:
    """--threads and --device, the same way in every benchmark."""
    parser.add_argument("--threads", type=int, default=1, help=threads_help)
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")


def apply_machine_options(args: argparse.Namespace) -> torch.device:
    torch.set_num_threads(args.threads)
    return resolve_device(args.device)
