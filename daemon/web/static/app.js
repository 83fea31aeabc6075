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
    var enable = { pause: s.status === "active", resume: s.status === "paused", cancel: s.status === "active" || s.status === "paused" || s.status === "waiting" };
    Object.keys(enable).forEach(function (k) {
      var b = document.getElementById("btn-" + k);
      if (b) b.disabled = !enable[k];
    });
    // An ended goal takes no message; only a paused one is resumed with it.
    var live = s.status === "active" || s.status === "paused" || s.status === "waiting";
    var form = document.getElementById("send-form");
    if (form) form.hidden = !live;
    var resume = document.getElementById("send-resume");
    if (resume) {
      resume.hidden = s.status !== "paused";
      var box = resume.querySelector("input");
      if (box && s.status !== "paused") box.checked = false;
    }
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

  // Answer forms (class "ans") post as they are: the page reloads without the answered question.
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

  // A live event: its entry, in the band the server says it belongs to. The band's frame (summary
  // with its counts, data attributes, the conversation link) is rendered on the server by the same
  // function as a reloaded page's, so a band added or grown live reads as it does after a reload.
  function addEntry(d) {
    var box = bandsBox();
    if (!box || !d.band) return;
    var empty = document.querySelector("#timeline .empty");
    if (empty) empty.remove();
    var tmp = document.createElement("div");
    tmp.innerHTML = d.band.html;
    var fresh = tmp.firstElementChild;
    var band = box.querySelector('details.band[data-first="' + d.band.first + '"]');
    if (!band) {
      band = fresh;
      band.open = true; // the newest band is shown expanded, as on a reloaded page
      box.insertBefore(band, box.firstChild);
    } else {
      band.dataset.last = fresh.dataset.last;
      band.dataset.open = fresh.dataset.open;
      band.querySelector("summary").textContent = fresh.querySelector("summary").textContent;
      var conv = band.querySelector("a.conv"), conv2 = fresh.querySelector("a.conv");
      if (conv && conv2) conv.setAttribute("href", conv2.getAttribute("href"));
    }
    band.querySelector("ol.entries").insertAdjacentHTML("beforeend", d.html);
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

  // Relative times ("3s ago", "in 1m20s") keep moving, in rows that do not: the same words as the
  // server's (daemon.display.age and span), from each time's datetime attribute, every second.
  function span(s) {
    s = Math.floor(Math.abs(s));
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60), sec = s % 60;
    if (m < 10) return sec ? m + "m" + (sec < 10 ? "0" : "") + sec + "s" : m + "m";
    if (m < 60) return m + "m";
    var h = Math.floor(m / 60); m = m % 60;
    if (h < 24) return m ? h + "h" + (m < 10 ? "0" : "") + m + "m" : h + "h";
    var dd = Math.floor(h / 24); h = h % 24;
    return h ? dd + "d" + h + "h" : dd + "d";
  }
  function age(iso) {
    var t = Date.parse(iso);
    if (isNaN(t)) return null;
    var delta = (Date.now() - t) / 1000;
    if (Math.abs(delta) < 1) return "now";
    return delta > 0 ? span(delta) + " ago" : "in " + span(delta);
  }
  function tick() {
    document.querySelectorAll("time.rel").forEach(function (el) {
      var text = age(el.getAttribute("datetime"));
      if (text !== null && el.textContent !== text) el.textContent = text;
    });
  }
  setInterval(tick, 1000);

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
