/* CleverThis live pages: node changes pushed over one WebSocket per tab (/ws/live/, fleet.browser_push).
 *
 * A part of the page that shows nodes carries data-push-url (the URL that renders it again; swapped
 * outerHTML, so the new part carries the same attributes) and one of:
 *   data-push-cluster="<id>"  refresh when a node of that compute cluster changed (the Nodes tab)
 *   data-push-node="<id>"     refresh when that node changed (the node page's header and event log)
 *   data-push-any             refresh on any change of the user's workspaces (the home page)
 * A page without such a part opens no socket. Refreshes of one part are coalesced (a burst of changes
 * costs one request). A lost socket is opened again after a growing wait (1 s up to 30 s), and then every
 * watched part is refreshed once: a change may have come while it was away. Every 10 minutes the tab
 * sends {"type": "renew"} (the server re-reads the user's workspaces and renews its groups).
 */
(function () {
  "use strict";
  var socket = null;
  var wait = 1000;
  var renewTimer = null;
  var queued = {};
  var RENEW_MS = 10 * 60 * 1000;

  function parts() {
    return document.querySelectorAll("[data-push-url][id]");
  }

  function refresh(part) {
    var id = part.id;
    if (queued[id]) return;
    var delay = part.hasAttribute("data-push-any") ? 1000 : 150;
    queued[id] = setTimeout(function () {
      delete queued[id];
      var current = document.getElementById(id);
      if (!current || !window.htmx) return;
      window.htmx.ajax("GET", current.getAttribute("data-push-url"), { source: current, target: current, swap: "outerHTML" });
    }, delay);
  }

  function shows(part, message) {
    if (part.hasAttribute("data-push-any")) return true;
    var cluster = part.getAttribute("data-push-cluster");
    if (cluster && message.clusters.indexOf(cluster) >= 0) return true;
    var node = part.getAttribute("data-push-node");
    return !!node && (message.nodes.indexOf(node) >= 0 || message.nodes.length === 0);
  }

  function onMessage(event) {
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (!message || message.type !== "nodes") return;
    parts().forEach(function (part) { if (shows(part, message)) refresh(part); });
  }

  function connect(missed) {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + window.location.host + "/ws/live/");
    socket.onopen = function () {
      wait = 1000;
      if (missed) parts().forEach(refresh);
      clearInterval(renewTimer);
      renewTimer = setInterval(function () {
        if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "renew" }));
      }, RENEW_MS);
    };
    socket.onmessage = onMessage;
    socket.onclose = function (event) {
      clearInterval(renewTimer);
      socket = null;
      if (event.code === 4401) return; // signed out: nothing to watch
      setTimeout(function () { if (parts().length) connect(true); }, wait);
      wait = Math.min(wait * 2, 30000);
    };
  }

  window.CleverPush = { connected: function () { return !!socket && socket.readyState === WebSocket.OPEN; } };
  document.addEventListener("DOMContentLoaded", function () { if (parts().length) connect(false); });
})();
