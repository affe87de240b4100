"""What a song model's continuations keep of their prompt, read from an `evaluate continuation`
run on a folder of real multi-track MIDI (an experiment script):
    musegen evaluate continuation -c CHECKPOINT --data SONGS --out RUN --prompt-bars 3 --bars 8
    python scripts/experiments/song_targets.py RUN SONGS      (SONGS: the MIDI folder or the shards)

For each piece and sample, against the same bars of the real piece (both as the song tokens hold
them):
- every track that plays in the prompt's last 2 bars: does it go on (a note in the continued
  bars), with its program, and its notes per bar pooled over tracks against the real bars';
- the bar lines: the meter of every continued bar against the meter the sampler keeps after the
  prompt (`song_grammar.held_meter`: that of its last two bars alike, else its last bar's);
- the tempo: every tempo written after the prompt against the prompt's last one;
- pieces in 3/4 or 6/8: the total variation between the generated and the real onsets'
  histograms, by position in the bar (12 units a quarter) and by beat of the bar (the meter's
  unit: a quarter in 3/4, an 8th in 6/8); beside it, as a ceiling, the same distance from the
  real continuation to the prompt's own bars, and as a floor, to another piece's continuation in
  the same meter; and the same distances to the rest of the real piece (its bars in that meter
  outside the continued ones), a steadier estimate of "the real piece's" histogram than 8 bars:
  the real continuation's distance to it is the ceiling, another piece's continuation's the floor;
- loops: the continued bars (with a note) whose notes (track, position, pitch) are those of the
  bar 1, 2, 4 or 8 bars before them, against the same share in the real continuation.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from musegen import schemas
from musegen.evaluation.compare import read_jsonl
from musegen.evaluation.run_continuation import EVALUATION_SETTINGS, PIECE_RECORD
from musegen.music.midi import find_midi_files
from musegen.shards import Shards
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.song_grammar import held_meter
from musegen.tokenizers.song_vocab import METERS, TEMPOS

TAIL_BARS = 2  # the prompt's last bars whose tracks must go on
LAGS = {
    1: "the bar before again",
    2: "the bar two before again",
    4: "the bar four before again",
    8: "the bar eight before again",
}


def bars_of(tok, ids) -> list[dict]:
    """Each bar of a song token sequence: its meter, the tempo in effect, and its notes as
    (track token, position, pitch)."""
    bars, tempo, track, position = [], None, None, 0
    for token in (int(t) for t in ids):
        if token == tok.bar_id:
            bars.append({"meter": None, "tempos": [], "notes": []})
        elif tok.meter_of[token] >= 0:
            bars[-1]["meter"] = METERS[tok.meter_of[token]]
        elif tok.position_of[token] >= 0:
            position = int(tok.position_of[token])
        elif tok.tempo_of[token] >= 0:
            tempo = float(TEMPOS[tok.tempo_of[token]])
            bars[-1]["tempos"].append(tempo)
        elif tok.program_of[token] >= 0:
            track = token
        elif tok.pitch_of[token] >= 0 or tok.drum_of[token] >= 0:
            bars[-1]["notes"].append((track, position, int(max(tok.pitch_of[token], tok.drum_of[token]))))
        if bars:
            bars[-1]["tempo"] = tempo
    return bars


def prompt_meter(tok, ids, bars: int) -> tuple[int, int]:
    """The meter the sampler keeps after the first `bars` bars of a song token sequence."""
    cut = np.flatnonzero(np.asarray(ids) == tok.bar_id)[bars]
    return METERS[held_meter(tok.grammar().states([int(t) for t in ids[:cut]])[-1])]


def histogram(bars: list[dict], unit: int = 1) -> np.ndarray:
    """The onsets' share at each position in the bar, counted in `unit`s of 12ths of a quarter."""
    counts = np.zeros(96)
    for bar in bars:
        for _, position, _ in bar["notes"]:
            counts[position // unit] += 1
    return counts / max(counts.sum(), 1)


def gaps(made: list[dict], truth: list[dict], meter: tuple[int, int]) -> dict[str, float]:
    """Total variation between two sets of bars' onset histograms, by position and by beat."""
    beat = 48 // meter[1]  # the meter's unit in 12ths of a quarter
    return {
        f"{kind} TV in {meter[0]}/{meter[1]}": 0.5 * np.abs(histogram(made, unit) - histogram(truth, unit)).sum()
        for kind, unit in (("position", 1), ("beat", beat))
    }


def measure(run: Path, songs: Path) -> dict:
    tok = tokenizer_from_dict({"kind": "song"})
    records = read_jsonl(run / "pieces.jsonl", PIECE_RECORD)
    if (songs / "index.json").is_file():  # prepared shards: the pieces as they were encoded
        shards = Shards(songs)
        real_ids = {
            name: ids for split in shards.splits for name, ids in zip(shards.names(split), shards.pieces(split))
        }
    else:  # the files the run continued (those it refused are not in it)
        evaluated = {record["piece"] for record in records}
        real_ids = {p.stem: tok.encode(p).ids for p in find_midi_files(songs) if p.stem in evaluated}
    span = schemas.read(run / "run.json", EVALUATION_SETTINGS)["bars"]
    out = defaultdict(list)
    continuations = defaultdict(list)  # meter -> each piece's real continued bars
    for record in records:
        real = bars_of(tok, real_ids[record["piece"]])
        start = record["span_start_bar"]
        prompt, truth = real[:start], real[start : start + span]
        tail = {t for bar in prompt[-TAIL_BARS:] for t, _, _ in bar["notes"]}
        meter, tempo = prompt_meter(tok, real_ids[record["piece"]], start), prompt[-1]["tempo"]
        rest = rest_of(real, start, span, meter)
        in_meter = [bar for bar in real if bar["meter"] == meter]  # the "real piece", continued bars too
        for lag in LAGS:
            out[f"real bars: {LAGS[lag]}"] += repeats(real, start, span, lag)
        for sample in sorted((run / "samples").glob(f"{record['piece']}_*.mid")):
            whole = bars_of(tok, tok.encode(sample).ids)
            made = whole[start : start + span]
            for lag in LAGS:
                out[f"generated bars: {LAGS[lag]}"] += repeats(whole, start, span, lag)
            out["bars"].append(len(made))
            out["bar lines in the prompt's meter"] += [bar["meter"] == meter for bar in made]
            out["tempos equal to the prompt's"] += [abs(t / tempo - 1) < 0.01 for bar in made for t in bar["tempos"]]
            for track in tail:
                played = sum(1 for bar in made for t, _, _ in bar["notes"] if t == track)
                wanted = sum(1 for bar in truth for t, _, _ in bar["notes"] if t == track)
                out["tail tracks that go on"].append(played > 0)
                out["generated notes"].append(played)
                out["real notes"].append(wanted)
            if meter in ((3, 4), (6, 8)):
                for key, gap in gaps(made, truth, meter).items():
                    out[key].append(gap)
                for key, gap in gaps(made, rest, meter).items():
                    out[f"{key}, against the rest of the piece"].append(gap)
                for key, gap in gaps(made, in_meter, meter).items():
                    out[f"{key}, against the whole piece"].append(gap)
        if meter in ((3, 4), (6, 8)):
            own = [bar for bar in prompt[-4:] if bar["meter"] == meter]
            for key, gap in gaps(own, truth, meter).items():
                out[f"{key}, prompt's bars"].append(gap)
            for key, gap in gaps(truth, rest, meter).items():
                out[f"{key}, against the rest of the piece: the real continuation"].append(gap)
            continuations[meter].append((truth, rest, in_meter))
    for meter, pieces in continuations.items():
        for i, (truth, rest, in_meter) in enumerate(pieces if len(pieces) > 1 else []):  # each against the one before
            for key, gap in gaps(pieces[i - 1][0], truth, meter).items():
                out[f"{key}, another piece"].append(gap)
            for key, gap in gaps(pieces[i - 1][0], rest, meter).items():
                out[f"{key}, against the rest of the piece: another piece"].append(gap)
            for key, gap in gaps(pieces[i - 1][0], in_meter, meter).items():
                out[f"{key}, against the whole piece: another piece"].append(gap)
    return out


def repeats(bars: list[dict], start: int, span: int, lag: int) -> list[bool]:
    """For each bar with a note among `bars[start : start + span]`: are its notes those of the
    bar `lag` before it?"""
    return [
        sorted(bars[k]["notes"]) == sorted(bars[k - lag]["notes"])
        for k in range(start, min(start + span, len(bars)))
        if bars[k]["notes"] and k >= lag
    ]


def rest_of(real: list[dict], start: int, span: int, meter: tuple[int, int]) -> list[dict]:
    """The real piece's bars in `meter` other than the continued ones."""
    return [bar for bar in real[:start] + real[start + span :] if bar["meter"] == meter]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("songs", type=Path)
    args = parser.parse_args()
    out = measure(args.run, args.songs)
    print("| measure | value | n |\n|---|---|---|")
    for key in ("tail tracks that go on", "bar lines in the prompt's meter", "tempos equal to the prompt's"):
        value = f"{np.mean(out[key]):.1%}" if out[key] else "none written"
        print(f"| {key} | {value} | {len(out[key])} |")
    ratio = sum(out["generated notes"]) / max(sum(out["real notes"]), 1)
    print(f"| notes per bar of those tracks, generated / real (pooled) | {ratio:.2f} | {len(out['real notes'])} |")
    for key in sorted(k for k in out if " again" in k):
        print(f"| {key} | {np.mean(out[key]):.1%} | {len(out[key])} |")
    for key in sorted(k for k in out if " TV in " in k):
        print(f"| {key} (mean) | {np.mean(out[key]):.3f} | {len(out[key])} |")


if __name__ == "__main__":
    main()
