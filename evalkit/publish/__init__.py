"""Results where users already look, computed from rows files: the leaderboard of a zoo with its
paired tests (docs/results.md), Hugging Face model cards and other tools' layouts
(docs/ecosystem.md).

Modules: ``leaderboard`` (the board, computed once) from ``board_reading`` (rows and per-image
files into boards of cells), ``board_pairs`` (each pair's paired test on the same images) and
``board_ranks`` (ranks, their intervals, tiers and the tests across tasks), ``rendering`` (every
format of a board, and its snapshots), ``card``, ``export`` (grouping and writing) with ``eee``
(Every Eval Ever records) and ``mteb_results`` (MTEB's results layout), and ``explore`` (a
static site of the images behind the numbers) with ``explore_pages`` (what its pages share:
setups, thumbnails, cards, paging), ``explore_outputs`` (per-image files in one shape) and a
module per kind of page: ``explore_classification`` (mistakes, pairs' flips),
``explore_calibration``, ``explore_cue_conflict`` and ``explore_dense``."""
