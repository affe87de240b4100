"""The shared preparation driver: encode many files in parallel, skip and count bad ones,
split by group (song or style), and write shards.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from tqdm import tqdm

from musegen.errors import MusegenError
from musegen.io import printable
from musegen.shards import write_shards
from musegen.tokenizers.base import Encoding, Tokenizer, tokenizer_from_dict

FILE_TIME_LIMIT_S = 60  # a pathological file is skipped, never allowed to stall the batch


@dataclass
class Item:
    """One input file: `name` is unique in the corpus, `group` decides its split (song, style)."""

    name: str
    path: Path
    group: str


def group_split(group: str, fractions: dict[str, float], salt: str = "musegen") -> str:
    """Deterministic split of a group by hashing its name: stable across runs and machines.

    `fractions` gives the share of each held-out split; the rest goes to "train".
    """
    key = f"{salt}:{group}".encode("utf-8", "surrogateescape")  # (a non-UTF-8 file name hashes by its bytes)
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
    edge = 0.0
    for split, share in fractions.items():
        edge += share
        if h < edge:
            return split
    return "train"


_worker_tokenizer: Tokenizer | None = None
Encoder = Callable[[Tokenizer, Item], Encoding]  # how a corpus turns one item into tokens


def encode_file(tokenizer: Tokenizer, item: Item) -> Encoding:
    """The default: the item's file, encoded as it is."""
    return tokenizer.encode(item.path)


_worker_encode: Encoder = encode_file


def _init_worker(tokenizer_dict: dict[str, Any], encode: Encoder) -> None:
    global _worker_tokenizer, _worker_encode
    _worker_tokenizer = tokenizer_from_dict(tokenizer_dict)
    _worker_encode = encode


def _timeout(signum, frame):
    raise TimeoutError


def _encode_one(item: Item):
    assert _worker_tokenizer is not None
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(FILE_TIME_LIMIT_S)
    try:
        enc = _worker_encode(_worker_tokenizer, item)
        return item, enc.ids, enc.report, None
    except MusegenError as exc:
        return item, None, None, printable(str(exc).splitlines()[0])
    except TimeoutError:
        return item, None, None, f"{printable(item.path)}: took longer than {FILE_TIME_LIMIT_S}s, skipped"
    except Exception as exc:  # a tokenizer bug must not take the batch down; it is reported
        return item, None, None, printable(f"{item.path}: internal error {type(exc).__name__}: {exc}")
    finally:
        signal.alarm(0)


def encode_items(
    tokenizer: Tokenizer,
    items: list[Item],
    workers: int | None = None,
    desc: str = "encoding",
    encode: Encoder = encode_file,
) -> tuple[list[tuple[Item, Any, dict]], list[tuple[str, str]]]:
    """Encode `items` on `workers` processes with `encode` (a module-level function).
    Returns (encoded, skipped) in input order.

    A worker that dies (the out-of-memory killer, a signal) breaks its pool: the files it may
    have held are retried one at a time, and the one that kills its worker again is skipped."""
    workers = max(1, workers or os.cpu_count() or 1)
    results: dict[str, tuple] = {}
    queue = items[::-1]  # popped from the end: input order
    with tqdm(total=len(items), desc=desc, unit="file") as progress:
        while queue:
            setup = (tokenizer.to_dict(), encode)
            for suspect in _encode_in_pool(setup, queue, workers, results, progress):
                if _encode_in_pool(setup, [suspect], 1, results, progress):
                    results[suspect.name] = (
                        suspect,
                        None,
                        None,
                        f"{printable(suspect.path)}: the process encoding it was killed (out of memory?), skipped",
                    )
                    progress.update(1)
    ordered = [results[it.name] for it in items]
    return (
        [(item, ids, report) for item, ids, report, error in ordered if error is None],
        [(item.name, error) for item, _, _, error in ordered if error is not None],
    )


def _encode_in_pool(setup: tuple, queue: list[Item], workers: int, results: dict[str, tuple], progress) -> list[Item]:
    """Encode items popped from `queue` into `results` until it is empty, or until a worker dies:
    then return the items that were in flight (one of them killed it), else []. `setup`: the
    workers' (tokenizer dict, encoder)."""
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=setup) as pool:
        running: dict[Future, Item] = {}
        while queue or running:
            while queue and len(running) < 2 * workers:  # a few queued: workers never wait for work
                item = queue.pop()
                running[pool.submit(_encode_one, item)] = item
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            broken = []
            for future in done:
                item = running.pop(future)
                try:
                    results[item.name] = future.result()
                    progress.update(1)
                except BrokenProcessPool:
                    broken.append(item)
            if broken:
                return broken + list(running.values())
    return []


def merge_reports(reports: Iterable[dict]) -> dict[str, int]:
    """Sum the numeric counters of per-file encode reports."""
    total: Counter = Counter()
    for report in reports:
        total.update({k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return dict(total)


def prepare(
    tokenizer: Tokenizer,
    items: list[Item],
    out: str | os.PathLike,
    fractions: dict[str, float],
    workers: int | None = None,
    extra_report: dict[str, Any] | None = None,
    split_of: Callable[[str], str] | None = None,
    skipped_before: Iterable[tuple[str, str]] = (),
    encode: Encoder = encode_file,
) -> dict[str, Any]:
    """Encode, split by group, write shards; return the summary that is also stored in the index.

    `split_of(group)` overrides the hashed split (for corpora that assign groups explicitly).
    `skipped_before`: (name, reason) of inputs a corpus rejected before encoding; counted as skipped.
    `encode(tokenizer, item)`: how an item becomes tokens (default: its file as it is)."""
    split_of = split_of or (lambda group: group_split(group, fractions))
    skipped_before = list(skipped_before)
    encoded, skipped = encode_items(tokenizer, items, workers, encode=encode)
    skipped = skipped_before + skipped
    splits: dict[str, list] = {"train": [], **{s: [] for s in fractions}}
    for item, ids, _ in encoded:
        splits[split_of(item.group)].append((item.name, ids))
    report = {
        "files": len(items) + len(skipped_before),
        "encoded": len(encoded),
        "skipped": len(skipped),
        "skipped_files": [{"name": n, "reason": r} for n, r in skipped],
        "tokens": {s: int(sum(len(ids) for _, ids in pieces)) for s, pieces in splits.items()},
        "pieces": {s: len(pieces) for s, pieces in splits.items()},
        "encode_counts": merge_reports(r for _, _, r in encoded),
        **(extra_report or {}),
    }
    write_shards(out, tokenizer, splits, report)
    return report


def summary_lines(report: dict[str, Any], max_reasons: int = 10) -> list[str]:
    """A short human summary of a preparation report."""
    lines = [f"files: {report['files']}  encoded: {report['encoded']}  skipped: {report['skipped']}"]
    for split, n in report["pieces"].items():
        lines.append(f"  {split}: {n} pieces, {report['tokens'][split]:,} tokens")
    for key, value in report.get("encode_counts", {}).items():
        lines.append(f"  {key}: {value}")
    for entry in report["skipped_files"][:max_reasons]:
        lines.append(f"  skipped {entry['reason']}")
    if report["skipped"] > max_reasons:
        lines.append(f"  ... and {report['skipped'] - max_reasons} more (see index.json)")
    return lines
