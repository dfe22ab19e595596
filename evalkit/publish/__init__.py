"""Results where users already look, computed from rows files: the leaderboard of a zoo with its
paired tests (docs/results.md), Hugging Face model cards and other tools' layouts
(docs/ecosystem.md).

Modules: ``leaderboard`` (boards, ranks and tests, computed once), ``rendering`` (every format
of a board, and its snapshots), ``card``, ``export`` and ``explore`` (a static site of the images behind the numbers)."""
