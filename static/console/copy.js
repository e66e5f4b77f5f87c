/* Copy buttons: a button with data-copy-target="<id>" copies that element's text (the join command). One
   listener on the document, so buttons that htmx swaps in work too. The clipboard API needs a secure context
   (https or localhost); elsewhere the text is selected for the user to copy. */
(function () {
  function say(button, text) {
    var status = document.getElementById(button.id + "-status");
    if (status) { status.textContent = text; }
  }
  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", function (evt) {
    var button = evt.target.closest ? evt.target.closest("[data-copy-target]") : null;
    if (!button) { return; }
    var source = document.getElementById(button.getAttribute("data-copy-target"));
    if (!source) { return; }
    var text = source.textContent;
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { say(button, "Copied."); },
        function () { selectText(source); say(button, "Selected: press Ctrl+C to copy."); });
    } else {
      selectText(source);
      say(button, "Selected: press Ctrl+C to copy.");
    }
  });
})();
