"""A provider for OpenAI-compatible Chat Completions (OpenAI, and the servers that speak its
API: vLLM, llama.cpp's server, Ollama, most gateways).

Runtime parameters map to the request as: `model`, `temperature`, `top_p`, `max_tokens` (or the
field named by `max_tokens_field`), `stop_sequences` -> `stop`, `system_prompt` -> a leading
system message, `provider_specific` merged into the body last. `top_k` is not part of this API
and is not sent (put it in `provider_specific` for a server that takes it). Streamed answers are
assembled into one `Completion`; usage arrives in the stream's last chunk. A tool call's
`extra_content` (Gemini's endpoint puts the thought signature there, which the next request must
return) is kept with the reply (`Completion.echoed`) and sent back on that call unchanged.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Unpack

from eventlog.errors import ConfigurationError
from sessions._ids import uuid7
from sessions.runtime import _wire
from sessions.runtime._http import (
    HttpOptions,
    HttpProvider,
    ProviderHTTPError,
    StreamDropped,
    context_refusal,
    read_answer_body,
)
from sessions.runtime._providers import ECHOED, Completion, Messages, Params, ToolSpecs

if TYPE_CHECKING:
    import httpx

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
"""`finish_reason` values as the runtime's stop reasons (others are kept as they come)."""

CONTEXT_WORDS = (
    "context_length_exceeded",
    "maximum context length",
    "context size",
    "context window",
    "too many tokens",
    "prompt is too long",
)
"""Words of a 400 answer that refuses the messages as too long, across compatible servers."""

EXTRA = "extra_content"
"""The field of a tool call that a server wants back on it (Gemini: its thought signature, in
``extra_content.google.thought_signature``)."""
EXTRA_BLOCK = "tool_call_extra_content"
"""The `type` of an echoed block holding one tool call's `extra_content`, by `tool_call_id`."""


class OpenAIProvider(HttpProvider):
    """Chat Completions over HTTP. The key comes from `api_key`, else `$api_key_env`, else that
    name's line in `secrets_file`; with none, no `Authorization` header is sent."""

    endpoint = "/chat/completions"
    context_words = CONTEXT_WORDS

    def __init__(
        self,
        name: str = "openai",
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str | None = "OPENAI_API_KEY",
        max_tokens_field: str = "max_tokens",
        **options: Unpack[HttpOptions],
    ) -> None:
        if max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ConfigurationError(
                "OpenAIProvider: max_tokens_field must be max_tokens or max_completion_tokens"
            )
        self.max_tokens_field = max_tokens_field
        super().__init__(name, base_url, api_key_env, **options)

    def key_header(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    async def read_answer(self, resp: httpx.Response, where: str) -> Completion:
        streamed = self.stream and _wire.is_event_stream(resp)
        return await (self._assemble if streamed else self._whole)(resp, where)

    def request_body(self, messages: Messages, params: Params, tools: ToolSpecs) -> dict[str, Any]:
        """The JSON body for these messages, merged parameters and tool specs."""
        where = self.where
        model = self.model(params)
        body: dict[str, Any] = {
            "model": model,
            "messages": to_openai(messages, params.get("system_prompt"), where),
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        for field, wire in (("temperature", "temperature"), ("top_p", "top_p")):
            if field in params:
                body[wire] = params[field]
        if "max_tokens" in params:
            body[self.max_tokens_field] = params["max_tokens"]
        if params.get("stop_sequences"):
            body["stop"] = list(params["stop_sequences"])
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": spec["name"],
                        "description": spec.get("description", ""),
                        "parameters": spec.get("parameters") or {"type": "object"},
                    },
                }
                for spec in tools
            ]
        body.update(params.get("provider_specific") or {})
        return body

    async def _whole(self, resp: httpx.Response, where: str) -> Completion:
        data = _wire.json_object(
            (await read_answer_body(resp, where)).decode("utf-8", "replace"), where
        )
        if isinstance(data.get("error"), dict):
            raise _api_error(data["error"], where)  # a proxy's error object sent with 200
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderHTTPError(f"{where}: the answer has no choices")
        message = choices[0].get("message") or {}
        stop_reason = _stop_reason(choices[0].get("finish_reason"))
        calls = [call for call in message.get("tool_calls") or () if call]
        finished = _wire.finished_calls(calls, stop_reason == "max_tokens", where, keep=EXTRA)
        echoed = _extras(finished)  # before the calls are recorded: it takes `extra_content` off
        return Completion(
            text=_wire.text_of(message.get("content")),
            stop_reason=stop_reason,
            tool_calls=finished,
            usage=_usage(data.get("usage")),
            model=data.get("model") if isinstance(data.get("model"), str) else None,
            echoed=echoed,
        )

    async def _assemble(self, resp: httpx.Response, where: str) -> Completion:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: dict[str, int] = {}
        model: str | None = None
        done = False
        async for _, data in _wire.sse_events(resp, where):
            if data.strip() == "[DONE]":
                done = True
                break
            chunk = _wire.json_object(data, where)
            if isinstance(chunk.get("error"), dict):
                raise _api_error(chunk["error"], where)
            model = chunk.get("model") if isinstance(chunk.get("model"), str) else model
            usage = _usage(chunk.get("usage")) or usage
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                _add_delta(choice.get("delta") or {}, text, calls)
                finish = choice.get("finish_reason") or finish
        if not done and finish is None:
            raise StreamDropped(f"{where}: the stream ended before its last chunk")
        stop_reason = _stop_reason(finish)
        slots = [
            {
                "id": slot["id"] or f"call_{uuid7()}",
                "name": slot["name"],
                "arguments": "".join(slot["arguments"]),
                EXTRA: slot[EXTRA],
            }
            for _, slot in sorted(calls.items())
        ]
        finished = _wire.finished_calls(slots, stop_reason == "max_tokens", where, keep=EXTRA)
        echoed = _extras(finished)
        return Completion(
            text="".join(text),
            stop_reason=stop_reason,
            tool_calls=finished,
            usage=usage,
            model=model,
            echoed=echoed,
        )


def _extras(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `extra_content` of each of `calls` (taken off it: the transcript's call keeps its
    canonical form) as an echoed block naming the call."""
    return [
        {"type": EXTRA_BLOCK, "tool_call_id": call["id"], EXTRA: call.pop(EXTRA)}
        for call in calls
        if EXTRA in call
    ]


def _add_delta(delta: dict[str, Any], text: list[str], calls: dict[int, dict[str, Any]]) -> None:
    content = delta.get("content")
    if isinstance(content, str):
        text.append(content)
    for part in delta.get("tool_calls") or ():
        if not isinstance(part, dict):
            continue
        function = part.get("function") or {}
        index = part.get("index")
        if not isinstance(index, int):
            index = _indexless_slot(part, function, calls)
        slot = calls.setdefault(index, {"id": None, "name": "", "arguments": [], EXTRA: None})
        if isinstance(part.get("id"), str) and part["id"]:
            slot["id"] = part["id"]
        if isinstance(part.get(EXTRA), dict):
            slot[EXTRA] = part[EXTRA]
        if isinstance(function.get("name"), str) and not slot["name"]:
            slot["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            slot["arguments"].append(function["arguments"])


def _indexless_slot(
    part: dict[str, Any], function: dict[str, Any], calls: dict[int, dict[str, Any]]
) -> int:
    """The call a tool-call delta without an `index` belongs to (Gemini's endpoint, some
    proxies): a new id, or a name without an id, opens a call; anything else (an empty id, the
    last call's id again, arguments alone) continues the last one."""
    if not calls:
        return 0
    last = max(calls)
    call_id = part.get("id")
    if call_id:
        return last + 1 if call_id != calls[last]["id"] else last
    return last + 1 if function.get("name") else last


def _api_error(error: dict[str, Any], where: str) -> Exception:
    """The error object of a 200 answer (in a stream, or as its whole body). One that says the
    server failed or is overloaded is a dropped answer, retried as a 5xx is."""
    text = f"{error.get('code', '')} {error.get('message', '')}"
    refused = context_refusal(400, text, where, CONTEXT_WORDS)
    if refused is not None:
        return refused
    kinds = {error.get("type"), error.get("code")}
    if kinds & PASSING_ERRORS:
        named = next(str(kind) for kind in (error.get("code"), error.get("type")) if kind)
        return StreamDropped(f"{where}: the API failed mid-answer ({named[:80]})")
    return ProviderHTTPError(f"{where}: the API sent an error: {text.strip()[:500]}")


PASSING_ERRORS = frozenset(
    ("server_error", "internal_error", "overloaded", "overloaded_error", "rate_limit_exceeded")
)
"""The `type` or `code` of an error object in a 200 answer that says the failure may pass."""


def _stop_reason(finish: object) -> str:
    if not isinstance(finish, str):
        return "end_turn"
    return STOP_REASONS.get(finish, finish)


def _usage(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    prompt = raw.get("prompt_tokens_details") or {}
    completion = raw.get("completion_tokens_details") or {}
    return _wire.usage_counts(
        input_tokens=raw.get("prompt_tokens"),
        output_tokens=raw.get("completion_tokens"),
        total_tokens=raw.get("total_tokens"),
        cache_read_tokens=prompt.get("cached_tokens") if isinstance(prompt, dict) else None,
        reasoning_tokens=(
            completion.get("reasoning_tokens") if isinstance(completion, dict) else None
        ),
    )


def to_openai(
    messages: list[dict[str, Any]], system_prompt: str | None, where: str
) -> list[dict[str, Any]]:
    """Transcript messages as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            out.append(_assistant(message, where))
        elif role == "tool" or message.get("tool_call_id") is not None:
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.get("tool_call_id"),
                    "content": _wire.text_of(message.get("content")),
                }
            )
        elif role == "system":
            out.append({"role": "system", "content": _wire.text_of(message.get("content"))})
        else:
            out.append({"role": "user", "content": _user_content(message, where)})
    return out


def _assistant(message: dict[str, Any], where: str) -> dict[str, Any]:
    """The turn, each tool call with the `extra_content` it came with (kept in the reply's
    metadata under `ECHOED`), as the server that sent it requires."""
    item: dict[str, Any] = {"role": "assistant", "content": _wire.text_of(message.get("content"))}
    calls = [_wire.call_parts(call, where) for call in message.get("tool_calls") or ()]
    if calls:
        echoed = (message.get("metadata") or {}).get(ECHOED)
        extras = {
            block.get("tool_call_id"): block.get(EXTRA)
            for block in (echoed if isinstance(echoed, list) else ())
            if isinstance(block, dict) and block.get("type") == EXTRA_BLOCK
        }
        item["content"] = item["content"] or None
        item["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": _json(arguments)},
            }
            for call_id, name, arguments in calls
        ]
        for call in item["tool_calls"]:
            if isinstance(extras.get(call["id"]), dict):
                call[EXTRA] = extras[call["id"]]
    return item


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _user_content(message: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    text = _wire.text_of(message.get("content"))
    files = message.get("files") or []
    if not files:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for ref in files:
        name, mime, data = _wire.read_file(ref, where)
        if mime.startswith("image/"):
            url = f"data:{mime};base64,{_wire.b64(data)}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif _wire.is_text(mime):
            body = data.decode("utf-8", "replace")
            parts.append({"type": "text", "text": f'<file name="{name}">\n{body}\n</file>'})
        else:
            url = f"data:{mime};base64,{_wire.b64(data)}"
            parts.append({"type": "file", "file": {"filename": name, "file_data": url}})
    return parts
