"""Give some heads of a beats checkpoint's sineSPE a kernel that peaks once a bar: their first
HARMONICS sines turn at 1/4, 2/4, ... cycles a beat (4/4 bars) with no phase offset, so the kernel
favours keys a whole number of bars back, by position alone. The other sines, heads and tensors
are the checkpoint's. A starting point to test positions in musical time without training the
kernel from scratch (a fine-tune at lr 1e-4 moves sineSPE's parameters by about 0.001).
    python scripts/experiments/bar_kernel.py CHECKPOINT OUT HEADS HARMONICS    (e.g. 2 4)
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from musegen import schemas
from musegen.checkpoint_format import CHECKPOINT_CONFIG

source, out = Path(sys.argv[1]), Path(sys.argv[2])
heads, harmonics = int(sys.argv[3]), int(sys.argv[4])
model = schemas.read(source / "config.json", CHECKPOINT_CONFIG).model_dump()["model"]
if model["positions"] != "beats" or model["pe"] != "sine":
    sys.exit(f"{source}: needs a sineSPE model whose positions are beats")
weights = load_file(source / "model.safetensors")
freqs, offsets = weights["spe.freqs"].clone(), weights["spe.offsets"].clone()  # [H, D, K]
per_position = torch.arange(1, harmonics + 1, dtype=torch.float64) / 4 / model["positions_per_beat"]
half = (2 * per_position).clamp(max=1 - 1e-6)  # sigmoid(param) / 2 is the frequency in cycles a position
freqs[:heads, :, :harmonics] = torch.log(half / (1 - half)).to(freqs.dtype)
offsets[:heads, :, :harmonics] = 0
shutil.copytree(source, out, dirs_exist_ok=True)
save_file({**weights, "spe.freqs": freqs.contiguous(), "spe.offsets": offsets.contiguous()}, out / "model.safetensors")
print(f"{out}: {source} with heads 0..{heads - 1} turning at 1..{harmonics} quarters of a cycle a beat")
