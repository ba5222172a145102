"""``python -m pdjit.distributed.launch --nproc_per_node N train.py [args...]``: run a training
script on N processes through MPICH's ``mpiexec``.

Options:

``--nproc_per_node N``  processes per machine (default 1);
``--hostfile FILE``     the machines, one per line (MPICH's host file: ``host`` or
                        ``host:slots``); the job then has N processes per host listed;
``--ips a,b,...``       the machines as a list (instead of a host file);
``--timeout S``         seconds a collective waits for its peers before the job stops with
                        an error (``PDJIT_DIST_TIMEOUT``; default 300);
``--threads T``         compute threads per process (``PDJIT_NUM_THREADS``, ``NUMBA_NUM_THREADS``,
                        ``OMP_NUM_THREADS``; default: the cores divided among the local processes);
``--mpiexec PATH``      the ``mpiexec`` to use (default: the one next to this Python, else the
                        one on ``PATH``).

The processes get MPICH's yielding wait (``MPIR_CVAR_POLLS_BEFORE_YIELD``,
``MPIR_CVAR_ENABLE_HEAVY_YIELD``) unless the environment sets it, so more processes than cores
do not starve each other. Several machines: every machine needs the same Python environment and
script path, and ``mpiexec`` must reach them (MPICH's hydra uses ssh). The exit status is
``mpiexec``'s: non-zero when a rank failed (its traceback and a line naming it are on stderr).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys


def find_mpiexec(explicit: str | None = None) -> str:
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise FileNotFoundError(f"--mpiexec {explicit!r}: no such executable file")
        return explicit
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError("mpiexec not found: install pdjit's 'distributed' extra "
                                "(pip install mpi4py mpich) or pass --mpiexec")
    return found


def yielding_env(env=None, threads: int | None = None) -> dict:
    """``env`` (default: this process's) with MPICH's yielding wait and ``threads`` compute
    threads per process (when given)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "1")
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    if threads is not None:
        for k in ("PDJIT_NUM_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                  "OPENBLAS_NUM_THREADS"):
            env[k] = str(threads)
    return env


def command(script_argv, nproc: int, hostfile=None, ips=None, mpiexec=None) -> list:
    """The ``mpiexec`` command line that runs ``script_argv`` (``[script, args...]``)."""
    cmd = [find_mpiexec(mpiexec)]
    hosts = [h.strip() for h in ips.split(",") if h.strip()] if ips else []
    if hostfile:
        if not os.path.isfile(hostfile):
            raise FileNotFoundError(f"--hostfile {hostfile!r}: no such file")
        with open(hostfile) as f:
            hosts_in_file = [ln.split("#")[0].strip() for ln in f]
        hosts = [h for h in hosts_in_file if h]
        cmd += ["-f", hostfile, "-ppn", str(nproc)]
    elif hosts:
        cmd += ["-hosts", ",".join(hosts), "-ppn", str(nproc)]
    total = nproc * max(len(hosts), 1)
    cmd += ["-n", str(total), sys.executable, *script_argv]
    return cmd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdjit.distributed.launch",
                                description="Run a pdjit training script on several processes "
                                            "through mpiexec (MPICH).")
    p.add_argument("--nproc_per_node", type=int, default=1,
                   help="processes per machine (default 1)")
    p.add_argument("--hostfile", help="the machines, one per line (MPICH's host file)")
    p.add_argument("--ips", help="the machines as a comma-separated list (instead of "
                                  "--hostfile)")
    p.add_argument("--timeout", type=float,
                   help="seconds a collective waits for its peers before the job stops "
                        "(PDJIT_DIST_TIMEOUT, default 300)")
    p.add_argument("--threads", type=int, help="compute threads per process")
    p.add_argument("--mpiexec", help="the mpiexec to run (default: MPICH's beside this "
                                      "Python, else on PATH)")
    p.add_argument("script", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = p.parse_args(argv)
    if a.nproc_per_node < 1:
        p.error(f"--nproc_per_node must be >= 1, got {a.nproc_per_node}")
    if a.timeout is not None and not a.timeout > 0:
        p.error(f"--timeout must be > 0, got {a.timeout}")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if not os.path.isfile(a.script):
        p.error(f"no such script: {a.script!r}")
    try:
        cmd = command([a.script, *a.args], a.nproc_per_node, a.hostfile, a.ips, a.mpiexec)
    except FileNotFoundError as e:
        p.error(str(e))
    threads = a.threads if a.threads is not None else \
        max(1, (os.cpu_count() or 1) // a.nproc_per_node)
    env = yielding_env(threads=threads)
    if a.timeout is not None:
        env["PDJIT_DIST_TIMEOUT"] = str(a.timeout)
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        print(f"pdjit.distributed.launch: the job ended with status {rc} (see the failing "
              f"rank's error above)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
