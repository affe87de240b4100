"""Continuing a prompt with a trained model, module by module along the data flow:

- `settings`: SampleSettings (what is asked for, its bounds) and the chain of constraints it implies;
- `prompt`: a MIDI or MIREX prompt encoded and cut after whole bars (load_prompt, prompt_from_ids);
- `constraints`: what may be drawn next (grammar mask, end hold, finishing, note-off mass);
- `resources`: device, CPU threads and the memory check before a batch starts;
- `loop`: generate, the batch loop with nucleus sampling;
- `outputs`: MIDI/WAV/PNG/JSON per sample, published as one set (write_samples, output_set);
- `batch`: the whole `musegen sample` run, one prompt or a folder of them (sample_to_folder).
"""
