"""The decoder-only Performer with Stochastic Positional Encoding.

- config.py: ModelConfig and the presets;
- transformer.py: MusicPerformer, its parallel pass and its streaming sessions;
- layer.py: the order of a layer's parts, shared by the parallel pass and the step;
- features.py: the feature maps of linear attention, a registry of classes;
- attention.py: causal linear attention (chunked, fast-transformers) and softmax attention;
- families.py: relative, synthesizer and Aaren attention;
- spe.py: sineSPE, convSPE and the gated SPE filter;
- dropout.py (+ dropout.c): the CPU dropout;
- torch_step.py: the single-token step in PyTorch; c_step.py (+ step.c): the same step in C;
- native.py: builds and loads the C kernels.

Nothing is imported here: import from the module that defines a name.
"""
