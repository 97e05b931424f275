"""The engine core and its clients (vllm/v1/engine/core.py, core_client.py, utils.py):
EngineCore runs the scheduler (engine/core/) and the executor (engine/executor/) in a loop;
EngineCoreProc runs it in a child process; the clients drive either from the front end."""
