"""The suffix cache on song tokens: one `evaluate continuation` run with the cache matched another
way than `SongTokenizer.cache_match` says (an experiment script; docs/sampling.md has the sweep).
    python scripts/experiments/song_cache.py --shortest 6 --match pitch|velocity|every -- \
        evaluate continuation -c CHECKPOINT --data SONGS --out RUN --cache 0.95 ...
    python scripts/experiments/song_targets.py RUN SONGS
--match pitch: velocities and durations are matched as one key each (the sampler's way);
velocity: velocities only; every: every token as it is (the groove tokens' way).
"""

from __future__ import annotations

import argparse

import numpy as np

from musegen.cli import main as musegen
from musegen.tokenizers.song import SongTokenizer

MATCHES = ("pitch", "velocity", "every")


def match_keys(match: str) -> np.ndarray | None:
    """The keys of the sampler's own match (`SongTokenizer.cache_match`), with durations matched
    as themselves for "velocity"; None (every id as itself) for "every"."""
    if match == "every":
        return None
    tok = SongTokenizer()
    keys = tok.cache_match[0].copy()
    if match == "velocity":
        keys[tok.duration_ids] = tok.duration_ids
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shortest", type=int, default=6, help="tokens a match needs at least")
    parser.add_argument("--match", choices=MATCHES, default="pitch")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then a musegen command line")
    args = parser.parse_args()
    match = (match_keys(args.match), args.shortest)
    SongTokenizer.cache_match = property(lambda self: match)  # what the sampler's SuffixCache reads
    musegen([a for a in args.command if a != "--"])


if __name__ == "__main__":
    main()
