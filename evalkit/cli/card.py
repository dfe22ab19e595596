"""``evalkit card``: a Hugging Face model card holding a backbone's result rows in its
``model-index`` (shown on the model's Hub page); ``--push`` uploads it."""

from __future__ import annotations

from pathlib import Path


def add_card(sub) -> None:
    card = sub.add_parser("card", help="write a Hugging Face model card of a backbone's results")
    card.add_argument("results", type=Path, help="a folder of rows (evalkit run's --out)")
    card.add_argument("--model-id", required=True, help="the Hub repository, ORG/NAME")
    card.add_argument("--backbone", help="whose rows, when the folder holds several backbones")
    card.add_argument("--out", type=Path, default=Path("README.md"), help="the card's file")
    card.add_argument("--push", action="store_true", help="upload it as the model's README.md")
    card.add_argument(
        "--allow-stand-in",
        action="store_true",
        help="let --push publish rows on evalkit's embedded stand-in data (labelled as such)",
    )


def cmd_card(args, console) -> int:
    from evalkit.publish.card import card_rows, check_publishable, push_card, write_card

    rows = card_rows(args.results, args.backbone)
    path = write_card(rows, args.model_id, args.out)
    console.print(f"card: {path}")
    if args.push:
        check_publishable(rows, args.allow_stand_in)
        console.print(f"pushed: {push_card(path, args.model_id)}")
    return 0
