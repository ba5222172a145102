"""``examples/distributed_digits.py``: the MLP trained by 2 MPI processes learns the digits."""
from __future__ import annotations

import pathlib
import subprocess
import sys

from test_mpi import _env, pytestmark  # noqa: F401 (skipped without MPI; the mpi worker)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_distributed_digits_learns_on_two_processes():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "distributed_digits.py"),
                           "--epochs", "3"], capture_output=True, text=True, timeout=240,
                          cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "2 processes, 3 epochs" in proc.stdout
    acc = float(proc.stdout.split("test accuracy:")[1].split()[0])
    assert acc > 0.9, proc.stdout   # 3 of the default 15 epochs; the full run: ~0.99
