"""Child-process helpers shared by the engine-core launcher and the executor's workers
(vllm/utils/system_utils.py): the python to start a child with, and how a child ended.

Inside libvllm.so `sys.executable` may be the C host program, so a child is started with
the python of the environment (LIBVLLM_PYTHON, else sys.executable when it is a python,
else <sys.prefix>/bin/python3), never by re-executing the host.
"""

from __future__ import annotations

import os
import sys

from libvllm.engine import envs
from libvllm.engine.errors import VllmError

ENV_PYTHON = "LIBVLLM_PYTHON"


def python_executable() -> str:
    """The interpreter to run the child with (never the C host program)."""
    explicit = envs.LIBVLLM_PYTHON
    candidates = [explicit] if explicit else []
    if sys.executable and os.path.basename(sys.executable).startswith("python"):
        candidates.append(sys.executable)
    major, minor = sys.version_info[:2]
    candidates += [os.path.join(sys.prefix, "bin", name)
                   for name in (f"python{major}.{minor}", "python3", "python")]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise VllmError(f"cannot find the python of this environment to start the engine core "
                    f"(tried {candidates}); set {ENV_PYTHON}")


def describe_exit(returncode: int) -> str:
    """'exit code 1' or 'killed by signal SIGKILL'."""
    if returncode < 0:
        import signal

        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
