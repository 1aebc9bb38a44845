"""What the simulated engine answers when a request asks for structure: tool calls and JSON.

The sim writes filler, but a request with tools or a JSON schema gets output of the shape
a real engine's would have, so scheduling tests and agent frameworks run their tool loops
on it. Deterministic: every choice comes from ``random.Random(seed)``, the request's seed.

- Tools, ``tool_choice`` "required" or a named function: one call, of a function picked
  by the seed (or the named one), with arguments valid against its parameters schema.
- ``tool_choice`` "auto": a call when the conversation ends with a user's (or system's)
  turn; once the last turn is a tool's result, a text answer (filler). So an agent loop
  calls a tool, gets its result back and ends.
- A JSON schema (``response_format``) and no call: one JSON value valid against it.

The call's text is the Hermes format (``tokenizer.call_text``), cut into the sim's tokens;
the engine emits it token by token and reports the parsed call with the last one.

Schemas: ``$ref`` into ``$defs``/``definitions``, ``const``, ``enum``, ``anyOf``/``oneOf``
(the first branch), ``allOf`` (merged), every JSON type with its bounds (lengths, item
counts, numeric ranges, ``multipleOf``), common string formats; a ``pattern`` is not
followed.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from daemon.engines.sim.tokenizer import call_text, split
from daemon.workers.protocol import ChatMessage, Submit, ToolCall, Tools

_FORMATS = {"date-time": "2025-01-01T00:00:00Z", "date": "2025-01-01", "time": "00:00:00Z",
            "email": "sim@example.com", "uri": "https://example.com/sim",
            "uuid": "00000000-0000-4000-8000-000000000000", "ipv4": "127.0.0.1"}
_MAX_DEPTH = 16  # a recursive schema ($ref to itself) stops at its optional parts


@dataclass(frozen=True)
class Script:
    """Output the sim writes instead of filler: its tokens' texts and the calls they hold."""

    pieces: list[str]
    calls: list[ToolCall]


def scripted_reply(submit: Submit, seed: int) -> Script | None:
    """The sim's structured answer to ``submit``; None: filler text."""
    rng = random.Random(seed)
    tools = submit.tools
    if tools is not None and tools.choice != "none":
        function = _called_function(tools, submit.messages or [], rng)
        if function is None:
            return None
        arguments = json.dumps(schema_instance(function.get("parameters") or {}, rng))
        call = ToolCall(id=f"call_sim_{rng.getrandbits(64):016x}", name=function["name"],
                        arguments=arguments)
        return Script(pieces=split(call_text(call.name, call.arguments)), calls=[call])
    if submit.sampling.json_schema is not None:
        value = schema_instance(json.loads(submit.sampling.json_schema), rng)
        return Script(pieces=split(json.dumps(value)), calls=[])
    return None


def _called_function(tools: Tools, messages: Sequence[ChatMessage],
                     rng: random.Random) -> dict[str, Any] | None:
    functions: list[dict[str, Any]] = [t["function"] for t in json.loads(tools.functions)]
    if tools.choice == "function":
        return next(f for f in functions if f["name"] == tools.function)
    if tools.choice == "auto" and messages and messages[-1].role == "tool":
        return None
    return rng.choice(functions)


def schema_instance(schema: dict[str, Any], rng: random.Random) -> Any:
    """A JSON value valid against ``schema``."""
    return _Instance(schema, rng).of(schema, 0)


class _Instance:
    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def of(self, schema: dict[str, Any], depth: int) -> Any:
        schema = self._resolved(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self.rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.of({**_without(schema, key), **schema[key][0]}, depth)
        if schema.get("allOf"):
            merged = _without(schema, "allOf")
            for part in schema["allOf"]:
                merged = _merged(merged, self._resolved(part))
            return self.of(merged, depth)
        kind = _type_of(schema)
        return getattr(self, f"_{kind}")(schema, depth + 1)

    def _resolved(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            target: Any = self.root
            for part in schema["$ref"].removeprefix("#/").split("/"):
                target = target[part] if part else target
            schema = {**_without(schema, "$ref"), **target}
        return schema

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        # Deep down only the required ones, so a recursive schema ends.
        names = [n for n in properties if depth < _MAX_DEPTH or n in required]
        return {name: self.of(properties[name], depth) for name in names}

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        low = schema.get("minItems", 0)
        count = max(low, min(schema.get("maxItems", 2), 2 if depth < _MAX_DEPTH else 0))
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        values = [self.of(prefix[i] if i < len(prefix) else items, depth) for i in range(count)]
        if schema.get("uniqueItems") and len({json.dumps(v) for v in values}) < len(values):
            values = values[:1]  # distinct values cannot always be made; one always is
        return values

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        text = _FORMATS.get(schema.get("format", ""), f"sim{self.rng.randrange(1000)}")
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        text = text.ljust(low, "x")
        return text if high is None else text[:high]

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low, high = _bounds(schema, 1)
        step = schema.get("multipleOf", 1)
        first = math.ceil(low / step) * step if low is not None else 0
        last = math.floor(high / step) * step if high is not None else first + 10 * step
        return int(first + step * self.rng.randrange(max(1, (last - first) // step + 1)))

    def _number(self, schema: dict[str, Any], depth: int) -> float:
        if "multipleOf" in schema:
            return float(self._integer({**schema, "multipleOf": 1}, depth)) \
                * float(schema["multipleOf"])
        low, high = _bounds(schema, 1e-6)
        low = 0.0 if low is None else low
        high = low + 10.0 if high is None else high
        return self.rng.uniform(low, high) if low < high else low

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        return None


def _type_of(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema \
            else "string"
    return str(kind)


def _bounds(schema: dict[str, Any], epsilon: float) -> tuple[float | None, float | None]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + epsilon
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - epsilon
    return low, high


def _without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != key}


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = {**a, **b}
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    if "required" in a and "required" in b:
        out["required"] = [*a["required"], *b["required"]]
    return out
