"""Task plugins, one module per protocol family (installed as ``evalkit.tasks``).

Modules: ``linear_probe``, ``fewshot``, ``knn``, ``zeroshot``, ``segmentation``, ``depth``,
``video``, ``calibration``, ``distillation``, ``fairness``, ``model_vs_human``, ``stability``
and ``efficiency``."""
