/* Live views: the page's websocket (htmx ws extension) re-syncs on every open. It sends the cursor (the
   newest Event id the page reflects) and the ids of the objects it shows; the server answers with the
   partials that changed since, and from then on with each change, as elements swapped by id. */
(function () {
  function visibleIds() {
    return Array.prototype.map.call(document.querySelectorAll("[data-live-id]"), function (el) {
      return parseInt(el.getAttribute("data-live-id"), 10);
    }).filter(function (n) { return !isNaN(n); });
  }
  function setStatus(text, cls) {
    var el = document.getElementById("live-status");
    if (el) { el.textContent = text; el.className = "live-status " + cls; }
  }
  document.addEventListener("htmx:wsOpen", function (evt) {
    var cursor = document.getElementById("live-cursor");
    evt.detail.socketWrapper.send(JSON.stringify({
      type: "resync", since: cursor ? cursor.getAttribute("data-cursor") : "0", ids: visibleIds()
    }));
    setStatus("live", "on");
  });
  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail && evt.detail.event ? evt.detail.event.code : 0;
    setStatus(code === 4403 ? "not allowed" : "reconnecting…", "off");
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    window.liveMessages = (window.liveMessages || 0) + 1;  // browser tests read this
  });
})();
