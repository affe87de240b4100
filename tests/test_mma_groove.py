"""The MMA groove corpus: style catalogue and split, chord conversion, rendering, the
Groove2Groove layout, and an exact round trip on every prepared piece of a 10-style trial corpus."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import symusic

from data_prep import mma_groove as mg
from data_prep import mma_pieces, mma_render, mma_styles
from musegen.errors import DataError
from musegen.io import read_json
from musegen.music.beats import round_half_even
from musegen.music.midi import read_parts
from musegen.music.roles import G2G_NAMES
from musegen.shards import Shards
from musegen.tokenizers.groove import GrooveTokenizer

pytestmark = pytest.mark.skipif(shutil.which("mma") is None, reason="the Debian package mma is not installed")

TOK = GrooveTokenizer()
TRIAL_PIECES = 40  # 10 styles x 4 pieces
CLI_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # `python -m musegen` of this copy


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, pop909_dir):
    out = tmp_path_factory.mktemp("mma-groove")
    report = mg.prepare(out=out, source=pop909_dir, limit=TRIAL_PIECES, workers=2)
    return out, report


# ---------------------------------------------------------------- catalogue and split


def test_catalogue_has_over_300_styles_split_disjointly_by_family():
    styles = mma_styles.load_styles()
    names = [s.name for s in styles]
    assert len(set(names)) == len(names) >= 300
    split = mg.family_splits(styles)
    sets = {s: {st.name for st in styles if split[st.family] == s} for s in mg.SPLITS}
    assert not (sets["train"] & sets["test"]) and not (sets["train"] & sets["validation"])
    assert not (sets["validation"] & sets["test"])
    assert len(sets["test"]) >= mg.HELD_OUT_STYLES and len(sets["validation"]) >= mg.HELD_OUT_STYLES
    families = {s: {st.family for st in styles if split[st.family] == s} for s in mg.SPLITS}
    assert not (families["train"] & (families["test"] | families["validation"]))
    assert all(not mma_styles.LEFT_OUT.search(st.groove) for st in styles)
    groove_names = {st.groove for st in styles}
    assert any(g.endswith("Sus") for g in groove_names) and any(g.endswith("Plus") for g in groove_names)
    _, fills = mma_styles.load_catalogue()
    assert sum(map(len, fills.values())) >= 100 and set(fills) <= {st.family for st in styles}
    assert all(mma_styles.FILL.search(f) for names in fills.values() for f in names)
    assert 100 < sum(st.swings for st in styles) < len(styles)  # straight grooves swing, swung ones need not


def test_tempo_follows_the_style_name():
    assert mma_styles.tempo_for("BossaNovaSus") == 132
    assert mma_styles.tempo_for("SlowJazz") < mma_styles.tempo_for("Jazz") < mma_styles.tempo_for("FastJazz")
    assert len({s.tempo for s in mma_styles.load_styles()}) >= 20


# ---------------------------------------------------------------- chords from POP909


@pytest.mark.parametrize(
    "label, name",
    [
        ("B:maj", "B"),
        ("Bb:min", "Bbm"),
        ("C#:maj7", "C#M7"),
        ("F#:maj7/5", "F#M7/C#"),
        ("Eb:min7/b7", "Ebm7/C#"),
        ("A:hdim7", "Am7b5"),
        ("G:sus4(b7)", "G7sus4"),
        ("Db:maj/3", "C#/F"),
        ("N", None),
        ("E:min(9)", "Em"),
    ],
)
def test_chord_labels_become_mma_chords(label, name):
    assert mma_pieces.mma_chord(label) == name


def test_song_bars_follow_the_annotation(pop909_dir):
    bars = mma_pieces.song_bars(pop909_dir / "001")
    assert len(bars) > 40 and all(len(b) == 4 and None not in b for b in bars)
    # 001: downbeats at 0.055 s and 2.72 s; no chord in the first bar, then B major for two
    # beats, C# major for two (chord_midi.txt: 2.72-4.06 B:maj, 4.06-5.39 C#:maj)
    assert bars[0] == ["B", "B", "C#", "C#"] and bars[1] == ["Bbm", "Bbm", "Ebm", "Ebm"]


def test_chords_move_to_another_key():
    assert mma_pieces.transpose_chord("Bbm7/Ab", 2) == "Cm7/Bb" and mma_pieces.transpose_chord("B", 1) == "C"
    assert mma_pieces.transpose_chord("C#M7/F", -5) == "AbM7/C" and mma_pieces.transpose_chord("/", 3) == "/"


def test_rendering_is_deterministic():
    style = mma_styles.load_styles()[0]
    text = mma_render.mma_text(style, [["C", "/", "G", "/"], ["Am", "/", "F", "/"]], seed=7)
    assert mma_render.render_mma(text) == mma_render.render_mma(text)
    with pytest.raises(DataError, match="mma failed"):
        mma_render.render_mma(text.replace("Am", "Hm"))


# ---------------------------------------------------------------- variants of a groove


def test_variant_plans_cover_every_treatment_key_and_fill(pop909_dir):
    styles, fills = mma_styles.load_catalogue()
    songs = mma_pieces.progressions(pop909_dir)
    style = next(st for st in styles if st.swings and st.family in fills)
    plans = [mma_pieces.piece_plan(style, k, songs, fills[style.family]) for k in range(400)]
    plain, variants = (
        [p for p, _ in plans[: mma_pieces.PIECES_PER_STYLE]],
        [p for p, _ in plans[mma_pieces.PIECES_PER_STYLE :]],
    )
    assert all(p.variant == "" and p.key == 0 and p.tempo == style.tempo for p in plain)
    assert Counter(t for p in variants for t in p.treatments).keys() == mma_render.TREATMENTS.keys()
    assert {p.key for p in variants} == set(mma_pieces.KEY_SHIFTS) and len({p.tempo for p in variants}) == 3
    assert 0.4 < np.mean([p.fill is not None for p in variants]) < 0.6
    assert {p.fill for p in variants} - {None} <= set(fills[style.family])
    assert all(len(set(p.treatments) & set(group)) <= 1 for p in variants for group in mma_pieces.TREATMENT_GROUPS)
    for (piece, bars), (again, bars_again) in zip(
        plans[:20], [mma_pieces.piece_plan(style, k, songs, fills[style.family]) for k in range(20)]
    ):
        assert piece == again and bars == bars_again  # by hashing: reruns render the same pieces
    moved = next((p, b) for p, b in plans[mma_pieces.PIECES_PER_STYLE :] if p.key)
    original = dict(songs)[moved[0].song][moved[0].first_bar : moved[0].first_bar + mma_pieces.BARS_PER_PIECE]
    assert moved[1] == [[mma_pieces.transpose_chord(c, moved[0].key) for c in bar] for bar in original]


def rendered_trio(tmp_path, style, bars, **variant) -> np.ndarray:
    """(track, pitch, on, off) of a rendering as the groove tokens hold it, 12 ticks a beat."""
    raw, g2g = tmp_path / "raw.mid", tmp_path / "g2g.mid"
    raw.write_bytes(mma_render.render_mma(mma_render.mma_text(style, bars, seed=5, **variant)))
    mma_render.to_groove2groove(raw, g2g)
    return TOK.notes(TOK.encode(g2g).ids)


def test_each_variant_changes_the_music_as_it_says(tmp_path):
    """On a straight 8-beat groove: swing delays the off-beat eighths of bass and drums (its
    chords are off-beat quarter notes, which MMA does not swing), articulation shortens or
    lengthens the notes, the chords move an octave up, a key moves the bass, and a fill changes
    the last bar of each phrase and leaves the bass and drums before it as they were."""
    style = mma_styles.Style("stdlib/8beat", "8Beat", 120, swings=True)
    bars = [["C", "/", "Am", "/"], ["F", "/", "G7", "/"], ["Dm7", "/", "G7", "/"], ["C", "/", "/", "/"]] * 4
    plain = rendered_trio(tmp_path, style, bars)
    position = lambda notes: Counter((notes[notes[:, 0] < 3][:, 2] % 12).tolist())  # bass and drums
    duration = lambda notes: np.median(notes[notes[:, 0] != 2][:, 3] - notes[notes[:, 0] != 2][:, 2])
    track = lambda notes, t: notes[notes[:, 0] == t]

    swung = rendered_trio(tmp_path, style, bars, treatments=("swing",))
    assert position(plain)[6] > 0 and position(swung)[6] == 0 and position(swung)[8] == position(plain)[6]
    assert duration(rendered_trio(tmp_path, style, bars, treatments=("staccato",))) < duration(plain)
    assert duration(rendered_trio(tmp_path, style, bars, treatments=("legato",))) > duration(plain)
    higher = rendered_trio(tmp_path, style, bars, treatments=("higher",))
    assert track(higher, 3)[:, 1].mean() > track(plain, 3)[:, 1].mean() + 6

    moved = rendered_trio(tmp_path, style, [[mma_pieces.transpose_chord(c, 2) for c in bar] for bar in bars])
    assert np.array_equal(track(moved, 2), track(plain, 2))  # the drums do not change key
    assert Counter(((track(moved, 1)[:, 1] - 2) % 12).tolist()) == Counter((track(plain, 1)[:, 1] % 12).tolist())

    filled = rendered_trio(tmp_path, style, bars, fill="8BeatFill")
    bar_of = lambda notes: notes[:, 2] // 48
    before = lambda notes: {tuple(n) for n in notes[(bar_of(notes) < 7) & (notes[:, 0] < 3)].tolist()}
    in_fill = lambda notes: {tuple(n) for n in notes[bar_of(notes) == 7].tolist()}
    assert before(filled) == before(plain) and in_fill(filled) != in_fill(plain)


# ---------------------------------------------------------------- the trial corpus


def test_trial_corpus_has_every_split_and_references(corpus):
    out, report = corpus
    shards = Shards(out)
    assert report["encoded"] == TRIAL_PIECES and report["skipped"] == 0 and not report["render_failures"]
    assert all(report["styles"][s] > 0 for s in mg.SPLITS)
    styles = read_json(out / "styles.json")["styles"]
    assert not (set(styles["train"]) & set(styles["test"])) and not (set(styles["validation"]) & set(styles["test"]))
    for split in mg.SPLITS:
        piece_styles = {name.rsplit("/", 1)[0] for name in shards.names(split)}
        assert piece_styles == set(styles[split])
    for name, ids in zip(shards.names("test"), shards.pieces("test")):
        assert np.array_equal(TOK.encode(out / "references" / f"{name}.mid").ids, ids)
    assert not (out / "references" / shards.names("train")[0]).with_suffix(".mid").exists()


def expected_trio(path, meta) -> set[tuple[int, int, int, int]]:
    """The trio of a Groove2Groove-layout file, computed here from symusic's reading: the named
    tracks, times on the 12-per-beat grid less the 2-bar count-in, and per track and pitch the
    k-th onset ending at the k-th offset (what first-in-first-out decoding gives)."""
    score = symusic.Score(str(path))
    role = {"BB Bass": 1, "BB Drums": 2, meta["other_track"]: 3}
    times = defaultdict(lambda: ([], []))
    for part in score.tracks:
        for n in part.notes if part.name in role else []:
            on, off = (int(round_half_even(12 * t, score.tpq)) - 96 for t in (n.time, n.time + n.duration))
            if on >= 0:
                times[(role[part.name], n.pitch)][0].append(on)
                times[(role[part.name], n.pitch)][1].append(off)
    return {
        (track, pitch, on, off)
        for (track, pitch), (ons, offs) in times.items()
        for on, off in zip(sorted(ons), sorted(offs))
    }


def test_round_trip_on_every_prepared_piece(corpus):
    out, _ = corpus
    shards = Shards(out)
    grammar = TOK.grammar()
    mismatches, pieces, tracks = 0, 0, Counter()
    for split in shards.splits:
        for name, ids in zip(shards.names(split), shards.pieces(split)):
            path = out / "g2g" / f"{name}.mid"
            enc = TOK.encode(path)
            assert np.array_equal(enc.ids, ids) and enc.report["meta"]["layout"] == "g2g"
            assert enc.report["count_in_notes"] == 8  # the clicks, and nothing of the music
            assert grammar.first_violation(ids) is None, name
            got = {tuple(n) for n in TOK.notes(ids).tolist()}
            mismatches += len(got ^ expected_trio(path, enc.report["meta"]))
            decoded = TOK.decode(ids, enc.report["meta"])
            assert np.array_equal(TOK.encode(decoded.midi_bytes()).ids, ids)
            tracks.update(set((decoded.track + 1).tolist()))
            pieces += 1
    assert pieces == TRIAL_PIECES and mismatches == 0
    assert tracks == Counter({1: pieces, 2: pieces, 3: pieces})  # every piece is a full trio


def test_the_groove2groove_layout_of_a_rendering(tmp_path):
    """MMA's tracks get Groove2Groove names (bass by MMA's track name, whatever its program),
    a 2-bar count-in comes first, and a tempo change moves with the music."""
    text = mma_render.mma_text(
        mma_styles.Style("stdlib/bossanova", "BossaNova", 100), [["C", "/", "Am", "/"]] * 2, seed=3
    )
    text += "Tempo 140\n" + "F / G7 /\n" * 2
    raw, g2g = tmp_path / "raw.mid", tmp_path / "g2g.mid"
    raw.write_bytes(mma_render.render_mma(text))
    mma_render.to_groove2groove(raw, g2g)
    before, after = read_parts(raw), read_parts(g2g)
    assert {p.name for p in after.parts if len(p.notes)} <= G2G_NAMES
    bass = [p for p in after.parts if p.name == "BB Bass"]
    mma_bass = [p for p in before.parts if p.name == "Bass"]
    assert len(bass) == 1 and bass[0].program == mma_bass[0].program == 26  # a guitar program plays the bass
    assert np.array_equal(bass[0].notes[:, :2] - 8 * after.tpq, mma_bass[0].notes[:, :2])
    clicks = [p for p in after.parts if p.name == "BB Drums" and len(p.notes) == 8][0]
    assert clicks.notes[:, 0].tolist() == [b * after.tpq for b in range(8)]
    assert [qpm for _, qpm in after.tempos] == pytest.approx([100, 140], abs=0.01)
    assert after.tempos[0][0] == 0 and after.tempos[1][0] == before.tempos[1][0] + 8 * after.tpq
    meta = TOK.encode(g2g).report["meta"]
    assert meta["bass_track"] == "BB Bass" and meta["tempos"] == [[0, 100.0], [96, 140.0]]
    decoded = TOK.decode(TOK.encode(g2g).ids, meta)
    assert [round(qpm) for _, qpm in decoded.tempos] == [100, 140]


def most_sounding_at_once_on_one_pitch(notes: np.ndarray) -> int:
    most = 0
    for pitch in np.unique(notes[:, 2]):
        same = notes[notes[:, 2] == pitch]
        edges = sorted([(on, 1) for on in same[:, 0]] + [(off, -1) for off in same[:, 1]])
        most = max(most, *np.cumsum([step for _, step in edges]))
    return most


def test_a_restruck_string_ends_its_note_in_the_layout(tmp_path):
    """MMA's strummed guitar re-strikes a sounding string without a note-off; read oldest-first,
    those notes pile up to the end of the piece (up to 193 at once in the first corpus). In the
    layout each string sounds once at a time, with every note kept."""
    text = mma_render.mma_text(
        mma_styles.Style("pflib/16beat1", "16beat1A", 112), [["C", "/", "Am", "/"], ["F", "/", "G", "/"]] * 4, seed=0
    )
    raw, g2g = tmp_path / "raw.mid", tmp_path / "g2g.mid"
    raw.write_bytes(mma_render.render_mma(text))
    mma_render.to_groove2groove(raw, g2g)
    piled = [p for p in read_parts(raw).parts if not p.is_drum and most_sounding_at_once_on_one_pitch(p.notes) > 2]
    assert piled, "the rendering no longer re-strikes without note-offs: this test checks nothing"
    laid_out = [p for p in read_parts(g2g).parts if not p.is_drum]
    assert all(most_sounding_at_once_on_one_pitch(p.notes) == 1 for p in laid_out)
    strummed = [p for p in laid_out if p.program == piled[0].program]
    assert sum(len(p.notes) for p in strummed) == sum(len(p.notes) for p in piled)
    assert np.median(np.concatenate([p.notes[:, 1] - p.notes[:, 0] for p in strummed])) <= 2 * read_parts(g2g).tpq


def test_augmentations_stay_grammatical_on_real_pieces(corpus):
    out, _ = corpus
    grammar = TOK.grammar()
    for ids in Shards(out).pieces("train")[:4]:
        assert np.array_equal(TOK.transpose(TOK.transpose(ids, 5), -5), ids)
        for variant in (TOK.skip_bars(ids, 3), TOK.drop_tracks(ids, [2]), TOK.drop_tracks(ids, [1, 3])):
            assert grammar.first_violation(variant) is None
        assert len(TOK.bar_starts(ids)) == mma_pieces.BARS_PER_PIECE


def test_rerun_reuses_renderings(corpus, pop909_dir):
    out, _ = corpus
    again = mg.prepare(out=out, source=pop909_dir, limit=TRIAL_PIECES, workers=2)
    assert again["rendered"] == 0 and again["tokens"] == corpus[1]["tokens"]
    shutil.rmtree(out / "g2g")  # the layout is rebuilt from the raw renderings, without MMA
    again = mg.prepare(out=out, source=pop909_dir, limit=TRIAL_PIECES, workers=2)
    assert again["rendered"] == 0 and again["tokens"] == corpus[1]["tokens"]


def test_a_rerun_reads_the_kept_tokens_unless_the_layout_is_newer(corpus, pop909_dir):
    """Each piece's tokens are kept beside its layout: a rerun takes them from there (shown here
    by swapping two pieces' kept files), and encodes again a layout written after them."""
    out, report = corpus
    train = Shards(out).names("train")
    kept = lambda name: next((out / "g2g" / name).parent.glob(f"{name.rsplit('/', 1)[1]}.groove-*.npz"))
    first, second = kept(train[0]), kept(train[1])
    first_bytes, second_bytes = first.read_bytes(), second.read_bytes()
    first.write_bytes(second_bytes)
    second.write_bytes(first_bytes)
    mg.prepare(out=out, source=pop909_dir, limit=TRIAL_PIECES, workers=2)
    pieces = dict(zip(Shards(out).names("train"), Shards(out).pieces("train")))
    assert not np.array_equal(pieces[train[0]], pieces[train[1]])
    assert np.array_equal(pieces[train[0]], TOK.encode(out / "g2g" / f"{train[1]}.mid").ids)
    for name in train[:2]:
        (out / "g2g" / f"{name}.mid").touch()  # a layout newer than its kept tokens
    again = mg.prepare(out=out, source=pop909_dir, limit=TRIAL_PIECES, workers=2)
    pieces = dict(zip(Shards(out).names("train"), Shards(out).pieces("train")))
    assert all(np.array_equal(pieces[name], TOK.encode(out / "g2g" / f"{name}.mid").ids) for name in train[:2])
    assert again["tokens"] == report["tokens"] and again["encode_counts"] == report["encode_counts"]


def test_a_scaled_corpus_adds_variants_and_keeps_the_plain_pieces(corpus, pop909_dir, tmp_path):
    """--scale 2: a style's first 4 pieces are token for token those of the plain corpus, the
    next 4 are variants, and styles.json records each variant's plan."""
    out, _ = corpus
    report = mg.prepare(out=tmp_path / "x2", source=pop909_dir, limit=8, scale=2, workers=2)
    assert report["pieces_per_style"] == 8 and report["encoded"] == 8 and not report["render_failures"]
    assert report["styles"]["test"] == 1 and report["style_variants"]["test"] > 1
    plans = read_json(tmp_path / "x2" / "styles.json")["pieces"]
    variants = [plan for name, plan in plans.items() if int(name.rsplit("/", 1)[1]) >= mma_pieces.PIECES_PER_STYLE]
    assert len(variants) == 4 and all({"key", "tempo", "variant"} <= plan.keys() for plan in variants)
    trial, scaled = Shards(out), Shards(tmp_path / "x2")
    trial_pieces = dict(zip(trial.names("test"), trial.pieces("test")))
    scaled_pieces = dict(zip(scaled.names("test"), scaled.pieces("test")))
    plain = [name for name in scaled_pieces if int(name.rsplit("/", 1)[1]) < mma_pieces.PIECES_PER_STYLE]
    assert len(plain) == 4 and all(np.array_equal(scaled_pieces[n], trial_pieces[n]) for n in plain)
    style = next(st for st in mma_styles.load_styles() if st.name == plain[0].rsplit("/", 1)[0])
    songs, fills = mma_pieces.progressions(pop909_dir), mma_styles.load_catalogue()[1].get(style.family, [])
    for k in range(mma_pieces.PIECES_PER_STYLE, 8):
        piece, _ = mma_pieces.piece_plan(style, k, songs, fills)
        assert plans[piece.name] == {
            "song": piece.song,
            "first_bar": piece.first_bar,
            "key": piece.key,
            "tempo": piece.tempo,
            "variant": piece.variant,
        }


def test_an_interrupted_run_resumes_where_it_stopped(corpus, pop909_dir, tmp_path):
    """The command is killed after a few pieces; run again, it renders only the rest, shows
    progress from where it stopped, and writes the same tokens as an uninterrupted run."""
    out = tmp_path / "resumed"
    command = [
        sys.executable,
        "-m",
        "musegen",
        "data",
        "prepare",
        "mma-groove",
        "--source",
        str(pop909_dir),
        "--limit",
        "12",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    rendered = lambda: list(out.glob("rendered/**/*.mid"))
    with open(tmp_path / "stderr.txt", "w") as stderr:  # a file, not a pipe no one reads while it runs
        proc = subprocess.Popen(command, env=CLI_ENV, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        deadline = time.monotonic() + 120
        while len(rendered()) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the command and its rendering workers, as a crash would
        proc.wait()
    done = len(rendered())
    complete = sum((out / "g2g" / path.relative_to(out / "rendered")).is_file() for path in rendered())
    assert "rendering (mma) and laying out" in (tmp_path / "stderr.txt").read_text()
    assert 3 <= done < 12 and not (out / "index.json").exists()

    result = subprocess.run(command, env=CLI_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"{complete}/12" in result.stderr  # the progress bar starts from the pieces already there
    report = Shards(out).index["report"]
    assert report["rendered"] == 12 - done and report["encoded"] == 12
    trial, resumed = Shards(corpus[0]), Shards(out)
    for split in mg.SPLITS:
        expected = dict(zip(trial.names(split), trial.pieces(split)))
        assert resumed.names(split) and all(
            np.array_equal(ids, expected[name]) for name, ids in zip(resumed.names(split), resumed.pieces(split))
        )


def test_loops_join_the_training_split_only(pop909_dir, tmp_path):
    """--loops 6: six loop pieces in training, none in validation or test, and a rerun keeps them."""
    report = mg.prepare(out=tmp_path / "x", source=pop909_dir, limit=4, loops=6, workers=2)
    shards = Shards(tmp_path / "x")
    loops = [name for name in shards.names("train") if name.startswith("loops/")]
    assert report["loops"] == 6 and len(loops) == 6 and report["skipped"] == 0
    assert not any(name.startswith("loops/") for split in ("validation", "test") for name in shards.names(split))
    first = (tmp_path / "x" / "loops" / "000000.mid").stat().st_mtime_ns
    mg.prepare(out=tmp_path / "x", source=pop909_dir, limit=4, loops=6, workers=2)
    assert (tmp_path / "x" / "loops" / "000000.mid").stat().st_mtime_ns == first


def test_bad_sources_are_one_line_data_errors(tmp_path):
    with pytest.raises(DataError, match="POP909 folder not found"):
        mg.prepare(out=tmp_path / "x", source=tmp_path / "missing", limit=4)
    with pytest.raises(DataError, match="tokenised as groove"):
        mg.prepare(out=tmp_path / "x", tokenizer="remi", limit=4)
    with pytest.raises(DataError, match="scale must be at least 1"):
        mg.prepare(out=tmp_path / "x", limit=4, scale=0)
    with pytest.raises(DataError, match="loops must be from 0"):
        mg.prepare(out=tmp_path / "x", limit=4, loops=-1)
    for corpus, option in (("chorales", "--scale"), ("pop909", "--loops")):
        out = tmp_path / corpus
        command = [sys.executable, "-m", "musegen", "data", "prepare", corpus, option, "2", "--out", str(out)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=CLI_ENV)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and not out.exists()
        assert f"{option} is for the mma-groove" in proc.stderr + proc.stdout
        assert f"corpus, not {corpus}" in proc.stderr + proc.stdout
