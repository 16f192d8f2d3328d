"""Records of conversation files -> normalised conversations (shared by ``prepare_data`` and
``regenerate_responses``; the files are read by ``conversation_files.read_records``).

Normalise: roles and turn order, one documented rule per defect, every skip counted by reason;
the rules are tabled in ``eagle3build/data/prepare_data.py``'s docstring (the stage's data report
counts them).

Roles: human/user -> user; gpt/chatgpt/bing/bard/assistant/model -> assistant; system/developer;
tool/function/ipython/observation -> tool (a tool's result); ShareGPT's function_call -> an
assistant turn that calls a tool.
Record formats: ShareGPT (``conversations`` of ``{"from", "value"}``, optional ``tools``) and
OpenAI chat (``messages`` of ``{"role", "content"}``, optional ``tools``); ``content`` may be a list
of OpenAI content parts (or plain strings, as vLLM takes them), whose text parts are joined
(``_content_parts``; a non-text part skips the record, ``non_text_part``). A string with a lone
UTF-16 surrogate, or a byte of the file that is not UTF-8, skips the record (``bad_unicode``).
An assistant message may carry ``tool_calls`` (OpenAI form; its content may then be empty or null) and reasoning
(``reasoning_content`` or ``reasoning``); a tool message may carry ``tool_call_id`` and ``name``.
Normalised messages are OpenAI/transformers chat messages: ``role``, ``content`` (str), and where
present ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments": dict}}]``,
transformers' chat-template convention), ``tool_call_id``, ``name``, ``reasoning`` (the key a
template reads is chosen when rendering: ``chat_masking.reasoning_key``) and ``token_ids`` (the
target's own tokens of a regenerated answer, ``regenerate_responses``).

A record without an ``id`` (or with a null or empty one) gets ``sha256:<16 hex>`` of its
normalised content, so the seeded split by id stays stable and spreads such records over both
splits (``content_key``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from dataclasses import dataclass, field

from .conversation_files import ESCAPED_BYTE

log = logging.getLogger(__name__)

ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system turn
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
    "function_call": "assistant",  # ShareGPT: the assistant calls a tool (value: {"name", "arguments"})
}
REASONING_FIELDS = ("reasoning_content", "reasoning")  # an assistant message's reasoning, first found wins
# OpenAI content parts: the types whose text is joined (Chat Completions' text/refusal, Responses' input/output_text)
TEXT_PART_TYPES = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
# Joined as vLLM's OpenAI server joins a message's text parts for a text-only model.
PART_SEPARATOR = "\n"


# Record field written by ``regenerate_responses`` for an answer cut at its ``max_tokens``.
UNFINISHED_KEY = "last_turn_unfinished"


# ---------------------------------------------------------------- normalise


@dataclass
class Conversation:
    """A normalised conversation: optional system turn, then user turns each answered by the
    assistant (an assistant turn that calls tools is followed by the tools' results), ending on
    an assistant turn. ``tools``: the function schemas the record offers (transformers'
    ``apply_chat_template(tools=...)``), or None."""

    id: str
    messages: list[dict]
    # The last assistant turn was cut at a generation cap (regenerate_responses' record field
    # ``last_turn_unfinished``): its end-of-turn token is not trained (``open_last_turn``).
    last_turn_unfinished: bool = False
    tools: list | None = None


EXAMPLES_PER_REASON = 3


@dataclass
class Counters:
    """Skip and fix counts by reason."""

    skipped: collections.Counter = field(default_factory=collections.Counter)
    fixed: collections.Counter = field(default_factory=collections.Counter)
    # The first EXAMPLES_PER_REASON skips of each reason: {"source", "index", "detail"}.
    examples: dict = field(default_factory=dict)

    def skip(self, reason: str, source: str, index: int, detail: str = "") -> None:
        """Count a skipped record; the first three of each reason are logged with file and record
        index, and kept (with ``detail``, e.g. a template's error message) for the data report."""
        self.skipped[reason] += 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < EXAMPLES_PER_REASON:
            kept.append({"source": source, "index": index, "detail": detail})
        level = logging.WARNING if self.skipped[reason] <= 3 else logging.DEBUG
        log.log(level, "%s record %d: skipped (%s) %s", source, index, reason, detail)


class _Skip(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _json_value(v, what: str):
    """``v`` itself, or the JSON it holds where it is a string (ShareGPT files keep tools and calls as strings)."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise _Skip("bad_tool_json", f"{what}: {e.msg}") from e
    return v


def _tool_call(c) -> dict:
    """One call in transformers' form: ``{"type": "function", "function": {"name", "arguments": dict}}``
    (plus ``id`` where given); accepts the OpenAI form and a bare ``{"name", "arguments"}``."""
    c = _json_value(c, "tool call")
    fn = c.get("function", c) if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _Skip("bad_tool_call", "a tool call without a function name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the string it is: some calls' arguments are not JSON
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(c, dict) and c.get("id") is not None:
        out["id"] = str(c["id"])
    return out


def _content_parts(parts: list, where: str) -> str:
    """OpenAI content parts (``[{"type": "text", "text": ...}, ...]``; a plain string is a text
    part, as vLLM's chat parser takes it) -> one text, the text parts joined by ``PART_SEPARATOR``.
    Fields a columnar export (Parquet, ``datasets``) fills with null for the other part types are ignored.

    Raises:
        _Skip: ``non_text_part`` for an image, audio, file or other non-text part (its type named:
            a text-only draft cannot train on it); ``non_string_text`` for a part without a type or
            whose text is not a string.
    """
    texts = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            texts.append(p)
            continue
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise _Skip("non_string_text", f"{where}: content part {i} is {type(p).__name__}, not a string or a "
                        "{'type': ...} object")
        key = TEXT_PART_TYPES.get(p["type"])
        if key is None:
            raise _Skip("non_text_part", f"{where}: content part {i} has type {p['type']!r}; only text parts "
                        f"({', '.join(sorted(TEXT_PART_TYPES))}) can be trained")
        if not isinstance(p.get(key), str):
            raise _Skip("non_string_text", f"{where}: content part {i} ({p['type']!r}) has no string {key!r}")
        texts.append(p[key])
    return PART_SEPARATOR.join(texts)


def content_text(content: object, where: str) -> str:
    """A message's ``content``: a string as it is, OpenAI content parts joined (``_content_parts``).

    Raises:
        ValueError: a non-text part (its type named), a part without a string text, or content
            that is neither a string nor a list; the message starts with ``where``.
    """
    if isinstance(content, list):
        try:
            return _content_parts(content, where)
        except _Skip as e:
            raise ValueError(e.detail) from None
    if not isinstance(content, str):
        raise ValueError(f"{where} is {type(content).__name__}, not a string or a list of content parts")
    return content


def _turn(t: dict, role_key: str, text_key: str, pos: int = 0) -> dict:
    """One raw turn (``pos``: its index in the record's turn list) -> a normalised message (before turn-order rules)."""
    raw_role = str(t.get(role_key, "")).strip().lower()
    role = ROLE_MAP.get(raw_role)
    if role is None:
        raise _Skip("unknown_role", f"turn {pos}: {role_key} {t.get(role_key)!r}")
    text = t.get(text_key)
    where = f"turn {pos} ({raw_role}) {text_key}"
    if raw_role == "function_call":  # ShareGPT: the value is the call itself
        return {"role": "assistant", "content": "", "tool_calls": [_tool_call(text)]}
    calls = t.get("tool_calls") if role == "assistant" else None
    calls = [_tool_call(c) for c in _json_value(calls, "tool_calls")] if calls else []
    if text is None and calls:
        text = ""
    if isinstance(text, list):
        text = _content_parts(text, where)
    if not isinstance(text, str):
        raise _Skip("non_string_text", f"{where} is {type(text).__name__}, not a string or a list of content parts")
    if not text.strip() and not calls:
        return _raise("empty_text", f"{where} is {'empty' if not text else 'blank (whitespace only)'}")
    msg = {"role": role, "content": text}
    if calls:
        msg["tool_calls"] = calls
    if role == "assistant":
        reasoning = next((t[k] for k in REASONING_FIELDS if isinstance(t.get(k), str) and t[k].strip()), None)
        if reasoning is not None:
            msg["reasoning"] = reasoning
        if isinstance(t.get("token_ids"), list) and all(isinstance(x, int) for x in t["token_ids"]):
            msg["token_ids"] = t["token_ids"]
    if role == "tool":
        for k in ("tool_call_id", "name"):
            if t.get(k) is not None:
                msg[k] = str(t[k])
    return msg


def _raise(reason: str, detail: str = ""):
    raise _Skip(reason, detail)


def _json_type(value) -> str:
    """``value``'s JSON type name (``array``, ``string``, ``number``, ``boolean``, ``null``), for a skip's detail."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {list: "array", str: "string", int: "number", float: "number"}.get(type(value), type(value).__name__)


def _merge(a: dict, b: dict) -> dict:
    """Two consecutive turns of one role as one: texts joined by a blank line, tool calls in order,
    reasoning joined; a regenerated answer's own tokens no longer describe the merged turn."""
    out = {k: v for k, v in a.items() if k != "token_ids"}
    out["content"] = "\n\n".join(x for x in (a["content"], b["content"]) if x)
    if b.get("tool_calls"):
        out["tool_calls"] = a.get("tool_calls", []) + b["tool_calls"]
    if b.get("reasoning"):
        out["reasoning"] = "\n\n".join(x for x in (a.get("reasoning"), b["reasoning"]) if x)
    return out


def content_key(messages: list[dict], tools: list | None = None) -> str:
    """A conversation's identity by content: SHA-256 of its roles, texts with runs of whitespace
    collapsed, tool calls, reasoning and tools (16 hex digits). Equal keys = the same conversation
    up to spacing; used to drop repeats before the split and to name records without an id."""
    norm = [[m["role"], " ".join(m["content"].split()), m.get("tool_calls"), " ".join((m.get("reasoning") or "").split())]
            for m in messages]
    blob = json.dumps([norm, tools], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def normalise(record: object, source: str, index: int, counters: Counters) -> Conversation | None:
    """Apply the module's normalisation rules to one record; None when it is skipped (counted)."""
    try:
        return _normalise(record, counters)
    except _Skip as e:
        counters.skip(e.reason, source, index, e.detail)
        return None


def _normalise(record: object, counters: Counters) -> Conversation:
    if not isinstance(record, dict):
        raise _Skip("not_an_object", f"the record is a JSON {_json_type(record)}, not an object with a turn list")
    if isinstance(record.get("conversations"), list):
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif isinstance(record.get("messages"), list):
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise _Skip("missing_key", "no 'conversations' or 'messages' list")
    tools = _json_value(record.get("tools"), "tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(x, dict) for x in tools)):
        raise _Skip("bad_tool_json", "tools is not a list of objects")

    msgs: list[dict] = []
    for t in turns:
        if not isinstance(t, dict) or role_key not in t or (text_key not in t and not t.get("tool_calls")):
            raise _Skip("missing_key", f"turn lacks {role_key!r}/{text_key!r}")
        m = _turn(t, role_key, text_key, len(msgs))
        if m["role"] == "system" and msgs:
            raise _Skip("system_not_first", f"turn {len(msgs)} is a system turn after a {msgs[-1]['role']} turn; "
                        "a system turn may only open the conversation")
        msgs.append(m)

    system = [msgs.pop(0)] if msgs and msgs[0]["role"] == "system" else []
    if msgs and msgs[0]["role"] in ("assistant", "tool"):
        counters.fixed["fixed_leading_assistant"] += 1
        while msgs and msgs[0]["role"] in ("assistant", "tool"):
            msgs.pop(0)
    merged: list[dict] = []
    for m in msgs:
        prev = merged[-1] if merged else None
        if prev is not None and prev["role"] == m["role"] and m["role"] != "tool":  # tool results stay one a call
            counters.fixed["fixed_merged_turns"] += 1
            merged[-1] = _merge(prev, m)
            continue
        if m["role"] == "tool" and not (prev and (prev["role"] == "tool" or prev.get("tool_calls"))):
            raise _Skip("tool_result_without_call", "a tool turn that follows no assistant tool call")
        merged.append(m)
    trailing = [m["role"] for m in merged]
    while merged and merged[-1]["role"] != "assistant":
        counters.fixed["fixed_trailing_user" if merged[-1]["role"] == "user" else "fixed_trailing_tool"] += 1
        merged.pop()
    if not any(m["role"] == "assistant" for m in merged):
        roles = ", ".join(trailing) or "none"
        raise _Skip("no_assistant_turn", f"no assistant turn to train on (the turns' roles: {roles})")
    for m in merged[:-1]:
        m.pop("token_ids", None)  # a regenerated answer's tokens are used for the last turn only
    last_kept = len(merged) == len(trailing)  # the record's own last turn ends the conversation
    unfinished = record.get(UNFINISHED_KEY) is True and last_kept
    messages = system + merged
    rid = record.get("id")
    _check_encodable({"id": rid, "messages": messages, "tools": tools})
    rid = str(rid) if rid is not None and str(rid).strip() else f"sha256:{content_key(messages, tools)}"
    return Conversation(id=rid, messages=messages, last_turn_unfinished=unfinished, tools=tools)


def _check_encodable(value, where: str = "") -> None:
    """Every string in ``value`` (nested dicts and lists, keys included) encodes as UTF-8.

    JSON's ``\\ud800`` escapes decode to lone UTF-16 surrogates (scraped text has them), which no
    tokenizer or file writer can encode; so does a byte of the file that is not UTF-8 (``read_records``
    decodes it to U+DC80-U+DCFF). Such a record is skipped, the field and position named.

    Raises:
        _Skip: ``bad_unicode``, naming the field (``messages[1].content``) and the character.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            c = value[e.start]
            what = (f"byte 0x{ord(c) - 0xDC00:02x} of the file is not UTF-8 (or it is a lone surrogate escape {c!r})"
                    if ESCAPED_BYTE.match(c) else f"lone surrogate {c!r} (not encodable as UTF-8)")
            raise _Skip("bad_unicode", f"{where or 'text'}: {what} at character {e.start}") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_encodable(k, f"{where} key" if where else "key")
            _check_encodable(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_encodable(v, f"{where}[{i}]")


def template_messages(messages: list[dict], reasoning_key: str | None) -> list[dict]:
    """Normalised messages as a chat template takes them: reasoning under ``reasoning_key`` (the
    field the target's template reads, ``chat_masking.reasoning_key``; None drops it), without
    the regenerated answers' ``token_ids``."""
    out = []
    for m in messages:
        t = {k: v for k, v in m.items() if k not in ("reasoning", "token_ids")}
        if m.get("reasoning") and reasoning_key:
            t[reasoning_key] = m["reasoning"]
        out.append(t)
    return out
