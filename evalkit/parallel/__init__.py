"""Sharded inference with torch.distributed (DESIGN §4): the process mesh (``mesh``), the
tensor-parallel and FSDP2 plans applied to the ViT-22B family from outside (``plan``), rank-aware
weight loading that reads only each rank's slices (``load``), and the memory/FLOPs planner."""
