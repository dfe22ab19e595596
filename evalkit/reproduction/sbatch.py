"""The Slurm batch script of a job array, written as submitit writes it when it submits one
(``evalkit sweep --dry-run``, ``evalkit reproduce --dry-run --executor slurm``).

It is written here rather than by submitit's private ``_make_sbatch_string`` so that a dry run,
which only plans, needs no ``evalkit[cluster]``; ``tests/test_sweep.py`` holds it to
submitit's own script wherever submitit is installed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

SIGNAL = "USR2@90"  # submitit's warning before a job's time is up, so it can requeue


def sbatch_script(
    command: str, folder: str, *, count: int, parallelism: int, **options: object
) -> str:
    """The script of an array of ``count`` tasks, at most ``parallelism`` at once, logging
    under ``folder`` (``%j``: the job id); ``options`` are sbatch's own (``job_name``,
    ``partition``, ``time``, ``nodes``, ``cpus_per_task``, ``gpus_per_node``, ``mem`` ...),
    None for one left unset."""
    logs = Path(folder).expanduser().absolute()
    stdout = str(logs / "%j_%t_log.out").replace("%j", "%A_%a")
    stderr = str(logs / "%j_%t_log.err").replace("%j", "%A_%a")
    parameters = {key: value for key, value in options.items() if value is not None}
    parameters |= {
        "wckey": "submitit",
        "signal": SIGNAL,
        "array": f"0-{count - 1}%{min(count, parallelism)}",
        "output": stdout.replace("%t", "0"),
        "error": stderr.replace("%t", "0"),
        "open-mode": "append",
    }
    srun = shlex.join(["srun", "--unbuffered", "--output", stdout, "--error", stderr])
    lines = ["#!/bin/bash", "", "# Parameters"]
    lines += [_flag(key, parameters[key]) for key in sorted(parameters)]
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", f"{srun} {command}", ""]
    return "\n".join(lines)


def _flag(key: str, value: object) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"
