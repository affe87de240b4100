"""The shared preparation driver: encode many files in parallel, skip and count bad ones,
split by group (song or style), and write shards.
"""

from __future__ import annotations

import abc
import ctypes
import hashlib
import multiprocessing as mp
import os
import re
import signal
import sys
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tqdm import tqdm

from musegen.errors import DataError, MusegenError
from musegen.io import printable
from musegen.shards import write_shards
from musegen.tokenizers.base import Encoding, Tokenizer, tokenizer_from_dict

FILE_TIME_LIMIT_S = 60  # a pathological file is skipped, never allowed to stall the batch
# where the project keeps raw corpora beside its checkouts (POP909: its songs and chord annotations)
SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


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


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with(parent: int) -> None:
    """In a forked worker: the kernel kills it when `parent` (the process that forked it) dies.
    Why: killed outright (SIGKILL, the OOM killer), a `data prepare` left its encoding workers
    waiting on their task pipe for ever, since each holds that pipe's write end too; a rendering
    worker went on with its render first. Linux only; elsewhere a no-op."""
    if not sys.platform.startswith("linux") or os.getpid() == parent:  # run in the parent itself: not a worker
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the call above took effect
        os._exit(1)


def _init_worker(parent: int, tokenizer_dict: dict[str, Any], encode: Encoder) -> None:
    global _worker_tokenizer, _worker_encode
    die_with(parent)
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
    except MusegenError as exc:  # (a piece encoded from memory is named by its file)
        reason = re.sub(r"^<(score|bytes)>", lambda _: str(item.path), str(exc).splitlines()[0])
        return item, None, None, printable(reason)
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
    workers = worker_count(workers)
    results: dict[str, tuple] = {}
    queue = items[::-1]  # popped from the end: input order
    with tqdm(total=len(items), desc=desc, unit="file") as progress:
        while queue:
            setup = (os.getpid(), tokenizer.to_dict(), encode)
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


def worker_count(workers: int | None) -> int:
    """`workers`, or by default every core."""
    return max(1, workers or os.cpu_count() or 1)


def worker_pool(workers: int | None) -> mp.pool.Pool:
    """A pool of `workers` processes (forked where the system can: they start at once, with the
    parent's modules already loaded), which die with this process (`die_with`)."""
    return _fork_context().Pool(worker_count(workers), initializer=die_with, initargs=(os.getpid(),))


def _fork_context():
    return mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()


def _encode_in_pool(setup: tuple, queue: list[Item], workers: int, results: dict[str, tuple], progress) -> list[Item]:
    """Encode items popped from `queue` into `results` until it is empty, or until a worker dies:
    then return the items that were in flight (one of them killed it), else []. `setup`: the
    workers' (this process's id, tokenizer dict, encoder)."""
    with ProcessPoolExecutor(workers, mp_context=_fork_context(), initializer=_init_worker, initargs=setup) as pool:
        running: dict[Future, Item] = {}
        while queue or running:
            while queue and len(running) < 2 * workers:  # a few queued: workers never wait for work
                item = queue.pop()
                try:
                    running[pool.submit(_encode_one, item)] = item
                except BrokenProcessPool:  # a worker died since the last wait: its item is in flight
                    queue.append(item)
                    if not running:
                        return []  # nothing in flight to suspect: the caller goes on in a new pool
                    break
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
        total.update(numeric_counts(report))
    return dict(total)


def numeric_counts(report: dict[str, Any]) -> dict[str, int | float]:
    """The counters of an encode report (its numbers; not its flags, lists or meta)."""
    return {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


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
    count_encodings: bool = True,
    summarise: Callable[[list[tuple[Item, Any, dict]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Encode, split by group, write shards; return the summary that is also stored in the index.

    `split_of(group)` overrides the hashed split (for corpora that assign groups explicitly).
    `skipped_before`: (name, reason) of inputs a corpus rejected before encoding; counted as skipped.
    `encode(tokenizer, item)`: how an item becomes tokens (default: its file as it is).
    `count_encodings`: report the sum of the encodings' counts (`encode_counts`).
    `summarise(encoded)`: a corpus' own report entries from its (item, ids, encode report) triples."""
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
        **({"encode_counts": merge_reports(r for _, _, r in encoded)} if count_encodings else {}),
        **(extra_report or {}),
        **(summarise(encoded) if summarise else {}),
    }
    write_shards(out, tokenizer, splits, report)
    return report


@dataclass
class Listing:
    """What a corpus found to encode: its items, the inputs it refused before encoding ((name,
    reason), counted as skipped), its own entries for the report, and, for a corpus that assigns
    groups to splits itself, `split_of(group)`."""

    items: list[Item]
    refused: list[tuple[str, str]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    split_of: Callable[[str], str] | None = None


class Corpus(abc.ABC):
    """A corpus declares what is its own: its name, its tokenizer, where its raw files are, how it
    lists them and, where it differs, how one becomes tokens. `prepare` is the same for all: it
    encodes the listing with workers, skips and counts bad files, splits and writes the shards."""

    name: str  # as `musegen data prepare` calls it
    fractions: dict[str, float] = {"validation": 0.05}  # held-out share of the groups, split by hash
    count_encodings = True  # report the encodings' counts (notes folded, bars...)

    def tokenizer(self, option: str | None) -> Tokenizer:
        """The tokenizer for `--tokenizer option`: REMI only, unless a corpus allows others."""
        if option not in (None, "remi"):
            raise DataError(f"{self.name} is a piano corpus: only --tokenizer remi applies, not {option!r}")
        return tokenizer_from_dict({"kind": "remi"})

    @abc.abstractmethod
    def locate(self, source: Path | None, download: bool, out: Path) -> Path | None:
        """The raw corpus: `source`, the corpus' usual place, or (if `download`) a download under `out`."""

    @abc.abstractmethod
    def listing(self, root: Path | None, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The items under `root` (at most `limit` pieces), and what the corpus refused."""

    def encode(self, tokenizer: Tokenizer, item: Item) -> Encoding:
        """How an item becomes tokens, in a worker process (by default its file as it is)."""
        return encode_file(tokenizer, item)

    def summarise(self, encoded: list[tuple[Item, Any, dict]]) -> dict[str, Any]:
        """A corpus' own report entries from the (item, ids, encode report) of every piece encoded."""
        return {}

    def finish(self, out: Path, tokenizer: Tokenizer) -> None:
        """Anything a corpus writes once its shards are there (by default nothing)."""

    def prepare(
        self,
        out: str | os.PathLike,
        source: str | os.PathLike | None = None,
        download: bool = False,
        workers: int | None = None,
        limit: int | None = None,
        tokenizer: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Write the corpus' token shards to `out`; return the report stored in their index.
        `options`: a corpus' own settings (mma-groove's scale and loops), given to its constructor."""
        corpus = type(self)(**options) if options else self
        tok = corpus.tokenizer(tokenizer)
        out = Path(out)
        root = corpus.locate(None if source is None else Path(source), download, out)
        found = corpus.listing(root, out, limit, workers)
        report = prepare(
            tok,
            found.items,
            out,
            corpus.fractions,
            workers,
            extra_report=found.report,
            split_of=found.split_of,
            skipped_before=found.refused,
            encode=corpus.encode,
            count_encodings=corpus.count_encodings,
            summarise=corpus.summarise,
        )
        corpus.finish(out, tok)
        return report


def pieces_per_meter(encoded: list[tuple[Item, Any, dict]]) -> dict[str, int]:
    """How many pieces have bars in each meter, from encode reports that list their `meters`."""
    counts = Counter(m for _, _, report in encoded for m in report.get("meters", ()))
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def summary_lines(report: dict[str, Any], max_reasons: int = 10) -> list[str]:
    """A short human summary of a preparation report."""
    lines = [f"files: {report['files']}  encoded: {report['encoded']}  skipped: {report['skipped']}"]
    for split, n in report["pieces"].items():
        lines.append(f"  {split}: {n} pieces, {report['tokens'][split]:,} tokens")
    for key, value in report.get("encode_counts", {}).items():
        lines.append(f"  {key}: {value}")
    for key in ("collections", "meters", "tracks"):  # a corpus' own counts of pieces, where it has them
        if key in report:
            lines.append(f"  {key} (pieces): " + ", ".join(f"{k} {n}" for k, n in report[key].items()))
    for entry in report["skipped_files"][:max_reasons]:
        lines.append(f"  skipped {entry['reason']}")
    if report["skipped"] > max_reasons:
        lines.append(f"  ... and {report['skipped'] - max_reasons} more (see index.json)")
    return lines
