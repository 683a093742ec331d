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

  document.addEventListener("DOMContentLoaded", function () { openDialogs(document); });
  document.addEventListener("htmx:load", function (e) { openDialogs(e.target && e.target.querySelectorAll ? e.target.parentNode || document : document); });
})();
