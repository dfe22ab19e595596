"""Developer sessions: tests (default), long, faults, slow, lint, demo, bench, regression."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# The gate's rows (tests/regression/gate.py; vit22b/test trained by: evalkit pretrain --model
# vit22b/test --data embedded --steps 300) run in every CI run through tests/test_gate.py, in
# the long tier (`nox -s long`).
GATE = "tests/regression/gate.py"
# Rows of the tiny effect table in the suite: the two training ablations that need no ladder,
# and the linear probe on the ladder (pretrained afresh, so its training is checked too)
EFFECT_ROWS = "1,2,5"


def install(session, extra: str = "test"):
    session.install("-e", f".[{extra}]")


@nox.session
def tests(session):
    install(session)
    session.run("lint-imports")
    session.run("pytest", "-q", *session.posargs, env=OFFLINE)


@nox.session
def long(session):
    """The long tier CI runs after the default suite: the regression gate (tests/test_gate.py),
    every kernel path (tests/test_kernels.py), the two-rank torchrun runs and the other
    end-to-end runs of half a minute or more (about 16 minutes on 2 cores)."""
    install(session)
    session.run("pytest", "-q", "-m", "long and not slow", *session.posargs, env=OFFLINE)


@nox.session
def faults(session):
    """The whole fault-injection suite: kills at random moments, a full disk at every write,
    processes racing on one cache (tests/test_faults.py; a short subset runs by default)."""
    install(session)
    session.run("pytest", "-q", "-m", "slow", "tests/test_faults.py", env=OFFLINE)


@nox.session
def slow(session):
    """Every test marked slow: the whole fault suite and the two-rank fine-tuning and
    distillation equalities (about 10 minutes on 2 cores; the default suite skips them)."""
    install(session)
    session.run("pytest", "-q", "-m", "slow", env=OFFLINE)


@nox.session
def lint(session):
    """ruff, and the layer rules of docs/architecture.md (import-linter)."""
    install(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session
def demo(session):
    """The main job on embedded data: a linear probe of a small ViT, then the table."""
    install(session)
    session.run(
        "evalkit",
        "run",
        "--task",
        "imagenet-linear",
        "--backbone",
        "timm/vit_tiny_patch16_224",
        "--data",
        "embedded",
        env=OFFLINE,
    )
    session.run("evalkit", "table", "results/runs", env=OFFLINE)


@nox.session
def bench(session):
    """Every benchmark in benchmarks/, each printing ratios against its own baseline (faiss
    and scikit-learn come with the bench extra)."""
    install(session, "bench")
    for module in (
        "bench_extraction",
        "bench_linear_probe",
        "bench_vit22b_blocks",
        "bench_dense",
        "bench_identity",
        "bench_probe_memory",
        "bench_lit",
        "bench_video",
        "bench_trainer",
        "bench_corruptions",
        "bench_corruption_fidelity",
        "bench_knn",
        "bench_dense_memory",
        "bench_loader",
        "bench_leaderboard",
    ):
        session.run("python", "-m", f"benchmarks.{module}", *session.posargs, env=OFFLINE)


def regression_rows(session, out: str):
    """The gate's rows (random-init and trained backbones) and the tiny effect table's rows."""
    install(session)
    session.run("rm", "-rf", out, external=True)
    session.run("python", GATE, f"{out}/gate", env=OFFLINE)
    ladder = ".cache/regression-ladder"
    session.run("rm", "-rf", ladder, external=True)
    session.run(
        "evalkit",
        "reproduce",
        "--scale",
        "tiny",
        "--rows",
        EFFECT_ROWS,
        "--out",
        f"{out}/paper",
        "--cache-dir",
        ladder,
        "--quiet",
        env=OFFLINE,
    )


@nox.session
def regression(session):
    """The gate's rows and rows of the tiny effect table on embedded data, compared with the
    committed baselines: any change beyond the metric's tolerance (results/baselines/
    tolerances.toml, else 1 point), up or down, fails."""
    regression_rows(session, "results/regression")
    session.run(
        "evalkit",
        "compare",
        "results/baselines",
        "results/regression",
        "--tolerance",
        "1.0",
        env=OFFLINE,
    )


@nox.session(name="update-baselines")
def update_baselines(session):
    """Regenerate results/baselines from a fresh regression run (review the diff)."""
    regression_rows(session, "results/regression")
    session.run(
        "evalkit",
        "compare",
        "results/baselines",
        "results/regression",
        "--update-baselines",
        env=OFFLINE,
    )
