"""Agent traffic from τ-bench: each request is one LLM call of an agent session (``kind: agent``).

A session is a real τ-bench task (its user's instruction and the tool calls it makes) in the airline or
retail domain, played as τ-bench's tool-calling agent plays it (``tau_bench/agents/tool_calling_agent.py``):
one LLM call per step, a step being a tool call (the tool's result follows) or a text reply (the user's next
message follows). A call's prompt is::

    [system + domain policy]  [tool schemas]  [history ...]                             [generation prompt]
     sys, shared by domain     reusable,       user messages, the agent's tool calls      private
                               shared by domain and replies (private), tool results
                                               (reusable)

The user's messages are the instruction's sentences (the opening two together); the agent answers the
opening by asking who the user is (as the policies require), and each later message with the task's tool
calls spread over the messages in order, then a text reply that reads the last result back. A write is first
listed in a reply and confirmed by the user ("yes", the policies' rule). The user's record enters through a
lookup (``get_user_details`` first when the task makes none), as in τ-bench, where it is never in the prompt
up front. Tool results are looked up deterministically in the domain database (a reservation, an order, a
user, flights on a route, ...) and are reusable segments: two sessions that make the same lookup share its
tokens (within one session a repeated lookup repeats its segment). The history grows by construction, so
request k+1's prompt starts with request k's prompt. Prompts keep their order (``fixed_order``).

Against τ-bench's published trajectories (``historical_trajectories/gpt-4o-airline.json``, 200 airline
sessions, counted with the local tokenizer): 12.3 calls a session (5.8 tool calls, 6.5 replies) and prompts
of 7,037 tokens on average (p50 6,514, p90 9,638); the airline sessions here make 8.8 calls with prompts of
6,517 (p50 6,041, p90 8,263). The difference is the agent's own extra steps (``think``, ``calculate``,
repeated lookups: 2.7 a session over the task's actions there), which no task records. The earlier reading
(one call per task action with a new user message before each, the user's record in the prompt from the
start) made 4.1 calls a session.

Segment ids are content hashes, so equal text is one segment with one token sequence. Tokens come from a
deterministic local tokenizer unless ``tokenizer`` names a local Hugging Face tokenizer directory.

Requests interleave ``concurrent_sessions`` live sessions (a finished session is replaced by the next task;
tasks are drawn in shuffled passes over the chosen domains). The order of requests comes from the content
stream; arrival times from the arrival stream (Poisson by default), so changing the QPS never changes a
prompt. A session ends early when its next prompt would exceed ``max_prompt_tokens``.

Every live session is built up front (its turns tokenized, about 0.2 ms each), so ``concurrent_sessions`` is
bounded by MAX_SESSIONS (10,000: a few seconds); the local tokenizer's ids must be int32 token ids, which
bounds ``vocab_size`` to 257..2^31 (256 ids are reserved).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prism.config import choice, optional_path, parse_json, path_kind, positive, rate, read_text, tokens, within
from prism.core import PRIV, REUSE, SYS, Request, SegmentTable, stable_hash
from prism.errors import UserError

from prism.traces.arrivals import GeneratedTraceSpec, default_data_dir, streams
from prism.traces.tokenizer import RESERVED, get_tokenizer
from prism.traces.trace import MAX_TOKEN_ID, Trace

DOMAINS = ("airline", "retail")
TABLES = {"airline": ("users", "reservations", "flights"), "retail": ("users", "orders", "products")}
SYSTEM = ("You are a customer service agent for the {domain} domain. Follow the policy below and call the "
          "tools described to help the user.\n\n")
CONFIRMATIONS = ("Yes, please go ahead.", "Okay, that works for me.", "Yes, I confirm.", "Sounds good, thanks.",
                 "Please continue.", "That is correct.")


MAX_SESSIONS = 10_000


@dataclass
class AgentSpec(GeneratedTraceSpec):
    kind: str = "agent"
    qps: float = rate(40.0, "mean arrival rate, requests/s")
    domain: str = choice("both", ("both", "airline", "retail"), "τ-bench domain(s)")
    data_path: str | None = optional_path("folder holding airline/ and retail/ (default ../shared/data/tau_bench)")
    concurrent_sessions: int = positive(16, "sessions whose calls interleave", le=MAX_SESSIONS)
    max_prompt_tokens: int = tokens(40960, "end a session before a prompt would exceed this")
    tokenizer: str | None = optional_path("a local Hugging Face tokenizer directory (default: the local tokenizer)")
    vocab_size: int = within(32000, RESERVED + 1, MAX_TOKEN_ID + 1, "local tokenizer vocabulary")


def _json(path: Path) -> Any:
    return parse_json(read_text(path, "JSON file"), str(path))


# ---------------------------------------------------------------- the domain database
class Domain:
    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        if path_kind(folder) != "dir":
            raise UserError("τ-bench data not found (set data_path)", str(folder))
        self.policy = read_text(folder / "policy.md")
        self.tools = _json(folder / "tools.json")
        self.tasks = _json(folder / "tasks_test.json")
        self.db = {t: _json(folder / f"{t}.json") for t in TABLES[name]}
        if not isinstance(self.tasks, list) or not isinstance(self.tools, list):
            raise UserError("τ-bench data: tools.json and tasks_test.json must hold lists", str(folder))

    def observe(self, name: str, kwargs: dict[str, Any]) -> Any:
        """The tool's result, deterministic: a database lookup, or the touched records for a write."""
        db = self.db
        if name == "get_user_details":
            return db["users"].get(kwargs.get("user_id"), {"error": "user not found"})
        if name == "get_reservation_details":
            return db["reservations"].get(kwargs.get("reservation_id"), {"error": "reservation not found"})
        if name == "get_order_details":
            return db["orders"].get(kwargs.get("order_id"), {"error": "order not found"})
        if name == "get_product_details":
            return db["products"].get(kwargs.get("product_id"), {"error": "product not found"})
        if name == "search_direct_flight":
            date = kwargs.get("date")
            return [{**{k: v for k, v in f.items() if k != "dates"}, "date": date, **(f["dates"].get(date) or {})}
                    for f in db["flights"].values()
                    if f["origin"] == kwargs.get("origin") and f["destination"] == kwargs.get("destination")
                    and date in f["dates"]]
        if name == "find_user_id_by_email":
            return next((u for u, rec in db["users"].items() if rec.get("email") == kwargs.get("email")),
                        "Error: user not found")
        if name == "find_user_id_by_name_zip":
            for u, rec in db["users"].items():
                n, a = rec.get("name", {}), rec.get("address", {})
                if (n.get("first_name"), n.get("last_name"), a.get("zip")) == (
                        kwargs.get("first_name"), kwargs.get("last_name"), kwargs.get("zip")):
                    return u
            return "Error: user not found"
        if name == "list_all_product_types":
            return {p["name"]: pid for pid, p in db["products"].items()}
        if name == "calculate":
            return _calculate(str(kwargs.get("expression", "")))
        # writes: the records they touch, as the tool returns them
        touched = {}
        for key, table in (("reservation_id", "reservations"), ("order_id", "orders"), ("user_id", "users")):
            if key in kwargs and table in db and kwargs[key] in db[table]:
                touched[table[:-1]] = db[table][kwargs[key]]
        return {"status": "success", "action": name, "arguments": kwargs, **touched}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _calculate(expr: str) -> str:
    """τ-bench's calculator on + − × ÷ and parentheses, without eval."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(expr)

    try:
        return str(round(ev(ast.parse(expr, mode="eval").body), 2))
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
        return "Error: invalid expression"


def _dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(", ", ": "))


def _sentences(text: str) -> list[str]:
    parts = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    return parts or [text.strip() or "Hello."]


# ---------------------------------------------------------------- generation
class _Builder:
    """Turns texts into content-addressed segments."""

    def __init__(self, spec: AgentSpec) -> None:
        self.table = SegmentTable()
        self.tok = get_tokenizer(spec.tokenizer, spec.vocab_size)

    def segment(self, prefix: str, kind: str, text: str):
        seg_id = f"{prefix}:{stable_hash(text):016x}"
        if seg_id not in self.table:
            tokens = self.tok.encode(text) or self.tok.encode(".")
            self.table.declare(seg_id, kind, tokens=tokens)
        full = self.table.explicit_tokens(seg_id)
        return self.table.segment(seg_id, kind, len(full))


#: tools that change the database: the policies require listing the action and an explicit "yes" first
#: (airline/policy.md: "Before taking any actions that update the booking database ... obtain explicit user
#: confirmation (yes)"; retail/policy.md likewise for cancel, modify, return, exchange)
WRITES = {
    "airline": {"book_reservation", "cancel_reservation", "update_reservation_baggages", "update_reservation_flights",
                "update_reservation_passengers", "send_certificate"},
    "retail": {"cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
               "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
               "return_delivered_order_items"},
}
LOOKUPS = {"get_user_details", "find_user_id_by_email", "find_user_id_by_name_zip"}
#: the agent's first reply: who the user is (airline/policy.md: "obtain the user id"; retail/policy.md:
#: "authenticate the user identity by locating their user id via email, or via name + zip code")
ASK_IDENTITY = {"airline": "Sure, I can help with that. Could you please provide your user id?",
                "retail": "I can help with that. To verify your identity, could you please provide your email "
                          "address, or your first name, last name and zip code?"}


def _summary(obs: Any) -> str:
    """The agent's reply after its lookups: the last result's plain fields, as agents read them back."""
    if isinstance(obs, list):
        items = obs[:3]
        return f"I found {len(obs)} option(s). " + " ".join(
            "; ".join(f"{k}: {v}" for k, v in item.items() if not isinstance(v, (dict, list))) + "."
            for item in items if isinstance(item, dict))
    if isinstance(obs, dict):
        fields = [f"{k}: {v}" for k, v in obs.items() if not isinstance(v, (dict, list))][:12]
        return "Here is what I found: " + "; ".join(fields) + "."
    return f"The result is {obs}."


def _blocks(actions: list[dict], n: int) -> list[list[dict]]:
    """The task's tool calls spread in order over the user's n messages after the opening (the opening gets
    the agent's identity question only)."""
    if n == 0:
        return [actions]
    return [[]] + [actions[(i * len(actions)) // n:((i + 1) * len(actions)) // n] for i in range(n)]


def _session_turns(domain: Domain, task: dict, b: _Builder, rng: np.random.Generator) -> list[list]:
    """The segment lists of a session's LLM calls, in order (the module docstring says how they are played)."""
    head = [b.segment(f"sys.{domain.name}", SYS, SYSTEM.format(domain=domain.name) + domain.policy),
            b.segment(f"tools.{domain.name}", REUSE, _dump(domain.tools))]
    actions = list(task.get("actions", []))
    if task.get("user_id") and not any(a.get("name") in LOOKUPS for a in actions):
        actions.insert(0, {"name": "get_user_details", "kwargs": {"user_id": task["user_id"]}})
    sentences = _sentences(task.get("instruction", ""))
    messages = [" ".join(sentences[:2])] + sentences[2:]
    history: list = []
    turns = []

    gen = b.segment("gen", PRIV, "Assistant:")  # the chat template's generation prompt ends every prompt

    def call(segment) -> None:  # an LLM call on the history so far; its output joins the history
        turns.append(head + history + [gen])
        history.extend((gen, segment))

    def user(text: str) -> None:
        history.append(b.segment("msg", PRIV, "User: " + text))

    def reply(text: str) -> None:
        call(b.segment("reply", PRIV, text))

    for k, (msg, block) in enumerate(zip(messages, _blocks(actions, len(messages) - 1))):
        user(msg)
        if k == 0 and len(messages) > 1:
            reply(ASK_IDENTITY[domain.name])
            continue
        result: Any = None
        for action in block:
            name, kwargs = action.get("name", ""), action.get("kwargs", {})
            if name in WRITES[domain.name]:
                reply(f"Before I proceed, please confirm this action: {name} with {_dump(kwargs)}. "
                      "Shall I go ahead (yes/no)?")
                user(CONFIRMATIONS[int(rng.integers(len(CONFIRMATIONS)))])
            call(b.segment("call", PRIV, "tool call: " + _dump({"name": name, "arguments": kwargs})))
            result = domain.observe(name, kwargs)
            history.append(b.segment(f"obs.{domain.name}", REUSE, f"Tool {name} returned: " + _dump(result)))
        reply(_summary(result) + " How would you like to proceed?" if block else "Understood. Let me look into it.")
    return turns


def content(spec: AgentSpec) -> Trace:
    """The turns, in arrival order (their arrival times: ``spec.arrive``)."""
    folder = Path(spec.data_path) if spec.data_path else default_data_dir() / "tau_bench"
    names = DOMAINS if spec.domain == "both" else (spec.domain,)
    domains = [Domain(n, folder / n) for n in names]
    tasks = [(d, t) for d in domains for t in d.tasks]
    if not tasks:
        raise UserError("no τ-bench tasks found", str(folder))
    rng = streams(spec.seed)[0]
    b = _Builder(spec)

    queue: list[int] = []
    started = 0

    def next_session():
        nonlocal started, queue
        if not queue:
            queue = list(rng.permutation(len(tasks)))
        d, task = tasks[queue.pop(0)]
        name = f"{d.name}-{started}"
        started += 1
        turns = [t for t in _session_turns(d, task, b, rng)]
        fitting = []
        for t in turns:  # a session ends before a prompt would pass the cap
            if sum(s.length for s in t) > spec.max_prompt_tokens:
                break
            fitting.append(t)
        return [name, fitting, 0]

    live = [next_session() for _ in range(spec.concurrent_sessions)]
    requests = []
    guard = 0
    while len(requests) < spec.num_requests:
        i = int(rng.integers(len(live)))
        name, turns, k = live[i]
        if k >= len(turns):
            live[i] = next_session()
            guard += 1
            if guard > 100 * len(tasks) and not requests:
                raise UserError(f"no session fits max_prompt_tokens={spec.max_prompt_tokens}")
            continue
        requests.append(Request(len(requests), 0.0, tuple(turns[k]), spec.output_len, name, True))
        live[i][2] = k + 1
    return Trace(requests, b.table, "agent", asdict(spec), {"domains": list(names), "sessions": started})
