"""Names an option may take that several layers check (sampling, training, the device): kept
free of torch, so that the command line builds its help without loading it."""

PRECISIONS = ("auto", "fp32", "bf16")  # "auto": the faster of fp32 and bf16 here (musegen.precision)
