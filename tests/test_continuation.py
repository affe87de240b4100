"""`musegen evaluate continuation`: every metric on MIDI built here with values worked out by hand,
against muspy where it defines the same quantity, and the whole protocol with tiny models on
POP909 shards and on a groove corpus built here."""

from __future__ import annotations

import csv
import json
import math
import shutil

import muspy
import numpy as np
import pytest
import torch
from conftest import DATA
from train_fixtures import prepare_pop909

from data_prep.common import Item, prepare
from musegen.checkpoint import save_checkpoint
from musegen.cli import main
from musegen.errors import ConfigError, DataError, FormatError
from musegen.evaluation.run_continuation import (
    SPAN_METRICS,
    ContinuationSettings,
    Piece,
    ResultLog,
    evaluate_continuation,
    usable_pieces,
)
from musegen.generation.settings import SampleSettings
from musegen.io import read_json
from musegen.metrics.metric import Metric, Span, measure
from musegen.metrics.span import pitch_classes, role_metrics, sounding, span_metrics
from musegen.metrics.style import reference_profiles, style_metrics
from musegen.metrics.two_sample import COMPARISONS, FEATURES, Prompt, bar_features
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.music.notes import NoteTable, Track
from musegen.shards import Shards
from musegen.tokenizers.groove import GrooveTokenizer

TPB = 480


def piece_of(tracks: dict[tuple[int, bool], list[tuple[float, float, int]]]) -> NoteTable:
    """A piece from {(program, is_drum): [(start beat, duration in beats, pitch)]}, read back from
    its MIDI file so that its tracks get their roles as a file's do."""
    written = [
        (Track(None, program, is_drum), [(int(s * TPB), int((s + d) * TPB), p, 100) for s, d, p in notes])
        for (program, is_drum), notes in tracks.items()
    ]
    return NoteTable.read(NoteTable.of_tracks(TPB, written).midi_bytes())


# Bar 0 (the prompt): C4 E4 G4 quarter notes. Bars 1-2 (the span): C3 held for bar 1 with E4 then
# G4 above it, then one D4 eighth at the start of bar 2 and silence.
PIANO = [(0, 1, 60), (1, 1, 64), (2, 1, 67), (4, 4, 48), (4, 1, 64), (5, 1, 67), (8, 0.5, 62)]


def test_every_span_metric_on_a_piece_worked_out_by_hand():
    notes = piece_of({(0, False): PIANO})
    prompt = pitch_classes(notes.onsets_in(0, 1))
    m = span_metrics(notes, first_bar=1, bars=2, prompt_classes=prompt)
    assert m["notes per bar"] == 4 / 2
    assert m["mean duration"] == pytest.approx((4 + 1 + 1 + 0.5) / 4)
    # 16th steps: 0-7 two pitches, 8-15 one (the C3), 16-17 one (the D4), 18-31 none
    assert m["polyphony"] == pytest.approx((8 * 2 + 8 + 2) / 18)
    assert m["polyphony rate"] == pytest.approx(8 / 18)
    assert m["polyphony rate (muspy)"] == 0.0  # never more than two pitches
    assert m["silent beats"] == pytest.approx(3 / 8)  # beats 9, 10, 11 of 4..11
    assert m["mean pitch"] == pytest.approx((48 + 64 + 67 + 62) / 4)
    assert m["bars with a low note"] == 0.5  # the C3 starts in bar 1, nothing low in bar 2
    assert m["pitch-class entropy"] == pytest.approx(2.0)  # C, D, E, G once each: log2(4) bits
    assert m["pitch-class cosine"] == pytest.approx(3 / (2 * math.sqrt(3)))  # CDEG against CEG
    assert m["scale consistency"] == 1.0  # all in C major
    assert m["groove consistency"] == pytest.approx(1 - 1 / 16)  # onsets {0, 4} then {0}


def test_polyphony_and_groove_consistency_agree_with_muspy():
    span = [(s - 4, d, p) for s, d, p in PIANO if s >= 4]  # the span alone, starting at 0
    notes = piece_of({(0, False): span})
    music = muspy.Music(
        resolution=4, tracks=[muspy.Track(notes=[muspy.Note(int(s * 4), p, int(d * 4)) for s, d, p in span])]
    )
    m = span_metrics(notes, first_bar=0, bars=2, prompt_classes=np.ones(12))
    assert m["polyphony"] == pytest.approx(muspy.polyphony(music))
    assert m["groove consistency"] == pytest.approx(muspy.groove_consistency(music, 16))
    assert m["pitch-class entropy"] == pytest.approx(muspy.pitch_class_entropy(music))
    assert m["scale consistency"] == pytest.approx(muspy.scale_consistency(music))
    # muspy's rate runs over its piano roll, to the last note's end: a chord of three filling the bar
    chord = [(0, 4, 60), (0, 4, 64), (1, 2, 67), (1, 1, 71)]
    notes = piece_of({(0, False): chord})
    music = muspy.Music(
        resolution=4, tracks=[muspy.Track(notes=[muspy.Note(int(s * 4), p, int(d * 4)) for s, d, p in chord])]
    )
    m = span_metrics(notes, first_bar=0, bars=1, prompt_classes=np.ones(12))
    assert m["polyphony rate (muspy)"] == pytest.approx(muspy.polyphony_rate(music)) == pytest.approx(8 / 16)
    assert m["polyphony rate"] == 1.0 and m["polyphony"] == pytest.approx(muspy.polyphony(music))
    assert m["pitch-class entropy"] == pytest.approx(muspy.pitch_class_entropy(music))
    assert m["scale consistency"] == pytest.approx(muspy.scale_consistency(music))


def test_a_note_sounds_where_it_overlaps_the_grid():
    # held from the prompt into the span; ending exactly on a step edge; shorter than a step
    notes = piece_of({(0, False): [(3, 1.5, 60), (4.25, 0.25, 62), (5.1, 0.05, 64)]})
    roll = sounding(notes, first_bar=1, bars=1)
    assert np.flatnonzero(roll[:, 60]).tolist() == [0, 1]  # beats 4 to 4.5: steps 0 and 1
    assert np.flatnonzero(roll[:, 62]).tolist() == [1]  # 4.25 to 4.5: step 1 only, not step 2
    assert np.flatnonzero(roll[:, 64]).tolist() == [4]  # inside step 4
    m = span_metrics(notes, 1, 1, np.ones(12))
    assert m["notes per bar"] == 2  # the held note's onset is in the prompt
    assert m["silent beats"] == pytest.approx(2 / 4)


def test_an_empty_span_is_silent_and_has_no_pitch_statistics():
    notes = piece_of({(0, False): [(0, 1, 60)]})
    m = span_metrics(notes, first_bar=1, bars=2, prompt_classes=np.ones(12))
    assert m["notes per bar"] == 0 and m["silent beats"] == 1.0 and m["pitch-class cosine"] == 0.0
    assert m["bars with a low note"] == 0.0 and m["groove consistency"] == 1.0
    for name in (
        "mean duration",
        "polyphony",
        "polyphony rate",
        "mean pitch",
        "pitch-class entropy",
        "scale consistency",
    ):
        assert math.isnan(m[name]), name


def groove_piece(
    bars: int, bass_pitch: int = 36, swap: bool = False, bass_until: int | None = None, drums_from: int = 0
):
    """Bass, drums and piano repeating a one-bar pattern for `bars` bars."""
    bass, drums, piano = [], [], []
    for b in range(bars):
        t = 4 * b
        if bass_until is None or b < bass_until:
            bass += [(t, 1.5, bass_pitch), (t + 2, 1.5, bass_pitch + 7)]
        if b >= drums_from:
            drums += [(t + k, 0.25, 36 if k % 2 == 0 else 38) for k in range(4)] + [
                (t + k / 2, 0.25, 42) for k in range(8)
            ]
        piano += [(t + (1 if swap else 0), 2, 60), (t + (1 if swap else 0), 2, 64), (t + 3, 1, 67)]
    return piece_of({(33, False): bass, (0, True): drums, (0, False): piano})


def test_role_and_style_metrics_on_a_repeated_groove():
    notes = groove_piece(8, bass_until=7)
    m = role_metrics(notes, first_bar=4, bars=4, roles=["bass", "drums", "other"])
    assert m["bass notes per bar"] == 6 / 4 and m["drums notes per bar"] == 12
    assert m["other notes per bar"] == 3 and m["other median duration"] == 2 and m["bass median duration"] == 1.5
    style = style_metrics(Span(notes, first_bar=4, bars=4, context={"reference": reference_profiles(notes)}))
    # a repeated bar has the whole piece's onset profiles; the bass is missing from the last quarter
    assert style["style onset-drum Q1"] == [pytest.approx(1.0)]
    assert style["style onset-duration Q1"] == [pytest.approx(1.0), pytest.approx(1.0)]  # bass, other
    assert style["style onset-duration Q4"][0] == 0.0 and style["style time-pitch Q4"][0] == 0.0
    assert 0 < style["style time-pitch Q1"][1] < 1  # one bar's pairs miss the pairs across bar lines
    reference = reference_profiles(notes)
    context = {"prompt_classes": pitch_classes(notes.pitched().onsets_in(0, 4))}
    values = measure(SPAN_METRICS, Span(notes, 4, 4, context | {"reference": reference, "roles": list(reference)}))
    assert {"bass notes per bar", "style onset-drum Q4"} <= set(values)
    assert "bass notes per bar" not in measure(SPAN_METRICS, Span(notes, 4, 4, context))


def test_a_role_the_prompt_does_not_play_is_counted_but_its_style_is_not_scored():
    """Drums that come in after the prompt (a quiet intro) are not the prompt's to continue: a
    continuation without them is not scored 0 on their style, and their notes per bar still count."""
    notes = groove_piece(8, drums_from=5)
    context = Piece("intro", np.zeros(1, dtype=np.int64), notes, span_start=4).context()
    assert context["roles"] == ["bass", "drums", "other"] and set(context["reference"]) == {"bass", "other"}
    values = measure(SPAN_METRICS, Span(notes, 4, 4, context))
    assert values["drums notes per bar"] == [12 * 3 / 4] and "style onset-drum Q1" not in values
    assert values["style onset-duration Q1"] == [pytest.approx(1.0), pytest.approx(1.0)]  # bass, other
    played_from_the_start = Piece("band", np.zeros(1, dtype=np.int64), groove_piece(8), span_start=4).context()
    assert set(played_from_the_start["reference"]) == {"bass", "drums", "other"}


# ---------------------------------------------------------------- the protocol on prepared shards


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:8], tmp_path_factory.mktemp("pop"))


def tiny_checkpoint(folder, tokenizer):
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tokenizer.vocab_size))
    return save_checkpoint(folder, model, model.config, tokenizer, {"train_len": 64})


def test_pop_protocol_measures_model_real_and_floor(pop, tmp_path, one_torch_thread):
    shards = Shards(pop)
    tok = shards.tokenizer
    ckpt = tiny_checkpoint(tmp_path / "ckpt", tok)
    settings = ContinuationSettings(prompt_bars=1, sample=SampleSettings(bars=2, num_samples=2, seed=3))
    out = tmp_path / "eval"
    result = evaluate_continuation(ckpt, pop, out, settings, split="train", limit=3, device="cpu", progress=False)
    assert result["pieces"] == 3 and result["resumed"] == 0
    records = [json.loads(line) for line in (out / "pieces.jsonl").read_text().splitlines()]
    usable, _ = usable_pieces(tok, shards.names("train"), shards.pieces("train"), settings)
    assert [r["piece"] for r in records] == [p.name for p in usable[:3]]
    floors = [usable[(i + len(usable) // 2) % len(usable)] for i in range(3)]
    for record, piece, floor in zip(records, usable, floors):
        # the real span's notes per bar, counted on the tokens: Pitch tokens between the span's Bars
        starts = tok.bar_starts(piece.ids)
        span = piece.ids[starts[piece.span_start] : starts[piece.span_start + 2]]
        assert record["real"]["notes per bar"] == [np.count_nonzero(tok.pitch_of[span] >= 0) / 2]
        assert record["floor_piece"] == floor.name and len(record["model"]) == 2
        assert record["seed"] == 3 + record["index"]
        # the two-sample test's bars: the real span, the prompt bar repeated, the floor's span after
        # this prompt, and every sample's bars
        bars = {name: np.array(rows, dtype=np.float64) for name, rows in record["bar_features"].items()}
        prompt = Prompt.of(piece.notes, piece.span_start - 1, 1)
        prompt_bar = bar_features(piece.notes, piece.span_start - 1, 1, prompt)
        np.testing.assert_allclose(bars["real"], bar_features(piece.notes, piece.span_start, 2, prompt), atol=1e-4)
        np.testing.assert_allclose(bars["copy prompt"], np.vstack([prompt_bar, prompt_bar]), atol=1e-4)
        np.testing.assert_allclose(
            bars["another song"], bar_features(floor.notes, floor.span_start, 2, prompt), atol=1e-4
        )
        assert bars["generated"].shape == (2 * 2, len(FEATURES))
    rows = {r["metric"]: r for r in result["rows"]}
    assert rows["notes per bar"]["model_n"] == 6
    real = [r["real"]["notes per bar"][0] for r in records]
    assert rows["notes per bar"]["real_mean"] == pytest.approx(np.mean(real))
    assert rows["pitch-class cosine"]["real_mean"] > rows["pitch-class cosine"]["floor_mean"]
    assert len(list((out / "samples").glob("*.mid"))) == 6
    assert list(result["two_sample"]) == list(COMPARISONS)
    two_sample = read_json(out / "two_sample.json")
    assert two_sample["copy prompt"]["bars"] == [3 * 2, 3 * 2] and two_sample["generated"]["bars"] == [3 * 4, 3 * 2]
    assert two_sample["real vs real"]["bars"] == [3, 3] and two_sample["generated"]["songs"] == 3
    for name, test in two_sample.items():
        assert 0 <= test["auc"] <= 1 and test["auc"] == result["two_sample"][name]["auc"]
        assert sorted(feature for feature, _ in test["telling"]) == sorted(FEATURES)
    assert all(f"| {name} |" in (out / "two_sample.md").read_text() for name in COMPARISONS)
    table = (out / "continuation.md").read_text()
    assert "| notes per bar |" in table and "model_over_real" in table
    assert (out / "continuation.png").read_bytes()[:4] == b"\x89PNG"

    before = (out / "pieces.jsonl").read_bytes()
    again = evaluate_continuation(ckpt, pop, out, settings, split="train", limit=3, device="cpu", progress=False)
    assert again["resumed"] == 3 and (out / "pieces.jsonl").read_bytes() == before
    more = evaluate_continuation(ckpt, pop, out, settings, split="train", limit=4, device="cpu", progress=False)
    assert more["resumed"] == 3 and more["pieces"] == 4
    with pytest.raises(ConfigError, match="other settings"):
        evaluate_continuation(
            ckpt,
            pop,
            out,
            ContinuationSettings(prompt_bars=1, sample=SampleSettings(bars=3, num_samples=2, seed=0)),
            split="train",
            limit=1,
            device="cpu",
            progress=False,
        )
    torch.manual_seed(1)  # another model at the same path (a re-export) must not resume these results
    model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size))
    save_checkpoint(ckpt, model, model.config, tok, {"train_len": 64})
    with pytest.raises(ConfigError, match=r"other settings \(weights_sha256\)"):
        evaluate_continuation(ckpt, pop, out, settings, split="train", limit=3, device="cpu", progress=False)


def test_quarters_partition_the_span(pop, tmp_path, one_torch_thread):
    """Each quarter is measured as a span of its own: quarters of equal bars average to the whole
    span's counts, and the model's quarters begin at its bar lines, in order."""
    shards = Shards(pop)
    tok = shards.tokenizer
    piece = usable_pieces(
        tok,
        shards.names("train"),
        shards.pieces("train"),
        ContinuationSettings(sample=SampleSettings(bars=8, num_samples=2, seed=0)),
    )[0][0]
    values = measure(SPAN_METRICS, Span(piece.notes, piece.span_start, 8, piece.context()), by_quarter=True)
    for metric in ("notes per bar", "silent beats", "bars with a low note"):
        quarters = [values[f"{metric} Q{q}"][0] for q in range(1, 5)]
        assert np.mean(quarters) == pytest.approx(values[metric][0])
        assert (
            quarters[1] == span_metrics(piece.notes, piece.span_start + 2, 2, piece.context()["prompt_classes"])[metric]
        )
    with pytest.raises(ConfigError, match="multiple of 4"):
        ContinuationSettings(sample=SampleSettings(bars=6, num_samples=2, seed=0), by_quarter=True).checked()

    out = tmp_path / "eval"
    settings = ContinuationSettings(
        prompt_bars=1, sample=SampleSettings(bars=4, num_samples=1, seed=0), by_quarter=True
    )
    result = evaluate_continuation(
        tiny_checkpoint(tmp_path / "ckpt", tok),
        pop,
        out,
        settings,
        split="train",
        limit=2,
        device="cpu",
        progress=False,
    )
    usable = {p.name: p for p in usable_pieces(tok, shards.names("train"), shards.pieces("train"), settings)[0]}
    for record in (json.loads(line) for line in (out / "pieces.jsonl").read_text().splitlines()):
        positions, source = record["model_positions"][0], usable[record["piece"]]
        assert positions == sorted(positions) and len(positions) == 5
        # the prompt keeps the piece's tokens up to the span's first bar line, where Q1 begins
        assert positions[0] == tok.bar_starts(source.ids)[source.span_start]
    assert "quarters_md" in result["files"] and (out / "continuation_quarters.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "continuation_quarters.md").read_text()
    assert "| notes per bar | median |" in table and "token positions" in table
    assert "notes per bar Q1" not in (out / "continuation.md").read_text().split("| metric |")[0]


def test_the_result_log_keeps_its_own_settings_and_refuses_foreign_files(tmp_path):
    settings = {"bars": 12, "seed": 0}
    log = ResultLog(tmp_path, settings)
    log.add({"piece": "a", "real": {"mean pitch": [math.nan]}})
    assert ResultLog(tmp_path, settings).records == {"a": {"piece": "a", "real": {"mean pitch": [None]}}}
    with pytest.raises(ConfigError, match=r"other settings \(seed\)"):
        ResultLog(tmp_path, {"bars": 12, "seed": 1})
    (tmp_path / "pieces.jsonl").write_text("{not json\n")
    with pytest.raises(FormatError, match="pieces.jsonl: not valid JSON"):
        ResultLog(tmp_path, settings)
    (tmp_path / "pieces.jsonl").write_text('{"real": {}}\n')
    with pytest.raises(FormatError, match="pieces.jsonl: invalid piece record: piece: field required"):
        ResultLog(tmp_path, settings)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(FormatError, match="run.json: not valid JSON"):
        ResultLog(tmp_path, settings)


def test_short_pieces_are_skipped_and_counted(pop, tmp_path):
    shards = Shards(pop)
    usable, skipped = usable_pieces(
        shards.tokenizer,
        shards.names("train"),
        shards.pieces("train"),
        ContinuationSettings(prompt_bars=4, sample=SampleSettings(bars=60, num_samples=2, seed=0)),
    )
    assert len(usable) + len(skipped) == len(shards.names("train")) and usable and skipped
    assert all(why.startswith("too short") for why in skipped.values())
    ckpt = tiny_checkpoint(tmp_path / "ckpt", shards.tokenizer)
    with pytest.raises(DataError, match="no piece"):
        evaluate_continuation(
            ckpt,
            pop,
            tmp_path / "e",
            ContinuationSettings(sample=SampleSettings(bars=10_000, num_samples=2, seed=0)),
            split="valid",
            device="cpu",
            progress=False,
        )


def test_groove_protocol_adds_roles_and_style(tmp_path, one_torch_thread):
    pieces = {f"p{k}": groove_piece(12, bass_pitch=33 + k, swap=k % 2 == 1) for k in range(3)}
    items = []
    for name, piece in pieces.items():
        (tmp_path / f"{name}.mid").write_bytes(piece.midi_bytes())
        items.append(Item(name=name, path=tmp_path / f"{name}.mid", group=name))
    tok = GrooveTokenizer()
    prepare(tok, items, tmp_path / "data", {"test": 1.0}, workers=1, split_of=lambda group: "test")
    ckpt = tiny_checkpoint(tmp_path / "ckpt", tok)
    result = evaluate_continuation(
        ckpt,
        tmp_path / "data",
        tmp_path / "eval",
        ContinuationSettings(prompt_bars=2, sample=SampleSettings(bars=4, num_samples=1, seed=0)),
        split="test",
        device="cpu",
        progress=False,
    )
    rows = {r["metric"]: r for r in result["rows"]}
    assert rows["drums notes per bar"]["real_mean"] == 12 and rows["bass notes per bar"]["real_mean"] == 2
    for metric in ("onset-drum", "onset-duration"):  # a repeated bar matches its whole piece
        assert rows[f"style {metric} Q1"]["real_median"] == pytest.approx(1.0)
    # the floor's piano plays on other beats (odd pieces are shifted): less alike than the real bars
    assert rows["style onset-duration Q1"]["floor_mean"] < 1.0
    assert rows["style time-pitch Q1"]["model_n"] == 3 * 2  # three pieces, bass and other pooled


def test_cli_prints_the_table_and_bad_options_are_one_line(pop, tmp_path, capsys, one_torch_thread):
    ckpt = tiny_checkpoint(tmp_path / "ckpt", Shards(pop).tokenizer)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "evaluate",
                "continuation",
                "-c",
                str(ckpt),
                "--data",
                str(pop),
                "--split",
                "train",
                "--pieces",
                "1",
                "--prompt-bars",
                "1",
                "--bars",
                "1",
                "--samples-per-piece",
                "1",
                "--out",
                str(tmp_path / "e"),
                "--device",
                "cpu",
            ]
        )
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "1 pieces of train continued" in printed and "| silent beats |" in printed
    assert "| comparison | auc |" in printed  # the two-sample table, without rows: one piece is too few
    assert read_json(tmp_path / "e" / "run.json")["bars"] == 1
    for bad in (["--bars", "0"], ["--samples-per-piece", "0"], ["--split", "nope"]):
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "evaluate",
                    "continuation",
                    "-c",
                    str(ckpt),
                    "--data",
                    str(pop),
                    "--out",
                    str(tmp_path / "x"),
                    "--device",
                    "cpu",
                    *bad,
                ]
            )
        assert exit_info.value.code != 0
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error:"), err


def test_a_folder_of_midi_files_is_continued_tune_by_tune(tmp_path, one_torch_thread):
    """Real multi-track MIDI that is in no corpus (the Freedoom tunes): each file is a piece encoded
    by the model's tokenizer, measured against its own bars and another tune's; a file the
    tokenizer cannot read is skipped with why."""
    folder = tmp_path / "tunes"
    folder.mkdir()
    tunes = sorted((DATA / "multitrack").glob("*.mid"))[:2]
    for path in tunes:
        shutil.copy(path, folder)
    (folder / "broken.mid").write_bytes(b"MThd not really")
    tok = GrooveTokenizer()
    ckpt = tiny_checkpoint(tmp_path / "ckpt", tok)
    result = evaluate_continuation(
        ckpt,
        folder,
        tmp_path / "eval",
        ContinuationSettings(prompt_bars=2, sample=SampleSettings(bars=2, num_samples=1, seed=0)),
        device="cpu",
        progress=False,
    )
    assert result["split"] == "midi" and result["pieces"] == 2
    assert list(result["skipped"]) == ["broken"] and result["skipped"]["broken"].startswith("cannot encode")
    records = {r["piece"]: r for r in map(json.loads, (tmp_path / "eval" / "pieces.jsonl").read_text().splitlines())}
    assert sorted(records) == [p.stem for p in tunes]
    for path in tunes:
        record = records[path.stem]
        assert record["floor_piece"] == next(p.stem for p in tunes if p != path)
        notes = tok.decode(tok.encode(path).ids)  # the tune as the tokenizer reads it
        span = notes.select(notes.role == "bass").onsets_in(record["span_start_bar"], 2)
        assert record["real"]["bass notes per bar"] == [len(span) / 2]
        assert record["span_start_bar"] == notes.first_bar() + 3  # pickup bar + 2 prompt bars
        assert len(record["real"]["style onset-drum Q1"]) == 1  # the tunes have drums, bass and other
    assert len(list((tmp_path / "eval" / "samples").glob("*.mid"))) == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="neither a prepared corpus"):
        evaluate_continuation(
            ckpt, tmp_path / "empty", tmp_path / "e2", ContinuationSettings(), device="cpu", progress=False
        )


class NotesAboveMiddleC(Metric):
    """A metric written against the public interface only: pitched onsets above middle C per bar."""

    needs = ("prompt_classes",)  # declared, so spans without that context are not measured

    def compute(self, span: Span) -> dict[str, float]:
        onsets = span.notes.pitched().onsets_in(span.first_bar, span.bars)
        return {"notes above middle C per bar": int((onsets.pitch > 60).sum()) / span.bars}


def test_a_metric_added_through_the_interface_is_measured_and_reported_like_the_built_in_ones(
    pop, tmp_path, one_torch_thread
):
    shards = Shards(pop)
    tok = shards.tokenizer
    settings = ContinuationSettings(
        prompt_bars=1, sample=SampleSettings(bars=4, num_samples=1, seed=0), by_quarter=True
    )
    ckpt, out = tiny_checkpoint(tmp_path / "ckpt", tok), tmp_path / "eval"
    metrics = SPAN_METRICS + (NotesAboveMiddleC(),)
    evaluate_continuation(
        ckpt, pop, out, settings, split="train", limit=2, device="cpu", progress=False, metrics=metrics
    )
    usable = usable_pieces(tok, shards.names("train"), shards.pieces("train"), settings)[0][:2]
    by_hand = []  # the real spans, counted on the decoded notes
    for piece in usable:
        first = piece.span_start * 4 * piece.notes.tpq
        span = piece.notes.select((piece.notes.start >= first) & (piece.notes.start < first + 16 * piece.notes.tpq))
        by_hand.append(int((span.pitch > 60).sum()) / 4)
    assert max(by_hand) > 0
    rows = {row[0]: row for row in csv.reader((out / "continuation.csv").open())}
    assert float(rows["notes above middle C per bar"][3]) == pytest.approx(np.mean(by_hand), abs=1e-3)  # real_mean
    assert rows["notes above middle C per bar"][-1] == "2"  # model_n: one sample a piece
    quarters = (out / "continuation_quarters.md").read_text()
    assert "| notes above middle C per bar | mean |" in quarters
    assert read_json(out / "run.json")["metrics"][-1] == "NotesAboveMiddleC"
    with pytest.raises(ConfigError, match=r"other settings \(metrics\)"):  # no mixing with the built-in set
        evaluate_continuation(ckpt, pop, out, settings, split="train", limit=2, device="cpu", progress=False)
