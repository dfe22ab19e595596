"""``evalkit pretrain``: train sizes of the built-in family from scratch (the reproduction's ladder)."""

from __future__ import annotations

from pathlib import Path

from evalkit.core.run_options import data_root
from evalkit.errors import EvalkitError


def add_pretrain_command(sub) -> None:
    pre = sub.add_parser("pretrain", help="train sizes of the built-in ViT family from scratch")
    pre.add_argument("--model", default="vit22b/ti", help="vit22b/<size> (default vit22b/ti)")
    pre.add_argument("--ladder", help="several sizes sharing data and schedule, e.g. test,ti,s")
    pre.add_argument(
        "--data", default="auto", help="embedded: the JFT stand-in; else jft/ or imagenet/"
    )
    pre.add_argument("--data-dir", type=data_root, help="dataset root (default: $EVALKIT_DATA)")
    pre.add_argument("--cache-dir", type=Path, help="where embedded stand-ins are written")
    pre.add_argument("--out", type=Path, default=Path("checkpoints/pretrain"))
    pre.add_argument("--image", type=int, default=32, help="training resolution (default 32)")
    pre.add_argument("--patch", type=int, default=8, help="patch size (default 8)")
    pre.add_argument("--steps", type=int, default=200)
    pre.add_argument("--batch-size", type=int, default=64)
    pre.add_argument("--lr", type=float, default=1e-3)
    pre.add_argument("--warmup", type=int, default=20)
    pre.add_argument("--weight-decay", type=float, default=1e-4)
    pre.add_argument("--optimizer", choices=("adamw", "adafactor"), default="adamw")
    pre.add_argument("--z-loss", type=float, default=0.0)
    pre.add_argument("--checkpoint-every", type=int, default=50)
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--device", default="cpu")
    pre.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (under torchrun)")
    pre.add_argument(
        "--fsdp", action="store_true", help="shard parameters over data-parallel ranks (FSDP2)"
    )
    pre.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_pretrain(args, console) -> int:
    from rich.table import Table

    from evalkit import distributed
    from evalkit.data import DataConfig
    from evalkit.schedule import Schedule
    from evalkit.storage.identity import cache_root
    from evalkit.training.pretrain import PretrainSpec, pretrain

    family, _, size = args.model.partition("/")
    if family != "vit22b":
        raise EvalkitError(
            f"pretrain trains the built-in family: --model vit22b/<size>, not {args.model!r}"
        )
    sizes = tuple(s.strip() for s in args.ladder.split(",")) if args.ladder else (size or "ti",)
    for name, value in (
        ("--steps", args.steps),
        ("--batch-size", args.batch_size),
        ("--lr", args.lr),
        ("--checkpoint-every", args.checkpoint_every),
    ):
        if value <= 0:
            raise EvalkitError(f"{name} must be positive, got {value}")
    schedule = Schedule(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        weight_decay=args.weight_decay,
        optimizer=args.optimizer,
        z_loss=args.z_loss,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
    )
    layout = distributed.setup(args.tp, device=args.device)
    spec = PretrainSpec(
        sizes=sizes,
        image=args.image,
        patch=args.patch,
        schedule=schedule,
        out=args.out,
        device=args.device,
        fsdp=args.fsdp,
        progress=not args.quiet and layout.main,
    )
    data = DataConfig(source=args.data, root=args.data_dir, cache=args.cache_dir or cache_root())
    table = Table("size", "params", "loss", "first", "final", "steps", "seconds", "weights")
    try:
        for s in pretrain(spec, data):
            table.add_row(
                s["size"],
                f"{s['params']:,}",
                s["loss"],
                f"{s['first_loss']:.4f}",
                f"{s['final_loss']:.4f}",
                str(s["steps"]),
                str(s["seconds"]),
                s["weights"],
            )
    finally:
        distributed.teardown()
    if layout.main:
        console.print(table)
    return 0
