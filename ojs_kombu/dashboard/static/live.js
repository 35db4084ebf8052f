// The dashboard's live updates: every few seconds, fetch this page again and put its [data-live]
// regions in place of the ones shown, when they changed. Nothing else on the page is touched, so
// a filter being typed, the scroll position, the selected checkboxes and the opened <details> stay as
// they are; a region holding the focus of a form field waits until the focus leaves it (a focused
// link or summary is focused again in the new content). Polling stops while the tab
// is hidden and resumes (at once) when it is shown. Without scripts the page is plain HTML with
// a Refresh link. When the page answered is of another kind (an error page, or the page once the
// error is gone), its whole <main> is put in place. See docs/operations.md, "Live updates".
(function () {
  "use strict";
  var body = document.body;
  var every = parseFloat(body.getAttribute("data-refresh") || "0") * 1000;
  var status = document.getElementById("live");
  if (!(every > 0) || !window.fetch || !window.DOMParser || !status || !document.querySelector("[data-live]")) {
    return;
  }
  var EDITING = "input, select, textarea, [contenteditable]";
  var FOCUSABLE = "a[href], summary, button";
  var timer = null;
  var busy = false;
  var stopped = false;

  function say(text, state) {
    status.textContent = text;
    status.setAttribute("data-state", state);
  }

  function clock() {
    return new Date().toISOString().slice(11, 19) + "Z";
  }

  function checked(region) {
    var kept = {};
    region.querySelectorAll("input[type=checkbox]:checked").forEach(function (box) {
      kept[box.name + "\u0000" + box.value] = true;
    });
    return kept;
  }

  // The <details> the user opened (a chart's numbers, a backtrace) stay open across an update.
  function opened(region) {
    return Array.prototype.map.call(region.querySelectorAll("details"), function (d) {
      return d.open;
    });
  }

  // The relative ages ("3 min ago") change on every update: their text is set in place, so
  // that a region whose other content is unchanged is not replaced.
  function ages(region, next) {
    var olds = region.querySelectorAll(".age");
    var news = next.querySelectorAll(".age");
    if (olds.length !== news.length) {
      return;
    }
    for (var i = 0; i < olds.length; i += 1) {
      if (olds[i].textContent !== news[i].textContent) {
        olds[i].textContent = news[i].textContent;
      }
    }
  }

  function ids(doc) {
    return Array.prototype.map.call(doc.querySelectorAll("[data-live][id]"), function (region) {
      return region.id;
    }).join(" ");
  }

  function swap(fresh) {
    var changed = 0;
    var main = document.querySelector("main");
    var freshMain = fresh.querySelector("main");
    if (main && freshMain && ids(document) !== ids(fresh)) {
      // Another kind of page (an error page, or the page after one): what a reload would show.
      main.innerHTML = freshMain.innerHTML;
      document.title = fresh.title;
      changed = 1;
    }
    document.querySelectorAll("[data-live][id]").forEach(function (region) {
      var next = fresh.getElementById(region.id);
      if (!next) {
        return;
      }
      ages(region, next);
      if (next.innerHTML === region.innerHTML) {
        return;
      }
      var active = document.activeElement;
      var holding = region.contains(active) && active !== body;
      if (holding && active.matches(EDITING)) {
        return; // the user is working in it: updated once the focus leaves
      }
      // A focused link or summary (keyboard navigation) is focused again once replaced.
      var focused = holding ? Array.prototype.indexOf.call(region.querySelectorAll(FOCUSABLE), active) : -1;
      var kept = checked(region);
      var open = opened(region);
      region.innerHTML = next.innerHTML;
      var details = region.querySelectorAll("details");
      details.forEach(function (d, i) {
        if (open.length === details.length && open[i]) {
          d.open = true;
        }
      });
      if (focused >= 0 && region.querySelectorAll(FOCUSABLE)[focused]) {
        region.querySelectorAll(FOCUSABLE)[focused].focus({ preventScroll: true });
      }
      region.querySelectorAll("input[type=checkbox]").forEach(function (box) {
        box.checked = !!kept[box.name + "\u0000" + box.value];
      });
      changed += 1;
    });
    body.setAttribute("data-updates", String(parseInt(body.getAttribute("data-updates") || "0", 10) + 1));
    return changed;
  }

  function tick() {
    timer = null;
    if (busy || stopped || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "X-OJS-Live": "1" },
      redirect: "manual",
    })
      .then(function (answer) {
        if (answer.status === 401 || answer.status === 403 || answer.type === "opaqueredirect") {
          stopped = true;
          say("not updating: no longer authorized, reload the page", "stopped");
          return null;
        }
        return answer.text().then(function (text) {
          return { ok: answer.ok, status: answer.status, text: text };
        });
      })
      .then(function (got) {
        if (got === null) {
          return;
        }
        swap(new DOMParser().parseFromString(got.text, "text/html"));
        say(got.ok ? "live · updated " + clock() : "live · error " + got.status + " at " + clock(),
            got.ok ? "live" : "error");
      })
      .catch(function () {
        say("dashboard unreachable at " + clock() + ", retrying", "offline");
      })
      .then(function () {
        busy = false;
        schedule();
      });
  }

  function schedule() {
    if (timer === null && !stopped && !document.hidden) {
      timer = window.setTimeout(tick, every);
    }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      if (timer !== null) {
        window.clearTimeout(timer);
        timer = null;
      }
      say("paused while the tab is hidden", "paused");
    } else if (!busy) {
      tick();
    }
  });

  say("live · every " + every / 1000 + " s", "live");
  schedule();
})();
