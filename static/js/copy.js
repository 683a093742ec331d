/* Copy buttons, the one copy mechanism of every page:
 *   <button data-copy-target="#join-command">Copy</button>  copies that element's text;
 *   <button data-copy-text="https://…">Copy</button>        copies the attribute's text itself.
 * Optional data-copy-status="#id" names the live region that says what happened (else #copy-status, if
 * the page has one). Where the browser refuses, the element's text is selected for Ctrl+C.
 */
(function () {
  "use strict";

  function writeText(text) {
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

  function find(selector) {
    if (!selector) return null;
    try { return document.querySelector(selector); } catch (e) { return null; }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy-target], [data-copy-text]") : null;
    if (!button) return;
    event.preventDefault();
    var source = find(button.getAttribute("data-copy-target"));
    var text = button.hasAttribute("data-copy-text") ? button.getAttribute("data-copy-text") : source ? source.innerText.trim() : null;
    var status = find(button.getAttribute("data-copy-status") || "#copy-status");
    if (text === null) return;
    var label = button.getAttribute("data-copy-label") || button.textContent;
    button.setAttribute("data-copy-label", label);
    writeText(text).then(function () {
      if (status) status.textContent = "Copied to the clipboard.";
      button.textContent = "Copied";
      clearTimeout(button.copyTimer);
      button.copyTimer = setTimeout(function () { button.textContent = label; }, 2000);
    }, function () {
      if (source) {
        var range = document.createRange();
        range.selectNodeContents(source);
        window.getSelection().removeAllRanges();
        window.getSelection().addRange(range);
      }
      if (status) status.textContent = source ? "Copy was refused: the text is selected, press Ctrl+C." : "Copy was refused by the browser: " + text;
    });
  });
})();
