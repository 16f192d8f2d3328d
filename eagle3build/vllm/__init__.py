"""vLLM, over ``workflow``: every engine's arguments, child process and run protocol (``engine``, the parent side),
the child side that starts the engine and measures (``measure``), and capture's vllm backend (``capture``). Only
these modules and the stages import vLLM, and only inside the engine's process."""
