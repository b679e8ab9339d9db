"""Whether this machine has room for more engine replicas beside the ones running: memory on a CPU host,
free GPU memory on a GPU host. A blue-green pool change starts the new replicas before it stops the old ones,
so it needs this room; where there is none, the change replaces replicas one at a time or is refused.

How it is judged:
- CPU engines (no GPU answers `nvidia-smi`): each replica needs its KV cache (`kv_cache_space_gib`, vLLM's
  default of 4 GiB when unset), its weights (the size of the model directory, where it is one on this host)
  and `ENGINE_OVERHEAD_BYTES` for its three processes (API server, engine core, worker: 1.9 GB resident for
  a demo engine on the 2-core development machine). The sum must fit in `MemAvailable` (/proc/meminfo)
  less `MEMORY_MARGIN` of the machine's memory, so the host does not swap or kill under the change.
- GPU engines: each replica takes `gpu_memory_utilization` (vLLM's default 0.9) of every GPU it uses
  (tensor x pipeline x data parallel), and vLLM refuses to start where that much is not free. So a replica fits
  on the GPUs whose free memory (`nvidia-smi`) holds that share of their total.
Pure reading: nothing here starts or stops anything.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from policies.schema import EngineSpec

__all__ = ["ENGINE_OVERHEAD_BYTES", "GIB", "MEMORY_MARGIN", "Gpu", "NoRoom", "Room", "Usage", "judge_room",
           "machine_usage"]

GIB = 1 << 30
ENGINE_OVERHEAD_BYTES = 2 * GIB
"""Memory of one CPU engine replica besides its KV cache and weights (API server, engine core, worker)."""
VLLM_CPU_DEFAULT_KV_GIB = 4
VLLM_DEFAULT_GPU_UTILIZATION = 0.9
MEMORY_MARGIN = 0.1
"""Share of the machine's memory left free after the new replicas start."""


class NoRoom(RuntimeError):
    """The machine has no room for one more replica (the message says what was judged)."""


@dataclass(frozen=True, slots=True)
class Gpu:
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class Usage:
    """What the machine has free now: memory (bytes) and, on a GPU host, each GPU."""

    memory_total: int
    memory_available: int
    gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True, slots=True)
class Room:
    """How many more replicas of a spec fit now (`fits`), and how that was judged (`how`, for logs and errors)."""

    fits: int
    how: str


def _meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    fields: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if rest.strip():
            fields[name] = int(rest.split()[0]) * 1024
    return fields.get("MemTotal", 0), fields.get("MemAvailable", fields.get("MemFree", 0))


def _gpus() -> tuple[Gpu, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        total, free = (int(float(v)) * (1 << 20) for v in line.split(","))
        gpus.append(Gpu(total, free))
    return tuple(gpus)


def machine_usage() -> Usage:
    """This machine's free memory and GPUs, read now."""
    total, available = _meminfo()
    return Usage(total, available, _gpus())


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _cpu_room(spec: EngineSpec, usage: Usage, weights: int) -> Room:
    kv = (spec.kv_cache_space_gib or VLLM_CPU_DEFAULT_KV_GIB) * GIB
    each = kv + weights + ENGINE_OVERHEAD_BYTES
    spare = usage.memory_available - int(MEMORY_MARGIN * usage.memory_total)
    fits = max(0, spare // each)
    how = (f"memory: {each / GIB:.1f} GiB a replica (KV cache {kv / GIB:.0f} GiB, weights {weights / GIB:.1f} GiB, "
           f"engine {ENGINE_OVERHEAD_BYTES / GIB:.0f} GiB) against {usage.memory_available / GIB:.1f} GiB available "
           f"less a {MEMORY_MARGIN:.0%} margin")
    return Room(int(fits), how)


def _gpu_room(spec: EngineSpec, usage: Usage) -> Room:
    share = spec.gpu_memory_utilization or VLLM_DEFAULT_GPU_UTILIZATION
    per_replica = spec.tensor_parallel_size * spec.pipeline_parallel_size * spec.data_parallel_size
    free_gpus = sum(1 for gpu in usage.gpus if gpu.free_bytes >= share * gpu.total_bytes)
    how = (f"GPU memory: a replica takes {share:.0%} of {per_replica} GPU(s); {free_gpus} of {len(usage.gpus)} "
           "GPU(s) have that much free")
    return Room(free_gpus // per_replica, how)


def judge_room(spec: EngineSpec, model_dir: Path | None, usage: Usage | None = None,
               read: Callable[[], Usage] = machine_usage) -> Room:
    """How many more replicas of `spec` this machine holds now, beside what runs. `model_dir`: the weights'
    directory on this host when the model is one (its size counts on a CPU host), else None."""
    usage = read() if usage is None else usage
    if usage.gpus:
        return _gpu_room(spec, usage)
    return _cpu_room(spec, usage, _dir_bytes(model_dir) if model_dir is not None else 0)

