/* Small page behaviours, no dependencies: modal dialogs that htmx swaps in open themselves.
 * (Copy buttons are static/js/copy.js.)
 */
(function () {
  "use strict";

  function openDialogs(root) {
    (root || document).querySelectorAll("dialog[data-modal]:not([open])").forEach(function (dialog) {
      if (typeof dialog.showModal === "function") dialog.showModal();
      else dialog.setAttribute("open", "");
    });
  }

  // A search box that narrows a list of checkboxes to the labels containing its text (ticked ones stay).
  document.addEventListener("input", function (e) {
    var box = e.target;
    if (!box.matches || !box.matches("input[data-filter-choices]")) return;
    var list = document.querySelector(box.getAttribute("data-filter-choices"));
    if (!list) return;
    var words = box.value.trim().toLowerCase();
    list.querySelectorAll("label.choice").forEach(function (label) {
      var input = label.querySelector("input");
      var match = !words || label.textContent.toLowerCase().indexOf(words) !== -1 || (input && input.checked);
      label.hidden = !match;
    });
  });

  document.addEventListener("DOMContentLoaded", function () { openDialogs(document); });
  document.addEventListener("htmx:load", function (e) { openDialogs(e.target && e.target.querySelectorAll ? e.target.parentNode || document : document); });
})();
