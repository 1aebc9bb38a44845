// A run's page: append its events as they happen, then show its outcome (SSE relayed
// from /v1/runs/{id}/events). Text goes in with textContent only.
(function () {
  "use strict";
  var t = document.querySelector("table[data-follow]");
  if (!t || !window.EventSource) { return; }
  var tbody = t.querySelector("tbody");
  var live = document.getElementById("live");
  var t0 = parseFloat(t.dataset.t0);
  // The relayed stream replays from the first event on every (re)connection.
  var seen = 0, appended = 0;
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }
  var source = new EventSource(t.dataset.follow);
  live.textContent = "Following live…";
  source.onopen = function () { seen = 0; live.textContent = "Following live…"; };
  source.addEventListener("run-event", function (ev) {
    seen += 1;
    if (seen <= appended) { return; }
    appended += 1;
    var e = JSON.parse(ev.data);
    var tr = el("tr");
    tr.appendChild(el("td", (e.ts - t0).toFixed(3) + " s", "num"));
    tr.appendChild(el("td", e.kind, "kind"));
    var td = el("td"); td.appendChild(el("code", JSON.stringify(e))); tr.appendChild(td);
    tbody.appendChild(tr);
  });
  source.addEventListener("done", function (ev) {
    var run = JSON.parse(ev.data);
    source.close();
    var status = document.getElementById("run-status");
    status.textContent = run.status;
    status.className = "badge run-" + run.status;
    var out = document.getElementById("run-outcome");
    while (out.firstChild) { out.removeChild(out.firstChild); }
    var body = run.status === "finished" ? run.result : run.error;
    out.appendChild(el("pre", JSON.stringify(body, null, 2), run.status === "finished" ? "" : "bad-text"));
    var cancel = document.getElementById("cancel-run");
    if (cancel) { cancel.parentNode.removeChild(cancel); }
    live.textContent = "Complete: " + run.status;
  });
  source.addEventListener("failure", function (ev) {
    live.textContent = "Following failed: " + JSON.parse(ev.data).message;
    source.close();
  });
  source.onerror = function () { live.textContent = "Reconnecting…"; };
}());
