"""Heads trained on frozen features: linear (logistic and ridge) for classification probes."""
