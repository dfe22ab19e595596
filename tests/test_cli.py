import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evalkit.cli import main


def _run(*args):
    return main(["run", "--backbone", "fake", "--data", "embedded", "--quiet", *args])


def test_run_writes_rows_and_rerun_skips(cli_env, capsys):
    assert _run("--task", "imagenet-linear") == 0
    out = capsys.readouterr().out
    assert "top1" in out and "random weights" in out
    rows = [
        json.loads(line)
        for line in (cli_env / "results/runs/imagenet-linear.jsonl").read_text().splitlines()
    ]
    assert [r["metric"] for r in rows] == ["top1", "top5"]
    assert _run("--task", "imagenet-linear") == 0
    assert "skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--task", "imagenet-lineer"],
            "unknown task 'imagenet-lineer': did you mean 'imagenet-linear'",
        ),
        (["--task", "imagenet-linear", "--set", "l2=3"], "no setting 'l2'"),
        (
            ["--task", "imagenet-linear", "--data", "folder", "--data-dir", "/nonexistent"],
            "dataset folder not found",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(cli_env, capsys, args, message):
    assert _run(*args) == 2
    err = capsys.readouterr().err.strip()
    assert message in " ".join(err.split()) and "Traceback" not in err


def test_argument_typos_are_refused_before_torch_is_imported(cli_env):
    """An unknown task or suite, a --set that is no key=value or names no setting, a
    malformed --model-arg and an unknown backbone family are one line each, before the
    imports that take half a minute on a loaded machine."""
    typos = [
        ["--task", "imagenet-linaer"],
        ["--task", "suite:nope"],
        ["--task", "imagenet-linear", "--set", "nope=1"],
        ["--task", "imagenet-linear[l2=1]"],
        ["--task", "imagenet-linear", "--set", "nope"],
        ["--task", "imagenet-linear", "--model-arg", "x"],
        ["--task", "imagenet-linear", "--backbone", "timmm/vit_tiny_patch16_224"],
        ["--task", "imagenet-linear", "--backbone", "timm"],
    ]
    code = (
        "import json, sys; from evalkit.cli import main\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    assert main(['run', '--backbone', 'fake', '--data', 'embedded', *args]) == 2, args\n"
        "    assert 'torch' not in sys.modules, f'{args} imported torch'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(typos)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("error: ") == len(typos) and "Traceback" not in proc.stderr


def test_the_settings_read_from_source_are_each_tasks_own():
    """The early check reads a built-in task's settings from its class's source: for every
    task they are the settings the class itself has."""
    import dataclasses

    from evalkit.core.catalog import TASKS, resolve_task
    from evalkit.core.preflight import setting_names

    for entry in TASKS.entries():
        own = {f.name for f in dataclasses.fields(resolve_task(entry.name))} - {"name"}
        assert setting_names(entry.target) == own, entry.name


def test_a_misspelt_timm_model_fails_before_the_stand_in_data_is_written(cli_env, capsys):
    cache = cli_env / "fresh-cache"
    args = ["--task", "imagenet-linear", "--cache-dir", str(cache)]
    assert (
        main(["run", *args, "--backbone", "timm/vit_tinny_patch16_224", "--data", "embedded"]) == 2
    )
    assert "did you mean 'vit_tiny_patch16_224'" in capsys.readouterr().err
    assert not (cache / "embedded").exists()


def test_bad_weights_is_one_line_via_subprocess(cli_env, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalkit",
            "run",
            "--task",
            "imagenet-linear",
            "--backbone",
            "timm/vit_tiny_patch16_224",
            "--weights",
            str(bad),
            "--data",
            "embedded",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "cannot read checkpoint" in proc.stderr and "Traceback" not in proc.stderr


def test_table_and_compare(cli_env, capsys):
    assert (
        _run("--task", "imagenet-linear", "--task", "imagenet-5shot", "--set", "seeds=2") == 2
    )  # seeds not in linear
    capsys.readouterr()
    assert _run("--task", "imagenet-linear") == 0
    assert _run("--task", "imagenet-linear", "--seed", "1") == 0
    capsys.readouterr()
    assert main(["table", "results/runs"]) == 0
    table = capsys.readouterr().out
    assert "imagenet-linear (stand-in) top1 ↑" in table
    assert "paper: ViT-22B" not in table and "89.51" not in table  # real-data numbers
    assert "±" in table  # two seeds → mean ± std
    assert main(["compare", "results/runs", "results/runs"]) == 0
    capsys.readouterr()
    worse = cli_env / "worse.jsonl"
    rows = [
        json.loads(x)
        for x in (cli_env / "results/runs/imagenet-linear.jsonl").read_text().splitlines()
    ]
    worse.write_text("".join(json.dumps({**r, "value": r["value"] - 5}) + "\n" for r in rows))
    assert main(["compare", "results/runs", str(worse), "--tolerance", "1"]) == 1
    assert "regression" in capsys.readouterr().out
    assert main(["compare", "results/runs", str(worse), "--tolerance", "10"]) == 0
    assert main(["compare", "results/runs", str(worse), "--tolerance", "1", "--no-fail"]) == 0
    better = cli_env / "better.jsonl"
    better.write_text("".join(json.dumps({**r, "value": r["value"] + 5}) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["compare", "results/runs", str(better), "--tolerance", "1"]) == 1  # two-sided
    assert "changed-up" in capsys.readouterr().out
    assert main(["compare", "results/runs", str(better), "--tolerance", "1", "--one-sided"]) == 0
    # per-metric tolerances: top-1 may move 10% of its value, top-5 nothing beyond the default
    spec = cli_env / "tol.toml"
    spec.write_text('"imagenet-linear:top1" = "10%"\n"imagenet-linear:top5" = 1\n')
    top1_only = cli_env / "top1.jsonl"
    top1_only.write_text(
        "".join(
            json.dumps({**r, "value": r["value"] * (1.05 if r["metric"] == "top1" else 1)}) + "\n"
            for r in rows
        )
    )
    assert main(["compare", "results/runs", str(top1_only), "--tolerance", "0"]) == 1
    assert main(["compare", "results/runs", str(top1_only), "--tolerances", str(spec)]) == 0
    assert main(["compare", "results/runs", str(worse), "--tolerances", str(spec)]) == 1  # top-5
    spec.write_text('"imagenet-linear:*" = "ten"\n')
    assert main(["compare", "results/runs", str(worse), "--tolerances", str(spec)]) == 2


@given(base=st.floats(-1e6, 1e6), share=st.floats(0, 100), delta=st.floats(-1e6, 1e6))
def test_a_relative_tolerance_is_a_share_of_the_baseline(base, share, delta):
    from evalkit.core.gate import Tolerances

    rule = Tolerances(0.0, {"t:m*": f"{share}%", "t:*": 2.5})
    assert rule.allowed("t", "metric", base) == pytest.approx(abs(base) * share / 100)
    assert rule.allowed("t", "other", base) == 2.5 and rule.allowed("u", "m", base) == 0.0


def test_cache_ls_and_clear(cli_env, capsys):
    assert _run("--task", "imagenet-1shot") == 0
    capsys.readouterr()
    assert main(["cache", "ls"]) == 0
    assert "fake" in capsys.readouterr().out
    assert main(["cache", "clear", "--backbone", "fake"]) == 0
    assert "removed" in capsys.readouterr().out
    assert main(["cache", "ls"]) == 0
    assert "fake" not in capsys.readouterr().out


def test_ls_is_fast_and_does_not_import_torch():
    code = (
        "import sys; from evalkit.cli import main; main(['ls', 'tasks']); main(['ls', 'backbones']); "
        "assert 'torch' not in sys.modules, 'ls imported torch'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "imagenet-linear" in proc.stdout and "open_clip" in proc.stdout


def test_entry_point_plugins_are_listed(monkeypatch):
    from importlib.metadata import EntryPoint

    from evalkit import registry

    fake_ep = EntryPoint("my-task", "mypkg.tasks:build", "evalkit.tasks")
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [fake_ep] if group == "evalkit.tasks" else []
    )
    reg = registry.Registry("task", "evalkit.tasks")
    assert reg.names() == ["my-task"] and reg.get("my-task").target == "mypkg.tasks:build"


def test_a_plugin_named_like_a_built_in_is_refused_by_name(monkeypatch):
    """Dropping it silently would run the built-in where the user asked for the plugin."""
    from importlib.metadata import EntryPoint

    from evalkit import registry
    from evalkit.errors import EvalkitError

    shadow = EntryPoint("probe", "mypkg.tasks:probe", "evalkit.tasks")
    monkeypatch.setattr(registry, "entry_points", lambda group: [shadow])
    reg = registry.Registry("task", "evalkit.tasks")
    reg.add("probe", "evalkit.tasks.linear:Probe")
    with pytest.raises(EvalkitError):
        reg.names()
    with pytest.raises(EvalkitError) as refused:  # and again: never the built-in after all
        reg.get("probe")
    assert str(refused.value) == (
        "plugin task 'probe' (mypkg.tasks:probe, from an installed package) has the name of "
        "evalkit's evalkit.tasks.linear:Probe: rename its entry point in group 'evalkit.tasks'"
    )
    twice = [shadow, EntryPoint("probe", "otherpkg:probe", "evalkit.tasks")]
    monkeypatch.setattr(registry, "entry_points", lambda group: twice)
    with pytest.raises(EvalkitError, match="has the name of another plugin's mypkg.tasks:probe"):
        registry.Registry("task", "evalkit.tasks").get("probe")
    monkeypatch.setattr(registry, "entry_points", lambda group: [shadow])
    same = registry.Registry("task", "evalkit.tasks")  # the built-in's own entry: no clash
    same.add("probe", "mypkg.tasks:probe")
    assert same.get("probe").target == "mypkg.tasks:probe"


def test_a_name_registered_twice_is_refused():
    from evalkit import registry
    from evalkit.errors import EvalkitError

    reg = registry.Registry("task", "nothing")
    reg.add("probe", "a:b", aliases=("prob",))
    with pytest.raises(EvalkitError, match="task 'probe' is registered twice"):
        reg.add("probe", "c:d")
    with pytest.raises(EvalkitError, match="task 'prob' is registered twice"):
        reg.add("other", "c:d", aliases=("prob",))


def test_update_baselines_is_explicit(cli_env, capsys):
    assert _run("--task", "imagenet-1shot") == 0
    base = cli_env / "baselines"
    base.mkdir()
    (base / "stale.jsonl").write_text("")
    (base / "tolerances.toml").write_text('"imagenet-1shot:*" = 0.1\n')
    nested = cli_env / "results" / "runs" / "paper"
    nested.mkdir()
    (nested / "qk-norm-lr.jsonl").write_text("")
    assert main(["compare", str(base), "results/runs", "--update-baselines"]) == 0
    kept = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    assert kept == ["imagenet-1shot.jsonl", "paper/qk-norm-lr.jsonl", "tolerances.toml"]
    assert main(["compare", str(base), "results/runs"]) == 0


@pytest.fixture()
def unnormalised(monkeypatch):
    """A preprocessing fault: images reach the backbone without their normalisation."""
    from torchvision import transforms as T

    import evalkit.backbones.fake as fake_module

    def no_normalise(pre, *, train=False, square=False):
        return T.Compose([T.Resize(pre.size), T.CenterCrop(pre.size), T.ToTensor()])

    monkeypatch.setattr(fake_module, "build_transform", no_normalise)


def test_the_regression_gate_catches_an_injected_preprocessing_fault(cli_env, request):
    assert _run("--task", "imagenet-linear", "--out", "base") == 0
    request.getfixturevalue("unnormalised")
    assert _run("--task", "imagenet-linear", "--out", "faulty") == 0
    assert main(["compare", "base", "faulty", "--tolerance", "1.0"]) == 1


def test_predictions_are_saved_and_errors_reads_them(cli_env, capsys):
    import pandas as pd

    assert _run("--task", "imagenet-linear", "--save-predictions") == 0
    files = list(
        (cli_env / "results/runs/predictions").glob("imagenet-linear--fake--s0--*.parquet")
    )
    assert len(files) == 1
    frame = pd.read_parquet(files[0])
    assert len(frame) == 384 and set(frame.columns) >= {"image", "label", "top5", "correct"}
    rows = [json.loads(x) for x in (cli_env / "results/runs/imagenet-linear.jsonl").open()]
    top1 = next(r["value"] for r in rows if r["metric"] == "top1")
    assert 100 * frame["correct"].mean() == pytest.approx(top1)
    assert files[0].name.endswith(f"--{rows[0]['run_key']}.parquet")
    capsys.readouterr()
    assert main(["errors", "results/runs", "--task", "imagenet-linear"]) == 0
    out = capsys.readouterr().out
    assert "most confused classes" in out and "most confident mistakes" in out
    assert "probability" in out
    assert main(["errors", "results/runs", "--task", "imagenet-5shot"]) == 2


def test_compare_writes_junit_and_github_annotations(tmp_path, capsys):
    from xml.etree import ElementTree as ET

    row = {
        "task": "imagenet-linear",
        "backbone": "fake",
        "higher_is_better": True,
        "n": 10,
        "seeds": [0],
        "weights_id": "w",
    }
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    base.write_text(
        "".join(json.dumps({**row, "metric": m, "value": 50.0}) + "\n" for m in ("top1", "top5"))
    )
    new.write_text(
        "".join(
            json.dumps({**row, "metric": m, "value": v}) + "\n"
            for m, v in (("top1", 48.0), ("top5", 50.2))
        )
    )
    report = tmp_path / "out" / "gate.xml"
    args = ["compare", str(base), str(new), "--tolerance", "0.5", "--junit", str(report)]
    assert main([*args, "--format", "github"]) == 1
    out = capsys.readouterr().out
    assert out.count("::error ") == 1
    assert (
        "::error title=imagenet-linear fake top1::regression: baseline 50, new 48, "
        "delta -2, tolerance ±0.5"
    ) in out
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite.get("name") == "imagenet-linear"
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"fake top1", "fake top5"}
    failure = cases["fake top1"].find("failure")
    assert failure.get("type") == "regression" and "tolerance ±0.5" in failure.get("message")
    assert cases["fake top5"].find("failure") is None


@pytest.mark.parametrize(
    ("name", "given", "kept"),
    [
        ("OMP_WAIT_POLICY", None, "PASSIVE"),
        ("OMP_WAIT_POLICY", "ACTIVE", "ACTIVE"),
        ("THP_MEM_ALLOC_ENABLE", None, "1"),
        ("THP_MEM_ALLOC_ENABLE", "0", "0"),
    ],
)
def test_the_command_sets_threads_and_pages_before_torch_unless_told_otherwise(name, given, kept):
    """OpenMP reads its wait policy, and torch's CPU allocator its large-page switch, when
    torch loads: the command sets them first, and a value the user set is kept."""
    import os

    from evalkit.cli import HUGE_PAGES_OFFERED

    if name == "THP_MEM_ALLOC_ENABLE" and not os.path.exists(HUGE_PAGES_OFFERED):
        pytest.skip("this kernel offers no transparent huge pages: the switch is left unset")
    env = {k: v for k, v in os.environ.items() if k != name}
    if given is not None:
        env[name] = given
    code = (
        "import os, sys; from evalkit.cli import main; main(['ls', 'tasks']); "
        "assert 'torch' not in sys.modules, 'torch loaded before the settings were made'; "
        f"print('value', os.environ[{name!r}])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"value {kept}" in proc.stdout


def test_torch_backs_large_cpu_buffers_with_huge_pages_under_the_command_setting():
    """The switch the command sets is the one torch reads: a 8 MiB tensor's memory is marked
    for huge pages (``hg`` in its mapping's flags), and is not without the switch."""
    import os

    from evalkit.cli import HUGE_PAGES_OFFERED

    if not os.path.exists(HUGE_PAGES_OFFERED):
        pytest.skip("this kernel offers no transparent huge pages")
    code = (
        "import torch\n"
        "buffer = torch.empty(8 * 2**20, dtype=torch.uint8)\n"
        "pointer = buffer.data_ptr()\n"
        "lines = open('/proc/self/smaps').read().splitlines()\n"
        "inside = False\n"
        "for line in lines:\n"
        "    head = line.split()[0]\n"
        "    if '-' in head and ':' not in head:\n"
        "        start, stop = (int(x, 16) for x in head.split('-'))\n"
        "        inside = start <= pointer < stop\n"
        "    elif inside and line.startswith('VmFlags:'):\n"
        "        print('huge' if ' hg' in line else 'plain')\n"
    )
    seen = {}
    for value in ("1", "0"):
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": value}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        seen[value] = done.stdout.split()
    assert seen == {"1": ["huge"], "0": ["plain"]}
