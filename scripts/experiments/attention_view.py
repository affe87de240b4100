"""Write a checkpoint's weights under attention settings that use the same weights: a Performer's
queries, keys and values read by exact softmax attention, by FAVOR+ with more random features, or
by FAVOR+ beside an exact window.
What the new settings draw afresh (the random-feature projections) is the new model's own draw;
every other tensor is the checkpoint's. An experiment's starting point, e.g. the softmax upper
bound of a fine-tuning comparison at equal compute (docs/experiments/groove-loops).
    python scripts/experiments/attention_view.py CHECKPOINT OUT attention=softmax
    python scripts/experiments/attention_view.py CHECKPOINT OUT n_features=256
    python scripts/experiments/attention_view.py CHECKPOINT OUT window=256
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from musegen import schemas
from musegen.checkpoint_format import CHECKPOINT_CONFIG
from musegen.io import write_json
from musegen.model.config import ModelConfig
from musegen.model.transformer import MusicPerformer

source, out, changes = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
config = schemas.read(source / "config.json", CHECKPOINT_CONFIG).model_dump()
for change in changes:
    key, _, value = change.partition("=")
    kind = type(config["model"].get(key, getattr(ModelConfig(), key)))  # (a setting newer than the checkpoint)
    config["model"][key] = kind(value)
torch.manual_seed(0)
fresh = MusicPerformer(ModelConfig(**config["model"])).state_dict()
weights = load_file(source / "model.safetensors")
kept = {name: weights[name] for name in fresh if name in weights and weights[name].shape == fresh[name].shape}
shutil.copytree(source, out, dirs_exist_ok=True)
save_file({name: kept.get(name, fresh[name]).contiguous() for name in fresh}, out / "model.safetensors")
write_json(out / "config.json", config)
print(f"{out}: {source} with {' '.join(changes)} ({len(fresh) - len(kept)} tensors drawn afresh)")
