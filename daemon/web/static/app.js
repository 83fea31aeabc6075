// goald status page: live updates, actions without a reload, timeline paging. The page works
// without this script (forms post, links navigate); this only makes it live.
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="csrf"]');
  var csrf = meta ? meta.content : "";
  var liveState = document.getElementById("live-state");
  var MAX_ENTRIES = 3000; // bounded memory on the page: the oldest bands go (reload them by paging)

  function say(text) { if (liveState) liveState.textContent = text; }

  function applyState(s) {
    if (!s || s.error) return;
    var st = document.getElementById("goal-status");
    if (st) { st.textContent = s.statusText; st.className = "status st-" + s.status; }
    [["goal-why", s.why], ["goal-activity", s.activity], ["goal-rounds", s.rounds], ["goal-tokens", s.tokens], ["goal-cost", s.cost]].forEach(function (p) {
      var el = document.getElementById(p[0]);
      if (el && p[1] != null) el.textContent = p[1];
    });
    var enable = { pause: s.status === "active", resume: s.status === "paused", cancel: s.status === "active" || s.status === "paused" };
    Object.keys(enable).forEach(function (k) {
      var b = document.getElementById("btn-" + k);
      if (b) b.disabled = !enable[k];
    });
    refreshChart(false);
  }

  var chartAt = 0;
  function refreshChart(now) {
    var img = document.getElementById("burn");
    if (!img) return;
    var t = Date.now();
    if (!now && t - chartAt < 5000) return;
    chartAt = t;
    img.src = img.src.split("?")[0] + "?t=" + t;
  }

  // Actions: the same POST the form makes, with the CSRF token, answered in JSON.
  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    if (!f.classList || !f.classList.contains("act")) return;
    ev.preventDefault();
    var out = document.getElementById("action-result");
    var body = new URLSearchParams(new FormData(f));
    var action = f.action.split("/").pop();
    fetch(f.action, { method: "POST", body: body, credentials: "same-origin",
                      headers: { "Accept": "application/json", "X-CSRF-Token": csrf } })
      .then(function (r) { return r.json().then(function (j) { return [r, j]; }, function () { return [r, { error: r.statusText }]; }); })
      .then(function (rj) {
        var r = rj[0], j = rj[1];
        if (out) { out.textContent = r.ok ? action + ": done" : "refused: " + j.error; out.className = r.ok ? "result good" : "result bad"; }
        if (r.ok) {
          var t = document.getElementById("send-text");
          if (action === "send" && t) t.value = "";
          refreshState();
        }
      });
  });

  var art = document.getElementById("goal");
  function refreshState() {
    if (!art) return;
    fetch("/goals/" + art.dataset.goal + "/state", { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; }).then(applyState);
  }

  function bandsBox() { return document.querySelector("#timeline .bands"); }

  function addEntry(d) {
    var box = bandsBox();
    if (!box) return;
    var empty = document.querySelector("#timeline .empty");
    if (empty) empty.remove();
    var top = box.firstElementChild;
    if (!top || top.dataset.open !== "1") {
      top = document.createElement("details");
      top.className = "band";
      top.open = true;
      top.dataset.open = "1";
      top.dataset.first = d.seq;
      var sum = document.createElement("summary");
      sum.textContent = d.label || "new interval · running";
      top.appendChild(sum);
      var ol = document.createElement("ol");
      ol.className = "entries";
      top.appendChild(ol);
      box.insertBefore(top, box.firstChild);
    } else if (d.label && top.dataset.labelled !== "1") {
      top.querySelector("summary").textContent = d.label + " · running";
    }
    if (d.label) top.dataset.labelled = "1";
    top.querySelector("ol.entries").insertAdjacentHTML("beforeend", d.html);
    top.dataset.last = d.seq;
    if (d.idle) {
      top.dataset.open = "0";
      var s = top.querySelector("summary");
      s.textContent = s.textContent.replace(/ · running$/, "");
    }
    trim(box);
  }

  function trim(box) {
    var n = box.querySelectorAll("li.ev").length;
    while (n > MAX_ENTRIES && box.children.length > 1) {
      var last = box.lastElementChild;
      n -= last.querySelectorAll("li.ev").length;
      last.remove();
      var older = document.getElementById("older");
      var oldest = box.lastElementChild;
      if (older && oldest) older.href = older.href.replace(/before=\d+/, "before=" + oldest.dataset.first);
    }
  }

  if (art) {
    var last = parseInt(art.dataset.lastSeq || "0", 10);
    var es = null;
    var connect = function () {
      es = new EventSource("/goals/" + art.dataset.goal + "/live?after=" + last);
      es.addEventListener("ev", function (m) {
        var d = JSON.parse(m.data);
        if (d.seq <= last) return; // already shown (a resumed stream never repeats, but be sure)
        addEntry(d);
        last = d.seq;
        art.dataset.lastSeq = String(last);
      });
      es.addEventListener("goal", function (m) { applyState(JSON.parse(m.data)); });
      es.addEventListener("caught-up", function () { say("live"); document.body.dataset.live = "1"; });
      es.onerror = function () {
        // Reconnect ourselves, from the newest entry shown (the daemon may have restarted).
        es.close();
        document.body.dataset.live = "0";
        say("reconnecting…");
        setTimeout(connect, 1000);
      };
    };
    connect();
  }

  // The goals table: each goal whose events moved comes back as its re-rendered row.
  var table = document.getElementById("goals");
  if (table && !art) {
    var tes = null;
    var connectTable = function () {
      tes = new EventSource("/live");
      tes.addEventListener("row", function (m) {
        var d = JSON.parse(m.data);
        var old = table.querySelector('tr[data-goal="' + d.goalId + '"]');
        var tmp = document.createElement("tbody");
        tmp.innerHTML = d.html;
        var fresh = tmp.firstElementChild;
        if (!fresh) return;
        if (old) {
          old.replaceWith(fresh);
        } else if (!d.known) {
          var body = table.querySelector("tbody");
          if (body) body.insertBefore(fresh, body.firstChild); // a goal created since the page loaded
        }
        fresh.classList.add("moved");
      });
      tes.addEventListener("reload", function () { say("many goals moved: reload for the new order"); });
      tes.addEventListener("caught-up", function () { say("live"); document.body.dataset.live = "1"; });
      tes.onerror = function () {
        tes.close();
        document.body.dataset.live = "0";
        say("reconnecting…");
        setTimeout(connectTable, 1000);
      };
    };
    connectTable();
  }

  // Older rounds and a band's conversation, loaded in place.
  document.addEventListener("click", function (ev) {
    var a = ev.target.closest ? ev.target.closest("a") : null;
    if (!a) return;
    if (a.id === "older") {
      ev.preventDefault();
      fetch(a.href, { credentials: "same-origin", headers: { "X-Fragment": "1" } }).then(function (r) { return r.text(); }).then(function (html) {
        var tmp = document.createElement("div");
        tmp.innerHTML = html;
        var box = bandsBox();
        var more = tmp.querySelector(".bands");
        if (box && more) while (more.firstChild) box.appendChild(more.firstChild);
        var next = tmp.querySelector("#older, .start");
        a.replaceWith(next || document.createTextNode(""));
      });
    } else if (a.classList.contains("conv")) {
      ev.preventDefault();
      var body = a.parentNode.querySelector(".conv-body");
      fetch(a.href, { credentials: "same-origin", headers: { "X-Fragment": "1" } }).then(function (r) { return r.text(); }).then(function (html) {
        body.innerHTML = html;
        a.remove();
      });
    }
  });
})();
