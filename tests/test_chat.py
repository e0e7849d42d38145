"""The chat segmentation rule (prism.traces.chat) on hand-made requests, checked against the tokenizer's own
encoding of the whole prompt and against the segment texts the ChatML template must produce."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PRIV, REUSE, SYS, need_data
from prism.traces.chat import ChatError, ChatSegmenter, Declared, block_layout, server_view
from prism.traces.chat_template import ChatTokenizer, content_format

SYSTEM = "You are a careful assistant. Answer from the documents."
DOCS = ["The FTX trial began in October.\n", "Sam Bankman-Fried founded the exchange.\n",
        "The jury deliberated for hours.\n", "Prosecutors called many witnesses.\n"]


@pytest.fixture(scope="module")
def tok(chat_tokenizer_dir):
    return ChatTokenizer(chat_tokenizer_dir)


@pytest.fixture
def seg(tok):
    return ChatSegmenter(tok)


def rag(docs, question, system=SYSTEM):
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": d} for d in [*docs, question]]}]


def texts(tok, layout) -> list[str]:
    ends = [end for _, _, end in layout.segments]
    return [tok.decode(layout.tokens[a:b]) for a, b in zip([0, *ends], ends)]


def whole(tok, messages, tools=None) -> np.ndarray:
    """The server's prompt: the template over the server's view of the messages, encoded in one piece."""
    return tok.encode(tok.render(server_view(messages, tok.content_format(tools)), tools, True))


def check_tiles(tok, layout, messages, tools=None):
    """Every prompt token in exactly one segment, and the prompt is the whole text's encoding."""
    ends = [end for _, _, end in layout.segments]
    assert ends == sorted(set(ends)) and ends[-1] == len(layout.tokens) and ends[0] > 0
    assert layout.tokens.tolist() == whole(tok, messages, tools).tolist()


def test_the_demo_template_takes_text_parts_as_a_list(tok):
    assert tok.content_format() == "openai" and tok.piecewise
    assert content_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "string"
    loops = "{% for turn in messages %}{% for p in turn['content'] %}{% endfor %}{% endfor %}"
    assert content_format(loops) == "string"
    assert content_format("{% for m in messages %}{% for p in m['content'] %}{% endfor %}{% endfor %}") == "openai"
    assert content_format("{% for message in messages %}{% for p in message['content'] %}{{ p.text }}"
                          "{% endfor %}{% endfor %}") == "openai"


def test_two_requests_sharing_a_system_prompt_and_two_of_three_documents(tok, seg):
    a, b = seg.layouts([(rag(DOCS[:3], "When did the trial begin?"), None, None),
                        (rag([DOCS[0], DOCS[1], DOCS[3]], "Who founded it?"), None, None)])
    for layout, docs, q in ((a, DOCS[:3], "When did the trial begin?"),
                            (b, [DOCS[0], DOCS[1], DOCS[3]], "Who founded it?")):
        assert [k for k, _, _ in layout.segments] == [SYS, REUSE, REUSE, REUSE, PRIV]
        assert texts(tok, layout) == [f"<|im_start|>system\n{SYSTEM}<|im_end|>\n", f"<|im_start|>user\n{docs[0]}",
                                      docs[1], docs[2], f"{q}<|im_end|>\n<|im_start|>assistant\n"]
    ids_a, ids_b = [i for _, i, _ in a.segments], [i for _, i, _ in b.segments]
    assert ids_a[:3] == ids_b[:3]  # the system prompt and the two shared documents
    assert ids_a[3] != ids_b[3] and ids_a[4] != ids_b[4]
    assert [i.split(":")[0] for i in ids_a] == ["sys", "doc", "doc", "doc", "user"]
    check_tiles(tok, a, rag(DOCS[:3], "When did the trial begin?"))


def test_different_content_of_the_same_length_is_two_segments(tok, seg):
    words = ["court", "trial", "jury", "judge", "witness", "verdict", "fraud", "exchange"]
    by_length: dict[int, list[str]] = {}
    for w1 in words:
        for w2 in words:
            text = f"The {w1} and the {w2}.\n"
            by_length.setdefault(len(tok.encode(text)), []).append(text)
    one, two = next(group[:2] for group in by_length.values() if len(group) > 1)
    a, b = seg.layouts([(rag(["Shared.\n", one], "q?"), None, None), (rag(["Shared.\n", two], "q?"), None, None)])
    (_, da, ea), (_, db, eb) = a.segments[2], b.segments[2]
    assert ea - a.segments[1][2] == eb - b.segments[1][2]
    assert da != db and a.segments[1][1] == b.segments[1][1]


def session(system, tool_result, first_question):
    call = {"type": "function", "function": {"name": "get_order", "arguments": json.dumps({"order_id": "#W1"})}}
    return [{"role": "system", "content": system}, {"role": "user", "content": first_question},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": tool_result},
            {"role": "assistant", "content": "Your order has shipped."},
            {"role": "user", "content": "Thanks, and the other one?"}]


def test_a_tool_result_repeated_across_sessions_is_one_segment(tok, seg):
    result = json.dumps({"order_id": "#W1", "status": "shipped", "items": ["lamp", "desk"]})
    a, b = seg.layouts([(session("Retail agent.", result, "Where is my order?"), None, None),
                        (session("Airline agent, retail desk.", result, "Order status please."), None, None)])
    tool_a = [(i, t) for (k, i, _), t in zip(a.segments, texts(tok, a)) if i.startswith("tool:")]
    tool_b = [(i, t) for (k, i, _), t in zip(b.segments, texts(tok, b)) if i.startswith("tool:")]
    assert len(tool_a) == len(tool_b) == 1 and tool_a == tool_b
    assert tool_a[0][1] == f"<|im_start|>tool\n{result}<|im_end|>\n"
    assert [i.split(":")[0] for _, i, _ in a.segments] == ["sys", "user", "asst", "tool", "asst", "user"]
    assert [k for k, _, _ in a.segments] == [SYS, PRIV, PRIV, REUSE, PRIV, PRIV]
    assert a.segments[0][1] != b.segments[0][1]  # different system prompts
    check_tiles(tok, a, session("Retail agent.", result, "Where is my order?"))


def test_tool_schemas_are_one_reusable_segment_inside_the_system_block(tok, seg):
    need_data("tau_bench")
    from conftest import DATA

    tools = json.loads((DATA / "tau_bench" / "retail" / "tools.json").read_text())
    a, b, c = seg.layouts([(rag(DOCS[:1], "q1"), tools, None), (rag(DOCS[1:2], "q2"), tools, None),
                           (rag(DOCS[:1], "q1"), tools[:3], None)])
    assert [i.split(":")[0] for _, i, _ in a.segments] == ["sys", "tools", "doc", "user"]
    ta = texts(tok, a)
    assert ta[0] == f"<|im_start|>system\n{SYSTEM}" and ta[1].startswith("\n\n# Tools")
    assert ta[1].endswith("</tool_call><|im_end|>\n") and json.dumps(tools[0]) in ta[1]
    assert a.segments[:2] == b.segments[:2]  # same system prompt, same tools
    assert c.segments[0] == a.segments[0] and c.segments[1][1] != a.segments[1][1]
    check_tiles(tok, a, rag(DOCS[:1], "q1"), tools)


def test_a_conversation_turn_continues_the_turn_before_token_for_token(tok, seg):
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi there."}]
    turn2 = turn1 + [{"role": "assistant", "content": "Hello! How can I help?"},
                     {"role": "user", "content": "Tell me about the trial."}]
    a, b = seg.layouts([(turn1, None, None), (turn2, None, None)])
    assert b.tokens[:len(a.tokens)].tolist() == a.tokens.tolist()  # what a cache of turn 1 gives turn 2
    assert a.segments[0] == b.segments[0]
    assert texts(tok, b)[1:] == ["<|im_start|>user\nHi there.<|im_end|>\n",
                                 "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n",
                                 "<|im_start|>user\nTell me about the trial.<|im_end|>\n<|im_start|>assistant\n"]
    check_tiles(tok, b, turn2)


def test_declared_segments_override_the_reading_and_may_move(tok, seg):
    q = "Which came first?"
    declared = Declared(((SYS, SYSTEM), (REUSE, DOCS[0]), (REUSE, DOCS[1]), (PRIV, q)), movable=True)
    flipped = Declared(((SYS, SYSTEM), (REUSE, DOCS[1]), (REUSE, DOCS[0]), (PRIV, q)), movable=True)
    a, b = seg.layouts([(rag(DOCS[:2], q), None, declared), (rag([DOCS[1], DOCS[0]], q), None, flipped)])
    assert not a.fixed_order
    ta = texts(tok, a)
    assert ta == [f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n", DOCS[0], DOCS[1],
                  f"{q}<|im_end|>\n<|im_start|>assistant\n"]
    # a document's segment is its own text wherever it sits: the two orders share the same document ids
    assert {i for _, i, _ in a.segments[1:3]} == {i for _, i, _ in b.segments[1:3]}
    assert a.segments[1][1] == b.segments[2][1]
    with pytest.raises(ChatError, match="segment 2's text is not in the rendered prompt"):
        seg.layout(rag(DOCS[:2], q), None, Declared(((SYS, SYSTEM), (REUSE, "no such text"))))


def test_the_server_view_follows_sglang(tok):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": None},
            {"role": "assistant", "content": None,
             "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]},
            {"role": "tool", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
            {"role": "assistant", "content": "draft"}]
    string = server_view(msgs, "string")
    assert string[0] == {"role": "user", "content": "a b"}  # joined by a space; null fields dropped
    assert string[1]["content"] == "" and string[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert string[2]["content"] == "r1 r2"
    assert string[3] == {"role": "user", "content": "draft"}  # a final assistant message is read as the user's
    assert server_view(msgs, "openai")[0]["content"] == msgs[0]["content"]
    bad = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]
    with pytest.raises(ChatError, match="arguments must be a JSON object"):
        server_view(bad, "string")


LAST_DIFFERS = ("{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
                "{% if loop.last %} (latest){% endif %}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_renders_the_last_message_apart_falls_back_to_the_texts(chat_tokenizer_dir, tmp_path):
    """Prefix renderings that do not begin the prompt (a template marking its last message) cannot place the
    blocks; the messages are then found by their text, and the tokens still tile the prompt exactly."""
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((chat_tokenizer_dir / "tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": LAST_DIFFERS}))
    tok = ChatTokenizer(folder)
    msgs = [{"role": "user", "content": "First question."}, {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "Second question."}]
    layout = ChatSegmenter(tok).layout(msgs)
    got = texts(tok, layout)
    assert "".join(got) == tok.render(msgs, None, True)
    assert got[1].startswith("First answer.") and got[2].startswith("Second question.")
    assert layout.tokens.tolist() == tok.encode(tok.render(msgs, None, True)).tolist()


def test_blocks_are_keyed_by_the_prompt_up_to_their_end():
    base = np.arange(100, 100 + 1300, dtype=np.int32)
    other = base.copy()
    other[1100] += 1  # differs inside the third block
    moved = np.concatenate([base[512:1024], base[:512]])  # the same blocks in another order
    a, b, c = (block_layout(t, 512) for t in (base, other, moved))
    assert [end for _, _, end in a.segments] == [512, 1024, 1300]
    assert [i for _, i, _ in a.segments][:2] == [i for _, i, _ in b.segments][:2]
    assert a.segments[2][1] != b.segments[2][1]
    assert not {i for _, i, _ in c.segments} & {i for _, i, _ in a.segments}  # a block's id is its prefix's
    assert all(k == REUSE for k, _, _ in a.segments) and a.fixed_order


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n", " ", "  ", "word", " Word",
                                 "é", "日本", "123", "'s", "\t", "!?", "<|im_", "end|>"]), max_size=30),
       st.lists(st.integers(0, 200), max_size=4))
def test_piecewise_encoding_equals_the_whole_texts_encoding(tok, pieces, cuts):
    """Split at the added tokens and memoized, the text still encodes as the tokenizer encodes it whole; a cut's
    token is the one holding the cut's character."""
    text = "".join(pieces)
    cuts = sorted({min(c, len(text)) for c in cuts})
    (tokens, where), = tok.tokenize([(text, cuts)])
    enc = tok._tok.encode(text, add_special_tokens=False)
    assert tokens.tolist() == enc.ids
    for c, t in zip(cuts, where):
        expected = next((enc.char_to_token(p) for p in range(c, len(text)) if enc.char_to_token(p) is not None),
                        len(enc.ids))
        assert t == expected


def test_a_tokenizer_file_that_truncates_still_gives_the_whole_prompt(chat_tokenizer_dir, tmp_path):
    """transformers (and so SGLang) encodes a prompt whole unless asked to cut it; a tokenizer.json that carries
    truncation and padding settings must not shorten or pad the imported prompt."""
    spec = json.loads((chat_tokenizer_dir / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    spec["padding"] = {"strategy": {"Fixed": 4096}, "direction": "Right", "pad_to_multiple_of": None,
                       "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_bytes((chat_tokenizer_dir / "tokenizer_config.json").read_bytes())
    cut, whole = ChatTokenizer(folder), ChatTokenizer(chat_tokenizer_dir)
    msgs = rag(DOCS[:2], "How long did the jury deliberate?")
    assert ChatSegmenter(cut).layout(msgs).tokens.tolist() == ChatSegmenter(whole).layout(msgs).tokens.tolist()
    assert len(cut.encode(SYSTEM)) == len(whole.encode(SYSTEM)) > 8
