"""Task plugins, one module per protocol family (installed as ``evalkit.tasks``)."""
