"""The project's own error types.

Every failure caused by the user's input (a file, a path, an option) is raised as a
`MusegenError` subclass with a one-line, human-readable message. The CLI prints that line
and exits non-zero; anything else is a bug in musegen.
"""


class MusegenError(Exception):
    """Base class: a problem with the user's input, reported as one line."""

    exit_code = 1


class MidiError(MusegenError):
    """A MIDI file that cannot be read or holds nothing the tokenizer can use."""


class TokenError(MusegenError):
    """A token sequence that cannot be decoded, or a token the grammar forbids."""


class CheckpointError(MusegenError):
    """A checkpoint folder that is missing, incomplete, tampered with or incompatible."""


class ConfigError(MusegenError):
    """An unknown preset, an unknown setting, an option out of its bounds, or a value of the wrong
    type: exit 2, as for an option the command line itself refuses."""

    exit_code = 2


class DataError(MusegenError):
    """A dataset folder that is missing, empty or malformed."""


class TrainingError(MusegenError):
    """A run that cannot go on, e.g. its loss kept coming out non-finite."""


class DiskFullError(MusegenError, OSError):
    """No space left where musegen was writing; the file under its final name is unchanged. Also
    an OSError, as the write's own error was, for code that handles that."""


class InputFileError(MusegenError, OSError):
    """A path that names no regular, readable file of acceptable size. Also an OSError, so code
    that expects what a plain `open()` raises for a missing file handles it the same way."""


class FormatError(ConfigError):
    """A file (JSON, YAML) or a setting whose value breaks its declared schema: a wrong type, a
    missing field, a number out of bounds (a `schemas.Format`'s model, ModelConfig)."""


class ResourceError(ConfigError):
    """A request refused before allocation: it would need more memory, time or disk than there is."""


class NumericError(CheckpointError):
    """A checkpoint whose numbers cannot be computed with as asked: weights beyond the range of the
    precision they run in, or activations that overflow (a distribution with no finite mass)."""

    exit_code = 2
