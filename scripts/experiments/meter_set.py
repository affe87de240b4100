"""A held-out set of real tunes in 3/4 and 6/8 for the song model's meter test (an experiment
script): fiddle tunes of O'Neill's Music of Ireland (1850), from music21's bundled corpus, which
no shipped model is trained on, written to MIDI as `data prepare music21-song` writes them.
    python scripts/experiments/meter_set.py OUT [--per-meter 12]
Tunes are taken in the corpus' order, those whose ABC header gives the meter and that hold at
least 14 bars as the song tokens count them (a pickup, a 4-bar prompt and 8 bars to continue;
the scores' repeats are not written out).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from data_prep.music21_song import FIDDLE_TUNES
from data_prep.scores import convert
from musegen.errors import MusegenError
from musegen.tokenizers import tokenizer_from_dict

TUNE = re.compile(r"^X:\s*(\d+)\s*\n(.*?)(?=^X:|\Z)", re.MULTILINE | re.DOTALL)
METER = re.compile(r"^M:\s*(\d+/\d+)", re.MULTILINE)


BARS = 14


def tunes_in(meter: str, root: Path):
    for path in sorted((root / "oneills1850").glob("*.abc")):
        for number, body in TUNE.findall(path.read_text(encoding="latin-1")):
            header = METER.search(body)
            if header and header.group(1) == meter:
                yield path, int(number)


def bars(tok, path: Path) -> int:
    """The bars of a tune as the song tokens hold them; 0 where they refuse it (a measure of a
    length no meter has)."""
    try:
        return len(tok.bar_starts(tok.encode(path).ids))
    except MusegenError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-meter", type=int, default=12)
    args = parser.parse_args()
    from music21 import corpus

    root = Path(corpus.__file__).parent
    program, bpm = FIDDLE_TUNES
    tok = tokenizer_from_dict({"kind": "song"})
    for meter in ("3/4", "6/8"):
        kept = 0
        for path, number in tunes_in(meter, root):
            dest = args.out / f"oneills-{meter.replace('/', '')}-{number:04d}.mid"
            _, failed = convert((path, number, dest, {"bpm": bpm, "program": program, "pickup": "bar"}))
            if failed or bars(tok, dest) < BARS:
                dest.unlink(missing_ok=True)
                continue
            print(dest)
            kept += 1
            if kept == args.per_meter:
                break


if __name__ == "__main__":
    main()
