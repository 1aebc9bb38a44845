"""`agentctl policy` on every layer: list shows them all; edit creates a new policy of
any layer from its template (`--layer`), stores, validates and activates it; the errors
an operator can make each get one readable line and exit code 1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("kv", "ordering", "meta", "admission")
# An $EDITOR: `editor.py MODE FILE` changes FILE the way MODE says.
EDITOR = '''\
import pathlib
import sys

mode, path = sys.argv[1], pathlib.Path(sys.argv[2])
text = path.read_text()
if mode == "comment":
    text += "\\n# tuned by the operator\\n"
elif mode == "shortest":
    text = text.replace("(request.arrival_s,)", "(request.l_pred, request.arrival_s)")
elif mode == "import-os":
    text = "import os\\n" + text
path.write_text(text)
'''


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(data_dir=tmp_path_factory.mktemp("policy-cli") / "data")
    yield d.start()
    d.stop()


@pytest.fixture(scope="module")
def editor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("editor") / "editor.py"
    path.write_text(EDITOR)
    return path


def agentctl(d: DaemonProcess, *args: str, editor: Path | None = None,
             mode: str = "comment") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VISUAL", "EDITOR")}
    env.update(AGENTD_URL=d.url, AGENTD_TOKEN=d.token)
    if editor is not None:
        env["EDITOR"] = f"{sys.executable} {editor} {mode}"
    return subprocess.run([sys.executable, "-m", "console.agentctl", "policy", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL)


def active(d: DaemonProcess) -> dict[str, tuple[str, int]]:
    return {p["layer"]: (p["name"], p["active_version"])
            for p in d.get("/v1/policies").json()["data"] if p["active"]}


def test_list_shows_every_layer_with_its_active_policy(daemon: DaemonProcess) -> None:
    res = agentctl(daemon, "list")
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()]
    marked = {row[1]: row[2] for row in rows if row[0] == "*"}
    assert set(LAYERS) <= set(marked), res.stdout
    assert {layer: (name, 1) for layer, name in marked.items()} == active(daemon)
    layers_listed = [row[-4] for row in rows]
    assert layers_listed == sorted(layers_listed)  # grouped by layer


@pytest.mark.parametrize("layer", LAYERS)
def test_edit_creates_and_activates_a_new_policy_of_each_layer(
        daemon: DaemonProcess, editor: Path, layer: str) -> None:
    name = f"cli-{layer}"
    res = agentctl(daemon, "edit", name, "--layer", layer, "--yes", editor=editor)
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"{name} v1 [draft] validation: ok" in res.stdout
    assert f"activated {name} v1" in res.stdout
    assert active(daemon)[layer] == (name, 1)
    stored = daemon.get(f"/v1/policies/{name}").json()
    assert stored["layer"] == layer and "# tuned by the operator" in stored["source"]
    if layer != "kv":
        live = daemon.get("/v1/scheduling").json()["policies"][layer]
        assert live == {"name": name, "version": 1}
    res = agentctl(daemon, "rollback", name)
    assert res.returncode == 0 and active(daemon)[layer][0] != name, res.stderr


def test_edit_an_existing_non_kv_policy_then_diff(daemon: DaemonProcess, editor: Path) -> None:
    res = agentctl(daemon, "edit", "shortest", "--layer", "ordering", editor=editor,
                   mode="shortest")
    assert res.returncode == 0, res.stderr
    # no terminal to ask on: stored, not activated
    assert "shortest v1 [draft] validation: ok" in res.stdout and "activated" not in res.stdout
    res = agentctl(daemon, "edit", "shortest", editor=editor)  # the layer is the stored one
    assert res.returncode == 0 and "shortest v2 [draft]" in res.stdout, res.stderr
    res = agentctl(daemon, "diff", "shortest", "1", "2")
    assert res.returncode == 0
    changed = [line for line in res.stdout.splitlines()
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["+", "+# tuned by the operator"], res.stdout
    assert "         return (request.l_pred, request.arrival_s)" in res.stdout.splitlines()
    res = agentctl(daemon, "activate", "shortest", "--version", "2")
    assert res.returncode == 0 and active(daemon)["ordering"] == ("shortest", 2)
    res = agentctl(daemon, "show", "shortest")
    assert "shortest (ordering) active version: 2" in res.stdout
    assert agentctl(daemon, "rollback", "shortest").returncode == 0


def test_a_broken_edit_is_stored_as_a_draft_and_refused(daemon: DaemonProcess,
                                                        editor: Path) -> None:
    res = agentctl(daemon, "edit", "nosy-admission", "--layer", "admission", "--yes",
                   editor=editor, mode="import-os")
    assert res.returncode == 1
    assert "validation: FAILED" in res.stdout and "line 1: import of os" in res.stdout
    assert active(daemon)["admission"][0] != "nosy-admission"


@pytest.mark.parametrize(("args", "mode", "message"), [
    (("edit", "nameless"), "comment",
     "no policy named 'nameless'; to create it, give its layer"),
    (("edit", "nameless", "--layer", "routing"), "comment",
     "unknown layer 'routing'; the daemon has admission, "),
    (("edit", "fcfs", "--layer", "kv"), "comment",
     "policy 'fcfs' belongs to layer 'ordering', not 'kv'"),
])
def test_edit_mistakes_get_one_line(daemon: DaemonProcess, editor: Path,
                                    args: tuple[str, ...], mode: str, message: str) -> None:
    res = agentctl(daemon, *args, editor=editor, mode=mode)
    assert res.returncode == 1 and res.stdout == ""
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"agentctl: {message}"), line


def test_an_unchanged_template_stores_nothing(daemon: DaemonProcess, editor: Path) -> None:
    res = agentctl(daemon, "edit", "untouched", "--layer", "meta", editor=editor, mode="same")
    assert res.returncode == 0 and "no changes; nothing stored" in res.stdout
    assert daemon.get("/v1/policies/untouched").status_code == 404
