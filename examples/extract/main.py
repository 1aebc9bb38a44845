"""JSON-schema extraction over documents, with the instructions kept as a named snapshot.

The extraction instructions are a prefix every document shares: the first run prefills
them and keeps their token ids as the tenant's snapshot `extract-contacts`; later runs (and
every document of this one) `Context.open` it, so the engine finds the instructions in
its prefix cache (`cached_tokens` per document, in the result). Each document's fields
come from a generate constrained by the JSON schema, so the output always parses.

On a daemon with the simulated engine (valid JSON, filler strings) or the real SmolLM2
worker (examples/router says how to start either):

    agentctl submit examples/extract --follow \\
        --args '{"documents": ["Call Ada Lovelace at +44 20 7946 0000, London."]}'
"""

from __future__ import annotations

import json
from typing import Any

import agentd

SNAPSHOT = "extract-contacts"
INSTRUCTIONS = ("Extract the contact in the user's text as JSON with the fields name, phone "
                "and city. Copy each value exactly as it is written in the text; use an empty "
                "string for a field the text does not give.")
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "phone", "city"],
          "properties": {"name": {"type": "string", "maxLength": 60},
                         "phone": {"type": "string", "maxLength": 30},
                         "city": {"type": "string", "maxLength": 40}}}


def instructions() -> tuple[agentd.Context, bool]:
    """The shared prefix, and whether this run found the snapshot (else it made it)."""
    try:
        return agentd.Context.open(SNAPSHOT), True
    except agentd.SnapshotNotFound:
        return agentd.Context().system(INSTRUCTIONS).snapshot(SNAPSHOT), False


def main(documents: list[str]) -> dict[str, Any]:
    primer, reused = instructions()
    records = []
    for document in documents:
        ctx = primer.fork(1)[0].user(document)
        out = ctx.generate(max_tokens=96, temperature=0, json_schema=SCHEMA)
        records.append({"fields": json.loads(out.text), "prompt_tokens": out.prompt_tokens,
                        "cached_tokens": out.cached_tokens})
        ctx.drop()
    return {"records": records, "snapshot_reused": reused,
            "instruction_tokens": len(primer.token_ids)}
