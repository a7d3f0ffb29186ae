"""Prediction heads over the target's own hidden state: the model and its file (model), training (train)."""
