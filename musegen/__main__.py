"""`python -m musegen ...` (and `torchrun -m musegen train ...`)."""

from .cli import main

main()
