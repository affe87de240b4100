"""Measurements of models and music: per-position loss (`loss`), style similarity (`style`)."""
