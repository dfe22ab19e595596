"""``evalkit export``: result rows in the formats other tools read (Every Eval Ever, MTEB,
MLflow/TensorBoard logs; docs/results.md)."""

from __future__ import annotations

from pathlib import Path


def add_export(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write result rows where other tools read them: Every Eval Ever records (eee) "
        "or MTEB's results layout (mteb)",
    )
    export.add_argument("results", type=Path, help="a folder of rows (evalkit run's --out)")
    export.add_argument("--format", required=True, choices=("eee", "mteb"))
    export.add_argument("--out", type=Path, required=True, help="the folder to write into")
    export.add_argument(
        "--organization",
        default="unknown",
        help="eee: who ran the evaluation (source_organization_name)",
    )


def cmd_export(args, console) -> int:
    from evalkit.publish.export import export

    written = export(args.results, args.out, args.format, organization=args.organization)
    console.print(f"{len(written)} file(s) under {args.out} ({args.format})", highlight=False)
    return 0
