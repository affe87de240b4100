"""Pure measurements of music and models: no checkpoint loading, no sampling, no training.

- `metric`: the interface every span metric follows (`Metric`, `Span`, `measure`, the statistics);
- the metrics (none imports another, only `metric`): `span` (a continuation span's notes,
  polyphony, pitch and groove; per role), `style` (style profiles and their similarity per
  quarter), `copy_score` (how exactly a bar repeats a loop), `loss` (NLL per position and per
  token type), `attention` (inside a model), `two_sample` (whether a classifier tells two sets
  of bars apart);
- `report`: every table and figure.

Training imports `loss` and `report`; the runners in `musegen.evaluation` import all of them.
A new span metric: a `Metric` subclass in a metric module, added to
`musegen.evaluation.run_continuation.SPAN_METRICS` (or passed to
`evaluate_continuation(..., metrics=...)`), described in docs/evaluation.md.
"""
