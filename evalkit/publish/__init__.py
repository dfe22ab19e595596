"""Results where users already look, computed from rows files: the leaderboard of a zoo with its
paired tests (docs/results.md), Hugging Face model cards and other tools' layouts
(docs/ecosystem.md).

Modules: ``leaderboard`` (boards, ranks and tests, computed once), ``rendering`` (every format
of a board, and its snapshots), ``card``, ``export`` (grouping and writing) with ``eee`` (Every
Eval Ever records) and ``mteb_results`` (MTEB's results layout), and ``explore`` (a static site
of the images behind the numbers)."""
