/* Small page behaviours, no dependencies: modal dialogs that htmx swaps in open themselves, and
 * copy buttons ([data-copy="#selector"]) copy that element's text and say so in a live region.
 */
(function () {
  "use strict";

  function openDialogs(root) {
    (root || document).querySelectorAll("dialog[data-modal]:not([open])").forEach(function (dialog) {
      if (typeof dialog.showModal === "function") dialog.showModal();
      else dialog.setAttribute("open", "");
    });
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    return new Promise(function (resolve, reject) {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.appendChild(area);
      area.select();
      var ok = document.execCommand && document.execCommand("copy");
      document.body.removeChild(area);
      if (ok) resolve(); else reject(new Error("copy refused"));
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    var status = document.querySelector(button.getAttribute("data-copy-status") || "#copy-status");
    if (!source) return;
    copyText(source.innerText.trim()).then(function () {
      if (status) status.textContent = "Copied to the clipboard.";
      button.textContent = "Copied";
    }, function () {
      var range = document.createRange();
      range.selectNodeContents(source);
      window.getSelection().removeAllRanges();
      window.getSelection().addRange(range);
      if (status) status.textContent = "Copy was refused: the command is selected, press Ctrl+C.";
    });
  });

  document.addEventListener("DOMContentLoaded", function () { openDialogs(document); });
  document.addEventListener("htmx:load", function (e) { openDialogs(e.target && e.target.querySelectorAll ? e.target.parentNode || document : document); });
})();
