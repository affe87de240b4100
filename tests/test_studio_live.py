"""The studio's live routes (musegen/studio/live.py), as a page uses them: the bars a page posts
are what the engine hears and the answer streamed is the engine's own; every bad request is one
line; an accompaniment needs a backing; live sessions are bounded per page and in all, and end
when idle with their piece written. The page itself is driven in test_studio_live_browser.py."""

from __future__ import annotations

import io
import json

import httpx
import miditoolkit
import pytest
from starlette.testclient import TestClient
from test_studio import EXAMPLES, GROOVE, POP, A, B, serving, upload

from musegen.generation.live import TPQ, Live, LiveNote
from musegen.generation.settings import SampleSettings
from musegen.studio import live as studio_live
from musegen.studio.models import Models
from musegen.studio.server import create_app

BAR = 4 * TPQ
SONG = POP.parent / "song"
# two bars as a player plays them: off the beat by a few ticks, the last note held over the line
PLAYED = [
    [[7, 400, 60, 90], [497, 890, 64, 80], [950, 1300, 67, 85], [1460, 1950, 72, 70]],
    [[BAR - 20, BAR + 420, 62, 90], [BAR + 955, BAR + 1900, 65, 88], [BAR + 1890, 2 * BAR + 200, 69, 75]],
]


@pytest.fixture(scope="module")
def models() -> Models:
    return Models([POP, GROOVE, SONG])


@pytest.fixture
def client(models, tmp_path) -> TestClient:
    return TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")


def start(client, session: str = A, **settings):
    return client.post(f"/api/live?session={session}", json={"model": "pop", **settings})


def post_bar(client, live: str, session: str = A, **body) -> list[dict]:
    """The bar's stream, read to its end: its events."""
    with client.stream("POST", f"/api/live/{live}/bar?session={session}", json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines()]


def refused(response) -> str:
    assert response.status_code >= 400, response.text
    error = response.json()["error"]
    assert "\n" not in error and "Traceback" not in error
    return error


def test_the_bars_posted_are_what_the_engine_hears_and_the_answer_streamed_is_its_own(client, models):
    started = start(client, seed=4, bpm=96).json()
    assert (started["bar"], started["bar_ticks"], started["tpq"], started["backing"]) == (0, BAR, TPQ, [])
    assert (started["bpm"], started["meter"]) == (96, [4, 4])
    assert post_bar(client, started["live"], bar=0, notes=PLAYED[0]) == [{"event": "done", "bar": 1}]
    events = post_bar(client, started["live"], bar=1, notes=PLAYED[1], answer=2)
    assert events[-1] == {"event": "done", "bar": 4} and all(e["event"] == "notes" for e in events[:-1])
    streamed = [note for e in events[:-1] for note in e["notes"]]

    # the same bars fed to the engine itself, with the same settings
    model, tokenizer, weights = models.shared("pop")
    engine = Live(model, tokenizer, SampleSettings(bars=1, seed=4), bpm=96, weights=weights)
    for bar in PLAYED:
        engine.close_bar([LiveNote(*note) for note in bar])
    answer = engine.answer(2)
    assert sorted(streamed) == sorted(note.row() for note in answer) and min(streamed)[0] >= 2 * BAR
    served = client.app.state.live.sessions[started["live"]].live
    assert served.notes == engine.notes  # the piece the model saw: the played notes on its grid, the answer

    # the piece as it sounded: the player's notes at their played ticks, the model's at theirs
    saved = client.get(f"/api/live/{started['live']}/live.mid?session={A}")
    midi = miditoolkit.MidiFile(file=io.BytesIO(saved.content))
    tracks = {i.name: sorted([n.start, n.end, n.pitch, n.velocity] for n in i.notes) for i in midi.instruments}
    assert tracks["player"] == sorted(PLAYED[0] + PLAYED[1])
    assert sorted((n[0], n[2]) for n in tracks["musegen"]) == sorted((n[0], n[2]) for n in streamed)
    assert midi.tempo_changes[0].tempo == pytest.approx(96)


def test_a_player_coming_in_over_an_answer_hands_the_piece_back_from_the_next_bar_line(client, models):
    live = start(client, seed=2).json()["live"]
    post_bar(client, live, bar=0, notes=PLAYED[0])
    post_bar(client, live, bar=1, notes=PLAYED[1], answer=4)  # bars 2 to 5
    came_in = [[3 * BAR + 480, 3 * BAR + 900, 71, 90]]
    assert refused(client.post(f"/api/live/{live}/bar?session={A}", json={"bar": 3, "notes": came_in})) == (
        "Bar must be 6, the bar being played, got 3"
    )
    assert post_bar(client, live, bar=3, notes=came_in, hand_back=True) == [{"event": "done", "bar": 4}]
    engine = client.app.state.live.sessions[live].live
    assert engine.bars == 4 and max(n.start for n in engine.notes) < 4 * BAR
    assert any(2 * BAR <= n.start < 4 * BAR for n in engine.notes)  # the answer's bars that sounded
    assert LiveNote(3 * BAR + 480, 3 * BAR + 900, 71, 90) not in engine.notes  # not fed, as musegen jam does
    assert post_bar(client, live, bar=4)[-1] == {"event": "done", "bar": 5}  # the piece goes on from there
    saved = client.get(f"/api/live/{live}/live.mid?session={A}")
    player = next(i for i in miditoolkit.MidiFile(file=io.BytesIO(saved.content)).instruments if i.name == "player")
    assert came_in[0] in [[n.start, n.end, n.pitch, n.velocity] for n in player.notes]  # kept as played


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"bpm": 500}, "Tempo must be within 30..300 in the studio, got 500"),
        ({"bpm": "fast"}, "Tempo must be a number, got 'fast'"),
        ({"meter": "4-4"}, "Meter must be a time signature such as 4/4, got '4-4'"),
        ({"meter": "4/5"}, "Meter must be a time signature such as 4/4, got '4/5'"),
        ({"meter": "3/4"}, "the remi tokens cannot play in 3/4"),
        ({"meter": "2/4"}, "the remi tokens cannot play in 2/4 (they join its bars into others)"),
        ({"program": 128}, "Instrument must be within 0..127 in the studio, got 128"),
        ({"answer_bars": 0}, "Answer bars must be within 1..8 in the studio, got 0"),
        ({"temperature": 9}, "Temperature must be within 0.1..3.0 in the studio, got 9"),
        ({"top_p": 2}, "Top-p"),
        ({"model": "nope"}, "unknown model 'nope'"),
        ({"model": "groove"}, "live play needs a model whose tokens put notes on a grid within bars"),
        ({"mode": "accompany"}, "an accompaniment goes on with a backing: choose a prompt"),
        ({"prompt": "0123456789ab"}, "no prompt 0123456789ab in this session"),
        ({"speed": 1}, "speed: extra inputs are not permitted"),
    ],
)
def test_a_bad_live_session_is_refused_in_one_line(client, settings, message):
    assert message in refused(start(client, **settings))
    assert not client.app.state.live.sessions


def test_the_model_list_offers_each_model_the_meters_it_starts_in_and_no_other(client):
    offered = {m["name"]: m["live_meters"] for m in client.get("/api/models").json()["models"]}
    # REMI writes 4/4 only; the song tokens write a bar of their own for each; groove plays no live at all
    assert offered == {"pop": ["4/4"], "groove": [], "song": ["4/4", "3/4", "2/4", "6/8"]}
    for model in ("pop", "song"):
        for meter in ("4/4", "3/4", "2/4", "6/8"):
            response = start(client, model=model, meter=meter)
            if meter in offered[model]:
                assert response.json()["meter"] == [int(x) for x in meter.split("/")]
            else:
                assert f"tokens cannot play in {meter}" in refused(response)


def test_a_bad_bar_is_refused_in_one_line_and_the_session_goes_on(client):
    live = start(client).json()["live"]
    url = f"/api/live/{live}/bar?session={A}"
    for body, message in [
        ({"bar": 1}, "Bar must be 0, the bar being played, got 1"),
        ({"bar": -1}, "Bar must be 0 or more, got -1"),  # a bound the field has on one side only
        ({"bar": 0, "notes": [[0, 100, 60]]}, "Notes[0] must be [start, end, pitch, velocity], got [0, 100, 60]"),
        ({"bar": 0, "notes": [[0, 100, 60, 1.5]]}, "Notes[0][3] must be a whole number, got 1.5"),
        ({"bar": 0, "notes": [[0, 100, 130, 90]]}, "Notes[0]: pitch 130 and velocity 90 must be MIDI's"),
        ({"bar": 0, "notes": [[100, 100, 60, 90]]}, "Notes[0] ends at tick 100, not after its start (100)"),
        (
            {"bar": 0, "notes": [[5 * BAR, 5 * BAR + 9, 60, 90]]},
            "Notes[0] starts at tick 9600, not within a bar of bar 0",
        ),
        ({"bar": 0, "notes": [[0, 9, 60, 90]] * 513}, "Notes: at most 512 in a bar"),
        ({"bar": 0, "answer": 9}, "Answer bars must be within 0..8 in the studio, got 9"),
        ({"bar": 0, "accompany": True}, "this live session answers; start one in accompany mode"),
        ({"notes": []}, "Bar: a post that ends no bar only asks for the next bar's accompaniment"),
        ({"bar": 0, "hand_back": True}, "Hand back: bar 0 is not one of the model's answer"),
        ([1, 2], "a live request must be a JSON object"),
    ]:
        assert message in refused(client.post(url, json=body)), body
    events = post_bar(client, live, bar=0, answer=1)  # nothing played yet: the engine's own line
    assert events == [{"event": "error", "error": "nothing has been played yet: the model answers what it heard"}]
    assert post_bar(client, live, bar=2, notes=[[2 * BAR, 2 * BAR + 200, 60, 90]]) == [{"event": "done", "bar": 3}]
    assert client.app.state.live.sessions[live].live.bars == 3  # the bar the answer did not fill, silent
    assert "no live session 'nope'" in refused(client.post(f"/api/live/nope/bar?session={A}", json={"bar": 0}))
    assert "no live session" in refused(client.post(f"/api/live/{live}/bar?session={B}", json={"bar": 1}))


def test_an_accompaniment_plays_the_backing_s_instruments_under_the_player_and_never_the_player_s(client):
    prompt = upload(client, A, "groove_rock.mid", (EXAMPLES / "groove_rock.mid").read_bytes(), model="song").json()
    started = start(client, model="song", mode="accompany", prompt=prompt["prompt"], program=73, seed=1).json()
    assert started["bar"] == prompt["bars"] and started["backing"]
    assert {(n[4], n[5]) for n in started["backing"]} == {(0, 1), (0, 0), (33, 0)}  # drums, piano, bass
    first = post_bar(client, started["live"], accompany=True)  # the band's first bar, before the player's
    bar = started["bar"]
    notes = [n for e in first if e["event"] == "notes" for n in e["notes"]]
    assert notes and first[-1] == {"event": "done", "bar": bar}
    assert all(bar * BAR <= n[0] < (bar + 1) * BAR and n[4] != 73 for n in notes)
    played = [[bar * BAR + 10, bar * BAR + 400, 72, 90]]
    second = post_bar(client, started["live"], bar=bar, notes=played, accompany=True)
    assert second[-1] == {"event": "done", "bar": bar + 1}
    assert all((bar + 1) * BAR <= n[0] < (bar + 2) * BAR for e in second[:-1] for n in e["notes"])


def test_one_live_session_per_page_a_few_in_all_and_an_idle_one_ends_with_its_piece_written(
    client, tmp_path, monkeypatch
):
    first = start(client).json()["live"]
    second = start(client).json()["live"]  # the page's earlier session ends
    assert set(client.app.state.live.sessions) == {second}
    assert "no live session" in refused(client.post(f"/api/live/{first}/bar?session={A}", json={"bar": 0}))
    pages = [f"{k:032x}" for k in range(1, studio_live.MAX_LIVE)]
    for page in pages:
        assert start(client, session=page).status_code == 200
    assert refused(start(client, session="f" * 32)) == (
        f"the studio has {studio_live.MAX_LIVE} live sessions going; try again when one ends"
    )
    post_bar(client, second, bar=0, notes=PLAYED[0])
    monkeypatch.setattr(studio_live, "IDLE_SECONDS", -1)  # every session is idle now
    assert start(client, session="f" * 32).status_code == 200  # the idle ones ended: room again
    assert len(client.app.state.live.sessions) == 1
    written = list((tmp_path / "out").glob("*/*/live.mid"))  # of the sessions with notes: the idle one's
    assert [p.parent.name for p in written] == [second]
    midi = miditoolkit.MidiFile(str(written[0]))
    assert sorted([n.start, n.end, n.pitch, n.velocity] for n in midi.instruments[0].notes) == sorted(PLAYED[0])


def test_a_script_that_posts_bars_faster_than_the_model_answers_is_refused_beyond_two(models, tmp_path):
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=60) as http:
        live = http.post(f"/api/live?session={A}", json={"model": "pop"}).json()["live"]
        url = f"/api/live/{live}/bar?session={A}"
        http.post(url, json={"bar": 0, "notes": PLAYED[0]})
        with (
            http.stream("POST", url, json={"bar": 1, "answer": 8}) as first,
            http.stream("POST", url, json={"bar": 10, "answer": 8}) as second,
            http.stream("POST", url, json={"bar": 19, "answer": 8}) as third,
        ):
            assert (first.status_code, second.status_code) == (200, 200)
            assert third.status_code == 400 and json.loads(third.read())["error"] == (
                f"the model is still at work on the {studio_live.MAX_PENDING} bars before; this one was not taken"
            )
            assert [json.loads(line) for line in second.iter_lines()][-1] == {"event": "done", "bar": 19}
        assert http.post(url, json={"bar": 19}).json() == {"event": "done", "bar": 20}  # taken now
