"""vLLM, over ``workflow`` (and importing nothing of it): every engine's arguments, sized to its job
(``engine_args``), the engine's child process, its parent watch and the OpenAI-compatible server's command line
(``engine_process``), the child side that starts the engine and measures (``measure``), and capture's vllm backend
(``capture``). Only these modules and the stages import vLLM, and only inside the engine's process."""
