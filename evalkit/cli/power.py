"""``evalkit power``: what a pilot's per-image outputs say about the experiment to run — for
two setups on a task, the observed difference, the smallest difference the pilot could detect
(MDE, 80% power), the images (and, with several seeds, the seeds) needed to detect a given
one, and the cheaper of the two levers (``evalkit.power``; docs/results.md)."""

from __future__ import annotations

from pathlib import Path

from evalkit.errors import EvalkitError


def add_power(sub) -> None:
    power = sub.add_parser(
        "power",
        help="from a pilot's per-image outputs: the MDE of two setups' paired test, and the "
        "images or seeds needed to detect --detect points",
    )
    power.add_argument("results", type=Path, help="rows with --save-predictions outputs")
    power.add_argument("--task", required=True, help="the task (every data it ran on)")
    power.add_argument("--a", help="a setup as the views label it, or a backbone name")
    power.add_argument("--b", help="the other setup (default: the board's top two)")
    power.add_argument(
        "--detect", type=float, default=1.0, help="the difference to detect, points (1)"
    )
    power.add_argument("--level", type=float, default=0.05, help="two-sided (one pair)")


def cmd_power(args, console) -> int:
    from evalkit.publish.board_ranks import _ranked
    from evalkit.publish.board_reading import _boards, board_task, folder_rows

    if (args.a is None) != (args.b is None):
        raise EvalkitError("--a and --b name a pair: give both, or neither for the top two")
    if args.detect <= 0 or not 0 < args.level < 1:
        raise EvalkitError("--detect takes points above 0, --level a probability in (0, 1)")
    boards = [
        _ranked(board)
        for board in _boards(folder_rows([args.results]))
        if board_task(board) == args.task
    ]
    if not boards:
        raise EvalkitError(f"no rows of {args.task} under {args.results}")
    for board in boards:
        for line in pilot_lines(board, pair_of(board, args), args):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0


def pair_of(board, args) -> tuple:
    """The two cells named by ``--a``/``--b`` (a setup label, or a backbone name that names
    one setup on the board), or the board's top two."""
    if args.a is None:
        if len(board.cells) < 2:
            raise EvalkitError(f"{board.task} has one setup: nothing to compare")
        return board.cells[0], board.cells[1]
    return cell_named(board, args.a), cell_named(board, args.b)


def cell_named(board, name: str):
    exact = [c for c in board.cells if c.backbone == name]
    by_backbone = [c for c in board.cells if c.rows[0]["backbone"] == name]
    found = exact or by_backbone
    if len(found) != 1:
        setups = ", ".join(repr(c.backbone) for c in board.cells)
        how = "names several setups" if found else "is no setup"
        raise EvalkitError(f"{name!r} {how} of {board.task}: expected one of {setups}")
    return found[0]


def pilot_lines(board, pair: tuple, args) -> list[str]:
    """What the pilot says of one pair: the difference, the MDE, images and seeds needed."""
    from evalkit import power
    from evalkit.publish.board_pairs import _paired
    from evalkit.publish.board_reading import per_image

    a, b = pair
    test = _paired(board, (per_image(a), per_image(b)), seed=0)
    head = f"{board.task}, {board.metric}: {a.backbone} − {b.backbone}"
    if isinstance(test, str):
        return [f"{head}: no paired test ({test})"]
    detectable = power.mde(test, args.level)
    needed = power.images_needed(test, args.detect, args.level)
    lines = [
        head,
        f"  observed difference: {power.difference_text(test)} points on {test.images} images "
        f"({test.test})",
        f"  MDE: {_shown(detectable)} points (80% power, level {args.level:g}, one pair)",
        f"  to detect {args.detect:g} points: {_count(needed)} images",
    ]
    factors = {"images": None if needed is None else needed / test.images}
    seeds = seed_lines(pair, args)
    if seeds:
        lines += seeds[0]
        factors["seeds"] = seeds[1]
    return [*lines, f"  cheapest lever: {lever(factors, args.detect)}"]


def seed_lines(pair: tuple, args):
    """With several seeds a side: their spread, the seed-level MDE and the seeds needed
    (lines, and the factor on the seeds run); None otherwise."""
    from evalkit import power
    from evalkit.publish.board_ranks import seed_spread

    counts = tuple(len({r.get("seed", 0) for r in cell.rows}) for cell in pair)
    spreads = tuple(seed_spread(cell) for cell in pair)
    if min(counts) < 2 or None in spreads:
        return None
    detectable = power.seed_mde(spreads, counts, args.level)
    needed = power.seeds_needed(spreads, args.detect, args.level)
    lines = [
        f"  seeds: sd {spreads[0]:.2f} over {counts[0]} and {spreads[1]:.2f} over {counts[1]}; "
        f"seed-level MDE {_shown(detectable)} points",
        f"  to detect {args.detect:g} points across seeds: {_count(needed)} seeds a side",
    ]
    return lines, None if needed is None else needed / min(counts)


def lever(factors: dict, detect: float) -> str:
    """The cheaper way to see ``detect`` points: each lever's factor on the pilot's cost
    (more images multiply every seed's pass, more seeds every image's); a lever that cannot
    be sized is never the cheaper."""
    short = {name: f for name, f in factors.items() if f is None or f > 1}
    if not short:
        return f"none needed: the pilot already detects {detect:g} points"
    if len(short) == 1:
        ((name, factor),) = short.items()
        other = "; the other already suffices" if len(factors) > 1 else ""
        return f"more {name} ({_times(factor)} the pilot's){other}"
    ordered = sorted(short.items(), key=lambda kv: float("inf") if kv[1] is None else kv[1])
    (cheap, f_cheap), (dear, f_dear) = ordered
    return (
        f"more {cheap} ({_times(f_cheap)} the pilot's) — and more {dear} too "
        f"({_times(f_dear)}): each lever shrinks only its own MDE"
    )


def _times(factor: float | None) -> str:
    return "beyond reach" if factor is None else f"×{factor:.1f}"


def _shown(value: float | None) -> str:
    return "unknown (no spread between the two sides)" if value is None else f"{value:.2f}"


def _count(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"
