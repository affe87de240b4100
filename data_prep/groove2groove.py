"""The Groove2Groove MIDI dataset (Cífka et al. 2020; Zenodo record 3958000, v1.0.0) -> groove.

The archive holds `midi/{train,val,test,itest}/{raw,fixed}/{chart}.{style}_{substyle}.mid`:
Band-in-a-Box accompaniments in tracks named `BB Bass`, `BB Drums`, `BB Guitar`, `BB Piano`,
`BB Strings`, each starting with a 2-bar count-in. The `fixed` versions (correct programs) of
train, val and test are used; their style sets are disjoint by construction, and musegen keeps
that split (val -> validation). `itest` (test charts in training styles) is left out. The
groove tokenizer reads the files as they are, as the paper's reference pipeline did: roles by
track name, the count-in dropped on the 12-per-beat grid.
"""

from __future__ import annotations

from pathlib import Path

from musegen.errors import DataError
from musegen.io import write_json
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Corpus, Item, Listing
from .download import extract, fetch

RECORD = "https://zenodo.org/record/3958000"
ARCHIVE = "groove2groove-data-v1.0.0.tar.gz"
ARCHIVE_URL = f"{RECORD}/files/{ARCHIVE}?download=1"
ARCHIVE_MD5 = "c407de7b3676267660c88dc6ee351c79"
ROOT_NAME = "groove2groove-data-v1.0.0"
DEFAULT_SOURCE = Path.home() / ".cache" / "musegen" / "groove2groove"
PARTS = {"train": "train", "val": "validation", "test": "test"}  # dataset part -> musegen split


def find_root(source: Path) -> Path | None:
    """The extracted dataset folder (the one holding `midi/`) at or just under `source`."""
    for candidate in (source, source / ROOT_NAME):
        if (candidate / "midi").is_dir():
            return candidate
    return None


def obtain(source: Path, download: bool) -> Path:
    """The dataset root, extracting a local archive or downloading one (md5-checked) if allowed."""
    root = find_root(source)
    if root:
        return root
    archive = source / ARCHIVE
    if not archive.is_file() and not download:
        raise DataError(
            f"{source}: Groove2Groove not found (neither {ROOT_NAME}/midi nor {ARCHIVE}); "
            f"pass --download to fetch it from {RECORD}"
        )
    fetch(ARCHIVE_URL, archive, md5=ARCHIVE_MD5)  # an existing archive is only checked
    extract(archive, source)
    root = find_root(source)
    if root is None:
        raise DataError(f"{archive}: archive does not contain {ROOT_NAME}/midi")
    return root


def style_of(path: Path) -> str:
    """`{chart}.{style}_{substyle}.mid` -> `{style}_{substyle}` (each substyle is a style)."""
    parts = path.stem.split(".", 1)
    if len(parts) != 2 or not parts[1]:
        raise DataError(f"{path.name}: not named chart.style_substyle.mid")
    return parts[1]


class Groove2Groove(Corpus):
    name = "groove2groove"
    fractions = {"validation": 0.0, "test": 0.0}  # the dataset's own parts are the splits

    def tokenizer(self, option: str | None) -> Tokenizer:
        if option not in (None, "groove"):
            raise DataError(f"Groove2Groove is tokenised as groove, not {option!r}")
        return tokenizer_from_dict({"kind": "groove"})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        return obtain(source or DEFAULT_SOURCE, download)

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The `fixed` files of each part (`limit` per part), grouped by their part's split; the
        style sets of the splits go to `<out>/styles.json`."""
        items, styles = [], {split: set() for split in PARTS.values()}
        for part, split in PARTS.items():
            for path in sorted((root / "midi" / part / "fixed").glob("*.mid"))[:limit]:
                items.append(Item(name=f"{part}/{path.stem}", path=path, group=split))
                styles[split].add(style_of(path))
        if not items:
            raise DataError(f"{root}: no MIDI files under midi/{{train,val,test}}/fixed")
        sets = {s: sorted(v) for s, v in styles.items()}
        write_json(out / "styles.json", {"split_by": "dataset part", "styles": sets})
        return Listing(items, report={"styles": {s: len(v) for s, v in styles.items()}}, split_of=lambda split: split)


prepare = Groove2Groove().prepare
