// flow's UI: the one script. A run page that is still running holds a server-sent event
// stream; on a change it closes the stream, fetches the page's main part again, swaps it
// in (keeping which outputs were open and where the keyboard focus was) and follows the
// new part's stream: one stream per page at any time. A stream the server refuses (too
// many live streams) makes the page poll instead. Everything else works without it.
"use strict";
(function () {
  function focusKey(el) {
    if (!el || el === document.body) return null;
    if (el.id) return { id: el.id };
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
          document.getElementById("main").innerHTML = html;
          document.querySelectorAll("details summary").forEach(function (s) {
            if (open.indexOf(s.textContent) >= 0) s.parentElement.open = true;
          });
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
  // in the viewer's zone, with the UTC time on hover.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function localTimes() {
    document.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime()) || el.dataset.local) return;
      var zone = "";
      try { zone = " " + (Intl.DateTimeFormat().resolvedOptions().timeZone || ""); } catch (e) { zone = ""; }
      el.title = el.textContent;
      el.textContent = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
        pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + zone;
      el.dataset.local = "1";
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(); follow(); });
})();
