// Live overview: one EventSource on /ui/events; every snapshot rebuilds the workers table,
// the alerts and the newest programs. Text goes in with textContent only (never HTML).
(function () {
  "use strict";
  var live = document.getElementById("live");
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }
  function fill(tbody, rows) {
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    rows.forEach(function (r) { tbody.appendChild(r); });
  }
  function workerRow(w) {
    var tr = el("tr"); tr.dataset.worker = w.id;
    tr.appendChild(el("td", w.id));
    tr.appendChild(el("td", w.engine, "engine"));
    tr.appendChild(el("td", w.model));
    var h = el("td"); h.appendChild(el("span", w.status, "badge " + (w.healthy ? "ok" : "bad")));
    tr.appendChild(h);
    var kv = el("td"); var m = el("meter", w.kv_pct + "%");
    m.min = 0; m.max = 100; m.high = 85; m.value = w.kv_pct;
    m.setAttribute("aria-label", "KV cache of " + w.id);
    kv.appendChild(m);
    kv.appendChild(el("span", " " + w.kv_pct + "% (" + w.kv_used + "/" + w.kv_capacity + ")", "num"));
    tr.appendChild(kv);
    tr.appendChild(el("td", w.running, "num"));
    tr.appendChild(el("td", w.waiting, "num"));
    tr.appendChild(el("td", w.inflight, "num"));
    return tr;
  }
  function programRow(p) {
    var tr = el("tr"); tr.dataset.program = p.id;
    tr.appendChild(el("td", p.id));
    var s = el("td"); var a = el("a", p.session_id);
    a.href = "/ui/session?id=" + encodeURIComponent(p.session_id);
    s.appendChild(a); tr.appendChild(s);
    var st = el("td"); st.appendChild(el("span", p.status, "badge st-" + String(p.status).toLowerCase()));
    tr.appendChild(st);
    tr.appendChild(el("td", p.worker_id || ""));
    tr.appendChild(el("td", p.steps, "num"));
    tr.appendChild(el("td", p.context_tokens, "num"));
    return tr;
  }
  function apply(snap) {
    fill(document.querySelector("#workers tbody"), snap.workers.map(workerRow));
    fill(document.querySelector("#live-programs tbody"), snap.programs.map(programRow));
    fill(document.getElementById("alerts"), snap.alerts.map(function (a) { return el("p", a, "alert"); }));
    document.getElementById("queued").textContent = String(snap.queued);
    document.getElementById("programs-total").textContent = String(snap.programs_total);
    live.textContent = "Live, updated " + new Date(snap.ts * 1000).toLocaleTimeString();
  }
  if (!window.EventSource) { return; }
  var source = new EventSource("/ui/events");
  source.addEventListener("snapshot", function (ev) { apply(JSON.parse(ev.data)); });
  source.addEventListener("failure", function (ev) {
    var f = JSON.parse(ev.data);
    live.textContent = "Live updates failed: " + f.message;
    if (f.status === 401) { source.close(); window.location.assign("/ui/login"); }
  });
  source.onerror = function () { live.textContent = "Live updates reconnecting…"; };
}());
