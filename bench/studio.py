"""musegen studio, as a page sees it: how soon the first generated note arrives after pressing
Generate, and how long 12 bars take, with the shipped pop model and its example prompt; then how
two runs started at once share the CPU: each against the same request run alone.

    python -m bench.studio              # 4 runs of 12 bars, one sample each (run from the repository root)
    python -m bench.studio --bars 4 --runs 2 --pair-bars 8 --pairs 6 --live 20

The studio is started as a user starts it (`musegen studio --port 0`, only the pop checkpoint
offered besides the shipped ones' loading) and driven over HTTP; times are from sending the request
to the event that carries the note (first note) or the finished run (total). The first run also
starts a worker process (the sampler imported, the model loaded), so it is reported apart from
the others' median.
The two concurrent runs are the same request (same seed) from two sessions, so the per-session
limit does not hold either back; both workers have run once before anything is timed. Each pair
lies between two runs alone, its reference.

The play-along mode is timed as a page uses it (`live_answers`, `--live` sessions, 20 by default):
live sessions of the pop model at 100 BPM, each fed two played bars and then a bar that asks for
an answer of two bars; the time is from posting that bar to the stream's first answer note (its
median is printed; a first session, which warms the model up, is not counted).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.common import cpu_name
from musegen import schemas
from musegen.studio.live import LIVE_EVENT
from musegen.studio.server import STUDIO_EVENT

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "pop_progression.mid"
SESSION = "0" * 32
OTHER_SESSION = "1" * 32  # the second of two concurrent runs


def start_studio(out: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "musegen", "studio", "--port", "0", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = server.stdout.readline()
    found = re.search(r"http://\S+/", line)
    if not found:
        server.kill()
        raise SystemExit(f"the studio did not start: {line.strip() or server.stderr.read().strip()}")
    return server, found.group(0)


def example_prompt(http: httpx.Client, session: str) -> dict:
    return http.post(f"/api/prompts?session={session}&model=pop&example={EXAMPLE}").json()


def one_run(http: httpx.Client, prompt: dict, bars: int, seed: int, session: str = SESSION) -> tuple[float, float]:
    """(seconds to the first generated note, seconds to the finished run)."""
    continuation = prompt["bars"] * 4 * prompt["ticks_per_beat"]
    request = {"model": "pop", "prompt": prompt["prompt"], "bars": bars, "samples": 1, "seed": seed}
    started, first = time.perf_counter(), None
    with http.stream("POST", f"/api/generate?session={session}", json=request) as response:
        for line in response.iter_lines():
            event = schemas.loads(line, STUDIO_EVENT, "the studio's stream").model_dump()
            if event["event"] == "notes" and first is None:
                if any(note[0] >= continuation for note in event["samples"][0]["notes"]):  # (the new notes)
                    first = time.perf_counter() - started
            elif event["event"] == "error":
                raise SystemExit(event["error"])
            elif event["event"] == "done":
                return first, time.perf_counter() - started
    raise SystemExit("the run ended without a result")


def one_answer(http: httpx.Client, seed: int) -> float:
    """Seconds from posting the bar that asks for an answer to the first answer note's event."""
    started = http.post(f"/api/live?session={SESSION}", json={"model": "pop", "bpm": 100, "seed": seed})
    live = started.json()["live"]
    bar, beat = started.json()["bar_ticks"], started.json()["tpq"]
    chords = ((60, 64, 67), (62, 65, 69), (59, 62, 67))
    for k, pitches in enumerate(chords):  # crotchets a little off the beat, as played; the third bar asks
        notes = [[k * bar + i * beat + 17, k * bar + i * beat + 300, p, 90] for i, p in enumerate(pitches)]
        body = {"bar": k, "notes": notes, "answer": 2 if k == len(chords) - 1 else 0}
        sent, first = time.perf_counter(), None
        with http.stream("POST", f"/api/live/{live}/bar?session={SESSION}", json=body) as response:
            for line in response.iter_lines():
                event = schemas.loads(line, LIVE_EVENT, "the live stream").model_dump()
                if event["event"] == "error":
                    raise SystemExit(event["error"])
                if event["event"] == "notes" and first is None:
                    first = time.perf_counter() - sent
    http.post(f"/api/live/{live}/stop?session={SESSION}")
    return first


def live_answers(url: str, sessions: int) -> list[float]:
    """The play-along mode's answer latencies, in seconds: see the module's docstring."""
    with httpx.Client(base_url=url, timeout=600) as http:
        one_answer(http, 0)  # warms the model up
        return [one_answer(http, seed) for seed in range(1, sessions + 1)]


def print_live(times: list[float]) -> None:
    # the page posts a bar half a grid cell (a 32nd note) before its line: 75 ms before it at 100 BPM
    median, early = statistics.median(times) * 1000, 60_000 / 100 / 8
    print(f"\nmusegen studio live, pop model, 100 BPM; {cpu_name()}, {os.cpu_count()} cores")
    print(f"bar posted to the first answer note, median of {len(times)}: {median:.0f} ms", end=" ")
    fastest, slowest = min(times) * 1000, max(times) * 1000
    print(f"(fastest {fastest:.0f}, slowest {slowest:.0f}); from the bar line: {median - early:.0f} ms")


def first_note_and_total(url: str, bars: int, runs: int) -> None:
    """One run after another: the first note's and the whole run's seconds."""
    with httpx.Client(base_url=url, timeout=600) as http:
        prompt = example_prompt(http, SESSION)
        times = [one_run(http, prompt, bars, seed) for seed in range(runs)]
    print(f"musegen studio, pop model, {EXAMPLE}, {bars} bars, 1 sample; {cpu_name()}, {os.cpu_count()} cores")
    print(f"{'run':<24}{'first note (s)':>16}{f'{bars} bars (s)':>14}")
    print(f"{'first (starts a worker)':<24}{times[0][0]:>16.2f}{times[0][1]:>14.2f}")
    if len(times) > 1:
        rest = times[1:]
        first, total = statistics.median(t[0] for t in rest), statistics.median(t[1] for t in rest)
        print(f"{f'median of {len(rest)} more':<24}{first:>16.2f}{total:>14.2f}")


def worker_cpu_seconds(server_pid: int) -> float:
    """CPU seconds (user + system) used so far by the studio's worker processes: every process
    below the server, whichever of its threads started it (Linux /proc)."""
    own = 0.0
    for children in Path(f"/proc/{server_pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            own += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + worker_cpu_seconds(int(pid))
    return own


def concurrent_runs(url: str, server_pid: int, bars: int, pairs: int) -> None:
    """The same request alone, then twice at once (two sessions), in turn, with an alone run after
    the last pair: each concurrent run's seconds against the mean of the alone runs just before and
    just after it (this virtual machine's speed drifts by a third within minutes), and the CPU
    seconds the workers used against the seconds the runs took (a run that waited on the other
    would take longer than its CPU time)."""
    sessions, load_before = (SESSION, OTHER_SESSION), os.getloadavg()[0]
    clients = [httpx.Client(base_url=url, timeout=600) for _ in sessions]
    try:
        prompts = [example_prompt(http, session) for http, session in zip(clients, sessions)]

        def run(i: int) -> float:
            return one_run(clients[i], prompts[i], bars, seed=0, session=sessions[i])[1]

        alone, together, cpu = [], [], []
        with ThreadPoolExecutor(len(sessions)) as pool:
            list(pool.map(run, range(2)))  # each worker's first run, untimed
            alone.append(run(0))
            for _ in range(pairs):
                before = worker_cpu_seconds(server_pid)
                together.append(list(pool.map(run, range(2))))
                cpu.append(worker_cpu_seconds(server_pid) - before)
                alone.append(run(0))
    finally:
        for http in clients:
            http.close()
    print(f"\ntwo runs at once, the same request ({bars} bars, 1 sample, seed 0), from two sessions; {cpu_name()}")
    print(f"load average (1 min) {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'':<8}{'alone before, after (s)':>25}{'run A, B (s)':>15}{'A, B / alone':>14}{'CPU / wall':>19}")
    ratios = []
    for i, (a, b) in enumerate(together):
        reference = (alone[i] + alone[i + 1]) / 2
        ratios += [a / reference, b / reference]
        print(
            f"{f'pair {i + 1}':<8}{f'{alone[i]:.2f}, {alone[i + 1]:.2f}':>25}{f'{a:.2f}, {b:.2f}':>15}"
            f"{f'{a / reference:.2f}, {b / reference:.2f}':>14}{cpu[i] / (a + b):>19.2f}"
        )
    print(
        f"concurrent / alone: median {statistics.median(ratios):.2f}x, slowest {max(ratios):.2f}x; "
        f"alone runs {min(alone):.2f} to {max(alone):.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bars", type=int, default=12)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--pair-bars", type=int, default=8, help="bars of each run of the concurrent part")
    parser.add_argument("--pairs", type=int, default=6, help="times alone, and pairs at once (0: skip the part)")
    parser.add_argument("--live", type=int, default=20, help="play-along answers to time (0: skip the part)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        server, url = start_studio(Path(out))
        try:
            first_note_and_total(url, args.bars, args.runs)
            if args.pairs:
                concurrent_runs(url, server.pid, args.pair_bars, args.pairs)
            if args.live:
                print_live(live_answers(url, args.live))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
