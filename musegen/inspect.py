"""`musegen inspect`: what a checkpoint's positional encoding and attention do, as PNGs and a CSV.

One call writes into the output folder:
- `templates.png` (SPE only): learned positional templates P_d(m, n) estimated from layer 1's
  codes for the strongest features of each head, and the kernel against lag: the module's
  analytic P_d, the estimate from the codes, and every layer's gated kernel (1 - g) P_d + g;
- `gates.png` (gated SPE): g per layer, head and feature;
- `attention_maps.png`: layers 1, 3, middle and last on a sequence the model generated to 1.5x its
  training length (causal attention, each row over its max, log colour scale);
- `probes.png`: the first layer's un-normalised attention against distance on identical tokens;
- `sparsity.png`: S per layer and head on real validation pieces (or the generated sequence);
- `summary.csv` (section, quantity, layer, head, detail, value) and `inspect.json` (arguments).
What does not apply to a model (templates without SPE) is skipped with a one-line note.
Layers and heads are numbered from 1 in every output. The measurements themselves live in
`musegen.metrics.attention`; this module runs them on a checkpoint and draws them.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import load_checkpoint
from .device import resolve_device
from .errors import ConfigError, DataError
from .generation.loop import generate
from .generation.prompt import Prompt
from .generation.settings import SampleSettings
from .io import write_json, write_text
from .metrics import attention as att
from .plots import pyplot, save_png
from .shards import Shards

COLUMNS = ("section", "quantity", "layer", "head", "detail", "value")
MAX_TEMPLATE_SPAN = 256  # positions shown in a template image
MAX_PROBE_WINDOW = 64  # keys (distances 0..window-1) per probed query
PROBE_TOKENS = 3  # identical-token sequences probed, spread over the vocabulary
MAP_PIXELS = 512  # most pixels per side of one attention map in the PNG


def shown_layers(n_layers: int) -> list[int]:
    """0-based indices of layers 1, 3, middle and last (duplicates dropped)."""
    return sorted({i for i in (0, 2, n_layers // 2, n_layers - 1) if i < n_layers})


def _row(
    section: str, quantity: str, value: float, layer: int | None = None, head: int | None = None, detail: str = ""
) -> dict[str, Any]:
    return {
        "section": section,
        "quantity": quantity,
        "layer": "" if layer is None else layer + 1,
        "head": "" if head is None else head + 1,
        "detail": detail,
        "value": float(value),
    }


# --- sections ------------------------------------------------------------------------------


def template_section(model, train_len: int, out: Path, seed: int) -> list[dict]:
    spe, gates = model.spe, att.gate_values(model)
    span = min(MAX_TEMPLATE_SPAN, train_len)
    with torch.no_grad():
        kernel = spe.kernel(torch.arange(span, dtype=torch.float32)).cpu()  # [H, D, span]
        pairs = att.strongest_features(kernel[..., 0], per_head=max(1, 8 // spe.n_heads))
        generator = torch.Generator(device=model.device).manual_seed(seed)
        codes = spe.codes(spe.draw_noise(generator), 0, span)
        first = model.layers[0].attention.spe_filter
        if gates is not None:
            codes = first.gated_codes(codes, first.draw_noise(generator))
        templates = att.code_templates(spe.code_scale, codes, pairs).cpu()
    estimated = att.diagonal_means(templates, span)
    heads, feats = [h for h, _ in pairs], [d for _, d in pairs]
    target = kernel[heads, feats]  # [P, span]
    if gates is None:
        per_layer = target[None]  # [layers, P, span]: the kernel each layer really uses
    else:
        g = gates[:, heads, feats, None].cpu()
        per_layer = (1 - g) * target + g

    rows = []
    for p, (h, d) in enumerate(pairs):
        rms = per_layer[0, p].pow(2).mean().sqrt().clamp_min(1e-12)
        error = (estimated[p] - per_layer[0, p]).pow(2).mean().sqrt() / rms
        rows.append(_row("template", "relative_rms_error_codes_vs_kernel", error, 0, h, f"feature {d + 1}"))

    plt = pyplot()
    fig, axes = plt.subplots(2, len(pairs), figsize=(2.6 * len(pairs), 5.4), squeeze=False)
    lags = np.arange(span)
    for p, (h, d) in enumerate(pairs):
        top, bottom = axes[0][p], axes[1][p]
        image = templates[p].numpy()
        limit = float(np.abs(image).max()) or 1.0
        top.imshow(image, cmap="RdBu_r", vmin=-limit, vmax=limit)
        top.set_title(f"head {h + 1}, feature {d + 1}", fontsize=8)
        top.set_xlabel("key n", fontsize=7)
        top.set_ylabel("query m", fontsize=7)
        for layer in range(1, per_layer.shape[0]):
            bottom.plot(lags, per_layer[layer, p].numpy(), color="0.75", lw=0.6)
        bottom.plot(lags, target[p].numpy(), "k--", lw=1, label="kernel P_d")
        bottom.plot(lags, estimated[p].numpy(), color="C1", lw=1, label="from layer-1 codes")
        if gates is not None:
            bottom.plot(lags, per_layer[0, p].numpy(), color="C0", lw=1, label="layer 1 gated")
        bottom.set_xlabel("lag m - n", fontsize=7)
        bottom.tick_params(labelsize=6)
        top.tick_params(labelsize=6)
    axes[1][0].legend(fontsize=6, loc="upper right")
    fig.suptitle(f"positional templates ({model.config.pe}SPE; grey: gated kernels of layers 2..)", fontsize=9)
    fig.tight_layout()
    save_png(fig, out / "templates.png")

    if gates is not None:
        L, H, D = gates.shape
        for layer in range(L):
            for h in range(H):
                rows.append(_row("gate", "mean_gate", gates[layer, h].mean(), layer, h))
        fig, ax = plt.subplots(figsize=(min(14, 2 + H * D / 16), 1 + 0.3 * L))
        shown = ax.imshow(gates.reshape(L, H * D).cpu().numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis")
        for h in range(1, H):
            ax.axvline(h * D - 0.5, color="w", lw=0.8)
        ax.set_yticks(range(L), [str(i + 1) for i in range(L)], fontsize=6)
        ax.set_ylabel("layer")
        ax.set_xlabel("head x feature (white lines between heads)")
        ax.set_title("gate g: 0 keeps the positional kernel, 1 switches it off", fontsize=9)
        fig.colorbar(shown, ax=ax)
        fig.tight_layout()
        save_png(fig, out / "gates.png")
    return rows


def generated_sequence(model, tokenizer, length: int, seed: int, progress: bool) -> torch.Tensor:

    samples, _ = generate(
        model,
        tokenizer,
        Prompt(np.zeros(0, dtype=np.int64)),
        SampleSettings(length=length, seed=seed),
        model.device,
        progress,
    )
    return torch.as_tensor(samples[0].ids[:length], dtype=torch.long, device=model.device)


def map_section(model, ids: torch.Tensor, train_len: int, out: Path, seed: int) -> list[dict]:
    layers = shown_layers(len(model.layers))
    got = att.capture_scored(model, ids[None], layers, seed)
    attentions = [layer.attention for layer in model.layers]
    T, H = len(ids), model.config.n_heads
    plt = pyplot()
    fig, axes = plt.subplots(len(layers), H, figsize=(2.4 * H, 2.4 * len(layers)), squeeze=False)
    rows = []
    for r, layer in enumerate(layers):
        logits = att.layer_logits(attentions[layer], got[layer])[0]
        maps = att.causal_attention_map(logits)
        row_sparsity = att.causal_row_sparsity(logits)  # query t = index + 1
        for h in range(H):
            ax = axes[r][h]
            # Each row over its own max: long rows are not drowned by their 1/t share of mass.
            relative = maps[h] / maps[h].amax(-1, keepdim=True)
            # Long sequences: max-pool to at most MAP_PIXELS a side so no peak is lost in the PNG.
            block = -(-T // MAP_PIXELS)
            shown = torch.nn.functional.max_pool2d(relative[None], block, ceil_mode=True)[0] if block > 1 else relative
            ax.imshow(
                shown.clamp_min(1e-4).log10().cpu().numpy(),
                vmin=-4,
                vmax=0,
                cmap="magma",
                interpolation="nearest",
                extent=(0, T, T, 0),
            )
            if train_len < T:
                ax.axvline(train_len, color="c", lw=0.6)
                ax.axhline(train_len, color="c", lw=0.6)
            ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=8)
            ax.tick_params(labelsize=6)
            inside, beyond = row_sparsity[h, : train_len - 1], row_sparsity[h, train_len - 1 :]
            rows.append(_row("maps", "sparsity", inside.mean(), layer, h, "within"))
            if len(beyond):
                rows.append(_row("maps", "sparsity", beyond.mean(), layer, h, "beyond"))
    fig.suptitle(
        f"attention on a generated sequence of {T} tokens\n(log10 of each row / its max; "
        f"cyan: training length {train_len})",
        fontsize=9,
    )
    fig.tight_layout()
    save_png(fig, out / "attention_maps.png")
    return rows


def probe_tokens(tokenizer) -> list[int]:
    usable = [t for t in range(tokenizer.vocab_size) if t != tokenizer.pad_id]
    picks = np.linspace(0, len(usable) - 1, PROBE_TOKENS).round().astype(int)
    return sorted({usable[i] for i in picks})


def probe_section(model, tokenizer, train_len: int, length: int, out: Path, seed: int) -> list[dict]:
    window = min(MAX_PROBE_WINDOW, train_len // 2)
    if window < 2:
        raise ConfigError(f"training length {train_len} is too short to probe (needs at least 4)")
    regions = {"within": range(train_len - window, train_len)}
    if length > train_len:
        start = max(train_len, length - window)
        regions["beyond"] = range(start, length)
    results = [
        att.probe_first_layer(model, token, max(length, train_len), regions, window, seed)
        for token in probe_tokens(tokenizer)
    ]
    rows = []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(regions), figsize=(4.2 * len(regions), 3.2), squeeze=False)
    for ax, region in zip(axes[0], regions):
        scores = {
            q: torch.stack([r[region][q] for r in results]).nanmean(0)
            for q in ("translation_invariance", "monotonicity")
        }
        for quantity, per_head in scores.items():
            for h, value in enumerate(per_head):
                rows.append(_row("probe", quantity, value, 0, h, region))
            finite = torch.nan_to_num(per_head, nan=-math.inf)
            best = int(finite.argmax())
            rows.append(_row("probe", f"best_head_{quantity}", per_head[best], 0, best, region))
        profile = torch.stack([r[region]["profile"] for r in results]).mean(0)  # [H, window]
        for h, curve in enumerate(profile):
            ax.plot(
                np.arange(window),
                (curve / curve.max()).cpu().numpy(),
                lw=1,
                label=f"head {h + 1}: TI {scores['translation_invariance'][h]:.2f}, "
                f"mono {scores['monotonicity'][h]:.2f}",
            )
        ax.set_title(f"queries {regions[region].start}..{regions[region].stop - 1} ({region})", fontsize=9)
        ax.set_xlabel("distance to the key")
        ax.set_ylabel("un-normalised attention (/ max)")
        ax.legend(fontsize=6)
    fig.suptitle("layer 1 on identical-token sequences", fontsize=9)
    fig.tight_layout()
    save_png(fig, out / "probes.png")
    return rows


def sparsity_pieces(data: Path, split: str, tokenizer, count: int, train_len: int) -> tuple[list[np.ndarray], str]:

    found, all_pieces = Shards(data).pieces_for(split, tokenizer)
    pieces = [np.asarray(p[:train_len]) for p in all_pieces if len(p) >= 2][:count]
    if not pieces:
        raise DataError(f"{data}: split {found!r} holds no piece of 2 tokens or more")
    return pieces, f"{len(pieces)} {found} piece" + ("s" if len(pieces) > 1 else "")


def sparsity_section(model, pieces: list[np.ndarray], source: str, out: Path, seed: int) -> list[dict]:
    L, H = len(model.layers), model.config.n_heads
    attentions = [layer.attention for layer in model.layers]
    totals = torch.zeros(L, H, dtype=torch.float64)
    rows_seen = 0
    for piece in pieces:
        ids = torch.as_tensor(piece, dtype=torch.long, device=model.device)[None]
        got = att.capture_scored(model, ids, range(L), seed)
        for layer in range(L):
            logits = att.layer_logits(attentions[layer], got[layer])[0]
            totals[layer] += att.causal_row_sparsity(logits).sum(-1).cpu()
        rows_seen += len(piece) - 1
    mean = totals / rows_seen  # every query row of every piece weighs the same
    rows = [_row("sparsity", "sparsity", mean[layer, h], layer, h, source) for layer in range(L) for h in range(H)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * H, 1.2 + 0.3 * L))
    shown = ax.imshow(mean.numpy(), aspect="auto", cmap="viridis_r", vmin=0, vmax=1)
    if L * H <= 64:
        for layer in range(L):
            for h in range(H):
                ax.text(h, layer, f"{mean[layer, h]:.2f}", ha="center", va="center", fontsize=6, color="w")
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=6)
    ax.set_yticks(range(L), [str(i + 1) for i in range(L)], fontsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"sparsity S (lower is sparser)\n{source}", fontsize=8)
    fig.colorbar(shown, ax=ax)
    fig.tight_layout()
    save_png(fig, out / "sparsity.png")
    return rows


# --- the job -------------------------------------------------------------------------------


def write_rows(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row | {"value": f"{row['value']:.6g}"})
    write_text(path, buffer.getvalue())


def _lengths(checkpoint, config, meta: dict, train_len: int | None, length: int | None, pieces: int):
    """(training length, generated length, notes on what was changed), each checked."""
    train_len = int(train_len or meta.get("train_len") or 0)
    if train_len < 4:
        raise ConfigError(f"{checkpoint}: no training length in its metadata; give --train-len (at least 4)")
    notes = []
    length = int(length or (3 * train_len) // 2)
    limit = config.max_positions
    if limit is not None and length >= limit:  # the generated sequence also holds its first token
        notes.append(
            f"length cut from {length} to {limit - 1}: {config.attention} attention reads at most "
            f"max_len={limit} positions"
        )
        length = limit - 1
    if length < 2:
        raise ConfigError(f"--length must be at least 2, got {length}")
    if pieces < 1:
        raise ConfigError(f"--pieces must be at least 1, got {pieces}")
    return train_len, length, notes


def inspect_checkpoint(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    length: int | None = None,
    data: str | os.PathLike | None = None,
    split: str = "valid",
    pieces: int = 4,
    seed: int = 0,
    train_len: int | None = None,
    device: str = "auto",
    progress: bool = False,
) -> dict[str, Any]:
    """Write every figure and `summary.csv` for one checkpoint; returns the headline numbers."""

    started = time.perf_counter()
    model, tokenizer, config, meta = load_checkpoint(checkpoint, device=resolve_device(device))
    train_len, length, notes = _lengths(checkpoint, config, meta, train_len, length, pieces)
    if data is not None:  # fail on bad data before the slow parts
        measured, source = sparsity_pieces(Path(data), split, tokenizer, pieces, train_len)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    rows: list[dict] = []
    if model.spe is not None:
        rows += template_section(model, train_len, out, seed)
    else:
        notes.append(f"no positional templates or gates: pe={config.pe} ({config.attention} attention) has no SPE")
    generated = generated_sequence(model, tokenizer, length, seed, progress)
    rows += map_section(model, generated, train_len, out, seed)
    rows += probe_section(model, tokenizer, train_len, length, out, seed)
    if data is None:
        measured, source = [generated[:train_len].cpu().numpy()], "the generated sequence"
    rows += sparsity_section(model, measured, source, out, seed)
    write_rows(out / "summary.csv", rows)
    written = ["templates.png"] if model.spe is not None else []  # what this run wrote, not stale files
    written += ["gates.png"] if att.gate_values(model) is not None else []
    written += ["attention_maps.png", "probes.png", "sparsity.png", "summary.csv"]

    best = {
        f"{r['quantity'][len('best_head_') :]}_{r['detail']}": {"head": r["head"], "value": r["value"]}
        for r in rows
        if r["quantity"].startswith("best_head_")
    }
    result = {
        "checkpoint": str(checkpoint),
        "pe": config.pe,
        "train_len": train_len,
        "length": length,
        "sparsity_source": source,
        "best_heads": best,
        "seconds": round(time.perf_counter() - started, 2),
        "files": written,
        "notes": notes,
    }
    write_json(
        out / "inspect.json",
        {
            "arguments": {
                "checkpoint": str(checkpoint),
                "length": length,
                "data": None if data is None else str(data),
                "split": split,
                "pieces": pieces,
                "seed": seed,
                "train_len": train_len,
            },
            "result": result,
        },
    )
    return result
