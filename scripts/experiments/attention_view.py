"""Write a checkpoint's weights under another attention family that uses the same weights:
a Performer's queries, keys and values read by exact softmax attention (its random-feature
projections left out). An experiment's starting point, e.g. the softmax upper bound of a
fine-tuning comparison at equal compute (docs/experiments/groove-loops).
    python scripts/experiments/attention_view.py CHECKPOINT OUT softmax
"""

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from musegen import schemas
from musegen.io import write_json
from musegen.model.config import ModelConfig
from musegen.model.transformer import MusicPerformer

source, out, attention = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
shutil.copytree(source, out, dirs_exist_ok=True)
config = schemas.read(source / "config.json", "checkpoint config").model_dump()
config["model"]["attention"] = attention
wanted = MusicPerformer(ModelConfig(**config["model"])).state_dict()
weights = load_file(source / "model.safetensors")
save_file({name: tensor for name, tensor in weights.items() if name in wanted}, out / "model.safetensors")
write_json(out / "config.json", config)
print(f"{out}: {source} read with {attention} attention ({len(weights) - len(wanted)} tensors left out)")
