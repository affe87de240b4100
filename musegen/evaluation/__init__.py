"""Measurements of models and music.

- `metric`: the interface every span metric follows (`Metric`, `Span`, `measure`, the statistics);
- metrics (the math; none imports another, only `metric`): `span` (a continuation
  span's notes, polyphony, pitch and groove; per role), `style` (style profiles and their
  similarity per quarter), `copy_score` (how exactly a bar repeats a loop), `loss` (NLL per
  position and per token type), `attention` (inside a model);
- `report`: every table and figure;
- runners (load checkpoints, sample, read files, call metrics and `report`): `run_continuation`,
  `run_copy`, `run_loss`, `run_style`; `compare` and `targets` read runners' outputs.

A new span metric: a `Metric` subclass in a metric module, added to `run_continuation.METRICS`
(or passed to `evaluate_continuation(..., metrics=...)`), described in docs/evaluation.md.
"""
