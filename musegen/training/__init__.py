"""`musegen train`, along the data flow: settings.py (TrainConfig and how the CLI builds it),
loader.py (shards to micro-batches), processes.py (torchrun ranks, stop signals), optim.py (loss,
optimiser, schedule), precision.py (fp32 or bf16 under "auto", timed on full updates),
learner.py (the model and its optimiser state, one update), writer.py and run_folder.py (what a
run writes, and the folder's layout, lock and resume checks), trainer.py (`train`: set-up, then
the loop)."""
