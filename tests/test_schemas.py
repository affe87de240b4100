"""Every file musegen reads is checked against its declared schema: a `schemas.Format` that the
module owning the file declares (musegen/schemas.py holds the machinery and the registry).

- The red team's hostile-but-valid cases that once went wrong (a checkpoint trusted field by
  field, settings that passed validation and failed later), each through the real command in a
  subprocess under a memory cap (2 GB) and a time limit: one line, exit 2, within 20 s of CPU.
- The list of readers: no module parses JSON or YAML but through the schemas.
- Where formats live: each declared once, by its own module, never in schemas.py, which imports
  nothing of musegen but errors and io (so not torch).
- Property tests: files built from each format's schema, made hostile (wrong types, extreme
  numbers, deep nesting, huge counts), read by the real reader: a FormatError of one line naming
  the file, or a result, never another exception, within a time bound.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import extreme
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from test_extreme import musegen
from test_fuzz import time_limit
from test_layout import imported_modules
from tiny_models import tiny_checkpoint
from train_fixtures import prepare_pop909, tiny_run

from musegen import mirex, schemas
from musegen.checkpoint import load_checkpoint
from musegen.errors import FormatError, MusegenError
from musegen.generation.outputs import SAMPLE_SUMMARY
from musegen.model.config import preset
from musegen.model.transformer import BF16, FP32
from musegen.shards import Shards
from musegen.tokenizers import Tokenizer, load_tokenizer, tokenizer_from_dict
from musegen.tokenizers.base import NoSettings

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("musegen", "data_prep") for p in (REPO / folder).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


for _path in SOURCES:  # every module that may declare a format, so that `schemas.FORMATS` holds them all
    if _path.name != "__main__.py":
        importlib.import_module(_module_name(_path))
# A refusal costs the command at most 20 s of CPU time (user + system: what it computes, however
# loaded the machine is; 3-6 s measured, half of it importing torch), and the wall clock at most
# 60 s (a hang, with room for waiting on the shared 2-core machine's other work).
REFUSAL_CPU_S = 20
TIME_LIMIT_S = 60


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint("remi", tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def data(pop909_songs, tmp_path_factory) -> Path:
    return prepare_pop909(pop909_songs[:3], tmp_path_factory.mktemp("data"))


# ---- the red team's cases ----------------------------------------------------------------------------


def _edit(name: str, edit):
    def apply(folder: Path):
        path = folder / name
        path.write_text(edit(path.read_text()))

    return apply


def _json_edit(name: str, edit):
    def change(text: str) -> str:
        data = json.loads(text)
        edit(data)
        return json.dumps(data)

    return _edit(name, change)


def _huge_weights(folder: Path):
    path = folder / "model.safetensors"
    save_file(
        {k: torch.full_like(v, 1e20) if v.is_floating_point() else v for k, v in load_file(str(path)).items()},
        str(path),
    )


CHECKPOINT_CASES = {  # name: (edit, words of the one line, exit code)
    "tokenizer kind a list": (_json_edit("tokenizer.json", lambda d: d.update(kind=["remi"])), "kind", 2),
    "tokenizer pitch_range an int": (
        _json_edit("tokenizer.json", lambda d: d["settings"].update(pitch_range=5)),
        "pitch_range",
        2,
    ),
    "tokenizer tempo infinite": (
        _edit("tokenizer.json", lambda t: t.replace('"tempos": [', '"tempos": [Infinity, ')),
        "tempos.0",
        2,
    ),
    "tokenizer max_duration 1e8": (
        _json_edit("tokenizer.json", lambda d: d["settings"].update(max_duration=10**8)),
        "max_duration",
        2,
    ),
    "tokenizer vocabulary of numbers": (
        _json_edit("tokenizer.json", lambda d: d.update(vocab=list(range(3)))),
        "vocab.0",
        2,
    ),
    "config n_features negative": (
        _json_edit("config.json", lambda d: d["model"].update(n_features=-2)),
        "n_features",
        2,
    ),
    "config meta a list": (_json_edit("config.json", lambda d: d.update(meta=[1, 2])), "meta", 2),
    "config meta a string": (_json_edit("config.json", lambda d: d.update(meta="x")), "meta", 2),
    "weights finite but huge": (_huge_weights, "no finite mass", 2),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_hostile_checkpoint_is_one_line(case, checkpoint, tmp_path):
    edit, words, code = CHECKPOINT_CASES[case]
    folder = shutil.copytree(checkpoint, tmp_path / "ckpt")
    edit(folder)
    run = musegen("sample", "-c", folder, "--length", 8, "--seed", 0, "--out", tmp_path / "out", timeout=TIME_LIMIT_S)
    errors = [line.split("\r")[-1] for line in run.stderr.splitlines() if "error:" in line]  # (after a cleared bar)
    assert not run.timed_out and run.rc == code and len(errors) == 1 and words in errors[0], run.stderr[-800:]
    assert run.cpu_seconds < REFUSAL_CPU_S, run.cpu_seconds
    assert errors[0].startswith("error:")
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists() or not any(
        p for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")
    )


TINY = tiny_run(steps=1)


def _huge_yaml(tmp_path: Path) -> list:
    (tmp_path / "huge.yaml").write_text("model:\n  n_layers: 256\n  d_model: 16384\n  n_heads: 16\n  d_ff: 65536\n")
    return ["--config", tmp_path / "huge.yaml"]


def _alias_bomb_yaml(tmp_path: Path) -> list:
    """Nine lines that stand for 9^8 (43 million) strings through nested aliases."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
    (tmp_path / "aliases.yaml").write_text("\n".join(lines) + "\nmodel:\n  n_layers: *a7\n")
    return ["--config", tmp_path / "aliases.yaml"]


SETTING_CASES = {  # name: (arguments after `train --data D --out O`, words)
    "n_features 0": (lambda tmp: ["--set", "model.n_features=0"], "n_features"),
    "spe_realizations 1e8": (lambda tmp: ["--set", "model.spe_realizations=100000000"], "spe_realizations"),
    "a YAML of a huge model": (_huge_yaml, "GiB"),
    "a YAML of nested aliases": (_alias_bomb_yaml, "more than 100,000 values with its aliases expanded"),
}


@pytest.mark.parametrize("case", list(SETTING_CASES))
def test_training_settings_are_refused_before_anything_is_built(case, data, tmp_path):
    make, words = SETTING_CASES[case]
    run = musegen("train", "--data", data, "--out", tmp_path / "run", *TINY, *make(tmp_path), timeout=TIME_LIMIT_S)
    assert not run.timed_out and run.rc == 2 and len(run.errors) == 1 and words in run.errors[0], run.stderr[-800:]
    assert run.cpu_seconds < REFUSAL_CPU_S, run.cpu_seconds
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_million_samples_of_a_prompt_are_refused_at_once(checkpoint, pop909_songs, tmp_path):
    run = musegen(
        "sample",
        "-c",
        checkpoint,
        "--prompt",
        pop909_songs[0],
        "--num-samples",
        10**6,
        "--length",
        8,
        "--out",
        tmp_path / "out",
        timeout=TIME_LIMIT_S,
    )
    assert not run.timed_out and run.rc == 2 and len(run.errors) == 1, run.stderr[-800:]
    assert run.cpu_seconds < REFUSAL_CPU_S, run.cpu_seconds
    assert re.search(r"--num-samples 1000000 needs about [\d,.]+ GiB but cpu has [\d,.]+ GiB", run.errors[0])


def test_a_thousand_tracks_of_a_million_notes_are_refused_before_fluidsynth(tmp_path):
    tracks = [
        extreme.track([(0, extreme.on(36 + i % 60, channel=i % 16)), (120, extreme.off(36 + i % 60, i % 16))] * 1000)
        for i in range(1000)
    ]
    (tmp_path / "dense.mid").write_bytes(extreme.smf(tracks))
    run = musegen("render", tmp_path / "dense.mid", "--out", tmp_path / "dense.wav", timeout=TIME_LIMIT_S)
    assert (
        not run.timed_out
        and run.rc == 2
        and run.errors
        == [
            f"error: {tmp_path / 'dense.mid'}: 1,000,000 notes; render plays at most 250,000 "
            "(FluidSynth's time grows with the notes it starts)"
        ]
    )
    assert run.cpu_seconds < REFUSAL_CPU_S, run.cpu_seconds
    assert not (tmp_path / "dense.wav").exists()


# ---- every reader goes through the schemas -----------------------------------------------------------

PARSERS = re.compile(r"\bjson\.loads?\(|\byaml\.(safe_)?load\(|\bread_json\(|\bparse_json\(|\brequest\.json\(")


def test_no_module_parses_json_or_yaml_but_through_the_schemas():
    """json/yaml parsing appears in io.py (the bounded parser) and schemas.py (which checks what
    it parses) only; a new reader that calls json.loads directly, or a web handler that parses a
    request's body itself (`request.json()`), fails here."""
    readers = {}
    sources = sorted(
        p for folder in ("musegen", "data_prep", "bench", "scripts") for p in (REPO / folder).rglob("*.py")
    )
    for path in sources:
        hits = [
            i + 1
            for i, line in enumerate(path.read_text().splitlines())
            if PARSERS.search(line) and not line.lstrip().startswith(("def ", "#"))
        ]
        if hits:
            readers[path.relative_to(REPO).as_posix()] = hits
    assert set(readers) == {"musegen/io.py", "musegen/schemas.py"}, readers


def _declarations(path: Path) -> list[str]:
    """The names of the formats a source file declares (`schemas.Format("name", ...)` calls)."""
    calls = [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Call)]
    return [
        call.args[0].value
        for call in calls
        if "Format" in (getattr(call.func, "attr", None), getattr(call.func, "id", None))
        and call.args
        and isinstance(call.args[0], ast.Constant)
    ]


def test_every_format_is_declared_once_by_its_own_module_and_every_tokenizer_kind_has_its_settings():
    declared = {path.relative_to(REPO).as_posix(): _declarations(path) for path in SOURCES}
    names = [name for found in declared.values() for name in found]
    assert sorted(names) == sorted(schemas.FORMATS), "each registered format is declared once, in the sources"
    assert declared["musegen/schemas.py"] == []
    assert all(name == fmt.name for name, fmt in schemas.FORMATS.items())
    with_settings = [cls for cls in Tokenizer.registry.values() if len(inspect.signature(cls.__init__).parameters) > 1]
    assert all(cls.settings_schema is not NoSettings for cls in with_settings), with_settings


def test_the_schemas_machinery_imports_nothing_of_musegen_but_errors_and_io():
    """So any module may declare its formats, and reading a file loads no model (nor torch)."""
    assert imported_modules("musegen.schemas") <= {"musegen", "musegen.errors", "musegen.io"}
    check = "import sys, musegen.schemas; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


# ---- property tests: hostile files built from the schemas ----------------------------------------------

HOSTILE = st.one_of(
    st.sampled_from(
        [None, True, "", "x" * 10_000, [], {}, -1, 0, 2**31, 2**63, 10**30, -(10**30), 1e308, -1e308, 0.5, 1e-300]
    ),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=4),
    st.integers(2, 60).map(lambda n: json.loads("[" * n + "]" * n)),  # deep nesting within the parser's bound
    st.integers(10**5, 10**6).map(lambda n: [0] * n),  # huge counts
)
TEXT_HOSTILE = st.sampled_from(["Infinity", "-Infinity", "NaN", "1e400", "-1e400", "[" * 70 + "]" * 70])


def field_paths(value, schema_fields: set[str], prefix=()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indices, the first three items of a list),
    and the schema's own field names at the top level even when the value lacks them."""
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key in value:
            paths += field_paths(value[key], set(), prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):
            paths += field_paths(item, set(), prefix + (i,))
    return paths + [(name,) for name in schema_fields if not prefix and name not in (value or {})]


def put(value, path: tuple, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return copy


def schema_fields(format_name: str) -> set[str]:
    schema = schemas.FORMATS[format_name].schema
    return set(getattr(schema, "model_fields", {}))


def hostile_files(format_name: str, baseline):
    """(JSON text) strategy: the baseline with one field replaced by a hostile value, or by a
    number the JSON text itself makes extreme (Infinity, 1e400), or nested past the bound."""
    paths = field_paths(baseline, schema_fields(format_name))
    as_value = st.tuples(st.sampled_from(paths), HOSTILE).map(lambda pv: json.dumps(put(baseline, *pv)))
    as_text = st.tuples(st.sampled_from(paths), TEXT_HOSTILE).map(
        lambda pt: json.dumps(put(baseline, pt[0], "@@")).replace('"@@"', pt[1])
    )
    return st.one_of(as_value, as_text)


def refused_or_read(read, path: Path) -> str:
    """ "read" when `read(path)` returns, "refused" when it raises a MusegenError of one line
    naming the file; anything else (another exception, a hang) fails."""
    try:
        with time_limit(TIME_LIMIT_S):
            read(path)
    except MusegenError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1 and message.strip()
        if isinstance(exc, FormatError):
            assert path.name in message, message
        return "refused"
    return "read"


PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _sample_summary(checkpoint: Path, out: Path) -> Path:
    from musegen.generation.batch import sample_to_folder
    from musegen.generation.settings import SampleSettings

    sample_to_folder(checkpoint, out, SampleSettings(length=8, seed=0, num_samples=2), None, progress=False)
    return out / "sample" / "sample.json"


def _read_checkpoint(config: Path):
    return load_checkpoint(config.parent)


def _read_sample_summary(path: Path):
    from musegen.generation.outputs import is_set  # what a rerun reads to decide whether to replace the set

    schemas.read(path, SAMPLE_SUMMARY)
    return is_set(path.parent, path.stem)


READERS = {  # format: (file name inside its folder, the real reader of that file)
    "checkpoint config": ("config.json", _read_checkpoint),
    "tokenizer": ("tokenizer.json", load_tokenizer),
    "shard index": ("index.json", lambda path: Shards(path.parent).pieces("train")),
    "mirex prompt": ("prompt.json", mirex.read_prompt),
    "sample summary": ("sample.json", _read_sample_summary),
}


@pytest.fixture(scope="module")
def baselines(checkpoint, data, tmp_path_factory) -> dict[str, Path]:
    """A real file of each format, in a folder its reader can use."""
    out = tmp_path_factory.mktemp("baselines")
    mirex_file = out / "mirex" / "prompt.json"
    mirex_file.parent.mkdir()
    mirex_file.write_text(
        json.dumps({"prompt": [{"start": 4 * i, "pitch": 60 + i % 12, "duration": 2} for i in range(16)]})
    )
    return {
        "checkpoint config": checkpoint / "config.json",
        "tokenizer": checkpoint / "tokenizer.json",
        "shard index": data / "index.json",
        "mirex prompt": mirex_file,
        "sample summary": _sample_summary(checkpoint, out / "sample"),
    }


@pytest.mark.parametrize("format_name", list(READERS))
def test_hostile_files_of_each_format_are_refused_in_one_line_or_read(format_name, baselines, tmp_path):
    name, read = READERS[format_name]
    original = baselines[format_name]
    folder = tmp_path / "copy"
    shutil.copytree(original.parent, folder)
    baseline = json.loads(original.read_text())
    read(folder / name)  # the baseline itself reads

    outcomes = []

    @PROPERTY_SETTINGS
    @given(text=hostile_files(format_name, baseline))
    def check(text):
        (folder / name).write_text(text)
        outcomes.append(refused_or_read(read, folder / name))

    check()
    assert "refused" in outcomes, outcomes  # the generator does reach the schema's refusals


CHECK_ONLY = {  # formats whose real file needs a training run: the schema alone, on a built value
    "training state": {
        "step": 3,
        "nonfinite_total": 0,
        "nonfinite_streak": 0,
        "tokens_seen": 96,
        "optimizer": {"param_groups": [{"lr": 1e-4}]},
        "scheduler": {"last_epoch": 3},
    },
    "train settings": {"steps": 10, "model": {"n_layers": 2}},
    "log record": {"step": 1, "loss": 5.5},
    "run record": {"config": {"steps": 10, "seq_len": 64, "lr": 2e-4}, "command": "train", "world_size": 1},
    "piece record": {"piece": "001", "real": {}},
    "zenodo record": {"files": [{"key": "a.zip", "checksum": "md5:00", "links": {"self": "https://x"}}]},
    "mma styles": {
        "mma_version": "21.09",
        "styles": [{"family": "stdlib/bossanova", "groove": "BossaNova", "tempo": 120, "swings": True}],
        "fills": {"stdlib/bossanova": ["BossaNovaFill"]},
    },
    "evaluation settings": {"bars": 12, "seed": 0},
    "layout stamp": {"version": 2},
    "mirex generation": {"generation": [{"start": 80, "pitch": 60, "duration": 4}]},
    "studio event": {"event": "notes", "progress": 0.5, "samples": [{"from": 0, "notes": [[0, 480, 60, 0]]}]},
    "studio request": {"model": "pop", "prompt": "0123456789ab", "bars": 8, "samples": 2, "temperature": 1.2},
    "studio live start": {"model": "pop", "mode": "answer", "bpm": 100, "meter": "4/4", "program": 0, "answer_bars": 2},
    "studio live bar": {"bar": 1, "notes": [[1920, 2300, 60, 90]], "answer": 2, "accompany": False},
    "studio live event": {"event": "notes", "notes": [[3840, 4320, 60, 90, 0, 0]]},
    "piece counts": {"notes": 120, "count_in_notes": 8},
    "precision cache": {
        "cpu; model": {"path": "bf16-step.c", "seconds": {"fp32": 0.02, "bf16": 0.01}, "date": "2026-11-25"}
    },
    "copy result": {
        "settings": {"bars": 4},
        "table": [{"name": "m", "scored": 2, "mean": 0.5}],
        "models": {"m": {"checkpoint": "checkpoints/groove"}},
    },
}


def test_every_format_has_a_property_test():
    assert set(READERS) | set(CHECK_ONLY) == set(schemas.FORMATS)


@pytest.mark.parametrize("format_name", list(CHECK_ONLY))
def test_hostile_values_of_each_format_are_refused_in_one_line_or_accepted(format_name, tmp_path):
    baseline = CHECK_ONLY[format_name]
    schemas.check(baseline, schemas.FORMATS[format_name], "f.json")

    outcomes = []

    @PROPERTY_SETTINGS
    @given(text=hostile_files(format_name, baseline))
    def check(text):
        (tmp_path / "f.json").write_text(text)
        outcomes.append(
            refused_or_read(lambda path: schemas.read(path, schemas.FORMATS[format_name]), tmp_path / "f.json")
        )

    check()
    assert "refused" in outcomes, outcomes


def test_a_value_shared_many_times_over_is_refused_in_a_short_line():
    """Parsed YAML can hold one list many times over (JSON cannot): the refusal shows a bounded
    excerpt of the value instead of writing out all of it."""
    nested = ["x"] * 9
    for _ in range(8):
        nested = [nested] * 9  # 9^9 strings, built from 80 lists
    with time_limit(10), pytest.raises(FormatError, match=r"f.json: invalid sample summary: stats: input should"):
        schemas.check({"samples": [], "stats": nested}, SAMPLE_SUMMARY, "f.json")


def test_bounds_hold_at_their_edges():
    """The largest value a declaration allows passes; one more is refused naming the field."""
    for field, largest in {"n_layers": 256, "spe_realizations": 1024, "n_features": 8192, "d_model": 16384}.items():
        assert getattr(preset("tiny", **{field: largest}), field) == largest
        with pytest.raises(FormatError, match=rf"setting {field}: input should be less than or equal to {largest}"):
            preset("tiny", **{field: largest + 2})
    assert tokenizer_from_dict({"kind": "remi", "settings": {"max_duration": 4096}}, "t").max_duration == 4096
    with pytest.raises(
        FormatError,
        match=r"t: invalid remi tokenizer settings: max_duration: input should be less "
        r"than or equal to 4096 \(got 4097\)",
    ):
        tokenizer_from_dict({"kind": "remi", "settings": {"max_duration": 4097}}, "t")


def test_weights_that_bf16_cannot_hold_are_refused_before_sampling_in_bf16(checkpoint):
    """bf16's largest is 3.3895e38; a value rounds to inf from halfway to the next power, 3.3961e38
    (fp32 still holds both). The last value that rounds down samples in bf16; the first that does
    not is refused by name, and still samples in fp32."""
    from musegen.errors import CheckpointError

    model, *_ = load_checkpoint(checkpoint)
    halfway = 2.0**127 * (2 - 2.0**-8)  # between bf16's largest and the next step, which is inf
    below, above = torch.tensor(halfway).nextafter(torch.tensor(0.0)), torch.tensor(halfway)
    assert torch.isfinite(below.to(torch.bfloat16)) and torch.isinf(above.to(torch.bfloat16))
    with torch.no_grad():
        model.head.weight[0, 0] = below
        model.session(1, BF16)
        model.head.weight[0, 0] = above
        with pytest.raises(
            CheckpointError,
            match=r"head.weight holds values up to 3.39618e\+38, beyond the range "
            r"of torch.bfloat16; sample with --precision fp32",
        ):
            model.session(1, BF16)
        model.session(1, FP32)
