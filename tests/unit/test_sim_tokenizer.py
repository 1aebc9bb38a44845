"""The sim tokenizer is deterministic across processes and agrees with its chat template."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from daemon.engines.sim import tokenizer
from daemon.workers.protocol import ChatMessage

TEXT = "Fix the failing test in utils.py, then run `pytest -x`!"


def test_ids_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "import json; from daemon.engines.sim.tokenizer import encode; "
        "print(json.dumps(encode(%r)))"
    )
    ids = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code % TEXT], env=env, capture_output=True, text=True,
            check=True,
        )
        ids.append(json.loads(out.stdout))
    assert ids[0] == ids[1] == tokenizer.encode(TEXT)


def test_pieces_and_special_tokens() -> None:
    ids = tokenizer.encode("<|user|> hello, hello")
    assert ids[0] == tokenizer.SPECIAL_TOKENS.index("<|user|>")
    assert ids[1] == ids[3] != ids[2]
    assert all(0 <= i < tokenizer.VOCAB_SIZE for i in tokenizer.encode(TEXT))
    assert tokenizer.count_tokens(TEXT) == len(tokenizer.encode(TEXT))


def test_previous_turn_renders_as_prompt_plus_generated_text() -> None:
    turn1 = [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    generated = "".join(tokenizer.filler_text(i, first=i == 0) for i in range(3))
    assert generated == "sim0 sim1 sim2"
    turn2 = [*turn1, ChatMessage("assistant", generated), ChatMessage("user", "more")]
    prompt1 = tokenizer.encode(tokenizer.render_chat(turn1))
    out_ids = [tokenizer.filler_token_id(i) for i in range(3)]
    assert tokenizer.encode(tokenizer.render_chat(turn2))[: len(prompt1) + 3] == prompt1 + out_ids
