"""The musical constants every representation, data step and metric shares, in one place.

The paper's two representations (REMI, groove) write 4/4 bars (its data is all in 4/4); the song
tokens hold each bar's time signature. Decoded MIDI files are at 480 ticks per beat, the
resolution Pop1K7's duration names count in. A representation's own grid (REMI's positions per
beat, groove's 12 units per beat) stays with it.
"""

BEATS_PER_BAR = 4
TICKS_PER_BEAT = 480  # decoded MIDI's resolution
DEFAULT_BPM = 120.0  # MIDI's tempo before any tempo event
MAX_BARS = 10_000  # about 5 hours at 120 bpm: anything longer is a broken file, not music
MAX_PROMPT_BARS = MAX_BARS // 2  # a prompt leaves a continuation at least as many bars as it has
