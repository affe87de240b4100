"""Every model shipped in checkpoints/ loads and continues the example prompt into valid MIDI."""

from pathlib import Path

import pytest

from musegen.checkpoint import load_checkpoint
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
SHIPPED = sorted(p.parent for p in CHECKPOINTS.glob("*/model.safetensors"))
PROMPTS = {
    "remi": CHECKPOINTS / "prompts" / "pop_progression.mid",
    "groove": CHECKPOINTS / "prompts" / "groove_rock.mid",
    "groove-dur": CHECKPOINTS / "prompts" / "groove_rock.mid",
    "song": CHECKPOINTS / "prompts" / "groove_rock.mid",
}


def test_a_pop_and_a_groove_model_are_shipped():
    assert [p.name for p in SHIPPED if p.name in ("groove", "pop")] == ["groove", "pop"]


@pytest.mark.parametrize("folder", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_model_continues_the_example_prompt(folder, tmp_path):
    model, tokenizer, config, meta = load_checkpoint(folder)
    assert (folder / "README.md").is_file(), "a shipped model carries its model card"
    prompt = load_prompt(tokenizer, PROMPTS[tokenizer.kind])
    samples, stats = generate(
        model, tokenizer, prompt, SampleSettings(length=64, num_samples=2, seed=0), progress=False
    )
    assert stats["invalid"] == 0
    for sample in samples:
        assert sample.valid and sample.new_tokens >= 64
        assert list(sample.ids[: len(prompt.ids)]) == list(prompt.ids)
        path = tmp_path / "x.mid"
        path.write_bytes(tokenizer.decode(sample.ids).midi_bytes())
        assert list(tokenizer.encode(path).ids) == list(sample.ids)  # a valid piece, by the grammar
