"""Stored kv policies in a real daemon: hot swap under load, automatic rollback, restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.daemon_process import DaemonProcess
from tests.waiting import wait_for

MODEL = "sim-llama3-8b"

CANARY = '''\
from scheduling.kv.baselines import StickyPolicy


class Canary(StickyPolicy):
    name = "canary"
'''
BOOM = '''\
from scheduling.kv.baselines import StickyPolicy

ARM_AT = {arm_at}


class Boom(StickyPolicy):
    name = "boom"

    def decide(self, view, now):
        if now > ARM_AT:
            raise RuntimeError("boom after arming")
        return super().decide(view, now)
'''


class PolicyDaemon(DaemonProcess):
    def put(self, path: str, **kw: object) -> httpx.Response:
        return httpx.put(f"{self.url}{path}", headers=self.auth_headers(), timeout=30,
                         **kw)  # type: ignore[arg-type]


class Traffic:
    """Steady OpenAI-client traffic from a thread; counts successes and failures."""

    def __init__(self, d: DaemonProcess) -> None:
        self.client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0,
                                    timeout=30)
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"step {n}"}],
                    max_tokens=4, extra_body={"program_id": f"load-{n % 4}"})
                self.ok += 1
            except Exception as exc:  # every failure is a dropped request
                self.errors.append(repr(exc))

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def serves(self, more: int = 5, timeout: float = 30.0) -> None:
        """Until `more` requests past those answered so far are answered too."""
        goal = self.ok + more
        wait_for(lambda: self.ok >= goal, timeout,
                 lambda: f"{more} more answered requests ({self.ok} of {goal}; "
                         f"errors {self.errors[:3]})", interval=0.05)


def events(d: PolicyDaemon, name: str) -> list[dict[str, object]]:
    return list(d.get(f"/v1/policies/{name}").json()["events"])


@pytest.fixture
def pd(tmp_path: Path) -> Iterator[PolicyDaemon]:
    d = PolicyDaemon(data_dir=tmp_path / "data", workers=2,
                     env={"AGENTD_KV_POLICY": "vllm-default"})
    d.start()
    yield d
    d.stop()


def test_builtins_registered_and_validation_errors_reported(pd: PolicyDaemon) -> None:
    listed = {p["name"]: p for p in pd.get("/v1/policies").json()["data"]}
    assert {"vllm-default", "sticky", "agentd", "thunderagent"} <= set(listed)
    assert listed["vllm-default"]["active_version"] == 1
    assert [p for p in listed.values() if p["active"] and p["layer"] == "kv"] == [
        listed["vllm-default"]]
    shown = pd.get("/v1/policies/sticky").json()
    assert "class StickyPolicy" in shown["source"] and shown["versions"][0]["author"] == "builtin"
    r = pd.put("/v1/policies/bad", json={"layer": "kv", "source": "import os\n" + CANARY})
    assert r.status_code == 201
    assert r.json()["validation"]["errors"][0]["line"] == 1
    r = pd.post("/v1/policies/bad/activate")
    assert r.status_code == 422 and "line 1" in r.json()["error"]["message"]
    r = pd.put("/v1/policies/x", json={"layer": "nope", "source": CANARY})
    assert r.status_code == 400 and "unknown layer 'nope'" in r.json()["error"]["message"]
    # A kv policy's source is no ordering policy: the interface check says so.
    r = pd.put("/v1/policies/x", json={"layer": "ordering", "source": CANARY})
    errors = r.json()["validation"]["errors"]
    assert r.status_code == 201 and "exactly one subclass of OrderingPolicy" in errors[0]["message"]
    active = {p["layer"]: p["name"] for p in pd.get("/v1/policies").json()["data"] if p["active"]}
    assert active == {"kv": "vllm-default", "ordering": "fcfs", "meta": "meta-rules",
                      "admission": "statera", "control": "nalar-default"}


def test_swap_under_load_rollback_history_and_restart(pd: PolicyDaemon) -> None:
    with Traffic(pd) as load:
        load.serves()
        r = pd.put("/v1/policies/canary", json={"layer": "kv", "source": CANARY})
        assert r.status_code == 201 and r.json()["validation"]["ok"], r.text
        started = time.perf_counter()
        r = pd.post("/v1/policies/canary/activate")
        activate_ms = (time.perf_counter() - started) * 1000
        assert r.status_code == 200, r.text
        print(f"activate: {activate_ms:.1f} ms round trip, swap {r.json()['swap_us']} us")
        load.serves()  # under the canary
        # Armed from a moment on (time passing is the trigger): it passes validation first.
        arm_at = time.time() + 2.5
        r = pd.put("/v1/policies/boom", json={"layer": "kv",
                                             "source": BOOM.format(arm_at=arm_at)})
        assert r.json()["validation"]["ok"], r.text
        assert pd.post("/v1/policies/boom/activate").status_code == 200
        wait_for(lambda: any(e["kind"] == "policy.rolled_back" for e in events(pd, "boom")),
                 15, "boom's rollback")
        load.serves()  # under the restored canary
    assert not load.errors, load.errors[:3]
    assert load.ok > 10

    boom = pd.get("/v1/policies/boom").json()
    assert boom["versions"][0]["status"] == "rolled_back" and boom["active_version"] is None
    [rolled] = [e for e in boom["events"] if e["kind"] == "policy.rolled_back"]
    data = rolled["data"]
    assert "RuntimeError: boom after arming" in data["reason"]
    assert (data["restored"], data["restored_version"]) == ("canary", 1)
    # one kv tick is 0.3 s: the first failing decide after arming triggers it
    assert float(rolled["ts"]) - arm_at < 1.0
    canary = pd.get("/v1/policies/canary").json()
    assert canary["active_version"] == 1 and canary["status"] == "active"
    kinds = [e["kind"] for e in canary["events"]]
    assert kinds.count("policy.activated") >= 1

    # history and diff
    pd.put("/v1/policies/canary", json={"layer": "kv",
                                         "source": CANARY + "\n    # v2\n"})
    versions = pd.get("/v1/policies/canary/versions").json()["data"]
    assert [(v["version"], v["status"]) for v in versions] == [(1, "active"), (2, "draft")]
    diff = pd.get("/v1/policies/canary/diff", params={"from": 1, "to": 2}).json()["diff"]
    assert diff.startswith("--- canary v1\n+++ canary v2\n") and "+    # v2" in diff

    # kv decisions carry the active policy once kv_control records it (wiring line)
    pd.stop()
    pd.start()
    after = pd.get("/v1/policies/canary").json()
    assert after["active_version"] == 1 and after["status"] == "active"
    assert [p["name"] for p in pd.get("/v1/policies").json()["data"]
            if p["active"] and p["layer"] == "kv"] == ["canary"]
    assert pd.post("/v1/policies/canary/rollback").json()["active"]["name"] == "vllm-default"
