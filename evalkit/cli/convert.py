"""``evalkit convert``: checkpoints into and out of the built-in family's layout."""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError


def add_convert(sub) -> None:
    """convert a checkpoint to the vit22b layout"""
    convert = sub.add_parser("convert", help="convert a checkpoint to the vit22b layout")
    convert.add_argument(
        "source",
        type=Path,
        help="timm vit_*_xp_* state dict, big_vision .npz, or (with --to big_vision) an evalkit "
        "checkpoint",
    )
    convert.add_argument("out", type=Path, help="output folder (evalkit) or .npz file")
    convert.add_argument("--from", dest="kind", choices=("timm", "big_vision"))
    convert.add_argument(
        "--to",
        dest="target",
        choices=("evalkit", "big_vision"),
        default="evalkit",
        help="big_vision: export an evalkit checkpoint as a big_vision .npz",
    )
    convert.add_argument(
        "--norm",
        choices=("layer", "rms"),
        help="big_vision source: its norms centre (layer) or not (rms); a tree does not say",
    )
    convert.add_argument(
        "--pool-include-prefix",
        choices=("yes", "no"),
        help="timm source with a class token and a MAP or average pool: the model's "
        "pool_include_prefix (its state dict does not say; timm's default is no)",
    )
    convert.add_argument("--shard-size", default="5GB", help="split files beyond this size")


def cmd_convert(args, console) -> int:
    from evalkit.models import convert

    if args.target == "big_vision":
        return export_big_vision(args, console)
    if args.kind is None:
        raise EvalkitError("convert needs --from timm or --from big_vision (or --to big_vision)")
    from evalkit.storage.checkpoints import parse_size, read_state_dict, save_checkpoint

    if args.kind == "timm":
        if args.norm not in (None, "rms"):
            raise EvalkitError("timm xp models use RMS norms: drop --norm")
        prefix = None if args.pool_include_prefix is None else args.pool_include_prefix == "yes"
        result = convert.from_timm_xp(read_state_dict(args.source), pool_include_prefix=prefix)
    else:
        result = convert.from_big_vision(convert.read_npz(args.source), norm=args.norm)
    state, cfg = result.state, result.config
    path = save_checkpoint(state, args.out, cfg.as_dict(), shard_bytes=parse_size(args.shard_size))
    params = sum(t.numel() for t in state.values())
    console.print(f"wrote {path} ({params:,} parameters; width {cfg.width}, depth {cfg.depth})")
    print_dropped(result.dropped, console)
    console.print(f"use: evalkit run --backbone vit22b/<size> --weights {path} ...")
    return 0


def export_big_vision(args, console) -> int:
    from evalkit.models import convert
    from evalkit.models.vit22b import ViTConfig
    from evalkit.storage.checkpoints import SafetensorsSource

    if args.kind is not None:
        raise EvalkitError("--to big_vision reads an evalkit checkpoint: drop --from")
    source = SafetensorsSource(args.source)
    if not source.config():
        raise EvalkitError(f"{args.source} carries no model config: convert it with evalkit first")
    cfg = ViTConfig(**source.config())
    state = {k: source.tensor(k) for k in source.weight_map}
    path = convert.write_npz(convert.to_big_vision(state, cfg), args.out)
    console.print(f"wrote {path} (big_vision tree; norm kind in {convert.CONFIG_ENTRY!r})")
    return 0


def print_dropped(keys: list[str], console):
    if keys:
        console.print(f"dropped on purpose (the classifier): {', '.join(keys)}")
