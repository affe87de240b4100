"""`musegen data ...`: prepare corpora into token shards, look at how a MIDI file tokenises, and
decode shards back to MIDI."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from data_prep import CORPORA

data_app = typer.Typer(help="Prepare corpora into token shards; inspect tokenisations.", no_args_is_help=True)


OPTION_CORPORA = {"scale": ("mma-groove", "mma-song"), "loops": ("mma-groove",)}  # the corpora a setting is for


@data_app.command("prepare")
def prepare(
    corpus: str = typer.Argument(..., help=" | ".join(CORPORA)),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the shards to."),
    source: Optional[Path] = typer.Option(
        None, help="Local copy of the raw corpus (default: the corpus' usual place)."
    ),
    download: bool = typer.Option(False, help="Download the corpus when no local copy is found."),
    workers: Optional[int] = typer.Option(None, min=1, help="Processes to encode with (default: all cores)."),
    limit: Optional[int] = typer.Option(None, min=1, help="Use at most this many pieces (quick trials)."),
    tokenizer: Optional[str] = typer.Option(
        None, help="remi | groove | groove-dur | song (for corpora that allow several)."
    ),
    scale: Optional[int] = typer.Option(
        None,
        min=1,
        help="mma-groove: render this many times the default "
        "pieces per style, the further ones style variants (keys, tempos, fills, "
        "swing, articulation, voicing); mma-song: pieces per groove (default 1). "
        "Rerun the same command to resume.",
    ),
    loops: Optional[int] = typer.Option(
        None,
        min=1,
        help="mma-groove only: add this many random groove loops to the training split, "
        "pieces that can only be predicted by copying their first bars (musegen/music/loops.py).",
    ),
):
    """Encode a corpus into train/validation(/test) token shards, skipping and counting bad files."""
    from data_prep import corpus_prepare
    from data_prep.common import summary_lines
    from musegen.errors import DataError

    own = {name: value for name, value in (("scale", scale), ("loops", loops)) if value is not None}
    for name in own:
        if corpus not in OPTION_CORPORA[name]:
            raise DataError(f"--{name} is for the {' and '.join(OPTION_CORPORA[name])} corpus, not {corpus}")
    report = corpus_prepare(corpus)(out, source, download, workers, limit, tokenizer, **own)  # (data_prep's order)
    for line in summary_lines(report):
        typer.echo(line)
    typer.echo(f"shards written to {out}")


@data_app.command("merge")
def merge(
    folders: list[Path] = typer.Argument(..., help="Prepared shard folders of one tokenizer."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the merged shards to."),
    exclude: list[str] = typer.Option(
        [],
        "--exclude",
        help="Leave out the pieces whose merged name (<folder>/<piece>) matches this shell pattern, "
        "e.g. 'm21folk/oneills1850/*' for a held-out set; repeatable.",
    ),
):
    """Merge prepared corpora of one tokenizer into one folder, to train on all of them."""
    from musegen.shards import merge_shards

    for split, (pieces, tokens) in merge_shards(out, folders, exclude).items():
        typer.echo(f"  {split}: {pieces} pieces, {tokens:,} tokens")
    typer.echo(f"shards written to {out}")


@data_app.command("show")
def show(
    midi: Path = typer.Argument(..., help="A MIDI file."),
    tokenizer: str = typer.Option("remi", help="remi | groove | groove-dur, or a tokenizer.json file."),
    max_tokens: int = typer.Option(64, min=1, help="How many tokens to print."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the whole encoding (ids, event names, report) as one JSON object."
    ),
):
    """Print how a MIDI file tokenises: the first tokens and the encoding report."""
    import json

    from musegen.tokenizers import load_tokenizer

    if tokenizer.endswith(".json"):
        tok = load_tokenizer(tokenizer)
    else:
        from musegen.tokenizers import tokenizer_from_dict

        tok = tokenizer_from_dict({"kind": tokenizer})
    enc = tok.encode(midi)
    if as_json:
        ids = [int(i) for i in enc.ids]
        whole = {
            "file": str(midi),
            "tokenizer": {"kind": tok.kind, "settings": tok.settings()},
            "tokens": len(ids),
            "ids": ids,
            "events": [tok.vocab[i] for i in ids],
            "report": enc.report,
        }
        typer.echo(json.dumps(whole, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
        return
    typer.echo(f"{midi}: {len(enc.ids)} {tok.kind} tokens")
    typer.echo(" ".join(tok.vocab[i] for i in enc.ids[:max_tokens]) + (" ..." if len(enc.ids) > max_tokens else ""))
    for key, value in enc.report.items():
        typer.echo(f"  {key}: {value}")


@data_app.command("export")
def export(
    data: Path = typer.Argument(..., help="Token shards folder (musegen data prepare)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the MIDI files (existing files are kept)."),
    split: str = typer.Option("train", help="Which split to decode."),
):
    """Decode prepared shards back to MIDI, one file per piece named after it, to listen to the data."""
    from musegen.shard_midi import export_midi

    result = export_midi(data, split, out)
    skipped = result["skipped"]
    typer.echo(
        f"{result['split']}: {result['pieces']} pieces, {result['written']} written, "
        f"{result['existing']} already in {out} (left as they were), {len(skipped)} skipped"
        + "".join(f"\n  skipped {name}: {why}" for name, why in list(skipped.items())[:10])
        + (f"\n  ... and {len(skipped) - 10} more" if len(skipped) > 10 else "")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
