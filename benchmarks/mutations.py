"""A mutation pass over the metric and protocol code: each named fault below is a one-line change
a careless edit could make; it is applied to the source, the tests that guard that code run, and
the fault is "killed" when they fail. The kill rate says how much of the protocol the suite
really checks; a surviving fault names the test that is missing.

Run: ``python -m benchmarks.mutations [--only NAME,NAME] [--root CLONE]`` (about 15 minutes on
a 2-core CPU). The source is restored after every fault, also on Ctrl-C; do not edit the tree
meanwhile — or give ``--root`` a clone (``git clone . /tmp/clone``), which the tests then
import instead (through ``PYTHONPATH``, so their subprocesses do too).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import report

ROOT = Path(__file__).parents[1]


@dataclass(frozen=True)
class Fault:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


METRICS = ("tests/test_metrics.py", "tests/test_dense.py")
GATE, IDENTITY = "tests/test_gate_families.py", "tests/test_identity.py"
SHARDS, BOARD = "tests/test_shards.py", "tests/test_board_statistics.py"
CALIBRATION = ("tests/test_metrics.py", "tests/test_calibration.py")
EXPLORE = "tests/test_explore.py"
LIGHT = "tests/test_light_imports.py"
THREADS = "tests/test_thread_invariance.py"
FAULTS = (
    Fault(
        "ece bins closed on the left",
        "evalkit/protocols/calibration.py",
        "index = torch.searchsorted(torch.tensor(edges, dtype=torch.float64), confidence)",
        "index = torch.searchsorted(torch.tensor(edges, dtype=torch.float64), confidence, "
        "right=True)",
        CALIBRATION,
    ),
    Fault(
        "ece bins unweighted",
        "evalkit/metrics.py",
        "n / total * abs(a - c)",
        "abs(a - c) / len(self.counts)",
        CALIBRATION,
    ),
    Fault(
        "pooled reliability averages sets",
        "evalkit/metrics.py",
        "total = sum(p.counts[b] * getattr(p, field)[b] for p in parts if p.counts[b])",
        "total = counts[b] * sum(getattr(p, field)[b] for p in parts if p.counts[b]) / "
        "sum(1 for p in parts if p.counts[b])",
        CALIBRATION,
    ),
    Fault(
        "brier averaged over classes",
        "evalkit/protocols/calibration.py",
        "return (probs.double() - onehot).pow(2).sum(dim=1).mean().item()",
        "return (probs.double() - onehot).pow(2).mean().item()",
        CALIBRATION,
    ),
    Fault(
        "temperature multiplies",
        "evalkit/protocols/calibration.py",
        "loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), labels)",
        "loss = torch.nn.functional.cross_entropy(logits * log_t.exp(), labels)",
        CALIBRATION,
    ),
    Fault(
        "miou over ground-truth classes only",
        "evalkit/metrics.py",
        "present = union > 0\n    labelled",
        "present = confusion.sum(1) > 0\n    labelled",
        METRICS,
    ),
    Fault(
        "miou union is the ground truth",
        "evalkit/metrics.py",
        "union = confusion.sum(0) + confusion.sum(1) - intersection",
        "union = confusion.sum(1).astype(np.float64)",
        METRICS,
    ),
    Fault(
        "confusion rows are predictions",
        "evalkit/metrics.py",
        "index = target[keep].astype(np.int64) * num_classes + pred[keep].astype(np.int64)",
        "index = pred[keep].astype(np.int64) * num_classes + target[keep].astype(np.int64)",
        METRICS,
    ),
    Fault(
        "top-k is top-1",
        "evalkit/metrics.py",
        "return (logits.topk(k, dim=1).indices == labels[:, None]).any(dim=1)",
        "return (logits.topk(k, dim=1).indices[:, :1] == labels[:, None]).any(dim=1)",
        METRICS,
    ),
    Fault(
        "depth delta one-sided",
        "evalkit/metrics.py",
        '"delta1": float((ratio < 1.25).mean()),',
        '"delta1": float((d / p < 1.25).mean()),',
        METRICS,
    ),
    Fault(
        "depth abs_rel over the prediction",
        "evalkit/metrics.py",
        '"abs_rel": float((np.abs(d - p) / d).mean()),',
        '"abs_rel": float((np.abs(d - p) / p).mean()),',
        METRICS,
    ),
    Fault(
        "depth rmse is mean absolute error",
        "evalkit/metrics.py",
        '"rmse": float(np.sqrt(squared.mean())),',
        '"rmse": float(np.sqrt(squared).mean()),',
        METRICS,
    ),
    Fault(
        "garg crop starts at half height",
        "evalkit/metrics.py",
        "int(0.40810811 * height)",
        "int(0.5 * height)",
        ("tests/test_dense.py",),
    ),
    Fault(
        "knn votes exp(sim·T)",
        "evalkit/heads/knn.py",
        "weights = (sims / temperature).exp() if",
        "weights = (sims * temperature).exp() if",
        ("tests/test_knn.py",),
    ),
    Fault(
        "knn votes uniform",
        "evalkit/heads/knn.py",
        "return scores.scatter_add_(1, labs, weights)",
        "return scores.scatter_add_(1, labs, torch.ones_like(weights))",
        ("tests/test_knn.py",),
    ),
    Fault(
        "knn rows not normalised",
        "evalkit/heads/knn.py",
        "blocks.append((rows / norms[:, None] * GRID).round_().int())",
        "blocks.append((rows * GRID).round_().int())",
        ("tests/test_knn.py",),
    ),
    Fault(
        "zero-shot class embedding not re-normalised",
        "evalkit/heads/zeroshot.py",
        "out.append(torch.nn.functional.normalize(mean, dim=-1, eps=1e-8))",
        "out.append(mean)",
        ("tests/test_zeroshot.py",),
    ),
    Fault(
        "zero-shot prompts not normalised before the mean",
        "evalkit/heads/zeroshot.py",
        "mean = torch.nn.functional.normalize(torch.cat(parts).float(), dim=-1).mean(0)",
        "mean = torch.cat(parts).float().mean(0)",
        ("tests/test_zeroshot.py",),
    ),
    Fault(
        "lit loss one direction",
        "evalkit/heads/text.py",
        "return 0.5 * (ce(logits, target) + ce(logits.T, target))",
        "return ce(logits, target)",
        ("tests/test_zeroshot.py",),
    ),
    Fault(
        "lit temperature not exponentiated",
        "evalkit/heads/text.py",
        "logits = images.float() @ texts.float().T * log_temperature.float().exp()",
        "logits = images.float() @ texts.float().T * log_temperature.float()",
        ("tests/test_zeroshot.py",),
    ),
    Fault(
        "probe not scaled",
        "evalkit/heads/linear.py",
        "return (x - self.mean.to(x.device)) / self.std.to(x.device)",
        "return x - self.mean.to(x.device)",
        METRICS,
    ),
    Fault(
        "probe std without the mean",
        "evalkit/heads/linear.py",
        "std = (squares / count - mean.pow(2)).clamp_min(0).sqrt()",
        "std = (squares / count).sqrt()",
        METRICS,
    ),
    Fault(
        "probe l2 gradient halved",
        "evalkit/heads/logistic.py",
        "model.weight.grad = grad_w + l2 * model.weight",
        "model.weight.grad = grad_w + 0.5 * l2 * model.weight",
        METRICS,
    ),
    Fault(
        "probe tie rule exact",
        "evalkit/protocols/classification.py",
        "if held_hits[l2] >= best - 1)",
        "if held_hits[l2] >= best)",
        ("tests/test_metrics.py",),
    ),
    Fault(
        "few-shot bias feature 1",
        "evalkit/heads/linear.py",
        "return torch.nn.functional.pad(x, (0, 1), value=BIAS_CONSTANT)",
        "return torch.nn.functional.pad(x, (0, 1), value=1.0)",
        METRICS,
    ),
    Fault(
        "few-shot bias constant",
        "evalkit/heads/linear.py",
        "BIAS_CONSTANT = 100.0",
        "BIAS_CONSTANT = 1.0",
        METRICS,
    ),
    # ({0, 1} targets instead of {-1, +1} would be an equivalent mutant: with the bias feature
    # the solution shifts every class's score alike, so no prediction changes.)
    Fault(
        "few-shot whitened with test statistics",
        "evalkit/heads/linear.py",
        "whiten = Standardizer.fit(x_train)",
        "whiten = Standardizer.fit(x_test)",
        METRICS,
    ),
    Fault(
        "video segment frames at the start",
        "evalkit/data/clips.py",
        "offset = (segment + 0.5) / sampling.segments",
        "offset = segment / sampling.segments",
        ("tests/test_video.py",),
    ),
    Fault(
        "video stride ignored",
        "evalkit/data/clips.py",
        "return [start + i * sampling.stride for i in range(t)], False",
        "return [start + i for i in range(t)], False",
        ("tests/test_video.py",),
    ),
    Fault(
        "corruption severities reversed",
        "evalkit/data/corruptions.py",
        "y = fn(x, levels[severity - 1], generator)",
        "y = fn(x, levels[-severity], generator)",
        ("tests/test_corruptions.py",),
    ),
    Fault(
        "cache key without the dtype",
        "evalkit/cache/keys.py",
        '        "dtype": dtype,\n        "libraries"',
        '        "libraries"',
        ("tests/test_keys.py",),
    ),
    Fault(
        "converter dense kernels not transposed",
        "evalkit/models/convert.py",
        '"dense": (lambda a, c: a.T, lambda t, c: t.T),',
        '"dense": (lambda a, c: a, lambda t, c: t),',
        ("tests/test_convert.py",),
    ),
    Fault(
        "preprocessing without normalisation",
        "evalkit/backbones/base.py",
        "return normalise(images, pre.mean, pre.std)",
        "return images.float() / 255",
        ("tests/test_gate.py",),
    ),
    # The gate, the study across machines and the board's edges (each with the test that
    # kills it): a fault here that survives names the test still missing.
    Fault(
        "compare averages every seed",
        "evalkit/core/gate.py",
        "kept[key] = shared or ran_base | ran_new",
        "kept[key] = ran_base | ran_new",
        (f"{GATE}::test_seed_sets_that_differ_are_compared_on_the_seeds_both_ran",),
    ),
    Fault(
        "labels name a default setting",
        "evalkit/core/labels.py",
        "defaults is None or _text(own.get(k)) != defaults.get(k)",
        "defaults is None or True",
        (f"{IDENTITY}::test_a_setups_default_run_has_one_label_whatever_its_siblings",),
    ),
    Fault(
        "paired gate without outputs runs anyway",
        "evalkit/cli/compare.py",
        'if not any(folder.rglob("predictions/*.parquet")):',
        "if False:",
        (f"{GATE}::test_paired_without_per_image_outputs_is_one_line",),
    ),
    Fault(
        "errors take no setup label",
        "evalkit/cli/errors.py",
        "outputs = [o for o in outputs if args.backbone in (o[1], o[2])]",
        "outputs = [o for o in outputs if args.backbone in (o[1],)]",
        (f"{IDENTITY}::test_errors_heads_each_block_by_its_setup_and_takes_the_printed_label",),
    ),
    Fault(
        "closing table names the bare backbone",
        "evalkit/cli/run.py",
        "summary_cells(row, cell_setup(job, spec), skipped=job.skipped)",
        "summary_cells(row, job.backbone, skipped=job.skipped)",
        (f"{IDENTITY}::test_the_closing_table_and_the_failed_cells_name_each_setup",),
    ),
    Fault(
        "card picks by backbone name only",
        "evalkit/publish/card.py",
        'rows = [r for r in rows if backbone in (r["backbone"], labels[setup_key(r)])]',
        'rows = [r for r in rows if backbone == r["backbone"]]',
        (f"{IDENTITY}::test_the_card_names_each_setup",),
    ),
    Fault(
        "piped output takes COLUMNS",
        "evalkit/cli/__init__.py",
        "return None if sys.stdout.isatty() else LOG_WIDTH",
        'return None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", LOG_WIDTH))',
        (f"{GATE}::test_piped_output_keeps_labels_whole_whatever_columns_says",),
    ),
    Fault(
        "few-shot draws overlap across seeds",
        "tasks/fewshot.py",
        'return [derived_seed(seed, "shots", index) for index in range(draws)]',
        "return [seed + index for index in range(draws)]",
        ("tests/test_tasks.py::test_fewshot_jobs_of_two_seeds_share_no_shot_draw",),
    ),
    Fault(
        "shares dealt to the first",
        "evalkit/core/cells.py",
        "smallest = min(range(count), key=lambda i: (len(shares[i]), i))",
        "smallest = 0",
        (f"{SHARDS}::test_each_backbone_setups_features_are_extracted_on_one_share",),
    ),
    Fault(
        "slurm position ignores the step",
        "evalkit/core/cells.py",
        "position, off_step = divmod(task - first, step)",
        "position, off_step = task - first, 0",
        (f"{SHARDS}::test_a_stepped_slurm_array_is_indexed_by_position",),
    ),
    Fault(
        "merge copies before reading",
        "evalkit/core/merge.py",
        "target = out / _readable(source).relative_to(folder)",
        "target = out / source.relative_to(folder)",
        (f"{SHARDS}::test_merge_reads_every_per_image_file_before_writing",),
    ),
    Fault(
        "merge sees an unmerged share as merged",
        "evalkit/core/merge.py",
        'if share not in study["merged"]:',
        "if False:",
        (f"{SHARDS}::test_a_lost_share_is_listed_and_fails_the_merge",),
    ),
    Fault(
        "failed cells never completed",
        "evalkit/publish/board_reading.py",
        'return [r for r in latest.values() if done.get(cell_key(r), -1.0) < _epoch(r.get("time"))]',
        "return list(latest.values())",
        ("tests/test_zoo.py::test_a_failed_cell_is_recorded_and_the_zoo_goes_on",),
    ),
    Fault(
        "tiers led by the first setup only",
        "evalkit/publish/board_ranks.py",
        "if leader is None or frozenset((leader, name)) in apart:",
        "if leader is None or frozenset((order[0], name)) in apart:",
        (f"{BOARD}::test_tiers_are_monotone_in_rank",),
    ),
    Fault(
        "separability ignores the number of pairs",
        "evalkit/publish/board_ranks.py",
        "return 2.0 ** (1 - n) <= level / pairs",
        "return 2.0 ** (1 - n) <= level",
        (f"{BOARD}::test_few_tasks_say_they_cannot_separate_any_two_setups",),
    ),
    Fault(
        "nemenyi without the square root of two",
        "evalkit/publish/board_ranks.py",
        "stats.studentized_range.sf(q * np.sqrt(2), k, np.inf)",
        "stats.studentized_range.sf(q, k, np.inf)",
        (f"{BOARD}::test_nemenyi_p_values_are_scikit_posthocs",),
    ),
    Fault(
        "overall order resamples one image draw",
        "evalkit/publish/board_ranks.py",
        "sums[rows] += ranks[rng.integers(0, len(ranks), size=int(rows.sum()))]",
        "sums[rows] += ranks[0]",
        (f"{BOARD}::test_on_null_boards_the_order_claims_no_leader",),
    ),
    Fault(
        "mcnemar mde without the power quantile",
        "evalkit/power.py",
        "k = _z(1 - level / 2) + _z(POWER)\n    share = discordant / images",
        "k = _z(1 - level / 2)\n    share = discordant / images",
        ("tests/test_power.py::test_mcnemar_detects_its_mde_80_percent_of_the_time",),
    ),
    Fault(
        "seed mde without dividing by the seeds",
        "evalkit/power.py",
        "error = math.sqrt(s_a * s_a / k_a + s_b * s_b / k_b)",
        "error = math.sqrt(s_a * s_a + s_b * s_b)",
        ("tests/test_power.py::test_seed_mde_is_detected_80_percent_of_the_time",),
    ),
    Fault(
        "holm level of the first step for every pair",
        "evalkit/power.py",
        "return level / max(tested - rejected_others, 1)",
        "return level / max(tested, 1)",
        ("tests/test_power.py::test_a_holm_level_is_the_step_a_pair_is_judged_at",),
    ),
    Fault(
        "explorer's flips one way only",
        "evalkit/publish/explore_outputs.py",
        '"wrong-to-right": ("wrong → right (A wrong, B right)", False, True),',
        '"wrong-to-right": ("wrong → right (A wrong, B right)", True, False),',
        (
            "tests/test_explore.py::test_the_site_shows_two_stand_in_setups_flips_with_every_picture_on_disk",
        ),
    ),
    Fault(
        "calibration bin's mistakes in file order",
        "evalkit/publish/explore_calibration.py",
        '"mistakes": mistakes(members),',
        '"mistakes": members[~members["right"]],',
        (f"{EXPLORE}::test_the_calibration_page_shows_each_confidence_bins_surest_mistakes",),
    ),
    Fault(
        "dense worst images best first",
        "evalkit/publish/explore_dense.py",
        '"score", ascending=higher_is_better, kind="stable", na_position="last"',
        '"score", ascending=not higher_is_better, kind="stable", na_position="last"',
        (f"{EXPLORE}::test_a_dense_setups_page_shows_its_worst_images_first",),
    ),
    Fault(
        "cue-conflict keeps stimuli whose shape is their texture",
        "evalkit/publish/explore_cue_conflict.py",
        'frame = frame[(frame["set"] == "cue-conflict") & (frame["category"] != frame["texture"])]',
        'frame = frame[frame["set"] == "cue-conflict"]',
        (f"{EXPLORE}::test_the_cue_conflict_page_says_which_cue_decided_each_stimulus",),
    ),
    Fault(
        "board resamples not kept for the overall order",
        "evalkit/publish/board_pairs.py",
        "board.resampled = image_resamples(board, shared)",
        "board.resampled = None",
        (f"{BOARD}::test_a_leaderboard_resamples_each_boards_images_for_its_overall_order",),
    ),
    # An outside review's list: behaviours each of which stayed green when changed alone.
    Fault(
        "merge writes rows before checking per-image outputs",
        "evalkit/core/merge.py",
        # lazily: the per-image files are checked only when the loop after the rows' writes starts
        "outputs = _outputs_to_copy(out, sources)",
        "outputs = (pair for _ in [0] for pair in _outputs_to_copy(out, sources))",
        (f"{SHARDS}::test_merge_reads_every_per_image_file_before_writing",),
    ),
    Fault(
        "merge's measurement check ignores the data identity",
        "evalkit/core/merge.py",
        'for what in ("task_version", "data_id"):',
        'for what in ("task_version",):',
        (f"{SHARDS}::test_merge_refuses_one_cell_measured_on_other_data_files",),
    ),
    Fault(
        "bootstrap p's normal-tail switch one resample late",
        "evalkit/significance.py",
        "if far_side >= FAR_ENOUGH:",
        "if far_side > FAR_ENOUGH:",
        (f"{BOARD}::test_the_count_is_read_from_exactly_far_enough_far_side_resamples",),
    ),
    Fault(
        "paired compare corrects each metric alone",
        "evalkit/publish/board_pairs.py",
        "adjusted = dict(zip(tested, holm([tests[i].p for i in tested]), strict=True))",
        "adjusted = {i: holm([tests[i].p])[0] for i in tested}",
        (f"{BOARD}::test_paired_compare_corrects_every_tested_metric_as_one_family",),
    ),
    Fault(
        "a metric of sums averages seeds before the metric",
        "evalkit/significance.py",
        "return np.mean([of_sums(counts @ rows, images) for rows, of_sums in prepared], axis=0)",
        "return prepared[0][1](counts @ np.mean([rows for rows, _ in prepared], axis=0), images)",
        (
            f"{BOARD}::test_a_metric_of_sums_over_seeds_is_the_seeds_mean_of_the_metric_on_each_"
            "resample",
        ),
    ),
    Fault(
        "the board's fingerprint ignores the data files",
        "evalkit/publish/board_reading.py",
        'MEASURED = ("task_version", "config", "data_files", "metric")',
        'MEASURED = ("task_version", "config", "metric")',
        (f"{BOARD}::test_a_board_of_cells_read_from_other_data_files_is_refused",),
    ),
    Fault(
        "holm across tasks drops the tied pairs",
        "evalkit/publish/board_ranks.py",
        "        adjusted = holm(raw)\n",
        "        tested = [k for k, p in enumerate(raw) if p < 1]\n"
        "        kept = dict(zip(tested, holm([raw[k] for k in tested]), strict=True))\n"
        "        adjusted = [kept.get(k, 1.0) for k in range(len(raw))]\n",
        (f"{BOARD}::test_pairs_tied_on_every_task_count_in_holms_family",),
    ),
    Fault(
        "rto bisection's lower bound without gamma",
        "evalkit/heads/debias.py",
        "else (-1.0 - gamma, 0.0)",
        "else (-1.0, 0.0)",
        ("tests/test_fairness.py::test_rto_reaches_a_rate_only_a_threshold_below_minus_one_gives",),
    ),
    Fault(
        "knn near-tie bound halved",
        "evalkit/heads/knn.py",
        "return gap > 2 * self.margin",
        "return gap > self.margin",
        ("tests/test_knn.py::test_a_rough_gap_under_twice_the_error_bound_proves_nothing",),
    ),
    Fault(
        "free cpus counts this process's own threads",
        "evalkit/device.py",
        "return max(0, running - max(own_before, _own_running()))",
        "return max(0, running)",
        ("tests/test_feeding.py::test_free_cpus_leaves_out_only_other_processes_running_threads",),
    ),
    Fault(
        "eee export's lower_is_better inverted",
        "evalkit/publish/eee.py",
        '"lower_is_better": not row.get("higher_is_better", True),',
        '"lower_is_better": bool(row.get("higher_is_better", True)),',
        ("tests/test_export.py::test_each_metrics_direction_is_exported_as_lower_is_better",),
    ),
    Fault(
        "the check before work reads the last task's splits only",
        "evalkit/core/runner.py",
        "lines = find_data(merged_reads(tasks), spec.data_config(), opened)",
        "lines = find_data(merged_reads(tasks[-1:]), spec.data_config(), opened)",
        (f"{IDENTITY}::test_the_check_before_work_reads_what_an_earlier_task_reads",),
    ),
    Fault(
        "kNN's paired test read as the default one",
        "evalkit/protocols/paired_tests.py",
        '"evalkit.tasks.knn:KNN": classification_test,',
        '"evalkit.tasks.knn:KNN": default_paired_test,',
        (f"{LIGHT}::test_every_built_in_task_declares_the_paired_test_the_results_read",),
    ),
    Fault(
        "the leaderboard imports a built-in task for its paired test",
        "evalkit/core/catalog.py",
        "    if target in declared:",
        "    if target in declared and not target:",
        (f"{LIGHT}::test_result_command_imports_no_model_library[leaderboard]",),
    ),
    Fault(
        "resolve spends the full level at every look",
        "evalkit/reproduction/resolve.py",
        "    return level / (look * (look + 1))",
        "    return level",
        (
            "tests/test_resolve.py::test_a_row_with_no_effect_is_decided_at_most_five_percent_of_the_time",
        ),
    ),
    Fault(
        "resolve reads a spread over seeds with a normal quantile",
        "evalkit/reproduction/resolve.py",
        "    if seeds >= 2:\n        return float(stdtrit(seeds - 1, 1 - level / 2))",
        "    if seeds >= 2000:\n        return float(stdtrit(seeds - 1, 1 - level / 2))",
        (
            "tests/test_resolve.py::test_a_row_with_no_effect_is_decided_at_most_five_percent_of_the_time",
        ),
    ),
    Fault(
        "the margin is the interval's near end",
        "evalkit/reproduction/resolve.py",
        "    return max(abs(interval[0]), abs(interval[1]))",
        "    return min(abs(interval[0]), abs(interval[1]))",
        (
            "tests/test_resolve.py::test_every_row_ends_as_agrees_disagrees_or_a_margin_with_its_mde",
        ),
    ),
    Fault(
        "a decided row's direction ignores the paper's sign",
        "evalkit/reproduction/resolve.py",
        "    return (low > 0) == (paper_sign > 0)",
        "    return low > 0",
        ("tests/test_resolve.py::test_a_row_whose_paper_effect_is_negative_agrees_below_zero",),
    ),
    Fault(
        "resolve's budget counts the table's own first look",
        "evalkit/reproduction/resolve.py",
        "        run.seconds = seconds - first",
        "        run.seconds = seconds",
        ("tests/test_resolve.py",),
    ),
    Fault(
        "the MDE drops the power quantile",
        "evalkit/reproduction/resolve.py",
        "    return half + POWER_Z * (stderr if stderr is not None else half / Z975)",
        "    return half",
        ("tests/test_resolve.py::test_the_stated_mde_is_detected_eighty_percent_of_the_time",),
    ),
    Fault(
        "the table reads two seeds' spread with a normal quantile",
        "evalkit/reproduction/rows.py",
        "    half = quantile(0.05, seeds) * stderr",
        "    half = quantile(0.05, 1) * stderr",
        ("tests/test_verdicts.py::test_a_spread_over_two_seeds_is_read_with_students_t",),
    ),
    Fault(
        "an undecided depth row shows its weakest head",
        "evalkit/reproduction/rows.py",
        "        return max(undecided, key=lambda o: max(map(abs, o.interval or (math.inf,))))",
        "        return min(heads.values(), key=lambda o: o.effect)",
        ("tests/test_verdicts.py::test_row_9_needs_both_heads_beyond_noise",),
    ),
    Fault(
        "declared schedule ignores the prefix",
        "evalkit/schedule.py",
        "        f.name: getattr(task, prefix + f.name)",
        "        f.name: getattr(task, f.name, None) or getattr(task, prefix + f.name)",
        ("tests/test_schedule.py",),
    ),
    Fault(
        "the head trainer refuses nothing",
        "evalkit/heads/train.py",
        "    if asked:",
        "    if asked and False:",
        ("tests/test_schedule.py",),
    ),
    Fault(
        "a plugin may shadow a built-in",
        "evalkit/registry.py",
        "if taken is not None and taken.target != ep.value:",
        "if False:",
        ("tests/test_cli.py::test_a_plugin_named_like_a_built_in_is_refused_by_name",),
    ),
    Fault(
        "deterministic mode set off",
        "evalkit/core/numerics.py",
        "        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)",
        "        torch._C._set_deterministic_algorithms(False, warn_only=warn_only)",
        ("tests/test_feeding.py::test_run_numerics_are_set_recorded_and_restored",),
    ),
    Fault(
        "mixup draws from the batch pick's stream",
        "tasks/distillation.py",
        'generator(ctx.seed, "mixup", step, micro)',
        'generator(ctx.seed, "batch", step, micro)',
        ("tests/test_architecture.py::test_each_draw_name_means_one_draw",),
    ),
    Fault(
        "a nameless draw is taken",
        "evalkit/seeds.py",
        "if not isinstance(name, str) or not name:",
        "if False:",
        ("tests/test_architecture.py::test_no_draw_is_taken_without_a_name",),
    ),
    Fault(
        "random weights keep the bare seed's id",
        "evalkit/backbones/base.py",
        'material += f":draw={draw}" if draw else ""',
        'material += ""',
        ("tests/test_keys.py::test_random_weights_drawn_under_named_draws_have_their_own_id",),
    ),
    Fault(
        "rows do not record the seed rule",
        "evalkit/core/task.py",
        '        "seed_rule": SEED_RULE,\n',
        "",
        ("tests/test_keys.py::test_the_run_key_covers_task_backbone_data_and_seed",),
    ),
    Fault(
        "errors builds the task to ask for its tables",
        "evalkit/cli/errors.py",
        'return declared_by(task, DECLARED, "error_tables", by_columns)',
        'return declared_by(task, {}, "error_tables", by_columns)',
        (f"{LIGHT}::test_result_command_imports_no_model_library[errors]",),
    ),
    Fault(
        "errors reads a plugin's outputs as classification",
        "evalkit/protocols/error_tables.py",
        '    if "miou" in frame:\n        return segmentation_tables(frame, top)',
        "    if False:\n        return segmentation_tables(frame, top)",
        (f"{LIGHT}::test_a_task_declaring_no_tables_gets_those_its_columns_suggest",),
    ),
    Fault(
        "a record without a seed rule is taken for this rule's",
        "evalkit/reproduction/reproduce.py",
        'rule = record.get("seed_rule", 1)',
        'rule = record.get("seed_rule", SEED_RULE)',
        ("tests/test_resolve.py::test_a_kept_row_drawn_under_another_seed_rule_says_so",),
    ),
    Fault(
        "every setup keeps its own list of image ids",
        "evalkit/publish/board_pairs.py",
        "            elif found[0] == ids:",
        "            elif found[0] == ids and not ids:",
        (f"{BOARD}::test_cells_naming_the_same_images_share_one_list_of_ids",),
    ),
    Fault(
        "the cell looks for the rows file of the name as written",
        "evalkit/core/cells.py",
        "path = rows_file(spec.out, resolve_task(cell[2], spec.overrides).name)",
        "path = rows_file(spec.out, cell[2])",
        (
            "tests/test_sweep.py::test_a_job_named_with_settings_or_an_alias_reads_the_rows_file_of_its_task",
        ),
    ),
    Fault(
        "two seed rules averaged as one run",
        "evalkit/core/labels.py",
        'return (row["task"], backbone, weights, options, config, data, row.get("seed_rule", 1))',
        'return (row["task"], backbone, weights, options, config, data, 1)',
        ("tests/test_rows_files.py::test_rows_of_two_seed_rules_are_two_runs_labelled_apart",),
    ),
    Fault(
        "a job's seed reaches a generator unnamed",
        "tasks/fairness.py",
        'rng = numpy_generator(seed, "fairness-interval")',
        "rng = np.random.default_rng(seed)",
        ("tests/test_architecture.py::test_no_generator_is_seeded_but_through_the_rule",),
    ),
    Fault(
        "MKL left outside its strict mode",
        "evalkit/__init__.py",
        'else f"{branch},STRICT"',
        "else branch",
        (THREADS,),
    ),
    Fault(
        "a late import fits on every core",
        "evalkit/device.py",
        "    if mkl_strict() is False:\n",
        "    if mkl_strict() is None:\n",
        (THREADS,),
    ),
    Fault(
        "bf16 sums in blocks of 1024 rows",
        "evalkit/heads/logistic.py",
        "PIECE = 256",
        "PIECE = 1024",
        (THREADS,),
    ),
    Fault(
        "the bf16 line summed over all features at once",
        "evalkit/heads/kept_logits_fit.py",
        "    for start in range(0, x.shape[1], PIECE):\n        features = slice(start, start + PIECE)",
        "    for start in range(0, x.shape[1], x.shape[1]):\n        features = slice(start, None)",
        (THREADS,),
    ),
    Fault(
        "row sums on every thread",
        "evalkit/heads/kept_logits_fit.py",
        "    with threads(1):\n        sums = values",
        "    if True:\n        sums = values",
        (THREADS,),
    ),
    Fault(
        "the loss's penalty summed on every thread",
        "evalkit/heads/logistic.py",
        "return loss + 0.5 * l2 * serial_dot(weight, weight)",
        "return loss + 0.5 * l2 * weight.pow(2).sum()",
        (THREADS,),
    ),
    Fault(
        "the few-shot solve on every thread",
        "evalkit/heads/linear.py",
        "    with threads(1):\n        return torch.linalg.solve(",
        "    if True:\n        return torch.linalg.solve(",
        (THREADS,),
    ),
    Fault(
        "ls settings lists the most derived class's fields first",
        "evalkit/core/settings_table.py",
        "for base in reversed(method_order((module, name))[1:]):",
        "for base in method_order((module, name))[1:]:",
        (LIGHT,),
    ),
    Fault(
        "ls settings ignores the catalog's parameters",
        "evalkit/core/settings_table.py",
        "value = params.get(field_name, default)",
        "value = default",
        (LIGHT,),
    ),
    Fault(
        "ls settings shows a value it did not evaluate",
        "evalkit/core/settings_table.py",
        "    def __repr__(self) -> str:\n        raise Unreadable(self.source)",
        "    def __repr__(self) -> str:\n        return self.source",
        (LIGHT,),
    ),
    Fault(
        "kNN's auto takes bf16 wherever the CPU has bf16 instructions",
        "evalkit/heads/knn.py",
        "return _bf16_product_faster(torch.get_num_threads())",
        "return True",
        ("tests/test_knn.py",),
    ),
    Fault(
        "a rough run met by its first similarity and not its maximum",
        "evalkit/heads/knn.py",
        "peaks = runs.amax(-1)",
        "peaks = runs[..., 0]",
        ("tests/test_knn.py",),
    ),
    Fault(
        "free cores from one reading",
        "evalkit/device.py",
        "busy = min(_busy_elsewhere(sample) for sample in range(BUSY_SAMPLES))",
        "busy = _busy_elsewhere(0)",
        ("tests/test_feeding.py",),
    ),
    Fault(
        "this process's threads counted after the kernel's count only",
        "evalkit/device.py",
        "return max(0, running - max(own_before, _own_running()))",
        "return max(0, running - _own_running())",
        ("tests/test_feeding.py",),
    ),
    Fault(
        "the tensor decoder imports torchvision's package",
        "evalkit/data/jpeg_ops.py",
        "    operators = image_operators()\n",
        "    operators = None\n",
        ("tests/test_feeding_views.py",),
    ),
    Fault(
        "the crop's anchor rounded down",
        "evalkit/data/jpeg_ops.py",
        "top = int(round((height - size) / 2.0))",
        "top = (height - size) // 2",
        ("tests/test_feeding_views.py",),
    ),
    Fault(
        "the longer side rounded to nearest",
        "evalkit/data/jpeg_ops.py",
        "new_short, new_long = side, int(side * long / short)",
        "new_short, new_long = side, round(side * long / short)",
        ("tests/test_feeding_views.py",),
    ),
    Fault(
        "bilinear without vector kernels resized in uint8",
        "evalkit/data/jpeg_ops.py",
        '    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")',
        "    return True",
        ("tests/test_feeding_views.py",),
    ),
    Fault(
        "mixed absolute and relative ids cut as one folder's",
        "evalkit/publish/board_reading.py",
        'return sum(map(str.startswith, ids, itertools.repeat("/")))',
        "return 0",
        ("tests/test_board_statistics.py",),
    ),
    Fault(
        "released frames not read again for pairs tested one by one",
        "evalkit/publish/board_pairs.py",
        "    if at_once is None and any(found is None for found in outputs.values()):\n",
        "    if False:\n",
        ("tests/test_board_statistics.py",),
    ),
    Fault(
        "resampled means from counts where the values are not whole",
        "evalkit/publish/board_pairs.py",
        "or (stacked != np.rint(stacked)).any():",
        "or False:",
        ("tests/test_board_statistics.py",),
    ),
    Fault(
        "the resize's output laid out channels-first",
        "evalkit/data/jpeg_ops.py",
        "batch = _channels_last_kept(image.reshape(1, channels, height, width))",
        "batch = image.reshape(1, channels, height, width)",
        ("tests/test_feeding_views.py",),
    ),
    Fault(
        "ls settings reads a constant the module binds again",
        "evalkit/core/settings_table.py",
        "if name in self.shadowed or self.bound[name] > 1:",
        "if name in self.shadowed:",
        (LIGHT,),
    ),
)


def run_fault(fault: Fault, root: Path) -> tuple[bool, float]:
    """(killed, seconds): the fault applied, its tests run, the source restored."""
    path = root / fault.path
    original = path.read_text()
    if original.count(fault.old) != 1:
        raise SystemExit(f"{fault.name}: the snippet is not in {fault.path} exactly once")
    start = time.perf_counter()
    try:
        path.write_text(original.replace(fault.old, fault.new))
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PYTHONPATH": str(root),
        }
        # the long tier included (the gate is one of the faults' tests); only slow ones left out
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        proc = subprocess.run(
            [*command, "-m", "not slow", *fault.tests],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=1800,
        )
    finally:
        path.write_text(original)
    if proc.returncode == 5:  # pytest ran nothing: no test could have caught the fault
        raise SystemExit(f"{fault.name}: no test of {fault.tests} ran")
    return proc.returncode != 0, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated fault names")
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to mutate")
    args = parser.parse_args()
    tasks = args.root / "evalkit" / "tasks"  # installed as evalkit.tasks; a clone needs the link
    if args.root != ROOT and not tasks.exists():
        tasks.symlink_to("../tasks")
    chosen = [f for f in FAULTS if not args.only or f.name in args.only.split(",")]
    results = {}
    for fault in chosen:
        killed, seconds = run_fault(fault, args.root.resolve())
        results[fault.name] = "killed" if killed else "SURVIVED"
        print(f"{'killed  ' if killed else 'SURVIVED'} {fault.name} ({seconds:.0f} s)", flush=True)
    kills = sum(v == "killed" for v in results.values())
    print(f"kill rate: {kills}/{len(results)} = {kills / len(results):.0%}")
    report("mutations", {"kill_rate": round(kills / len(results), 3), "faults": results})


if __name__ == "__main__":
    main()
