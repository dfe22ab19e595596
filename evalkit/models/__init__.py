"""Model implementations that evalkit ships (ViT-22B family) and their checkpoint converters."""
