// flow's UI: the one script. A run page that is still running holds a server-sent event
// stream; on a change it closes the stream, fetches the page's main part again, swaps it
// in (keeping which outputs were open and where the keyboard focus was) and follows the
// new part's stream: one stream per page at any time. A stream the server refuses (too
// many live streams) makes the page poll instead. A run page also follows the steps'
// logs (followLogs, below). Everything else works without it.
"use strict";
(function () {
  function focusKey(el) {
    if (!el || el === document.body) return null;
    if (el.id) return { id: el.id };
    if (el.classList && el.classList.contains("logbody")) return { log: el.closest("details").getAttribute("data-step") };
    var form = el.closest && el.closest("form");
    if (form) return { form: form.getAttribute("action") };
    if (el.tagName === "SUMMARY") return { summary: el.textContent };
    if (el.getAttribute && el.getAttribute("href")) return { href: el.getAttribute("href") };
    return null;
  }
  function refocus(key) {
    if (!key) return;
    var el = null;
    if (key.id) el = document.getElementById(key.id);
    if (key.form) { var f = document.querySelector('form[action="' + CSS.escape(key.form) + '"]'); el = f && f.querySelector("button"); }
    if (key.summary) el = Array.prototype.find.call(document.querySelectorAll("summary"), function (s) { return s.textContent === key.summary; });
    if (key.href) el = document.querySelector('[href="' + CSS.escape(key.href) + '"]');
    if (key.log) el = document.querySelector('details.log[data-step="' + CSS.escape(key.log) + '"] .logbody');
    if (el) el.focus({ preventScroll: true });
  }
  function follow() {
    var live = document.querySelector("[data-events]");
    if (!live || !window.EventSource) return;
    var src = new EventSource(live.getAttribute("data-events"));
    var refresh = function (ev) {
      src.close(); // one refresh at a time; the new part brings its own stream
      var open = Array.prototype.map.call(document.querySelectorAll("details[open] summary"), function (s) { return s.textContent; });
      var focus = focusKey(document.activeElement);
      fetch(location.href, { headers: { "X-Flow-Fragment": "1" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var carried = carryLogs(); // with the swap, in one go: no line is lost or shown twice
          document.getElementById("main").innerHTML = html;
          document.querySelectorAll("details summary").forEach(function (s) {
            if (open.indexOf(s.textContent) >= 0) s.parentElement.open = true;
          });
          followLogs(carried); // before the focus: it may put back the log views that had it
          refocus(focus);
          localTimes();
          follow();
        })
        .catch(function () {
          // The page could not be fetched (the node restarting, the run gone): try the
          // stream again in a while, unless it had ended.
          if (ev.type !== "end") setTimeout(follow, 3000);
        });
    };
    src.addEventListener("change", refresh);
    src.addEventListener("end", refresh);
    src.addEventListener("error", function () {
      // A stream the browser gave up on: refused (429, too many live streams of this
      // user or node) or not a stream. Poll instead: reload the main part in 5 s, which
      // tries a stream again (a lost connection is CONNECTING: the browser retries it).
      if (src.readyState !== EventSource.CLOSED) return;
      var badge = document.querySelector(".livebadge");
      if (badge) badge.textContent = "reloading every 5 s";
      setTimeout(function () { refresh({ type: "poll" }); }, 5000);
    });
  }
  // Times come in UTC, to the second (the page reads the same without the script); shown
  // in the viewer's zone, with the UTC time on hover. A log line's time (data-clock) is
  // its time of day, with the whole UTC time, to the millisecond, on hover.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock(d) { return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()); }
  function localTimes() {
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime()) || el.dataset.local) return;
      el.dataset.local = "1";
      if (el.hasAttribute("data-clock")) {
        el.textContent = clock(d);
        return;
      }
      var zone = "";
      try { zone = " " + (Intl.DateTimeFormat().resolvedOptions().timeZone || ""); } catch (e) { zone = ""; }
      el.title = el.textContent;
      el.textContent = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(d) + zone;
    });
  }

  // The steps' logs (docs/ui.md, "Step logs"). A run page comes with the first lines of
  // the run's log, each in its step's view (details.log), and the cursor after them
  // (data-log-after); from there the script reads the run's log (GET data-logs?after=),
  // page after page while pages come full, then once a second until the run has ended and
  // a page is empty. Every line is the steps' output, hostile as any: it is put in the
  // page as text (textContent), never as markup. The page holds at most LOG_CAP lines
  // until asked for more: a step may print megabytes.
  var LOG_POLL = 1000, LOG_RETRY = 5000, LOG_CAP = 20000;
  var STREAMS = ["stdout", "stderr", "log", "http", "flow"];
  var logs = null; // the page's follower
  function atBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight < 8; }
  function keyOf(l) { return l.epoch + "/" + (l.item == null ? -1 : l.item) + "/" + l.attempt; }
  function keyParts(k) { return k.split("/").map(Number); }
  function keyLess(a, b) {
    for (var i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] < b[i];
    return false;
  }
  // logBlock is the list of the block of key in a step's view, made (with its header, as
  // the server writes it) where the order of blocks puts it: by epoch, item, attempt.
  function logBlock(body, key) {
    var p = keyParts(key), before = null;
    var blocks = body.querySelectorAll(":scope > .logblock");
    for (var i = 0; i < blocks.length; i++) {
      var k = blocks[i].getAttribute("data-key");
      if (k === key) return blocks[i].querySelector(".loglines");
      if (!before && keyLess(p, keyParts(k))) before = blocks[i];
    }
    var b = document.createElement("div"), h = document.createElement("p"), ol = document.createElement("ol");
    b.className = "logblock";
    b.setAttribute("data-key", key);
    h.className = "loghead";
    h.textContent = "epoch " + p[0] + (p[1] >= 0 ? " · item " + p[1] : "") + " · attempt " + p[2];
    ol.className = "loglines";
    b.appendChild(h);
    b.appendChild(ol);
    body.insertBefore(b, before);
    return ol;
  }
  function lineElement(l) {
    var stream = STREAMS.indexOf(l.stream) >= 0 ? l.stream : "other";
    var li = document.createElement("li"), t = document.createElement("time");
    var tag = document.createElement("span"), text = document.createElement("span");
    li.className = "ls-" + stream;
    t.setAttribute("data-clock", "");
    var at = String(l.at || "").replace(/(\.\d{3})\d+/, "$1"); // Date reads milliseconds
    var d = new Date(at);
    if (isNaN(d.getTime())) {
      t.textContent = "--:--:--";
    } else {
      t.setAttribute("datetime", at);
      t.title = d.toISOString().replace("T", " ").replace("Z", " UTC");
      t.textContent = clock(d);
      t.dataset.local = "1";
    }
    tag.className = "tag";
    tag.textContent = stream === "stdout" ? "" : stream;
    text.className = "lt";
    text.textContent = String(l.line);
    li.appendChild(t);
    li.appendChild(tag);
    li.appendChild(text);
    return li;
  }
  function appendLines(f, lines) {
    var touched = new Map(); // each view's body, and whether it was scrolled to its end
    lines.forEach(function (l) {
      var view = f.views.get(l.step);
      if (!view) return;
      var body = view.querySelector(".logbody");
      if (!touched.has(body)) {
        touched.set(body, atBottom(body));
        view.hidden = false;
        var none = body.querySelector(".lognone");
        if (none) none.hidden = true;
      }
      var key = keyOf(l), last = f.last.get(l.step);
      if (!last || last.key !== key) {
        last = { key: key, list: logBlock(body, key) };
        f.last.set(l.step, last);
      }
      last.list.appendChild(lineElement(l));
    });
    touched.forEach(function (end, body) { if (end) body.scrollTop = body.scrollHeight; }); // a view at its end follows the log
  }
  function setNote(f, text) {
    if (!f.note) return;
    f.note.textContent = text;
    f.note.hidden = !text;
  }
  function capNote(f) {
    setNote(f, "This page shows the first " + f.lines.toLocaleString() + " lines of the steps' logs; flowctl run logs prints them all. ");
    if (!f.note) return;
    var more = document.createElement("button");
    more.type = "button";
    more.textContent = "Show more lines";
    more.addEventListener("click", function () {
      f.cap = f.lines + LOG_CAP;
      setNote(f, "");
      pollLogs(f);
    });
    f.note.appendChild(more);
  }
  function pollLogs(f) {
    if (f.stopped) return;
    if (f.lines >= f.cap) { capNote(f); return; }
    var again = function (ms) { f.timer = setTimeout(function () { pollLogs(f); }, ms); };
    if (document.hidden) { again(LOG_POLL); return; } // nobody looks: no request
    fetch(f.url + (f.after ? "?after=" + encodeURIComponent(f.after) : ""), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.ok) return r.json();
        return r.text().then(function (t) {
          var e = new Error(t.trim() || "HTTP " + r.status);
          e.status = r.status;
          throw e;
        });
      })
      .then(function (page) {
        if (f.stopped) return; // the page's main part was swapped: its new follower reads from here
        setNote(f, "");
        var lines = Array.isArray(page.lines) ? page.lines : [];
        appendLines(f, lines);
        f.lines += lines.length;
        if (page.next) f.after = String(page.next);
        if (lines.length > 0) pollLogs(f); // more may be there already
        else if (!page.ended) again(LOG_POLL);
        // else: the run ended and every line it printed is on the page
      })
      .catch(function (e) {
        if (f.stopped) return;
        if (e.status >= 400 && e.status < 500) { // refused (signed out, the run gone): asking again will not help
          setNote(f, "The steps' logs could not be read: " + e.message);
          return;
        }
        setNote(f, "The steps' logs could not be read (" + e.message + "); trying again in 5 s.");
        again(LOG_RETRY);
      });
  }
  // carryLogs stops the page's follower before its main part is swapped, and keeps what it
  // followed: the new part shows the first lines again, the follower may have had more.
  function carryLogs() {
    var f = logs;
    logs = null;
    if (!f) return null;
    f.stopped = true;
    clearTimeout(f.timer);
    var bodies = new Map();
    f.views.forEach(function (view, step) {
      var b = view.querySelector(".logbody");
      bodies.set(step, { body: b, top: b.scrollTop, end: atBottom(b) });
    });
    return { url: f.url, after: f.after, lines: f.lines, cap: f.cap, bodies: bodies };
  }
  // followLogs follows the steps' logs of the page's main part, keeping carried's views
  // (the part swapped out) if they held more lines than the new part shows.
  function followLogs(carried) {
    var root = document.querySelector("[data-logs]");
    if (!root || !window.fetch || !window.Map) return;
    var f = { url: root.getAttribute("data-logs"), after: root.getAttribute("data-log-after") || "",
      lines: parseInt(root.getAttribute("data-log-lines"), 10) || 0, cap: LOG_CAP, views: new Map(), last: new Map(),
      note: root.querySelector(".lognote"), timer: null, stopped: false };
    root.querySelectorAll("details.log[data-step]").forEach(function (d) { f.views.set(d.getAttribute("data-step"), d); });
    var keep = carried && carried.url === f.url && carried.lines > f.lines;
    if (keep) {
      f.after = carried.after;
      f.lines = carried.lines;
      f.cap = carried.cap;
    }
    f.views.forEach(function (view, step) {
      var old = carried && carried.bodies.get(step), body = view.querySelector(".logbody");
      if (keep && old) {
        body.parentNode.replaceChild(old.body, body);
        body = old.body;
        if (body.querySelector(".logblock")) view.hidden = false;
      }
      if (old ? old.end : view.open) body.scrollTop = body.scrollHeight; // at the end, as the log goes on
      else if (old) body.scrollTop = old.top;
    });
    logs = f;
    pollLogs(f);
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(); followLogs(null); follow(); });
})();
