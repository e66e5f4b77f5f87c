/* A link with data-print prints the page (the certificate): a static file, as the pages' policy allows no
   inline script. */
document.addEventListener("click", function (evt) {
  var link = evt.target.closest ? evt.target.closest("[data-print]") : null;
  if (!link) { return; }
  evt.preventDefault();
  window.print();
});
