"""Small models trained (or fitted) on frozen features, and the post-processing of their scores.

Modules: ``linear`` (the probe and few-shot heads) with its two fits ``kept_logits_fit`` and
``streamed_fit`` and what they share, ``logistic``; ``knn``; ``decoders`` (segmentation and
depth heads on patch grids); ``temporal`` (video heads); ``text`` and ``zeroshot`` (LiT);
``fairness`` and ``debias`` (demographic-parity post-processing); ``train`` (the loop that
trains heads)."""
