"""What ``prism-live --model NAME|PATH`` serves, without a model hub.

A known name (any model of ``calibration/profiles/models.yaml``, ``tiny`` included) becomes a folder holding
only a ``config.json`` with that model's real geometry, served with SGLang's ``--load-format dummy``: random
weights, so the text is meaningless, but the model's real shapes, hence its timings and KV use (DESIGN §6).
No tokenizer is needed either: the client sends token ids (``--skip-tokenizer-init``). The model's EOS ids are
read from its config too: the client bans them where SGLang must not ignore EOS (:mod:`prism.live.requests`).

A path is a local model folder (a ``config.json`` beside real weights), loaded as SGLang loads any model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from prism.calibration import profiles
from prism.errors import UserError
from prism.output import write_atomic_text

_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2",
                "MistralForCausalLM": "mistral"}


@dataclass(frozen=True)
class ServedModel:
    """A model folder for SGLang and what the client must know of it."""

    path: Path
    load_format: str  # "dummy" (generated geometry) or "auto" (local weights)
    vocab_size: int
    context_length: int
    name: str
    eos_ids: tuple[int, ...] = ()  # the token ids at which SGLang ends a request that does not ignore EOS


def hf_config(m: profiles.Model, dtype: str = "bfloat16") -> dict:
    """A Hugging Face ``config.json`` with the geometry of ``m``."""
    if m.architecture not in _MODEL_TYPES:
        raise UserError(f"model {m.key!r}: no config.json template for architecture {m.architecture!r}")
    return {
        "architectures": [m.architecture],
        "model_type": _MODEL_TYPES[m.architecture],
        "hidden_size": m.hidden,
        "intermediate_size": m.intermediate,
        "num_hidden_layers": m.layers,
        "num_attention_heads": m.heads,
        "num_key_value_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab,
        "max_position_embeddings": m.context_length,
        "rope_theta": m.rope_theta,
        "rms_norm_eps": m.rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": m.tie_embeddings,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prism" / "models"


def resolve_model(spec: str, dtype: str = "bfloat16", root: Path | None = None) -> ServedModel:
    """A known model name (generated config, dummy weights) or a local model folder."""
    path = Path(spec).expanduser()
    if path.exists() or os.sep in spec:
        if not path.is_dir():
            raise UserError("expected a model folder holding config.json", str(path))
        config_file = path / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except FileNotFoundError:
            raise UserError("no config.json in this model folder", str(path)) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"unreadable config.json ({type(e).__name__})", str(config_file)) from None
        vocab = config.get("vocab_size") if isinstance(config, dict) else None
        if not isinstance(vocab, int) or vocab < 2:
            raise UserError("config.json has no usable vocab_size", str(config_file))
        context = config.get("max_position_embeddings", 4096)
        has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
        return ServedModel(path, "auto" if has_weights else "dummy", vocab, int(context), path.name,
                           eos_ids(path, config, vocab))
    m = profiles.model(spec)
    folder = (root or cache_dir()) / f"{m.key}-{dtype}"
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(m, dtype)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    target = folder / "config.json"
    if not target.exists() or target.read_text() != text:
        write_atomic_text(target, text)
    return ServedModel(folder, "dummy", m.vocab, m.context_length, m.key, eos_ids(folder, config, m.vocab))


def eos_ids(folder: Path, config: dict, vocab: int) -> tuple[int, ...]:
    """The end-of-sequence ids SGLang stops at: ``eos_token_id`` of ``config.json`` and of a
    ``generation_config.json`` beside it (an int or a list each), those inside the vocabulary, sorted."""
    found: set[int] = set()
    sources = [config]
    try:
        sources.append(json.loads((folder / "generation_config.json").read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    for source in sources:
        value = source.get("eos_token_id") if isinstance(source, dict) else None
        for t in value if isinstance(value, list) else [value]:
            if isinstance(t, int) and 0 <= t < vocab:
                found.add(t)
    return tuple(sorted(found))
