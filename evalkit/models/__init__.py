"""Model implementations that evalkit ships, free of distributed code.

Modules: ``vit22b`` (the ViT-22B family) and ``convert`` (checkpoint key maps into and out of it)."""
