"""Runtime parameters: validating one set, and merging provider defaults < session < prompt.

A parameter set is a plain dict holding only the fields that are set. `None` means unset, so it
never overrides a lower layer; `provider_specific` merges shallowly across the layers. Nothing here
touches storage or a provider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from eventlog import InvalidArgumentError, check_encodable
from eventlog.limits import check_at_most
from sessions.runtime import _limits

FIELDS = (
    "model",
    "temperature",
    "max_tokens",
    "top_p",
    "top_k",
    "stop_sequences",
    "system_prompt",
    "provider_specific",
)
_CAMEL = {
    "maxTokens": "max_tokens",
    "topP": "top_p",
    "topK": "top_k",
    "stopSequences": "stop_sequences",
    "systemPrompt": "system_prompt",
    "providerSpecific": "provider_specific",
}


def check_params(value: object, where: str) -> dict[str, Any]:
    """A validated copy of one parameter set (None is the empty set)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(
            f"{where}: runtime_params must be a dict with str keys, got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        hints = [f" ({_CAMEL[k]!r}?)" if k in _CAMEL else "" for k in unknown]
        named = ", ".join(f"{k!r}{hint}" for k, hint in zip(unknown, hints, strict=True))
        raise InvalidArgumentError(
            f"{where}: unknown runtime parameter {named}; expected one of: {', '.join(FIELDS)}"
        )
    out: dict[str, Any] = {}
    for name in FIELDS:
        item = value.get(name)
        if item is not None:
            out[name] = _CHECKS[name](item, f"{where}: runtime_params.{name}")
    return out


def wire_params(value: object, where: str) -> dict[str, Any]:
    """A parameter set in seed 002's camelCase form (``maxTokens``, ``topP``, ...; snake_case
    names are read too), validated into the runtime's snake_case one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(
            f"{where}: runtimeParams must be an object with str keys, got {type(value).__name__}"
        )
    out: dict[str, Any] = {}
    for key, item in value.items():
        name: str = _CAMEL.get(key) or key
        if name in out:
            raise InvalidArgumentError(f"{where}: runtime parameter {name!r} is given twice")
        out[name] = item
    return check_params(out, where)


def camel_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A snake_case parameter set in seed 002's camelCase form."""
    back = {snake: camel for camel, snake in _CAMEL.items()}
    return {back.get(name, name): item for name, item in params.items()}


def _text(item: object, where: str, limit: int, limit_name: str) -> str:
    if not isinstance(item, str) or not item:
        raise InvalidArgumentError(f"{where} must be a non-empty str, got {item!r:.80}")
    check_at_most(len(item), limit, limit_name, where)
    return item


def _number(item: object, where: str, low: float, high: float) -> float:
    if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
        raise InvalidArgumentError(f"{where} must be a number from {low} to {high}, got {item!r}")
    if not low <= item <= high:
        raise InvalidArgumentError(f"{where} must be from {low} to {high}, got {item}")
    return float(item)


def _positive(item: object, where: str) -> int:
    if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
        raise InvalidArgumentError(f"{where} must be an int > 0, got {item!r}")
    return item


def _model(item: object, where: str) -> str:
    return _text(item, where, _limits.model_chars_max, "model_chars_max")


def _system_prompt(item: object, where: str) -> str:
    return _text(item, where, _limits.system_prompt_chars_max, "system_prompt_chars_max")


def _temperature(item: object, where: str) -> float:
    return _number(item, where, 0.0, 2.0)


def _top_p(item: object, where: str) -> float:
    return _number(item, where, 0.0, 1.0)


def _stop_sequences(item: object, where: str) -> list[str]:
    if isinstance(item, (str, bytes)) or not isinstance(item, (list, tuple)):
        raise InvalidArgumentError(f"{where} must be a list of str, got {type(item).__name__}")
    check_at_most(len(item), _limits.stop_sequences_max, "stop_sequences_max", where)
    return [
        _text(s, f"{where}[{i}]", _limits.stop_sequence_chars_max, "stop_sequence_chars_max")
        for i, s in enumerate(item)
    ]


def _provider_specific(item: object, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
        raise InvalidArgumentError(
            f"{where} must be a dict with str keys, got {type(item).__name__}"
        )
    data = dict(item)
    size = check_encodable(data, what=where)
    check_at_most(size, _limits.provider_specific_bytes_max, "provider_specific_bytes_max", where)
    return data


_CHECKS = {
    "model": _model,
    "temperature": _temperature,
    "max_tokens": _positive,
    "top_p": _top_p,
    "top_k": _positive,
    "stop_sequences": _stop_sequences,
    "system_prompt": _system_prompt,
    "provider_specific": _provider_specific,
}


def merge_params(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win, field by field; unset fields never override; `provider_specific` is
    merged key by key (shallowly)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for name, item in layer.items():
            if item is None:
                continue
            if name == "provider_specific":
                merged[name] = {**merged.get(name, {}), **item}
            else:
                merged[name] = item
    return merged
