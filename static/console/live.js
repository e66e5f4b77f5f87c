/* Live views: the page's websocket (htmx ws extension) re-syncs on every open. It sends the cursor (the
   newest Event id the page reflects) and the ids of the objects it shows; the server answers with the
   partials that changed since, and from then on with each change, as elements swapped by id.
   While disconnected the badge offers "reconnect now"; the automatic back-off is capped at MAX_DELAY_MS. */
(function () {
  var MAX_DELAY_MS = 10000;
  var socket = null;  // the ws extension's socket wrapper: reconnect() opens a new socket at once
  if (window.htmx) {
    // The extension's "full-jitter" waits up to 64 s after a long outage; ours doubles from 1 s up to 10 s.
    htmx.config.wsReconnectDelay = function (retryCount) {
      var delay = Math.min(MAX_DELAY_MS, 1000 * Math.pow(2, Math.min(retryCount, 10)));
      return delay / 2 + Math.random() * delay / 2;
    };
  }
  function visibleIds() {
    return Array.prototype.map.call(document.querySelectorAll("[data-live-id]"), function (el) {
      return parseInt(el.getAttribute("data-live-id"), 10);
    }).filter(function (n) { return !isNaN(n); });
  }
  function setStatus(text, cls, offerReconnect) {
    var el = document.getElementById("live-status");
    if (!el) { return; }
    el.textContent = text;
    el.className = "live-status " + cls;
    if (offerReconnect && socket) {
      var button = document.createElement("button");
      button.type = "button";
      button.id = "live-reconnect";
      button.className = "live-reconnect";
      button.textContent = "reconnect now";
      button.addEventListener("click", function () {
        setStatus("connecting…", "");
        socket.reconnect();
      });
      el.appendChild(document.createTextNode(" "));
      el.appendChild(button);
    }
  }
  document.addEventListener("htmx:wsOpen", function (evt) {
    socket = evt.detail.socketWrapper;
    var cursor = document.getElementById("live-cursor");
    evt.detail.socketWrapper.send(JSON.stringify({
      type: "resync", since: cursor ? cursor.getAttribute("data-cursor") : "0", ids: visibleIds()
    }));
    setStatus("live", "on");
  });
  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail && evt.detail.event ? evt.detail.event.code : 0;
    if (evt.detail && evt.detail.socketWrapper) { socket = evt.detail.socketWrapper; }
    if (code === 4403) { setStatus("not allowed", "off"); } else { setStatus("reconnecting…", "off", true); }
  });
  // A live update never overwrites a box the user is typing in (focused, or changed and not sent), nor redraws
  // one that already shows the new value (the "saved" note of the user's own change stays).
  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    var target = evt.detail.target;
    var mine = target && target.querySelector && target.querySelector("input[name=quantity]");
    if (!mine) { return; }
    var theirs = evt.detail.fragment && evt.detail.fragment.querySelector("input[name=quantity]");
    var editing = document.activeElement === mine || mine.value !== mine.defaultValue;
    if (editing || (theirs && theirs.value === mine.value)) { evt.detail.shouldSwap = false; }
  });
  // "Since" times: elements with data-timestamp (ISO 8601) show the time since it, as the server's `since`
  // filter does (core/templatetags/console.py), and are refreshed here every 20 s, live page or not.
  var UNITS = [["year", 365 * 86400], ["month", 30 * 86400], ["week", 7 * 86400], ["day", 86400],
               ["hour", 3600], ["minute", 60]];
  function timesince(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 60) { return "less than a minute"; }  // as the server's `since` filter: never "0 minutes"
    for (var i = 0; i < UNITS.length; i++) {
      var count = Math.floor(seconds / UNITS[i][1]);
      if (count > 0 || i === UNITS.length - 1) {
        var text = count + "\u00a0" + UNITS[i][0] + (count === 1 ? "" : "s");
        if (i + 1 < UNITS.length) {
          var next = Math.floor((seconds - count * UNITS[i][1]) / UNITS[i + 1][1]);
          if (next > 0 && count > 0) { text += ", " + next + "\u00a0" + UNITS[i + 1][0] + (next === 1 ? "" : "s"); }
        }
        return text;
      }
    }
  }
  function refreshTimes() {
    var now = Date.now();
    Array.prototype.forEach.call(document.querySelectorAll("[data-timestamp]"), function (el) {
      var at = Date.parse(el.getAttribute("data-timestamp"));
      if (!isNaN(at)) { el.textContent = timesince((now - at) / 1000); }
    });
  }
  window.liveTimesince = timesince;  // browser tests read this
  setInterval(refreshTimes, 20000);
  // A rarely changing list (server: events.consumers.ListPageConsumer) was told it is stale: fetch the page
  // again through its own view and swap its main part, unless the user is typing in it; at most one fetch
  // every REFETCH_MS, however busy the fleet (the last change is always fetched).
  var REFETCH_MS = 2000, lastFetch = 0, pending = null;
  function refetch() {
    pending = null;
    var main = document.querySelector("main");
    if (main && main.contains(document.activeElement) && document.activeElement.matches("input, select, textarea")) { return; }
    lastFetch = Date.now();
    htmx.ajax("GET", location.href, {target: "main", select: "main", swap: "outerHTML"});
  }
  document.addEventListener("htmx:oobAfterSwap", function (evt) {
    if (!evt.detail.target || evt.detail.target.id !== "live-stale" || pending) { return; }
    pending = setTimeout(refetch, Math.max(0, lastFetch + REFETCH_MS - Date.now()));
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    window.liveMessages = (window.liveMessages || 0) + 1;  // browser tests read this
  });
})();
