"""Measurements of models and music: per-position loss (`loss`), style similarity (`style`),
continuations against the real ones (`continuation`), attention inside a model (`attention`), and
side-by-side reports of several models (`compare`)."""
