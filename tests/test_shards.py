"""A zoo on many machines: each process runs its share of the cells (``--shard I/N``, a Slurm
array task, a Kubernetes Indexed Job pod), finished cells are left out before the cut, and
``evalkit merge`` brings the shards' folders into one that equals the one-process zoo; a merge
refuses rows that conflict and lists the cells still missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rows_compare import stable

from evalkit.cli import main
from evalkit.core.cells import shard_asked
from evalkit.errors import EvalkitError

TASKS = ("imagenet-knn", "imagenet-1shot")
ZOO = '[[backbone]]\nname = "fake"\n\n[[backbone]]\nname = "fake"\nmodel_args = { dim = 16 }\n'


def zoo(cli_env: Path, out: str, *extra: str) -> int:
    (cli_env / "zoo.toml").write_text(ZOO)
    argv = ["run", "--zoo", "zoo.toml", "--data", "embedded", "--out", out, "--quiet"]
    return main([*argv, *(a for task in TASKS for a in ("--task", task)), *extra])


def outputs(folder: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p) for p in sorted((folder / "predictions").glob("*"))}


@pytest.mark.parametrize(
    "environ,shard",
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, (3, 4)),
        (
            {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "8"},
            (4, 8),
        ),
        ({"JOB_COMPLETION_INDEX": "2", "EVALKIT_SHARDS": "5"}, (2, 5)),
    ],
)
def test_the_share_comes_from_the_engine_that_started_the_process(environ, shard):
    assert shard_asked(None, environ) == shard
    assert shard_asked("1/2", environ) == (1, 2)  # --shard wins


@pytest.mark.parametrize("text", ["2/2", "-1/3", "a/b", "3"])
def test_a_bad_shard_is_one_line(text):
    with pytest.raises(EvalkitError, match="expected I/N with 0 ≤ I < N"):
        shard_asked(text, {})
    with pytest.raises(EvalkitError, match="EVALKIT_SHARDS"):
        shard_asked(None, {"JOB_COMPLETION_INDEX": "0"})


def test_shards_then_merge_equal_the_one_process_zoo(cli_env, capsys):
    assert zoo(cli_env, "whole") == 0
    assert zoo(cli_env, "s0", "--shard", "0/2") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "shard 0/2: 2 cell(s) to run of its 2 (4 in all" in out
    assert zoo(cli_env, "s1", "--shard", "1/2") == 0
    assert main(["merge", "merged", "s0", "s1"]) == 0
    assert stable(cli_env / "merged") == stable(cli_env / "whole")
    mine, theirs = outputs(cli_env / "merged"), outputs(cli_env / "whole")
    assert list(mine) == list(theirs) and len(mine) == 4
    assert all(mine[name].equals(theirs[name]) for name in mine)
    before = stable(cli_env / "merged")
    assert main(["merge", "merged", "s0", "s1"]) == 0  # merging twice changes nothing
    assert stable(cli_env / "merged") == before
    assert json.loads((cli_env / "merged" / "missing-cells.json").read_text()) == []


def test_a_rerun_of_the_array_does_only_what_is_left(cli_env, capsys, monkeypatch):
    """Array tasks sharing one --out: a rerun leaves out the cells of its share that are done,
    so it runs what is left of its share, or nothing."""
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    for index in ("0", "1"):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", index)
        assert zoo(cli_env, "shared") == 0
    capsys.readouterr()
    assert zoo(cli_env, "shared") == 0
    assert "shard 1/2: 0 cell(s) to run of its 2 (4 in all" in " ".join(
        capsys.readouterr().out.split()
    )
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    monkeypatch.setenv("EVALKIT_SHARDS", "2")
    rows = cli_env / "shared" / "imagenet-knn.jsonl"
    lines = rows.read_text().splitlines()
    rows.write_text("\n".join(lines[2:]) + "\n")  # share 0's kNN cell's rows lost
    assert zoo(cli_env, "shared") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "shard 0/2: 1 cell(s) to run of its 2" in out
    assert len(rows.read_text().splitlines()) == 4  # the lost cell, run again


def test_a_shard_runs_as_its_own_process_under_slurms_variables(cli_env):
    (cli_env / "zoo.toml").write_text(ZOO)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    argv = [sys.executable, "-m", "evalkit", "run", "--zoo", "zoo.toml", "--data", "embedded"]
    argv += ["--task", "imagenet-knn", "--out", "p", "--quiet"]
    done = subprocess.run(argv, cwd=cli_env, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "shard 1/2: 1 cell(s) to run of its 1" in " ".join(done.stdout.split())
    assert len((cli_env / "p" / "imagenet-knn.jsonl").read_text().splitlines()) == 2


def test_merge_refuses_conflicts_and_lists_missing_cells(cli_env, capsys):
    assert zoo(cli_env, "a", "--shard", "0/2") == 0
    shutil.copytree(cli_env / "a", cli_env / "b")
    rows = cli_env / "b" / "imagenet-knn.jsonl"
    changed = [json.loads(x) for x in rows.read_text().splitlines()]
    changed[0]["value"] += 1.0
    rows.write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert main(["merge", "m", "a", "b"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "one job cannot have two values" in err and "a/imagenet-knn.jsonl" in err
    assert not (cli_env / "m").exists() or not list((cli_env / "m").glob("*.jsonl"))
    changed[0]["value"] -= 1.0
    changed[0]["task_version"] = 99
    changed[0]["run_key"] = "another"
    rows.write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert main(["merge", "m", "a", "b"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "measured with another task_version" in err
    assert "of fake (random init) (seed" in err  # the setup as every view names it
    one = ["run", "--task", "imagenet-1shot", "--backbone", "fake", "--data", "embedded"]
    assert main([*one, "--out", "c", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["merge", "m", "a", "c"]) == 1  # share 1 of a's study was never merged
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("share 1 of 2: that share was not merged") == 2
    assert "missing-cells.json" in out and "(not run)" not in out
    assert main(["merge", "m", "a", "c", "--allow-missing"]) == 0
    other = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--model-arg", "dim=16"]
    assert main([*other, "--data", "embedded", "--out", "d", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["merge", "gaps", "c", "d"]) == 1  # no shares: a task one setup did not run
    out = " ".join(capsys.readouterr().out.split())
    assert "missing: imagenet-1shot · imagenet (stand-in) × fake [dim=16] (random init)" in out
    assert out.count("(not run)") == 2


PAGE = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"


def cluster_page_blocks() -> tuple[str, dict, str]:
    """The Slurm script, the Kubernetes Job and the image build command of docs/cluster.md."""
    import re

    import yaml

    page = PAGE.read_text()
    script = re.search(r"```bash\n(#!/bin/bash.*?)```", page, re.S)[1]
    job = yaml.safe_load(re.search(r"```yaml\n(.*?)```", page, re.S)[1])
    build = re.search(r"```bash\n(docker build .*?)```", page, re.S)[1]
    return script, job, build


def test_the_cluster_pages_slurm_script_and_kubernetes_job_are_ready(cli_env, capsys):
    import re

    script, job, _ = cluster_page_blocks()
    array = re.search(r"#SBATCH --array=(\d+)-(\d+)", script)
    first, last = int(array[1]), int(array[2])
    command = " ".join(script.split("\\\n")).split("evalkit run", 1)[1].split()
    assert command[:2] == ["--zoo", "zoo.toml"] and "--out" in command
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["EVALKIT_SHARDS"]) == spec["completions"]
    assert container["command"][:3] == ["evalkit", "run", "--zoo"]
    # what the script's last array task and the job's last pod run, with their variables
    slurm = {"SLURM_ARRAY_TASK_ID": str(last), "SLURM_ARRAY_TASK_MIN": str(first)}
    slurm["SLURM_ARRAY_TASK_MAX"] = str(last)
    assert shard_asked(None, slurm) == (last - first, last - first + 1)
    pod = {"JOB_COMPLETION_INDEX": str(spec["completions"] - 1), **env}
    assert shard_asked(None, pod) == (spec["completions"] - 1, spec["completions"])


def test_the_slurm_script_activates_its_environment_and_names_a_missing_data_root(tmp_path):
    """The page's script under bash as an array task: it activates the environment it names,
    stops in one line naming EVALKIT_DATA when that is unset, and otherwise runs evalkit
    with the data root and its own shard folder (a stand-in evalkit records its arguments)."""
    script, _, _ = cluster_page_blocks()
    (tmp_path / "script.sh").write_text(script)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "evalkit").write_text('#!/bin/bash\necho "$@" > "$RECORD"\n')
    (venv / "bin" / "evalkit").chmod(0o755)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "EVALKIT_VENV": str(venv)}
    env |= {"SLURM_ARRAY_TASK_ID": "3", "RECORD": str(tmp_path / "args")}
    bash = ["bash", str(tmp_path / "script.sh")]
    unset = subprocess.run(bash, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert unset.returncode != 0 and "EVALKIT_DATA" in unset.stderr
    assert len(unset.stderr.strip().splitlines()) == 1
    done = subprocess.run(
        bash, env={**env, "EVALKIT_DATA": "/data"}, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "args").read_text().split()
    assert argv[argv.index("--data-dir") + 1] == "/data"
    assert argv[argv.index("--out") + 1] == "results/zoo/shard-3"


def test_the_kubernetes_job_mounts_every_path_it_names_and_its_image_has_a_recipe():
    """Every path the Job's command and environment read or write lies on a volume it mounts,
    each mount has its volume, and the image it runs is the one the page's build command tags
    from deploy/Dockerfile, whose every COPY source is in the repository."""
    _, job, build = cluster_page_blocks()
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts.values()) <= {v["name"] for v in pod["volumes"]}
    paths = [a for a in container["command"] if a.startswith("/")]
    paths += [e["value"] for e in container["env"] if str(e["value"]).startswith("/")]
    assert paths and all(any(p.startswith(m) for m in mounts) for p in paths), paths
    read_only = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    out = container["command"][container["command"].index("--out") + 1]
    assert not any(out.startswith(m) for m in read_only)  # results go to a writable volume
    words = build.split()
    assert words[words.index("-t") + 1] == container["image"]
    root = PAGE.parents[1]
    recipe = (root / words[words.index("-f") + 1]).read_text().splitlines()
    copies = [line.split()[1:-1] for line in recipe if line.startswith("COPY")]
    assert all((root / source).exists() for sources in copies for source in sources)
    assert any(line.startswith("RUN pip install") for line in recipe)


@pytest.mark.parametrize(
    "environ,shard",
    [
        (
            {
                "SLURM_ARRAY_TASK_ID": "4",
                "SLURM_ARRAY_TASK_STEP": "2",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            (2, 3),
        ),
        (
            {
                "SLURM_ARRAY_TASK_ID": "5",
                "SLURM_ARRAY_TASK_MIN": "1",
                "SLURM_ARRAY_TASK_MAX": "9",
                "SLURM_ARRAY_TASK_STEP": "4",
            },
            (1, 3),
        ),
    ],
)
def test_a_stepped_slurm_array_is_indexed_by_position(environ, shard):
    assert shard_asked(None, environ) == shard  # --array=0-4:2 and --array=1-9:4


@pytest.mark.parametrize(
    "environ,says",
    [
        (  # --array=0,5,9: ids not evenly spaced have no position Slurm tells
            {
                "SLURM_ARRAY_TASK_ID": "5",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            "position cannot be told from SLURM_ARRAY_TASK_ID=5",
        ),
        ({"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "SLURM_ARRAY_TASK_ID='x'"),
        ({"JOB_COMPLETION_INDEX": "1", "EVALKIT_SHARDS": "two"}, "EVALKIT_SHARDS='two'"),
        (
            {"JOB_COMPLETION_INDEX": "3", "EVALKIT_SHARDS": "2"},
            "JOB_COMPLETION_INDEX/EVALKIT_SHARDS gives 3/2",
        ),
        ({"EVALKIT_SHARDS": "4"}, "EVALKIT_SHARDS=4 is set but not JOB_COMPLETION_INDEX"),
        (  # sbatch --array=5: one index of a larger array submitted again
            {
                "SLURM_ARRAY_TASK_ID": "5",
                "SLURM_ARRAY_TASK_MIN": "5",
                "SLURM_ARRAY_TASK_MAX": "5",
                "SLURM_ARRAY_TASK_COUNT": "1",
            },
            "pass --shard 5/N",
        ),
        (  # --array=1,5,7 with a step of 1: its first id has no position either
            {
                "SLURM_ARRAY_TASK_ID": "1",
                "SLURM_ARRAY_TASK_MIN": "1",
                "SLURM_ARRAY_TASK_MAX": "7",
                "SLURM_ARRAY_TASK_STEP": "1",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            "position cannot be told",
        ),
    ],
)
def test_a_bad_share_from_the_environment_names_its_variable(environ, says):
    with pytest.raises(EvalkitError) as caught:
        shard_asked(None, environ)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert "--shard 3/2" not in str(caught.value)  # never a flag the user did not pass


def test_a_negative_shard_is_one_line(cli_env):
    done = subprocess.run(
        [sys.executable, "-m", "evalkit", "run", "--task", "imagenet-knn", "--shard", "-1/2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--option=VALUE" in done.stderr


def test_each_backbone_setups_features_are_extracted_on_one_share():
    """4 backbone setups × 3 tasks: cut cell by cell (i mod N) every setup ran on both of 2
    shares (8 extractions) and on all of 3 (12); cut by features, each on one (4)."""
    from evalkit.core.cells import shares_by_features

    cells = [(n, (f"fake{n}", 0, task)) for n in range(4) for task in ("a", "b", "c")]
    for count in (2, 3):
        cut = shares_by_features(cells, count)
        assert sorted(p for share in cut for p in share) == list(range(12))
        where = {cells[p][1][0]: set() for p in range(12)}
        for index, share in enumerate(cut):
            for position in share:
                where[cells[position][1][0]].add(index)
        assert all(len(shares) == 1 for shares in where.values())
        assert sum(map(len, where.values())) == 4
        assert max(map(len, cut)) - min(map(len, cut)) <= 3
    one = [(0, ("fake", 0, task)) for task in "abcd"]  # one setup: split to use every share
    assert all(shares_by_features(one, 2))


def test_a_lost_share_is_listed_and_fails_the_merge(cli_env, capsys):
    assert zoo(cli_env, "s0", "--shard", "0/2") == 0
    shutil.copytree(cli_env / "s0", cli_env / "s0-again")  # the same share run twice
    capsys.readouterr()
    assert main(["merge", "merged", "s0", "s0-again"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("share 1 of 2: that share was not merged") == 2  # its two cells
    missing = json.loads((cli_env / "merged" / "missing-cells.json").read_text())
    assert len(missing) == 2 and {cell["task"] for cell in missing} == set(TASKS)
    assert zoo(cli_env, "s1", "--shard", "1/2") == 0
    capsys.readouterr()
    assert main(["merge", "merged", "s1"]) == 0  # the lost share found: every cell there
    assert json.loads((cli_env / "merged" / "missing-cells.json").read_text()) == []


def test_merge_reads_every_per_image_file_before_writing(cli_env, capsys):
    assert zoo(cli_env, "s0", "--shard", "0/2", "--save-predictions") == 0
    shutil.copytree(cli_env / "s0", cli_env / "cut")
    victim = sorted((cli_env / "cut" / "predictions").glob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    for target in ("fresh", "holding"):
        if target == "holding":
            assert main(["merge", "holding", "s0", "--allow-missing"]) == 0
            before = sorted(p.name for p in (cli_env / "holding").rglob("*"))
        capsys.readouterr()
        assert main(["merge", target, "cut", "--allow-missing"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"per-image outputs {victim.relative_to(cli_env)} cannot be read" in err
        if target == "fresh":
            assert not (cli_env / "fresh").exists() or not list((cli_env / "fresh").rglob("*.*"))
        else:
            assert sorted(p.name for p in (cli_env / "holding").rglob("*")) == before


def test_an_empty_data_root_is_refused_naming_the_variable(capsys):
    """``--data-dir "$EVALKIT_DATA"`` with the variable unset: one line, not a search for the
    data in the current folder."""
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--task", "imagenet-knn", "--backbone", "fake", "--data-dir", ""])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "$EVALKIT_DATA" in err


def test_merge_refuses_one_cell_measured_on_other_data_files(cli_env, capsys):
    """Two rows of one setup, task, settings, dataset and seed whose data files differ (another
    ``data_id``: the same folder name, other images) cannot share a table: the merge is
    refused, naming ``data_id``, and writes no row."""
    one = ["run", "--task", "imagenet-knn", "--backbone", "fake", "--data", "embedded"]
    assert main([*one, "--out", "a", "--quiet"]) == 0
    shutil.copytree(cli_env / "a", cli_env / "b")
    rows = cli_env / "b" / "imagenet-knn.jsonl"
    changed = [json.loads(x) for x in rows.read_text().splitlines()]
    changed[0] |= {"run_key": "another", "data_id": {**changed[0]["data_id"], "val": "other"}}
    rows.write_text("".join(json.dumps(r) + "\n" for r in changed))
    capsys.readouterr()
    assert main(["merge", "m", "a", "b"]) == 2
    assert "measured with another data_id" in " ".join(capsys.readouterr().err.split())
    assert not (cli_env / "m").exists() or not list((cli_env / "m").glob("*.jsonl"))


def test_a_share_runs_tasks_given_with_settings_or_by_an_alias(cli_env):
    """Cells name their task as given: a bracketed task and an alias run in their share (they
    were taken for another share's, and nothing ran)."""
    argv = ["run", "--backbone", "fake", "--data", "embedded", "--quiet", "--shard", "0/1"]
    tasks = ["--task", "imagenet-knn[ks=10]", "--task", "imagenet-1shot[l2=10]"]
    assert main([*argv, *tasks, "--out", "s"]) == 0
    rows = [json.loads(x) for x in (cli_env / "s" / "imagenet-knn.jsonl").read_text().splitlines()]
    assert {r["metric"] for r in rows} == {"top1/k=10", "top5/k=10"}
    assert (cli_env / "s" / "imagenet-1shot.jsonl").exists()


def test_a_lost_share_of_another_study_with_other_settings_is_listed(cli_env, capsys):
    """Two studies of one zoo, the second with --set ks=10, merged into one folder: the
    second's lost share is missing though the first delivered cells of the same names (a
    cell is its rows' request key: settings, weights and data included)."""
    assert zoo(cli_env, "a0", "--shard", "0/2") == 0
    assert zoo(cli_env, "a1", "--shard", "1/2") == 0
    assert zoo(cli_env, "b0", "--shard", "0/2", "--set", "ks=10") == 2  # 1-shot has no ks
    (cli_env / "zoo.toml").write_text(ZOO)
    argv = ["run", "--zoo", "zoo.toml", "--data", "embedded", "--quiet", "--task", "imagenet-knn"]
    assert main([*argv, "--set", "ks=10", "--shard", "0/2", "--out", "b0"]) == 0
    capsys.readouterr()
    assert main(["merge", "m", "a0", "a1", "b0"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("share 1 of 2: that share was not merged") == 1


def test_a_failure_record_keeps_its_offset_so_every_reader_orders_it_alike(monkeypatch):
    import time

    from evalkit.publish.board_reading import _epoch

    written = "2026-12-07T14:16:36+0000"
    failed = "2026-12-07T23:46:36+0900"  # 30 minutes later, written in Tokyo
    for zone in ("UTC", "America/New_York", "Asia/Tokyo"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        assert _epoch(failed) - _epoch(written) == 1800
    monkeypatch.delenv("TZ")
    time.tzset()
