// The fleet board's selection: "select all" ticks every host of this page; the bulk form says how many are ticked.
// A row the live view swaps in keeps its tick: the selection is kept by host name, not by the checkbox.
(function () {
  var chosen = new Set();
  function boxes() { return Array.from(document.querySelectorAll("#fleet-table input.select-host")); }
  function count() {
    var all = boxes();
    var n = all.filter(function (b) { return b.checked; }).length;
    var out = document.getElementById("bulk-count");
    if (out) out.textContent = n ? n + " selected" : "";
    var head = document.getElementById("select-all");
    if (head) head.checked = n > 0 && n === all.length;
  }
  function pick(box, on) { box.checked = on; if (on) chosen.add(box.value); else chosen.delete(box.value); }
  document.addEventListener("change", function (e) {
    if (e.target.id === "select-all") {
      boxes().forEach(function (b) { pick(b, e.target.checked); });
    } else if (e.target.classList && e.target.classList.contains("select-host")) {
      pick(e.target, e.target.checked);
    } else {
      return;
    }
    count();
  });
  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("fleet-table");
    if (!table) return;
    new MutationObserver(function () {
      boxes().forEach(function (b) { if (chosen.has(b.value) && !b.checked) b.checked = true; });
      count();
    }).observe(table, {childList: true, subtree: true});
  });
})();
