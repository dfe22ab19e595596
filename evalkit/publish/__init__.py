"""Results where users already look, computed from rows files: the leaderboard of a zoo with its
paired tests (docs/results.md), Hugging Face model cards and other tools' layouts
(docs/ecosystem.md).

Modules: ``leaderboard`` (the board, computed once) from ``board_reading`` (rows and per-image
files into boards of cells), ``board_pairs`` (each pair's paired test on the same images) and
``board_ranks`` (ranks, their intervals, tiers and the tests across tasks), ``rendering`` (every
format of a board, and its snapshots), ``card``, ``export`` (grouping and writing) with ``eee``
(Every Eval Ever records) and ``mteb_results`` (MTEB's results layout), and ``explore`` (a
static site of the images behind the numbers)."""
