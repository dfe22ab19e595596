"""Sharding of the ViT-22B family (docs/architecture.md), applied to the model from outside. It
imports the model family and the ground floor, never the adapters.

Modules: ``sharding`` (the tensor-parallel and FSDP2 plans), ``load`` (rank-aware weight
loading that reads only each rank's slices) and ``sizing`` (the memory and FLOPs planner)."""
