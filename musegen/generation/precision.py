"""Sampling's precision under "auto": the path the single-token step takes (fp32, PyTorch's bf16,
or bf16 through step.c), timed on the step itself by musegen.precision.

Here, beside its caller, not in the model: the model runs the path it is given and holds no
policy, and musegen.precision, which times and caches, needs nothing of the model.
"""

from __future__ import annotations

from functools import partial

import torch

from ..model.torch_step import PreparedWeights
from ..model.transformer import BF16, STEP_C
from ..precision import Choice, choose, digest
from .resources import probe_onsets


def step_choice(precision: str, model, batch: int, quiet: bool = False) -> Choice:
    """The path of `model`'s single-token steps at `batch` sequences for `precision`: "fp32",
    "bf16" (step.c's where it runs this model, as timed fastest there) or timed for "auto"."""
    paths = model.step_paths()

    def candidates():
        weights = PreparedWeights(model)  # the candidates' own copies: freed once timed
        tokens = torch.zeros(batch, dtype=torch.long, device=model.device)
        sessions = [model.session(batch, path, seed=0, weights=weights) for path in paths]
        beats = probe_onsets(model, batch)
        return {session.path: partial(session.step, tokens, beats) for session in sessions}

    what = f"the step of {digest(model.config.to_dict())} at batch {batch}"
    bf16_path = STEP_C if STEP_C in paths else BF16
    timed = candidates if paths else None  # no fast step: nothing worth timing
    return choose(precision, model.device, what, bf16_path, timed, rounds=(5, 30), budget=1.5, quiet=quiet)
