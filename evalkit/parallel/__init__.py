"""Sharding of the ViT-22B family (docs/architecture.md): the tensor-parallel and FSDP2 plans
applied to the model from outside (``plan``), rank-aware weight loading that reads only each
rank's slices (``load``), and the memory/FLOPs planner (``planner``). It imports the model family
and the ground floor (``evalkit.checkpoints``, ``evalkit.distributed``), never the adapters."""
