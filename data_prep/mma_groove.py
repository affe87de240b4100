"""A groove corpus synthesised with MMA (Musical MIDI Accompaniment), split by style.

The open counterpart of Groove2Groove's Band-in-a-Box corpus: real chord progressions (from
POP909's chord annotations) are rendered by `mma` in hundreds of its library grooves, each
rendering is reduced to the bass/drums/other trio by the groove tokenizer, and the styles
are split into train/validation/test so that test styles are never seen in training.

- A *style* is one MMA groove (e.g. `stdlib/bossanova/BossaNovaSus`): 4/4, with drums and at
  least two melodic tracks; its variations (`Plus`, `1`/`2`, A-D) and sustained (`Sus`) versions
  are styles too. Intros and endings are left out, as Groove2Groove's charts are one long section
  in one groove (its test files are exactly 16 bars after the count-in); fills are played where
  they belong, in the last bar of a phrase (below). The list, with one tempo per style chosen
  from its name, and the fills of each family are `mma_styles.json`, made by
  `python -m data_prep.mma_groove --catalogue`.
- The split is by style *family* (the library file), so variants of a test groove (its
  `Sus`/`Plus` versions, its fills) are not in training either: families in a fixed
  pseudo-random order (by hash) fill the test split up to HELD_OUT_STYLES styles, then
  validation, and the rest is training. `styles.json` in the output lists the three disjoint
  style sets.
- Each style renders PIECES_PER_STYLE pieces of BARS_PER_PIECE bars, each on a different
  POP909 song's progression (chosen by hashing, so reruns are identical; MMA's random
  humanisation is seeded too). With `scale` > 1 it renders scale x as many: the further pieces
  are variants, each in a key, at a tempo, with MMA treatments (swing, articulation, voicing)
  and a fill chosen by hashing (`piece_plan`); `styles.json` lists each piece's plan.
- A rerun resumes: renderings (`rendered/`), layouts (`g2g/`) and their tokens (kept beside
  each layout) already there are reused, and every file is written atomically, so an
  interrupted run loses at most the pieces in flight.
- Each rendering is written again in Groove2Groove's layout (`to_groove2groove`), so the groove
  tokenizer reads it as it reads the paper's data: tracks named `BB Drums`, `BB Bass` and up to
  three of `BB Guitar` / `BB Piano` / `BB Strings`, after a 2-bar count-in, tempo changes kept.
- Output: token shards, `styles.json`, `rendered/` (the raw MMA MIDI), `g2g/` (the same pieces
  in Groove2Groove's layout) and `references/<style>/<n>.mid`: each test
  piece's trio as the tokens hold it (decoded with the original programs and tempo changes),
  the style reference for evaluation.

The parts: `mma_styles.py` (the catalogue), `mma_pieces.py` (what each piece plays: POP909
chords and variants), `mma_render.py` (running MMA, the Groove2Groove layout); this module is
the corpus.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, Field
from tqdm import tqdm

from musegen import schemas
from musegen.errors import DataError, MusegenError
from musegen.io import atomic_path, write_bytes, write_json
from musegen.music.loops import LOOP_GROUP, random_loop_piece
from musegen.music.roles import TRACKS
from musegen.shards import Shards
from musegen.tokenizers.base import Encoding, Tokenizer, tokenizer_from_dict

from .common import SHARED_DATASETS, Corpus, Item, Listing, numeric_counts
from .mma_pieces import PIECES_PER_STYLE, piece_plan, progressions, stable_hash
from .mma_render import mma_text, render_jobs, render_mma, to_groove2groove
from .mma_styles import STYLES_FILE, Style, build_catalogue, load_catalogue

HELD_OUT_STYLES = 50  # at least this many styles each in test and validation, as in the paper
SPLITS = ("test", "validation", "train")
LAYOUT_VERSION = 1  # raise it when to_groove2groove changes: reruns then lay every piece out again
MAX_LOOPS = 1_000_000  # below musegen.music.loops.HELD_OUT_SEEDS: no evaluation loop is a training one


class LayoutStamp(BaseModel):
    """g2g/layout.json of a groove corpus: the version of the layout its files were written in."""

    model_config = schemas.STRICT
    version: Annotated[int, Field(ge=1, le=1000)]


LAYOUT_STAMP = schemas.Format("layout stamp", None, LayoutStamp)
PIECE_COUNTS = schemas.Format("piece counts", None, dict[schemas.Name, int | float])  # a kept piece's report counts


def family_splits(styles: list[Style]) -> dict[str, str]:
    """family -> split, over the whole catalogue (so a trial subset splits the same way)."""
    sizes: dict[str, int] = {}
    for st in styles:
        sizes[st.family] = sizes.get(st.family, 0) + 1
    splits, filled = {}, dict.fromkeys(SPLITS, 0)
    for family in sorted(sizes, key=lambda f: (stable_hash("split", f), f)):
        split = next(s for s in SPLITS if s == "train" or filled[s] < HELD_OUT_STYLES)
        splits[family] = split
        filled[split] += sizes[family]
    return splits


def choose_styles(styles: list[Style], limit: int | None, per_style: int = PIECES_PER_STYLE) -> list[Style]:
    """All styles, or for `limit` pieces enough styles taken in turn from test, validation and
    train, so a small trial still has every split."""
    if limit is None:
        return styles
    split = family_splits(styles)
    by_split = {s: [st for st in styles if split[st.family] == s] for s in SPLITS}
    chosen, n = [], -(-limit // per_style)
    while len(chosen) < n and any(by_split.values()):
        for split in by_split:
            if by_split[split] and len(chosen) < n:
                chosen.append(by_split[split].pop(0))
    return chosen


class MmaGroove(Corpus):
    name = "mma-groove"
    fractions = {"validation": 0.0, "test": 0.0}  # whole families go to a split: family_splits

    def __init__(self, scale: int = 1, loops: int = 0):
        """`scale`: render scale x PIECES_PER_STYLE pieces per style (the plain ones, then variants).
        `loops`: add this many random groove loops to the training split (`musegen.music.loops`)."""
        if scale < 1:
            raise DataError(f"scale must be at least 1, not {scale}")
        if not 0 <= loops <= MAX_LOOPS:
            raise DataError(f"loops must be from 0 to {MAX_LOOPS:,}, not {loops}")
        self.scale, self.loops = scale, loops

    def tokenizer(self, option: str | None) -> Tokenizer:
        """A trio tokenizer (groove by default)."""
        trio = [kind for kind, cls in Tokenizer.registry.items() if set(cls.roles) == set(TRACKS.values())]
        if option not in (None, *trio):
            raise DataError(f"the mma-groove corpus is a trio, tokenised as {' or '.join(trio)}, not {option!r}")
        return tokenizer_from_dict({"kind": option or "groove"})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        """The POP909 folder whose chord annotations the pieces play (`progressions` reads it)."""
        return source or SHARED_DATASETS / "pop909"

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The pieces, rendered and laid out where they are not yet (a rerun resumes), then the
        loops; `styles.json` lists the styles of each split and each piece's plan."""
        catalogue, fills = load_catalogue()
        family_split = family_splits(catalogue)
        per_style = self.scale * PIECES_PER_STYLE
        styles = choose_styles(catalogue, limit, per_style)
        songs = progressions(root)
        _current_layouts(out / "g2g")
        items, jobs, plans, variants = [], [], {}, {s: set() for s in SPLITS}
        for style in styles:
            for k in range(per_style):
                if limit is not None and len(items) >= limit:
                    break
                piece, bars = piece_plan(style, k, songs, fills.get(style.family, []))
                path, raw = out / "g2g" / f"{piece.name}.mid", out / "rendered" / f"{piece.name}.mid"
                items.append(Item(name=piece.name, path=path, group=style.family))
                plans[piece.name] = {"song": piece.song, "first_bar": piece.first_bar}
                if k >= PIECES_PER_STYLE:
                    plans[piece.name].update(key=piece.key, tempo=piece.tempo, variant=piece.variant)
                variants[family_split[style.family]].add((style.name, piece.variant))
                if not (raw.is_file() and path.is_file()):
                    text = mma_text(style, bars, piece.seed, piece.tempo, piece.treatments, piece.fill)
                    jobs.append((k, piece.name, text, raw, path))
        # piece 0 of every style first, then piece 1...: a run stopped early leaves every style with
        # its first pieces, which a smaller scale then reuses whole
        failures, rendered, seconds = render_jobs(
            _render_one,
            [job[1:] for job in sorted(jobs, key=lambda job: job[0])],
            len(items),
            workers,
            "rendering (mma) and laying out",
        )
        items += _write_loops(out / LOOP_GROUP, self.loops)
        style_sets = {s: sorted(st.name for st in styles if family_split[st.family] == s) for s in SPLITS}
        tempos = {st.name: st.tempo for st in styles}
        write_json(out / "styles.json", {"split_by": "family", "styles": style_sets, "tempo": tempos, "pieces": plans})
        report = {
            "styles": {s: len(v) for s, v in style_sets.items()},
            "style_variants": {s: len(v) for s, v in variants.items()},
            "pieces_per_style": per_style,
            "rendered": rendered,
            "render_seconds": seconds,
            "render_failures": failures,
            "loops": self.loops,
        }
        return Listing(items, report=report, split_of=lambda g: "train" if g == LOOP_GROUP else family_split[g])

    def encode(self, tokenizer: Tokenizer, item: Item) -> Encoding:
        """A piece's tokens, kept beside its layout (`<k>.<tokenizer>.npz`) so that an interrupted
        encoding resumes: read back when that file is newer than the layout, else encoded and kept.
        What is kept is what the shards need: the ids and the report's counts."""
        settings = json.dumps(tokenizer.to_dict(), sort_keys=True)
        kept = item.path.with_name(f"{item.path.stem}.{tokenizer.kind}-{stable_hash(settings) % 16**8:08x}.npz")
        try:
            fresh = kept.stat().st_mtime >= item.path.stat().st_mtime
        except OSError:
            fresh = False
        if fresh:
            with np.load(kept) as stored:
                return Encoding(stored["ids"], schemas.loads(str(stored["counts"]), PIECE_COUNTS, kept))
        enc = tokenizer.encode(item.path)
        with atomic_path(kept) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, ids=enc.ids, counts=json.dumps(numeric_counts(enc.report)))
        return enc

    def finish(self, out: Path, tokenizer: Tokenizer) -> None:
        """Each test piece's trio as MIDI, with its original programs and tempo changes."""
        shards = Shards(out)
        if "test" not in shards.splits:
            return
        for name in shards.names("test"):
            enc = tokenizer.encode(out / "g2g" / f"{name}.mid")
            piece = tokenizer.decode(enc.ids, enc.report["meta"])
            write_bytes(out / "references" / f"{name}.mid", piece.midi_bytes())


prepare = MmaGroove().prepare


def _render_one(job: tuple[str, str, Path, Path]) -> tuple[str | None, bool]:
    """Render a piece unless its raw MIDI is there, and write its Groove2Groove version unless
    that is there. Returns an error line or None, and whether MMA ran."""
    name, text, raw, dest = job
    try:
        rendered = not raw.is_file()
        if rendered:
            write_bytes(raw, render_mma(text))
        if rendered or not dest.is_file():
            to_groove2groove(raw, dest)
        return None, rendered
    except MusegenError as exc:
        return f"{name}: {exc}", False


def _current_layouts(g2g: Path) -> None:
    """Make `g2g` hold layouts of this LAYOUT_VERSION only: files of another version (or of an
    unstamped folder) are removed, to be written again from the raw renderings."""
    stamp = g2g / "layout.json"
    try:
        current = schemas.read(stamp, LAYOUT_STAMP).version == LAYOUT_VERSION
    except MusegenError:
        current = False
    if not current:
        shutil.rmtree(g2g, ignore_errors=True)
        write_json(stamp, {"version": LAYOUT_VERSION})


def _write_loops(folder: Path, count: int) -> list[Item]:
    """Loop pieces 0 .. count - 1 as MIDI files in `folder` (those already there are kept)."""
    items = []
    for k in tqdm(range(count), desc="writing random loops", unit="piece", disable=not count):
        path = folder / f"{k:06d}.mid"
        if not path.is_file():
            write_bytes(path, random_loop_piece(k).midi_bytes())
        items.append(Item(name=f"{LOOP_GROUP}/{k:06d}", path=path, group=LOOP_GROUP))
    return items


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogue", action="store_true", help="re-probe MMA's library into mma_styles.json")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    if args.catalogue:
        found = build_catalogue(args.workers)
        print(f"{len(found)} styles written to {STYLES_FILE}")
