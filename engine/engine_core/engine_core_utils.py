"""Starting the engine-core child process, as vllm/v1/engine/utils.py
(CoreEngineProcManager, get_engine_client_zmq_addr, wait_for_engine_startup).

Traps of an embedded interpreter (docs/c_api.md, "Engine-core process"):
- inside libvllm.so `sys.executable` may be the C host program: the child is started with
  the python of the environment (LIBVLLM_PYTHON, else sys.executable when it is a
  python, else <sys.prefix>/bin/python3), never by re-executing the host, and not through
  multiprocessing (which would use sys.executable);
- the child gets the parent's sys.path as PYTHONPATH, and its own session, so a
  terminal's Ctrl-C reaches the host only (the host then stops the child);
- the child's glibc malloc gets MALLOC_ARENA_MAX=CORE_MALLOC_ARENA_MAX unless the
  environment sets it: xgrammar compiles on up to 8 threads, and with glibc's default
  (8 arenas per core) the memory its compiles free stays scattered over those arenas, so
  the core's RSS grew by ~2 MB per structured-output request long after xgrammar's own
  cache stopped growing (examples/bench/soak.py --mix structured shows the growth).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

from libvllm.engine import envs
from libvllm.engine.config import EngineConfig
from libvllm.engine.process_utils import python_executable

# the first frame of the child's messages on the output socket (engine_core_proc.py)
READY, FAILED, DEAD = b"READY", b"FAILED", b"DEAD"
# before READY: PROGRESS + the load's progress; the front end's answer on the input
# socket is one of LOAD_CONTINUE, LOAD_ABORT, LOAD_UNWATCHED (engine_core/load_progress_relay.py)
PROGRESS = b"PROGRESS"
LOAD_CONTINUE, LOAD_ABORT, LOAD_UNWATCHED = b"LOAD_CONTINUE", b"LOAD_ABORT", b"LOAD_UNWATCHED"
CORE_MALLOC_ARENA_MAX = "2"


@dataclasses.dataclass
class CoreProcess:
    proc: subprocess.Popen
    ipc_dir: str
    input_address: str  # the front end binds PUSH; the child connects PULL
    output_address: str  # the front end binds PULL; the child connects PUSH

    def cleanup(self) -> None:
        shutil.rmtree(self.ipc_dir, ignore_errors=True)


def ipc_addresses() -> tuple[str, str, str]:
    """(private directory, input address, output address) of two fresh IPC sockets."""
    ipc_dir = tempfile.mkdtemp(prefix="vllm-core-")
    return ipc_dir, f"ipc://{ipc_dir}/input", f"ipc://{ipc_dir}/output"


def launch_core_process(config: EngineConfig, ipc_dir: str, input_address: str,
                        output_address: str) -> CoreProcess:
    env = envs.child_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the child is the core
    env.setdefault("MALLOC_ARENA_MAX", CORE_MALLOC_ARENA_MAX)
    log_level = logging.getLogger("libvllm.engine").getEffectiveLevel()
    argv = [python_executable(), "-m", "libvllm.engine.engine_core.engine_core_proc",
            "--input", input_address, "--output", output_address,
            "--parent-pid", str(os.getpid()), "--log-level", str(log_level),
            "--config", json.dumps(dataclasses.asdict(config))]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True)
    return CoreProcess(proc, ipc_dir, input_address, output_address)
