"""A small Hugging Face tokenizer folder, trained here, for tests and examples that must not download a model.

Machines here reach no model hub, yet importing a chat log needs a real tokenizer with a chat template. This
module trains a byte-level BPE (the `tokenizers` library, as GPT-2, Llama 3 and Qwen use) on text the repo
can read — the MultiHop-RAG passages and queries and the τ-bench policies and tool schemas under
``../shared/data`` — and writes a folder a Hugging Face loader reads: ``tokenizer.json``,
``tokenizer_config.json`` (with the chat template) and ``special_tokens_map.json``.

The chat template is ChatML (``<|im_start|>role\\n ... <|im_end|>\\n``, Qwen's and many others' format) with
tool support in the manner of Qwen 2.5: tool schemas rendered into the system block, assistant tool calls as
``<tool_call>`` JSON, tool results as ``tool`` messages. It iterates a message's content parts (OpenAI's
``[{"type": "text", "text": ...}]``), so SGLang's content-format detection reads it as an ``openai`` template.

    from prism.traces.demo_tokenizer import build
    folder = build(tmp_path / "tok")        # about 2 s; the same bytes on every run

Tests get it as the session fixture ``chat_tokenizer_dir`` (``tests/conftest.py``, which ``tests/live`` shares:
the live suite can start SGLang with the same folder); ``prism-trace make-tokenizer -o DIR`` writes one from the
command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from prism.config import parse_json, path_kind, read_jsonl, read_text
from prism.errors import UserError
from prism.output import atomic_path

VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML with tools, written without line breaks so that trim_blocks/lstrip_blocks (which transformers sets)
#: have no newline to eat: every newline is a "\n" the template emits. A message's content: a string, or its
#: text parts in order (the loop over ``message.content`` is what makes SGLang pass parts as a list).
CONTENT = ("{%- if message.content is string -%}{{ message.content }}"
           "{%- elif message.content -%}{%- for part in message.content -%}"
           "{%- if part.type == 'text' -%}{{ part.text }}"
           "{%- else -%}{{ raise_exception('only text content parts are supported') }}{%- endif -%}"
           "{%- endfor -%}{%- endif -%}")
CHAT_TEMPLATE = (
    "{%- set has_system = messages and messages[0].role in ['system', 'developer'] -%}"
    "{%- if has_system or tools -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if has_system -%}{%- for message in messages[:1] -%}" + CONTENT + "{%- endfor -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{ '\n\n# Tools\n\nYou may call one or more functions. Their signatures:\n<tools>' }}"
    "{%- for tool in tools -%}{{ '\n' }}{{ tool | tojson }}{%- endfor -%}"
    "{{ '\n</tools>\n\nTo call a function, reply with <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n"
    "</tool_call>' }}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and has_system -%}"
    "{%- elif message.role == 'user' or message.role == 'tool' -%}"
    "{{ '<|im_start|>' + message.role + '\n' }}" + CONTENT + "{{ '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}" + CONTENT +
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{ '<tool_call>\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}{{ fn.arguments | tojson }}"
    "{{ '}\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- else -%}"
    "{{ raise_exception('unknown role ' + message.role) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def corpus(data_dir: Path) -> Iterator[str]:
    """The training text: MultiHop-RAG passages and queries, τ-bench policies and tool schemas."""
    mh, tb = data_dir / "multihop_rag", data_dir / "tau_bench"
    if path_kind(mh) != "dir" or path_kind(tb) != "dir":
        raise UserError("public data not found (needs multihop_rag/ and tau_bench/; set PRISM_DATA_DIR)",
                        str(data_dir))
    for _, rec in read_jsonl(mh / "evidence_passages.jsonl", "passages (JSONL)"):
        if isinstance(rec, dict):
            yield f"{rec.get('title', '')}\n{rec.get('fact', '')}"
    queries = parse_json(read_text(mh / "queries.json", "JSON file"), str(mh / "queries.json"))
    for q in queries if isinstance(queries, list) else []:
        if isinstance(q, dict):
            yield f"{q.get('query', '')}\n{q.get('answer', '')}"
    for domain in ("airline", "retail"):
        yield read_text(tb / domain / "policy.md", "policy (Markdown)")
        yield read_text(tb / domain / "tools.json", "tool schemas (JSON)")


def build(folder: str | Path, data_dir: str | Path | None = None, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the tokenizer and write its folder (created; files replaced atomically). Returns the folder."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise UserError("building a tokenizer needs the 'tokenizers' package (pip install 'prism-serve[hf]')"
                        ) from None
    from prism.traces.arrivals import default_data_dir

    texts = list(corpus(Path(data_dir) if data_dir else default_data_dir()))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "tokenizer.json") as tmp:
        try:
            tok.save(str(tmp))
        except Exception as e:  # the library's own (Rust) error, an OSError's text: "No space left on device"
            raise UserError(f"cannot write: {e}", str(out / "tokenizer.json")) from None
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "added_tokens_decoder": {str(tok.token_to_id(t)): {"content": t, "special": True, "normalized": False,
                                                           "lstrip": False, "rstrip": False, "single_word": False}
                                 for t in SPECIAL_TOKENS},
        "chat_template": CHAT_TEMPLATE,
    }
    for name, data in (("tokenizer_config.json", config),
                       ("special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})):
        with atomic_path(out / name) as tmp:
            tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out
