// Live updates over server-sent events. The overview follows /ui/events; a table with
// data-live follows its own feed (the programs table is rebuilt, a session's programs are
// updated in place). Text goes in with textContent only, never as HTML.
(function () {
  "use strict";
  if (!window.EventSource) { return; }
  var live = document.getElementById("live");
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }
  function fill(parent, children) {
    while (parent.firstChild) { parent.removeChild(parent.firstChild); }
    children.forEach(function (c) { parent.appendChild(c); });
  }
  function badge(status) { return el("span", status, "badge st-" + String(status).toLowerCase()); }
  // Every object's id links to its page (/ui/<kind>?id=...), as the server renders it.
  function link(kind, id) {
    var a = el("a", id); a.href = "/ui/" + kind + "?id=" + encodeURIComponent(id); return a;
  }
  function sessionLink(id) { return link("session", id); }
  function cell(child) { var td = el("td"); td.appendChild(child); return td; }
  function ago(ts) {
    var d = Math.max(Date.now() / 1000 - ts, 0);
    return d < 60 ? Math.round(d) + "s ago" : d < 3600 ? Math.round(d / 60) + "m ago" : (d / 3600).toFixed(1) + "h ago";
  }
  function stamp(ts) { if (live) { live.textContent = "Live, updated " + new Date(ts * 1000).toLocaleTimeString(); } }
  function follow(url, event, apply) {
    var source = new EventSource(url);
    source.addEventListener(event, function (ev) { apply(JSON.parse(ev.data)); });
    source.addEventListener("failure", function (ev) {
      var f = JSON.parse(ev.data);
      if (live) { live.textContent = "Live updates failed: " + f.message; }
      if (f.status === 401) { source.close(); window.location.assign("/ui/login"); }
    });
    source.onerror = function () { if (live) { live.textContent = "Live updates reconnecting…"; } };
  }

  // --- the overview -------------------------------------------------------------------
  function workerRow(w) {
    var tr = el("tr"); tr.dataset.worker = w.id;
    tr.appendChild(cell(link("worker", w.id)));
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
    [w.running, w.waiting, w.inflight].forEach(function (n) { tr.appendChild(el("td", n, "num")); });
    return tr;
  }
  function newestRow(p) {
    var tr = el("tr"); tr.dataset.program = p.id;
    tr.appendChild(cell(link("program", p.id)));
    var s = el("td"); s.appendChild(sessionLink(p.session_id)); tr.appendChild(s);
    var st = el("td"); st.appendChild(badge(p.status)); tr.appendChild(st);
    tr.appendChild(el("td", p.worker_id || ""));
    tr.appendChild(el("td", p.steps, "num"));
    tr.appendChild(el("td", p.context_tokens, "num"));
    return tr;
  }
  function policyItem(p) {
    var li = el("li"); li.dataset.policy = p.name;
    li.appendChild(el("span", p.layer, "badge")); li.appendChild(document.createTextNode(" "));
    var a = el("a", p.name); a.href = "/ui/policy?name=" + encodeURIComponent(p.name);
    li.appendChild(a); li.appendChild(document.createTextNode(" v" + p.version));
    return li;
  }
  function chart(c) {
    var fig = document.querySelector('figure[data-chart="' + c.key + '"]');
    if (!fig) { return; }
    var svg = fig.querySelector("svg");
    svg.querySelectorAll("polyline").forEach(function (p) { svg.removeChild(p); });
    c.lines.forEach(function (ln) {
      var p = document.createElementNS(svg.namespaceURI, "polyline");
      p.setAttribute("class", "chart-line " + ln.cls);
      p.setAttribute("data-line", ln.name);
      p.setAttribute("points", ln.points);
      svg.appendChild(p);
    });
    fill(fig.querySelector(".chart-legend"), c.lines.map(function (ln) {
      var li = el("li"); li.appendChild(el("span", null, "swatch " + ln.cls));
      li.appendChild(document.createTextNode(ln.name)); return li;
    }));
    fig.querySelector(".chart-last").textContent = c.last;
    fig.querySelector(".chart-top").textContent = "max " + c.top;
    fig.querySelector(".chart-since").textContent = c.since;
  }
  function eventRow(e) {
    var tr = el("tr"); tr.dataset.event = e.id;
    tr.appendChild(el("td", ago(e.ts)));
    var sev = el("td"); sev.appendChild(el("span", e.severity, "badge sev-" + e.severity)); tr.appendChild(sev);
    tr.appendChild(el("td", e.kind));
    tr.appendChild(el("td", e.count, "num"));
    tr.appendChild(el("td", e.message));
    return tr;
  }
  function overview(snap) {
    fill(document.querySelector("#workers tbody"), snap.workers.map(workerRow));
    fill(document.querySelector("#live-programs tbody"), snap.programs.map(newestRow));
    fill(document.getElementById("alerts"), snap.alerts.map(function (a) { return el("p", a, "alert"); }));
    if (snap.policies.length) { fill(document.getElementById("active-policies"), snap.policies.map(policyItem)); }
    snap.charts.forEach(chart);
    var events = document.querySelector("#events tbody");
    if (events && snap.events.length) { fill(events, snap.events.map(eventRow)); }
    document.getElementById("queued").textContent = String(snap.queued);
    document.getElementById("programs-total").textContent = String(snap.programs_total);
    stamp(snap.ts);
  }

  // --- program tables -----------------------------------------------------------------
  function setFields(tr, p) {
    tr.querySelectorAll("[data-field]").forEach(function (td) {
      var f = td.dataset.field;
      if (f === "status") { fill(td, [badge(p.status)]); if (p.held) { td.appendChild(document.createTextNode(" (held)")); } }
      else if (f === "worker_id") {
        fill(td, p.worker_id ? [link("worker", p.worker_id)] : []);
        if (p.pinned) { td.appendChild(document.createTextNode(" (pinned)")); }
      }
      else if (f in p) { td.textContent = String(p[f]); }
    });
  }
  function programRow(p) {
    var tr = el("tr"); tr.dataset.program = p.id;
    tr.appendChild(cell(link("program", p.id)));
    var s = el("td"); s.appendChild(sessionLink(p.session_id)); tr.appendChild(s);
    ["status", "worker_id", "steps", "context_tokens"].forEach(function (f) {
      var td = el("td", null, f === "steps" || f === "context_tokens" ? "num" : ""); td.dataset.field = f; tr.appendChild(td);
    });
    tr.appendChild(el("td", p.created_at ? ago(p.created_at) : ""));
    setFields(tr, p);
    return tr;
  }
  function rowsById(tbody) {
    var out = {};
    tbody.querySelectorAll("tr[data-program]").forEach(function (tr) { out[tr.dataset.program] = tr; });
    return out;
  }
  function table(t) {
    var tbody = t.querySelector("tbody");
    var update = t.dataset.liveMode === "update";
    follow(t.dataset.live, "programs", function (data) {
      var known = rowsById(tbody), unknown = 0;
      if (update) {
        data.rows.forEach(function (p) { if (known[p.id]) { setFields(known[p.id], p); } else { unknown += 1; } });
      } else if (data.rows.length) {
        fill(tbody, data.rows.map(programRow));
      } else {
        var none = el("tr"), td = el("td", "No programs match.");
        td.colSpan = 7; none.appendChild(td); fill(tbody, [none]);
      }
      document.querySelectorAll(".pager [data-field]").forEach(function (s) { s.textContent = String(data[s.dataset.field]); });
      stamp(Date.now() / 1000);
      if (unknown && live) { live.textContent += " · " + unknown + " new program(s): reload to act on them"; }
    });
  }

  var charts = document.getElementById("charts");
  if (document.getElementById("workers")) {
    follow("/ui/events?range=" + encodeURIComponent(charts ? charts.dataset.range : "hour"), "snapshot", overview);
  }
  document.querySelectorAll("table[data-live]").forEach(table);
}());
