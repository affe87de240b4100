"""musegen: long-context symbolic music generation with Performers and Stochastic Positional Encoding."""

__version__ = "0.1.0"
