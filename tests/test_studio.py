"""musegen studio's server: a run streamed and written as `musegen sample` writes it, every bad
input answered with one line, sessions kept apart, and many runs at once (the page itself is
driven in a browser in test_studio_browser.py)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import miditoolkit
import pytest
import uvicorn
from starlette.testclient import TestClient

from musegen import schemas
from musegen.generation.outputs import SAMPLE_SUMMARY
from musegen.generation.settings import SampleSettings
from musegen.studio import jobs, server, workers
from musegen.studio.models import Models
from musegen.studio.runs import Stop
from musegen.studio.server import create_app
from musegen.studio.sound import PACKAGES, Sound

ROOT = Path(__file__).resolve().parents[1]
POP = ROOT / "checkpoints" / "pop"
GROOVE = ROOT / "checkpoints" / "groove"
EXAMPLES = ROOT / "checkpoints" / "prompts"
EXAMPLE = "pop_progression.mid"
A, B = "a" * 32, "b" * 32  # two sessions


@pytest.fixture(scope="module")
def models() -> Models:
    return Models([POP])


@pytest.fixture(scope="module")
def pop_and_groove() -> Models:
    return Models([POP, GROOVE])


@pytest.fixture
def client(models, tmp_path) -> TestClient:
    return TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")


@contextlib.contextmanager
def serving(app):
    """The app served by uvicorn on a free port of 127.0.0.1, in a thread: yields its base URL."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def upload(client, session: str, name: str, data: bytes, model: str = "pop"):
    return client.post(f"/api/prompts?session={session}&model={model}&name={name}", content=data)


def midi_bytes(numerator: int = 4, notes: bool = True) -> bytes:
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    midi.time_signature_changes = [miditoolkit.TimeSignature(numerator, 4, 0)]
    inst = miditoolkit.Instrument(0)
    if notes:
        inst.notes = [miditoolkit.Note(80, 60 + i % 12, i * 480, i * 480 + 400) for i in range(32)]
    midi.instruments = [inst]
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def events(client, session: str, **request) -> list[dict]:
    with client.stream("POST", f"/api/generate?session={session}", json=request) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line]


def page_notes(drawn: list[dict]) -> list[list[list]]:
    """Each sample's notes as the page holds them after each "notes" event: every event keeps a
    sample's first `from` notes and appends its `notes`."""
    held, seen = [[] for _ in drawn[0]["samples"]], []
    for event in drawn:
        held = [notes[: d["from"]] + d["notes"] for notes, d in zip(held, event["samples"])]
        seen.append(held)
    return seen


def test_a_run_streams_notes_and_is_written_as_sample_writes_it(client, tmp_path):
    prompt = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()
    assert prompt["bars"] == 4 and len(prompt["notes"]) > 20
    got = events(client, A, model="pop", prompt=prompt["prompt"], bars=4, samples=2, seed=5)  # ~1 s: several reports
    kinds = [e["event"] for e in got]
    assert kinds[:2] == ["queued", "started"] and kinds[-1] == "done", kinds
    drawn = [e for e in got if e["event"] == "notes"]
    assert drawn and all(len(e["samples"]) == 2 for e in drawn)
    # with each sample's notes, what the roll draws them by: its tracks' instruments (REMI's one
    # stream of piano, one lane however its decoder splits it into tracks) and its meters
    assert prompt["tracks"] == [[0, 0, "Acoustic Grand Piano"]] and prompt["meters"] == [[0, 4, 4]]
    assert all(d["tracks"] and d["meters"] == [[0, 4, 4]] for e in drawn for d in e["samples"])
    # notes arrive before the run ends (each event only what is new), and never fewer as it goes on
    sent, held = sum(len(d["notes"]) for e in drawn for d in e["samples"]), page_notes(drawn)
    assert len(drawn) > 1 and sent < sum(len(notes) for seen in held for notes in seen)
    counts = [len(seen[0]) for seen in held]
    assert counts == sorted(counts) and counts[0] >= len(prompt["notes"]) and counts[-1] > len(prompt["notes"])
    done = got[-1]
    folder = tmp_path / "out" / A / done["run"]
    summary = schemas.read(folder / "pop_progression.json", SAMPLE_SUMMARY)
    assert [s.midi for s in summary.samples] == ["pop_progression_000.mid", "pop_progression_001.mid"]
    assert summary.settings["bars"] == 4 and summary.settings["seed"] == 5 and summary.settings["tempo"] == "keep"
    assert all(v["prompt_end"] > 0 and v["notes"] for v in done["samples"])
    # what the page's synthesiser needs besides the notes: their velocities, the tracks' programs, the tempos
    first = done["samples"][0]
    assert all(len(n) == 6 and 1 <= n[5] <= 127 for n in first["notes"])
    assert len(first["tracks"]) > max(n[3] for n in first["notes"]) and first["tempos"][0][0] == 0
    # what the page lists after a reload, and the files it plays and offers
    listed = client.get(f"/api/results?session={A}").json()["results"]
    assert [r["run"] for r in listed] == [done["run"]]
    # what the page needs to set its form as it was: the model by the studio's name, the prompt by its id
    assert listed[0]["model"] == "pop" and listed[0]["settings"]["seed"] == 5
    assert (listed[0]["prompt_id"], listed[0]["prompt_name"]) == (prompt["prompt"], EXAMPLE)
    assert client.get(f"/api/results?session={B}").json()["results"] == []  # another session sees none of it
    midi = client.get(f"/files/{done['run']}/pop_progression_000.mid?session={A}")
    assert midi.status_code == 200 and midi.content[:4] == b"MThd"
    assert client.get(f"/files/{done['run']}/pop_progression_000.mid?session={B}").status_code == 400
    task = client.get(f"/files/{done['run']}/pop_progression_000.json?session={A}").json()["generation"]
    continuation = [n for n in done["samples"][0]["notes"] if n[0] >= done["samples"][0]["prompt_end"]]
    assert len(task) == len(continuation) and min(n["start"] for n in task) >= 4 * 16  # after the 4 prompt bars
    detail = client.get(f"/api/runs/{done['run']}?session={A}").json()
    assert detail["views"] == done["samples"]


def test_each_model_offers_the_examples_it_can_continue(pop_and_groove, tmp_path):
    client = TestClient(create_app(tmp_path / "out", pop_and_groove), base_url="http://127.0.0.1")
    offered = {m["name"]: m["examples"] for m in client.get("/api/models").json()["models"]}
    # the groove tokenizer needs a drum track: of the shipped examples only the groove one has drums
    assert offered == {"pop": ["bach_chorale.mid", "groove_rock.mid", EXAMPLE], "groove": ["groove_rock.mid"]}
    for model, names in offered.items():
        for name in names:
            assert client.post(f"/api/prompts?session={A}&model={model}&example={name}").status_code == 200


@pytest.mark.parametrize("tempo", [None, "free", "140"])
def test_the_same_seed_gives_what_musegen_sample_gives(client, tmp_path, models, tempo):
    from musegen.generation.batch import sample_to_folder

    prompt = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()
    done = events(client, A, model="pop", prompt=prompt["prompt"], bars=1, samples=1, seed=9, tempo=tempo)[-1]
    studio = (tmp_path / "out" / A / done["run"] / "pop_progression_000.mid").read_bytes()
    settings = SampleSettings(bars=1, seed=9, **({"tempo": tempo} if tempo else {}))
    cli = sample_to_folder(POP, tmp_path / "cli", settings, EXAMPLES / EXAMPLE, progress=False)
    assert (Path(cli["folder"]) / cli["samples"][0]["midi"]).read_bytes() == studio
    assert sorted(os.listdir(cli["folder"])) == sorted(os.listdir(tmp_path / "out" / A / done["run"]))


def test_a_mirex_prompt_gives_mirex_json(client):
    task = (
        '{"prompt": ['
        + ",".join(f'{{"start": {i}, "pitch": {60 + i % 7}, "duration": 2}}' for i in range(0, 64, 2))
        + "]}"
    )
    prompt = upload(client, A, "task.json", task.encode())
    assert prompt.status_code == 200, prompt.text
    done = events(client, A, model="pop", prompt=prompt.json()["prompt"], bars=1, seed=1)[-1]
    assert done["event"] == "done" and done["samples"][0]["files"]["json"] == "task_000.json"


BAD_PROMPTS = [
    ("broken.mid", b"MThd\x00\x00\x00\x06garbage", "corrupt MIDI"),
    ("waltz.mid", midi_bytes(numerator=3), "time signature 3/4"),
    ("silence.mid", midi_bytes(notes=False), "no notes"),
    ("notes.txt", b"hello", "not a MIDI file"),
    ("empty.mid", b"", "empty"),
    ("task.json", b'{"prompt": [', "json"),
]


@pytest.mark.parametrize("name,data,message", BAD_PROMPTS, ids=[b[0] for b in BAD_PROMPTS])
def test_a_bad_prompt_gets_one_line(client, name, data, message):
    answer = upload(client, A, name, data)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert message.lower() in error.lower() and "\n" not in error and "Traceback" not in error


def test_a_huge_upload_is_refused_before_it_is_read(client):
    answer = upload(client, A, "huge.mid", b"MThd" + bytes(17 * 2**20))
    assert answer.status_code == 413 and "huge.mid: more than the 16,777,216" in answer.json()["error"]


@pytest.mark.parametrize(
    "request_,message",
    [
        ({"model": "nope"}, "unknown model 'nope'"),
        ({"model": "../../etc"}, "unknown model"),
        ({"model": "pop", "bars": 0}, "Bars must be within 1..64"),
        ({"model": "pop", "bars": 2.5}, "Bars must be a whole number"),
        ({"model": "pop", "samples": 99}, "Samples must be within 1..8"),
        # a temperature far from any useful one is refused in the studio (the command line takes 0.001..100)
        ({"model": "pop", "temperature": 100}, "Temperature must be within 0.1..3.0 in the studio, got 100"),
        ({"model": "pop", "temperature": 0.01}, "Temperature must be within 0.1..3.0 in the studio, got 0.01"),
        ({"model": "pop", "top_p": 2}, "Top-p must be within [1e-06, 1], got 2.0"),
        ({"model": "pop", "seed": -1}, "Seed must be within"),
        ({"model": "pop", "bars": "many"}, "Bars must be a whole number"),
        ({"model": "pop", "bars": True}, "Bars must be a whole number"),
        ({"model": "pop", "temperature": "hot"}, "Temperature must be a number"),
        ({"model": "pop", "tempo": "brisk"}, "Tempo must be keep, free or a tempo in BPM within 1..1000, got brisk"),
        ({"model": "pop", "tempo": 96}, "Tempo must be text"),
        ({"model": 5}, "Model must be text, got 5"),
        ({"model": "pop", "temprature": 1.0}, "temprature: extra inputs are not permitted"),
        ({"model": "pop", "prompt": "0123456789ab"}, "no prompt 0123456789ab"),
        ({"model": "pop", "prompt": "../../x"}, "not a valid prompt id"),
    ],
)
def test_bad_options_get_one_line(client, request_, message):
    answer = client.post(f"/api/generate?session={A}", json={"bars": 2, **request_})
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text
    assert "--" not in answer.json()["error"]  # the page's words, not the command line's flags


@pytest.mark.parametrize(
    "body,message",
    [(b"[1, 2]", "a generation request must be a JSON object"), (b"{", "not valid JSON"), (b"\xff", "not valid JSON")],
)
def test_a_body_that_is_no_request_gets_one_line(client, body, message):
    answer = client.post(f"/api/generate?session={A}", content=body)
    assert answer.status_code == 400 and message in answer.json()["error"] and "\n" not in answer.json()["error"]


@pytest.mark.parametrize(
    "path,message",
    [
        ("/api/results?session=../../etc", "not a valid session id"),
        (f"/api/runs/%2E%2E?session={A}", "not a valid run id"),
        (f"/files/20260101-000000-abcdef/%2E%2E?session={A}", "not a valid file name"),
        (f"/files/20260101-000000-abcdef/.hidden?session={A}", "not a valid file name"),
        (f"/files/20260101-000000-abcdef/x.mid?session={B}", "no run 20260101-000000-abcdef"),
    ],
)
def test_no_request_reaches_outside_its_session(client, tmp_path, path, message):
    (tmp_path / "out" / A / "20260101-000000-abcdef").mkdir(parents=True)
    (tmp_path / "out" / A / "20260101-000000-abcdef" / "x.mid").write_bytes(b"MThd")
    answer = client.get(path)
    assert answer.status_code == 400 and message in answer.json()["error"]
    assert client.get(f"/files/20260101-000000-abcdef/%2E%2E%2F%2E%2E%2Fx.mid?session={A}").status_code == 404


def test_an_upload_name_cannot_choose_where_it_is_written(client, tmp_path):
    answer = upload(client, A, "..%2F..%2F..%2Fevil.mid", (EXAMPLES / EXAMPLE).read_bytes())
    assert answer.status_code == 200 and answer.json()["name"] == "evil.mid"
    written = [p for p in (tmp_path / "out").rglob("*.mid")]
    assert len(written) == 1 and written[0].parent.parent == tmp_path / "out" / A / "prompts"


def test_a_full_disk_gets_one_line(client, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("musegen.studio.store.write_bytes", full)
    answer = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes())
    assert answer.status_code == 507 and answer.json()["error"].startswith("disk full")


def test_a_disk_that_fills_during_a_run_gets_one_line_and_leaves_no_run(models, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    # what a worker process does with a run (jobs.run_events), here in this process, where the
    # disk can be made to fill: the run's summary, written last
    monkeypatch.setattr("musegen.generation.batch.write_json", full)
    request = jobs.Request.parse(b'{"model": "pop", "bars": 1, "seed": 2}', None, None)
    got = []
    jobs.run_events(models, request, "run", tmp_path / "run", got.append, Stop())
    assert got[-1] == {"event": "error", "error": "disk full: the studio's --out folder has no space left"}
    assert not (tmp_path / "run").exists()


def test_an_unknown_model_keeps_no_upload(client, tmp_path):
    answer = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes(), model="nope")
    assert answer.status_code == 400 and "unknown model 'nope'; choose one of: pop" in answer.json()["error"]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.mid"))


def test_ten_runs_at_once_each_get_their_own_results_and_the_page_stays_responsive(models, tmp_path):
    sessions = [f"{i:032x}" for i in range(10)]
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=300) as http:
        prompt = upload(http, sessions[0], EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()["prompt"]

        def run(i: int) -> dict:
            request = {"model": "pop", "bars": 1, "seed": i, "prompt": prompt if i == 0 else None}
            with http.stream("POST", f"/api/generate?session={sessions[i]}", json=request) as response:
                return [json.loads(line) for line in response.iter_lines() if line][-1]

        with ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(run, i) for i in range(10)]
            waits = []
            while not all(f.done() for f in futures):
                started = time.perf_counter()
                assert http.get("/api/models").status_code == 200
                waits.append(time.perf_counter() - started)
                time.sleep(0.2)
            results = [f.result() for f in futures]
    assert [r["event"] for r in results] == ["done"] * 10, results
    assert len({r["run"] for r in results}) == 10
    for session, result in zip(sessions, results):
        assert len(list((tmp_path / "out" / session).glob(f"{result['run']}/*.mid"))) == 1
    assert waits and max(waits) < 1.0, waits  # the event loop answers while ten runs sample


def test_two_runs_at_once_each_write_what_the_same_request_writes_alone(models, tmp_path):
    request = {"model": "pop", "bars": 2, "samples": 2, "seed": 4}
    sessions = (A, B, "c" * 32)  # one alone, then two at once (each session may run 4)
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=120) as http:
        prompts = {s: upload(http, s, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()["prompt"] for s in sessions}

        def run(session: str) -> dict:
            return events(http, session, prompt=prompts[session], **request)[-1]

        alone = run(sessions[0])
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(run, sessions[1:]))

    def written(session: str, done: dict) -> dict[str, bytes]:
        assert done["event"] == "done", done
        return {path.name: path.read_bytes() for path in (tmp_path / "out" / session / done["run"]).glob("*.mid")}

    expected = written(sessions[0], alone)
    assert sorted(expected) == ["pop_progression_000.mid", "pop_progression_001.mid"]
    assert [written(s, done) for s, done in zip(sessions[1:], together)] == [expected, expected]


def run_ends(app, within: float) -> bool:
    """Whether every run of `app` has ended (its worker gave its place back) within `within` seconds."""
    deadline = time.perf_counter() + within
    while app.state.places.held() and time.perf_counter() < deadline:
        time.sleep(0.05)
    return not app.state.places.held()


def test_a_page_that_leaves_ends_its_run_and_nothing_is_written(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        request = {"model": "pop", "bars": 64, "samples": 8, "seed": 1}  # minutes of sampling
        with http.stream("POST", f"/api/generate?session={A}", json=request) as response:
            for line in response.iter_lines():
                if json.loads(line)["event"] == "notes":
                    break  # the page is closed: its request with it
        assert run_ends(app, 30)
        assert http.get(f"/api/results?session={A}").json()["results"] == []
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_stop_keeps_the_bars_drawn_so_far_as_a_result(models, tmp_path):
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=60) as http:
        request = {"model": "pop", "bars": 64, "samples": 2, "seed": 1}  # minutes of sampling
        notes, events = 0, []
        with http.stream("POST", f"/api/generate?session={A}", json=request) as response:
            for line in response.iter_lines():
                event = json.loads(line)
                events.append(event)
                if event["event"] == "notes":
                    notes += sum(len(s["notes"]) for s in event["samples"])
                    if notes and not any(e["event"] == "stop sent" for e in events):
                        stopped = http.post(f"/api/runs/{events[0]['run']}/stop?session={A}")
                        assert stopped.status_code == 200, stopped.text
                        events.append({"event": "stop sent"})
        last = events[-1]
        assert last["event"] == "stopped" and last["run"] == events[0]["run"]
        assert len(last["samples"]) == 2 and all(s["notes"] for s in last["samples"])
        (result,) = http.get(f"/api/results?session={A}").json()["results"]
        assert result["run"] == last["run"] and result["stopped"] is True
        assert 1 <= result["stopped_at_bars"] < 64
        midi = http.get(f"/files/{result['run']}/{result['samples'][0]['midi']}?session={A}")
        assert midi.status_code == 200 and midi.content[:4] == b"MThd"


def test_stop_before_a_note_is_drawn_leaves_nothing(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        with contextlib.ExitStack() as busy:  # every worker sampling another page's long run
            for seed in range(server.WORKERS):
                request = {"model": "pop", "bars": 64, "seed": seed}
                busy.enter_context(http.stream("POST", f"/api/generate?session={B}", json=request))
            with http.stream("POST", f"/api/generate?session={A}", json={"model": "pop"}) as response:
                lines = response.iter_lines()
                run = json.loads(next(lines))["run"]
                assert http.post(f"/api/runs/{run}/stop?session={A}").status_code == 200  # while it waits
                busy.close()  # the other page leaves: A's run gets a worker, and is stopped already
                events = [json.loads(line) for line in lines]
        assert events[-1] == {"event": "stopped"}
        assert http.get(f"/api/results?session={A}").json()["results"] == []
        assert run_ends(app, 30)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_a_worker_killed_during_a_run_ends_it_in_one_line_and_the_next_run_gets_a_new_one(models, tmp_path):
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=60) as http:
        request = {"model": "pop", "bars": 64, "samples": 8, "seed": 1}  # minutes of sampling
        got = []
        with http.stream("POST", f"/api/generate?session={A}", json=request) as response:
            for line in response.iter_lines():
                got.append(json.loads(line))
                if got[-1]["event"] == "notes" and sum(e["event"] == "notes" for e in got) == 1:
                    idle = {w.process.pid for held in workers._idle.values() for w in held}
                    sampling = [p for p in multiprocessing.active_children() if p.name == "musegen-studio-worker"]
                    (busy,) = [p for p in sampling if p.pid not in idle]
                    os.kill(busy.pid, signal.SIGKILL)  # as the kernel ends a process out of memory
        assert got[-1] == {"event": "error", "error": "internal error: WorkerEnded (see the studio's console)"}
        assert events(http, A, model="pop", bars=1, seed=1)[-1]["event"] == "done"
        assert http.get(f"/api/results?session={A}").json()["results"][0]["run"] != got[0]["run"]


def studio_command(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "musegen", "studio", *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_page_s_synthesiser_and_soundfont_are_served_or_their_absence_said(models, tmp_path):
    node_modules = tmp_path / "node_modules"  # as `npm ci` lays out the packages the page imports
    for package in PACKAGES:
        (node_modules / package / "dist").mkdir(parents=True)
        (node_modules / package / "dist" / "index.js").write_text(f"export const name = {package!r};\n")
    installed = TestClient(
        create_app(tmp_path / "out", models, sound=Sound.find(node_modules)), base_url="http://127.0.0.1"
    )
    assert installed.get("/api/models").json()["sound_missing"] is None
    library = installed.get("/vendor/stb-vorbis/index.js")
    assert library.text == "export const name = 'stb-vorbis';\n" and "javascript" in library.headers["content-type"]
    head = installed.get("/sound/soundfont.sf2", headers={"Range": "bytes=0-11"})  # the one the WAVs use
    assert head.status_code == 206 and head.content[:4] == b"RIFF" and head.content[8:] == b"sfbk"

    (node_modules / "stb-vorbis" / "dist" / "index.js").unlink()  # a package short: none is served
    partly = TestClient(
        create_app(tmp_path / "out", models, sound=Sound.find(node_modules)), base_url="http://127.0.0.1"
    )
    missing = "the in-page synthesiser is not installed (scripts/setup.sh runs npm for it)"
    assert partly.get("/api/models").json()["sound_missing"] == missing
    assert partly.get("/vendor/spessasynth_lib/index.js").status_code == 404
    no_soundfont = create_app(tmp_path / "out", models, sound=Sound(node_modules, None))
    answer = TestClient(no_soundfont, base_url="http://127.0.0.1").get("/sound/soundfont.sf2")
    assert answer.status_code == 404 and answer.json() == {"error": Sound(node_modules, None).missing()}
    assert "soundfont" in answer.json()["error"]


def test_musegen_studio_serves_the_page_on_127_0_0_1_and_prints_its_address(tmp_path):
    server = studio_command("--port", "0", "--out", str(tmp_path / "out"))
    try:
        url = re.fullmatch(r"musegen studio: (http://127\.0\.0\.1:\d+/) .*", server.stdout.readline().strip()).group(1)
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "<title>musegen studio</title>" in page.text
        names = [m["name"] for m in httpx.get(url + "api/models", timeout=30).json()["models"]]
        assert names == ["groove", "groove-dur", "groove-dur-softmax", "pop", "song"]  # the shipped checkpoints
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    assert (server.returncode, out.strip(), err) == (0, "musegen studio: stopped", "")  # SIGTERM stops it, no error


def test_sigterm_during_a_run_ends_the_run_and_the_studio_at_once(tmp_path):
    server = studio_command("--port", "0", "--out", str(tmp_path / "out"))
    events: list[str] = []

    def follow(url: str, started: threading.Event) -> None:
        request = {"model": "pop", "bars": 64, "samples": 8, "seed": 1}  # minutes of sampling
        with httpx.stream("POST", url + "api/generate?session=" + "a" * 32, json=request, timeout=600) as response:
            try:
                for line in response.iter_lines():
                    events.append(json.loads(line)["event"])
                    if events[-1] == "notes":
                        started.set()
            except httpx.HTTPError:  # the server went away mid-stream
                pass
        started.set()

    try:
        url = re.fullmatch(r"musegen studio: (http://\S+/) .*", server.stdout.readline().strip()).group(1)
        started = threading.Event()
        reader = threading.Thread(target=follow, args=(url, started))
        reader.start()
        started.wait(300)
        assert "notes" in events, events
    finally:
        server.terminate()
        out, err = server.communicate(timeout=300)
    reader.join(60)
    assert (server.returncode, out.strip(), err) == (0, "musegen studio: stopped", "")
    assert "done" not in events  # the run was ended, not waited for
    assert not list((tmp_path / "out").rglob("*.mid"))  # and left nothing half-written


@pytest.mark.parametrize(
    "args,message,code",
    [
        (
            ["--checkpoint", "no-such-folder"],
            "error: no-such-folder: checkpoint folder not found, nor a shipped model of that name "
            "(shipped: groove, groove-dur, groove-dur-softmax, pop, song)",
            1,
        ),
        (["--port", "70000"], "error: --port must be within 0..65535, got 70000", 2),
    ],
)
def test_musegen_studio_refuses_a_bad_option_in_one_line(tmp_path, args, message, code):
    done = studio_command(*args, "--out", str(tmp_path / "out"))
    _, err = done.communicate(timeout=120)
    assert done.returncode == code and err.strip() == message


def test_musegen_studio_on_every_address_warns_that_the_page_is_open_to_the_network(tmp_path):
    server = studio_command("--host", "0.0.0.0", "--port", "0", "--out", str(tmp_path / "out"))
    try:
        assert server.stdout.readline().startswith("musegen studio: http://0.0.0.0:")
        warning = server.stderr.readline().strip()
        assert warning.startswith("warning: --host '0.0.0.0' opens the studio to the network: anyone who can reach")
    finally:
        server.terminate()
        server.wait(30)


def test_the_page_draws_a_single_stream_piano_as_one_lane_and_a_songs_tracks_as_theirs():
    from musegen.music.notes import NoteTable, Track
    from musegen.studio.jobs import as_drawn, tracks_of
    from musegen.tokenizers.remi import RemiTokenizer
    from musegen.tokenizers.song import SongTokenizer

    notes = [(0, 960, 60, 80), (240, 480, 60, 80), (480, 960, 64, 80)]  # two overlapping Cs
    piano = NoteTable.of_tracks(480, [(Track("piano", 0, False), notes)], [(0, 120.0)], [(0, 4, 4)])
    remi = RemiTokenizer()
    decoded = remi.decode(remi.encode(piano.midi_bytes()).ids)
    assert len(decoded.tracks) == 2  # the decoder keeps the overlapping C on a track of its own
    drawn = as_drawn(decoded, remi)
    assert tracks_of(drawn) == [[0, 0, "Acoustic Grand Piano"]] and len(drawn) == len(decoded) == 3
    two = NoteTable.of_tracks(
        480, [(Track("melody", 0, False), notes[:1]), (Track("piano", 0, False), notes[2:])], [(0, 120.0)], [(0, 4, 4)]
    )
    song = SongTokenizer()
    songs = song.decode(song.encode(two.midi_bytes()).ids)
    assert len(as_drawn(songs, song).tracks) == len(songs.tracks) == 2  # melody and piano stay apart
