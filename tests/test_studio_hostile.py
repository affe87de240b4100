"""musegen studio under hostile clients (issue 44): each fault the red team found, replayed through
real HTTP against a served studio with the same requests and files (made here), answered with a
one-line refusal or a correct result, while another client is still answered (GET /api/models,
timed throughout with a wide margin: the machine may be a loaded 2-core one), the server's memory
stays bounded, and no FluidSynth or sampling work outlives the client that asked for it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import extreme
import httpx
import miditoolkit
import pytest
from starlette.testclient import TestClient
from test_render import fluidsynth_children, needs_fluidsynth
from test_studio import POP, events, serving, upload

from musegen.errors import MusegenError
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.studio import audio, jobs, runs, server
from musegen.studio.models import Models
from musegen.studio.server import create_app, error_message

A, B = "a" * 32, "b" * 32  # two sessions
RUN = "20260101-000000-abcdef"  # a run folder made by the test (no sampling needed to serve its files)
ANSWERED_WITHIN = 2.0  # seconds another client may wait, whatever the hostile load


@pytest.fixture(scope="module")
def models() -> Models:
    return Models([POP])


def rss_mb() -> float:
    """This process's resident memory (the studio is served in it), in MiB."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


@contextlib.contextmanager
def answered_meanwhile(base: str):
    """Another client asking for the model list every 0.2 s while the block runs: yields the list
    of how long each answer took (filled in as they come), from one before the block to one after."""
    waits: list[float] = []
    done = threading.Event()

    def ask() -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            while not done.is_set():
                started = time.perf_counter()
                assert http.get("/api/models").status_code == 200
                waits.append(time.perf_counter() - started)
                done.wait(0.2)

    with ThreadPoolExecutor(1) as pool:
        asking = pool.submit(ask)
        try:
            wait_until(lambda: waits or asking.done(), 60)  # asking from before the load starts
            yield waits
            asked = len(waits)
            wait_until(lambda: len(waits) > asked or asking.done(), 60)  # ... to after it ended
        finally:
            done.set()
            asking.result()


def raw_request(base: str, head: str, host: str | None = None) -> tuple[int, dict]:
    """Send `head` (request line and headers; Host and Connection added) with no body: (status,
    JSON body) of the answer."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(f"{head}\r\nHost: {host or url.netloc}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while data := sock.recv(65536):
            answer += data
    head_, _, body = answer.partition(b"\r\n\r\n")
    return int(head_.split()[1]), json.loads(body)


def chunked_post(base: str, path: str, megabytes: int) -> tuple[int, bytes]:
    """POST `megabytes` MiB of body in chunks with no Content-Length, stopping once the server has
    answered or shut the connection: (bytes sent, its answer; b"" when it reset the connection,
    as a server does that closes with part of the body unread)."""
    url = urlsplit(base)
    sent, chunk, answer = 0, b"%x\r\n%s\r\n" % (2**16, b" " * 2**16), b""
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        headers = f"Host: {url.netloc}\r\nTransfer-Encoding: chunked\r\nConnection: close"
        sock.sendall(f"POST {path} HTTP/1.1\r\n{headers}\r\n\r\n".encode())
        try:
            while sent < megabytes * 2**20 and not select.select([sock], [], [], 0)[0]:
                sock.sendall(chunk)
                sent += 2**16
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            return sent, b""
    return sent, answer


def midi_file(path: Path, minutes: float) -> Path:
    """`minutes` of three-note piano chords, one a beat at 120 bpm."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    inst = miditoolkit.Instrument(0)
    beats = int(minutes * 120)
    inst.notes = [
        miditoolkit.Note(80, 48 + (b * 5 + k * 4) % 36, b * 480, b * 480 + 960) for b in range(beats) for k in range(3)
    ]
    midi.instruments = [inst]
    path.parent.mkdir(parents=True, exist_ok=True)
    midi.dump(str(path))
    return path


def dense_prompt(bars: int = 20, pitches: int = 48) -> bytes:
    """A prompt of `bars` bars with `pitches` notes on every 16th: ~2,300 REMI tokens a bar (the red
    team's 200 bars were 616k tokens; 20 bars take the model minutes to read already)."""
    events = [(0, b"\xff\x58\x04\x04\x02\x18\x08")]  # 4/4
    for _ in range(bars * 16):
        events += [(0, extreme.on(36 + p, 80)) for p in range(pitches)]
        events += [(120 if p == 0 else 0, extreme.off(36 + p)) for p in range(pitches)]
    return extreme.smf([extreme.track(events)])


def wait_until(condition, timeout: float, every: float = 0.05) -> float:
    """Seconds until `condition()` held; fails after `timeout`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        time.sleep(every)
    return time.monotonic() - started


def open_run(stack: contextlib.ExitStack, http: httpx.Client, session: str, **request):
    """A run's stream, open and read up to its "queued" line (closed when `stack` closes): its
    further lines."""
    response = stack.enter_context(http.stream("POST", f"/api/generate?session={session}", json=request))
    assert response.status_code == 200, response.read()
    lines = response.iter_lines()
    stack.callback(lines.close)  # held until the stack closes: a dropped reader would close the stream, and leave
    assert json.loads(next(lines))["event"] == "queued"
    return lines


# ---- fault 1: refused requests took a place in the queue and never gave it back ----------------


def test_34_requests_without_a_good_session_leave_the_queue_as_it_was(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, httpx.Client(base_url=base, timeout=120) as http:
        for i in range(34):  # as a cross-site form would send them (text/plain), without and with a bad session
            path = "/api/generate" if i % 2 else "/api/generate?session=not-a-session"
            answer = http.post(path, content=b'{"model": "pop", "bars": 1}', headers={"Content-Type": "text/plain"})
            assert answer.status_code == 400 and "not a valid session id" in answer.json()["error"]
        assert app.state.places.held() == 0
        assert events(http, A, model="pop", bars=1, seed=1)[-1]["event"] == "done"  # was "the studio is busy"
    assert app.state.places.held() == 0


def test_one_session_has_at_most_4_runs_going_and_the_others_keep_their_places(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    long_run = {"model": "pop", "bars": 64, "samples": 8}  # minutes of sampling: runs until the page leaves
    with serving(app) as base, httpx.Client(base_url=base, timeout=120) as http:
        with contextlib.ExitStack() as stack:
            for seed in range(server.PER_SESSION):
                open_run(stack, http, A, seed=seed, **long_run)
            refused = http.post(f"/api/generate?session={A}", json={**long_run, "seed": 9})
            assert refused.status_code == 400
            assert refused.json()["error"] == "this page already has 4 runs going; wait for one to end"
            open_run(stack, http, B, seed=1, **long_run)  # another page still gets its place
            assert app.state.places.held() == server.PER_SESSION + 1
        wait_until(lambda: app.state.places.held() == 0, 60)  # the pages left: every place is free
        assert events(http, A, model="pop", bars=1, seed=1)[-1]["event"] == "done"


# ---- cross-site requests and DNS rebinding ------------------------------------------------------

CROSS_SITE = "refused: this request was sent by another site, not by the studio's page"


def test_a_cross_site_post_with_a_good_session_is_refused(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        port = urlsplit(base).port
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},  # a sandboxed frame or a file:// page
            {"Origin": f"http://127.0.0.1:{port + 1}"},  # another local server's page
            {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        ):
            answer = http.post(f"/api/generate?session={A}", content=b'{"model": "pop", "bars": 1}', headers=headers)
            assert (answer.status_code, answer.json()) == (403, {"error": CROSS_SITE}), headers
        prompt = (POP.parent / "prompts" / "pop_progression.mid").read_bytes()
        answer = http.post(
            f"/api/prompts?session={A}&model=pop&name=p.mid", content=prompt, headers={"Origin": "http://evil.example"}
        )
        assert answer.status_code == 403
        assert app.state.places.held() == 0 and not (tmp_path / "out" / A).exists()  # nothing run, nothing kept
        same_origin = {"Origin": base, "Sec-Fetch-Site": "same-origin"}  # what the studio's own page sends
        answer = http.post(f"/api/prompts?session={A}&model=pop&name=p.mid", content=prompt, headers=same_origin)
        assert answer.status_code == 200, answer.text


def test_a_host_header_naming_another_host_is_refused(models, tmp_path):
    with serving(create_app(tmp_path / "out", models)) as base:
        port = urlsplit(base).port
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", f"10.0.0.1:{port}"):
            status, body = raw_request(base, "GET /api/models HTTP/1.1", host=host)
            assert status == 403 and body["error"].startswith("this studio answers only at the address it printed")
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"):
            assert raw_request(base, "GET /api/results?session=" + A + " HTTP/1.1", host=host)[0] == 200


def test_listening_on_every_address_takes_ip_addresses_but_no_names(models, tmp_path):
    app = create_app(tmp_path / "out", models, host="0.0.0.0")
    assert TestClient(app, base_url="http://192.168.1.5:8765").get("/api/models").status_code == 200
    assert TestClient(app, base_url="http://[fe80::1]:8765").get("/api/models").status_code == 200
    assert TestClient(app, base_url="http://rebound.evil.example:8765").get("/api/models").status_code == 403
    named = create_app(tmp_path / "out", models, host="studio.lan")
    assert TestClient(named, base_url="http://studio.lan:8765").get("/api/models").status_code == 200
    assert TestClient(named, base_url="http://other.lan:8765").get("/api/models").status_code == 403


# ---- fault 2: a huge body was read whole, and parsed on the event loop --------------------------

JSON_TOO_BIG = "a request body of more than 65,536 bytes; the studio takes no more here"


def test_huge_bodies_are_refused_before_they_are_read(models, tmp_path):
    with serving(create_app(tmp_path / "out", models)) as base, answered_meanwhile(base) as waits:
        before = rss_mb()
        big = str(128 * 2**20)
        # from Content-Length: refused before a byte of the body is sent
        answer = raw_request(base, f"POST /api/generate?session={A} HTTP/1.1\r\nContent-Length: {big}")
        assert answer == (413, {"error": JSON_TOO_BIG})
        answer = raw_request(base, f"GET /api/models HTTP/1.1\r\nContent-Length: {big}")  # every route has a limit
        assert answer == (413, {"error": JSON_TOO_BIG})
        head = f"POST /api/prompts?session={A}&model=pop&name=big.mid HTTP/1.1\r\nContent-Length: {big}"
        assert raw_request(base, head) == (413, {"error": "big.mid: more than the 16,777,216 bytes a prompt may have"})
        # chunked (no length): refused once past the limit while it streams in; the rest is never read
        sent, answer = chunked_post(base, f"/api/generate?session={A}", 128)
        assert sent < 32 * 2**20 and (answer == b"" or answer.startswith(b"HTTP/1.1 413 ")), (sent, answer)
        assert answer == b"" or json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": JSON_TOO_BIG}
        grown = rss_mb() - before
    assert grown < 300, grown
    assert waits and max(waits) < ANSWERED_WITHIN, max(waits)


def test_a_request_just_within_the_limit_is_parsed(models, tmp_path):
    client = TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")
    body = b'{"model": "pop", "bars": 1' + b" " * (server.MAX_JSON_BYTES - 40) + b', "x": 1}'
    answer = client.post(f"/api/generate?session={A}", content=body)
    assert answer.status_code == 400 and answer.json()["error"].startswith("x: extra inputs are not permitted")


# ---- fault 3: every WAV request started its own FluidSynth, and left it running -----------------


@needs_fluidsynth
def test_40_requests_for_one_wav_render_it_once_and_one_at_a_time(models, tmp_path, monkeypatch):
    midi = midi_file(tmp_path / "out" / A / RUN / "x.mid", minutes=0.5)
    renders, most = [], []
    render_wav = audio.render_wav

    def counted(*args, **kwargs):
        renders.append(args[0])
        return render_wav(*args, **kwargs)

    monkeypatch.setattr(audio, "render_wav", counted)
    with serving(create_app(tmp_path / "out", models)) as base, answered_meanwhile(base) as waits:
        with httpx.Client(base_url=base, timeout=120) as http, ThreadPoolExecutor(40) as pool:

            def get() -> tuple[int, bytes]:
                answer = http.get(f"/files/{RUN}/x.wav?session={A}")
                return answer.status_code, answer.content[:4] + hashlib.sha256(answer.content).digest()

            asked = [pool.submit(get) for _ in range(40)]
            while not all(a.done() for a in asked):
                most.append(len(fluidsynth_children()))
                time.sleep(0.05)
            answers = [a.result() for a in asked]
    assert {status for status, _ in answers} == {200} and len({body for _, body in answers}) == 1
    assert answers[0][1][:4] == b"RIFF" and renders == [midi]
    assert max(most) <= audio.RENDERS
    assert sorted(p.name for p in midi.parent.iterdir()) == ["x.mid", "x.wav"]  # no temporary file left
    assert max(waits) < ANSWERED_WITHIN, max(waits)


@needs_fluidsynth
def test_a_render_whose_clients_all_left_is_stopped_and_leaves_nothing(models, tmp_path):
    midi = midi_file(tmp_path / "out" / A / RUN / "x.mid", minutes=10)  # FluidSynth takes several seconds
    with serving(create_app(tmp_path / "out", models)) as base:
        url = urlsplit(base)
        clients = [socket.create_connection((url.hostname, url.port)) for _ in range(10)]
        for sock in clients:
            sock.sendall(f"GET /files/{RUN}/x.wav?session={A} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode())
        wait_until(fluidsynth_children, 60)
        for sock in clients:
            sock.close()
        left = lambda: sorted(p.name for p in midi.parent.iterdir())  # noqa: E731
        wait_until(lambda: not fluidsynth_children() and left() == ["x.mid"], 10)  # the WAV half written is gone


@needs_fluidsynth
def test_a_wav_refused_by_the_studio_says_so_in_its_own_words(models, tmp_path):
    midi_file(tmp_path / "out" / A / RUN / "long.mid", minutes=audio.MAX_MINUTES + 1)
    (tmp_path / "out" / A / RUN / "bad.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    client = TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")
    error = client.get(f"/files/{RUN}/long.wav?session={A}").json()["error"]
    assert error == "long.mid: lasts 16.0 minutes; the studio plays at most 15"  # no --max-minutes to give
    error = client.get(f"/files/{RUN}/bad.wav?session={A}").json()["error"]
    assert error.startswith("bad.mid: corrupt MIDI") and str(tmp_path) not in error


# ---- fault 5: a page that never read its stream made the server buffer every event -------------


def test_a_slow_reader_gets_the_latest_notes_never_a_backlog():
    loop = __import__("asyncio").new_event_loop()
    buffered = runs.RunEvents(loop)
    buffered.put({"event": "started"})
    notes, sent = [], []
    for step in range(2_000):  # a run's reports, none read
        notes = notes[:-1] + [[step, step + 2, 60, 0], [step + 1, step + 9, 62, 0]]  # the last note changes
        buffered.put({"event": "notes", "progress": step / 2_000, "samples": [runs.notes_delta(sent, notes)]})
        sent = notes
        assert len(buffered) <= 2
    buffered.put({"event": "done"})
    got = [loop.run_until_complete(buffered.get()) for _ in range(3)]
    loop.close()
    assert [e["event"] for e in got] == ["started", "notes", "done"] and got[1]["progress"] == 0.9995
    delta = got[1]["samples"][0]
    assert [][: delta["from"]] + delta["notes"] == notes  # the page ends with exactly the notes drawn


def test_notes_deltas_rebuild_every_change_exactly():
    sent, page = [], []
    snapshots = [[[0, 4, 60, 0]], [[0, 4, 60, 0], [2, 3, 62, 0]], [[0, 8, 60, 0], [2, 3, 62, 0]], [[0, 8, 60, 0]]]
    pending = None
    for now in snapshots:
        delta = runs.notes_delta(sent, now)
        pending = delta if pending is None else runs.merged_deltas(pending, delta)
        page = page[: delta["from"]] + delta["notes"]
        sent = now
        assert page == now
    assert [][: pending["from"]] + pending["notes"] == snapshots[-1]


def test_a_page_that_never_reads_its_stream_holds_no_backlog(models, tmp_path, monkeypatch):
    made = []

    class Watched(runs.RunEvents):
        def __init__(self, loop):
            super().__init__(loop)
            self.most, self.notes = 0, 0
            made.append(self)

        def put(self, event):
            super().put(event)
            self.notes += event is not None and event["event"] == "notes"
            self.most = max(self.most, len(self))

    monkeypatch.setattr(server, "RunEvents", Watched)
    app = create_app(tmp_path / "out", models)
    with serving(app) as base:
        url = urlsplit(base)
        body = json.dumps({"model": "pop", "bars": 64, "samples": 8, "seed": 1}).encode()
        head = f"POST /api/generate?session={A} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection((url.hostname, url.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a page that reads nothing
            sock.sendall(head.encode() + body)
            wait_until(lambda: made and made[0].notes >= 30, 120)
        wait_until(lambda: app.state.places.held() == 0, 60)  # it left: its run ended
    assert made[0].most <= 3, made[0].most


@pytest.mark.slow
def test_two_pages_that_never_read_64_bars_of_8_samples_keep_memory_bounded(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, answered_meanwhile(base) as waits:
        url = urlsplit(base)
        body = json.dumps({"model": "pop", "bars": 64, "samples": 8, "seed": 1}).encode()
        head = f"POST /api/generate?session={{}} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {len(body)}\r\n\r\n"
        before, most = rss_mb(), 0.0
        with contextlib.ExitStack() as stack:
            for session in (A, B):
                sock = stack.enter_context(socket.create_connection((url.hostname, url.port)))
                sock.sendall(head.format(session).encode() + body)
            for _ in range(60):  # the red team's 57 s
                time.sleep(1)
                most = max(most, rss_mb() - before)
        wait_until(lambda: app.state.places.held() == 0, 60)
    assert most < 300, most
    assert max(waits) < ANSWERED_WITHIN, max(waits)


# ---- fault 4: a long prompt was fed to the model after its client had gone ----------------------


def test_a_long_prompt_whose_pages_left_frees_its_workers(models, tmp_path):
    app = create_app(tmp_path / "out", models)
    with serving(app) as base, httpx.Client(base_url=base, timeout=300) as http:
        prompt = upload(http, A, "dense.mid", dense_prompt()).json()["prompt"]
        with answered_meanwhile(base) as waits:
            with contextlib.ExitStack() as stack:
                for seed in range(server.WORKERS):  # every worker feeds the prompt (minutes each, before)
                    lines = open_run(stack, http, A, model="pop", prompt=prompt, bars=8, samples=8, seed=seed)
                    assert json.loads(next(lines))["event"] == "started"
                time.sleep(2)  # into the prompt
            freed = wait_until(lambda: app.state.places.held() == 0, 60)
            done = events(http, B, model="pop", bars=1, seed=1)[-1]
    assert done["event"] == "done" and freed < 30, freed
    assert max(waits) < ANSWERED_WITHIN, max(waits)


def test_a_run_stopped_while_its_prompt_is_fed_feeds_no_more_of_it(models, tmp_path):
    (tmp_path / "dense.mid").write_bytes(dense_prompt(bars=4))
    model, tokenizer, _ = models.shared("pop")
    prompt = load_prompt(tokenizer, tmp_path / "dense.mid")
    fed, stop = [], threading.Event()

    def on_ingest() -> None:  # as the studio's: set by the page leaving, here after the first chunk
        fed.append(len(fed))
        if stop.is_set():
            raise jobs.Stopped
        stop.set()

    assert len(prompt.ids) > 4 * 512
    with pytest.raises(jobs.Stopped):
        generate(
            model, tokenizer, prompt, SampleSettings(bars=1, num_samples=2, seed=1), progress=False, on_ingest=on_ingest
        )
    assert fed == [0, 1]  # one chunk of 512 tokens fed, then stopped before the next


def test_a_prompt_of_200_dense_bars_is_refused_before_it_is_encoded(models, tmp_path):
    client = TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")
    started = time.monotonic()
    answer = upload(client, A, "dense.mid", dense_prompt(bars=200))  # the red team's 616k tokens
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "dense.mid: 153,600 notes; a prompt in the studio has at most 20,000"
    assert time.monotonic() - started < 60  # (encoding it took minutes)
    assert not list((tmp_path / "out" / A / "prompts").iterdir())


# ---- the rest of the issue ----------------------------------------------------------------------


def test_a_refused_upload_is_not_kept(models, tmp_path):
    client = TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")
    answer = upload(client, A, "broken.mid", b"MThd\x00\x00\x00\x06garbage")
    assert answer.status_code == 400 and answer.json()["error"].startswith("broken.mid: corrupt MIDI")
    assert not [p for p in (tmp_path / "out").rglob("*") if not p.is_dir()]
    assert not list((tmp_path / "out" / A / "prompts").iterdir())


def test_messages_name_files_not_where_the_server_keeps_them():
    said = MusegenError("/srv/studio-out/aaaa/prompts/0123/song.mid: corrupt MIDI (expected 'MTrk'), see 4/4 or a/b")
    assert error_message(said) == "song.mid: corrupt MIDI (expected 'MTrk'), see 4/4 or a/b"
    said = MusegenError("cannot read '/home/me/checkpoints/pop/weights.safetensors' (tampered)")
    assert error_message(said) == "cannot read 'weights.safetensors' (tampered)"
