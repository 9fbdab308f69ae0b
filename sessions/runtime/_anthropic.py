"""A provider for the Anthropic Messages API.

Runtime parameters map to the request as: `model`, `max_tokens` (required by the API: the
provider's `max_tokens_default` when no layer sets it), `temperature`, `top_p`, `top_k`,
`stop_sequences`, `system_prompt` -> `system` (after any system messages of the transcript),
`provider_specific` merged into the body last. Tool results travel as `tool_result` blocks of a
user message, and consecutive messages of one role are merged, as the API requires. An answer's
`thinking` and `redacted_thinking` blocks are kept with the reply (`Completion.echoed`) and sent
back first in its turn, as the API requires of a tool loop with extended thinking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack

from eventlog.errors import ConfigurationError
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

API_VERSION = "2023-06-01"
CONTEXT_WORDS = ("prompt is too long", "context window", "context length", "too many tokens")
THINKING = frozenset(("thinking", "redacted_thinking"))
"""The blocks of an answer sent back with its turn (`Completion.echoed`)."""


class AnthropicProvider(HttpProvider):
    """Messages over HTTP. The key comes from `api_key`, else `$api_key_env`, else that name's
    line in `secrets_file`; it is sent as `x-api-key`."""

    endpoint = "/messages"
    context_words = CONTEXT_WORDS

    def __init__(
        self,
        name: str = "anthropic",
        *,
        base_url: str = "https://api.anthropic.com/v1",
        api_key_env: str | None = "ANTHROPIC_API_KEY",
        max_tokens_default: int = 4096,
        **options: Unpack[HttpOptions],
    ) -> None:
        if isinstance(max_tokens_default, bool) or not isinstance(max_tokens_default, int):
            raise ConfigurationError("AnthropicProvider: max_tokens_default must be an int")
        self.max_tokens_default = max_tokens_default
        options["headers"] = {
            "anthropic-version": API_VERSION,
            **dict(options.get("headers") or {}),
        }
        super().__init__(name, base_url, api_key_env, **options)

    def key_header(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    async def read_answer(self, resp: httpx.Response, where: str) -> Completion:
        streamed = self.stream and _wire.is_event_stream(resp)
        return await (_assemble if streamed else _whole)(resp, where)

    def request_body(self, messages: Messages, params: Params, tools: ToolSpecs) -> dict[str, Any]:
        where = self.where
        model = self.model(params)
        system, turns = to_anthropic(messages, where)
        if params.get("system_prompt"):
            system.append(params["system_prompt"])
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": params.get("max_tokens", self.max_tokens_default),
            "messages": turns,
        }
        if system:
            body["system"] = "\n\n".join(system)
        if self.stream:
            body["stream"] = True
        for field in ("temperature", "top_p", "top_k"):
            if field in params:
                body[field] = params[field]
        if params.get("stop_sequences"):
            body["stop_sequences"] = list(params["stop_sequences"])
        if tools:
            body["tools"] = [
                {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "input_schema": spec.get("parameters") or {"type": "object"},
                }
                for spec in tools
            ]
        body.update(params.get("provider_specific") or {})
        return body


async def _whole(resp: httpx.Response, where: str) -> Completion:
    data = _wire.json_object(
        (await read_answer_body(resp, where)).decode("utf-8", "replace"), where
    )
    if data.get("type") == "error" or isinstance(data.get("error"), dict):
        raise _error(data.get("error"), where)  # also a proxy's error object sent with 200
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    echoed: list[dict[str, Any]] = []
    for block in data.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(block)
        elif block.get("type") in THINKING:
            echoed.append(block)
    stop_reason = data.get("stop_reason") or "end_turn"
    return Completion(
        text="".join(text),
        stop_reason=stop_reason,
        tool_calls=_wire.finished_calls(calls, stop_reason == "max_tokens", where),
        usage=_usage(data.get("usage") or {}),
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        echoed=echoed,
    )


async def _assemble(resp: httpx.Response, where: str) -> Completion:
    blocks: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    stop_reason: str | None = None
    model: str | None = None
    finished = False
    async for name, data in _wire.sse_events(resp, where):
        event = _wire.json_object(data, where)
        kind = event.get("type", name)
        if kind == "error":
            raise _error(event.get("error"), where)
        if kind == "message_start":
            message = event.get("message") or {}
            model = message.get("model") if isinstance(message.get("model"), str) else None
            usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            block["partial"] = []
            blocks[int(event.get("index", len(blocks)))] = block
        elif kind == "content_block_delta":
            _add_delta(blocks, event, where)
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            stop_reason = delta.get("stop_reason") or stop_reason
            usage.update(event.get("usage") or {})
        elif kind == "message_stop":
            finished = True
            break
    if not finished:
        raise StreamDropped(f"{where}: the stream ended before message_stop")
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    echoed: list[dict[str, Any]] = []
    for _, block in sorted(blocks.items()):
        kind, partial = block.pop("type", None), block.pop("partial")
        if kind == "text":
            text.append(str(block.get("text", "")) + "".join(partial))
        elif kind == "tool_use":
            raw = "".join(partial)
            arguments = raw if raw else block.get("input")
            calls.append({"id": block.get("id"), "name": block.get("name"), "arguments": arguments})
        elif kind == "thinking":
            thought = str(block.get("thinking", "")) + "".join(partial)
            signature = str(block.get("signature", "")) + "".join(block.pop("signed", ()))
            echoed.append({"type": kind, "thinking": thought, "signature": signature})
        elif kind == "redacted_thinking":
            echoed.append({"type": kind, "data": block.get("data")})
    stop_reason = stop_reason or "end_turn"
    return Completion(
        text="".join(text),
        stop_reason=stop_reason,
        tool_calls=_wire.finished_calls(calls, stop_reason == "max_tokens", where),
        usage=_usage(usage),
        model=model,
        echoed=echoed,
    )


def _add_delta(blocks: dict[int, dict[str, Any]], event: dict[str, Any], where: str) -> None:
    block = blocks.get(int(event.get("index", 0)))
    if block is None:
        raise ProviderHTTPError(f"{where}: a delta for a content block that never started")
    delta = event.get("delta") or {}
    if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
        block["partial"].append(delta["text"])
    elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        block["partial"].append(delta["partial_json"])
    elif delta.get("type") == "thinking_delta" and isinstance(delta.get("thinking"), str):
        block["partial"].append(delta["thinking"])
    elif delta.get("type") == "signature_delta" and isinstance(delta.get("signature"), str):
        block.setdefault("signed", []).append(delta["signature"])


def _error(error: object, where: str) -> Exception:
    info = error if isinstance(error, dict) else {}
    text = f"{info.get('type', 'error')}: {info.get('message', '')}"
    refused = context_refusal(400, text, where, CONTEXT_WORDS)
    if refused is not None:
        return refused
    if info.get("type") in ("overloaded_error", "api_error"):  # a 529 or a 500, mid-answer
        return StreamDropped(f"{where}: the API failed mid-answer ({info['type']})")
    return ProviderHTTPError(f"{where}: the API sent an error: {text[:500]}")


def _usage(raw: dict[str, Any]) -> dict[str, int]:
    return _wire.usage_counts(
        input_tokens=raw.get("input_tokens"),
        output_tokens=raw.get("output_tokens"),
        cache_read_tokens=raw.get("cache_read_input_tokens"),
        cache_write_tokens=raw.get("cache_creation_input_tokens"),
    )


def to_anthropic(
    messages: list[dict[str, Any]], where: str
) -> tuple[list[str], list[dict[str, Any]]]:
    """Transcript messages as (system texts, Messages API turns): tool results become
    `tool_result` blocks of a user turn, and turns of one role in a row are merged."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            system.append(_wire.text_of(message.get("content")))
            continue
        if role == "assistant":
            blocks = _assistant_blocks(message, where)
            turn_role = "assistant"
        elif role == "tool" or message.get("tool_call_id") is not None:
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": _wire.text_of(message.get("content")),
            }
            if (message.get("metadata") or {}).get("tool_error"):
                result["is_error"] = True
            blocks = [result]
            turn_role = "user"
        else:
            blocks = _user_blocks(message, where)
            turn_role = "user"
        if not blocks:
            continue
        if turns and turns[-1]["role"] == turn_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": turn_role, "content": blocks})
    return system, turns


def _assistant_blocks(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The turn's blocks: its thinking first, as the API sent it (a tool loop with thinking
    enabled must return it, signature and all), then its text and tool calls."""
    echoed = (message.get("metadata") or {}).get(ECHOED)
    blocks: list[dict[str, Any]] = [
        dict(block)
        for block in (echoed if isinstance(echoed, list) else ())
        if isinstance(block, dict) and block.get("type") in THINKING
    ]
    text = _wire.text_of(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        call_id, name, arguments = _wire.call_parts(call, where)
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    return blocks


def _user_blocks(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    text = _wire.text_of(message.get("content"))
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for ref in message.get("files") or ():
        name, mime, data = _wire.read_file(ref, where)
        if mime.startswith("image/"):
            source = {"type": "base64", "media_type": mime, "data": _wire.b64(data)}
            blocks.append({"type": "image", "source": source})
        elif _wire.is_text(mime):
            source = {
                "type": "text",
                "media_type": "text/plain",
                "data": data.decode("utf-8", "replace"),
            }
            blocks.append({"type": "document", "source": source, "title": name})
        else:
            source = {"type": "base64", "media_type": mime, "data": _wire.b64(data)}
            blocks.append({"type": "document", "source": source, "title": name})
    return blocks
