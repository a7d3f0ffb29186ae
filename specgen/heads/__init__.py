"""Prediction heads over the target's own last hidden state (Medusa-1, Hydra).

model: the heads (begin / step / advance) and their file; train: the numpy training
(Adam, cross-entropy over a restricted vocabulary); collect: the target's output rows
and its self-generated data; seeds: the built-in seed prompts; fit: `specgen heads train`
short of printing.
"""
