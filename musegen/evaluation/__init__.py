"""Runners: each loads a checkpoint or reads files, samples where it must, measures with
`musegen.metrics` and writes its tables and figures with `musegen.metrics.report`.

`run_continuation`, `run_copy`, `run_loss`, `run_recall`, `run_style`; `compare` reads runners'
outputs side by side.
"""
