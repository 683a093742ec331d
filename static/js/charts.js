/* CleverThis charts: a small hand-written SVG renderer, no dependencies.
 *
 * <div data-chart='{"series": {"cpu": [..]}, "labels": {"cpu": "CPU"}, "window": "last hour"}'>
 *   draws one line chart (0–100 %) with a legend; every series has its own dash pattern and marker
 *   shape as well as its colour, so the chart reads without colour. Optional "unit" ("%" by default,
 *   "" for counts, " ms") and "max" (the top of the scale; null fits it to the data) draw other scales.
 * <span data-sparkline='[..]'> draws a small line of one series (0–100 %).
 * null values are gaps (no heartbeat in that bucket). The server writes the text alternative
 * (aria-label and a data table); this file only draws. Re-runs on every htmx swap.
 */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var STYLES = {
    cpu: { color: "#2f6fed", dash: "", marker: "circle" },
    memory: { color: "#1f9d55", dash: "6 3", marker: "square" },
    gpu: { color: "#b45309", dash: "2 3", marker: "triangle" },
    vram: { color: "#7c3aed", dash: "9 3 2 3", marker: "diamond" },
    // the home page's series: states, commands, requests, latency
    online: { color: "#1f9d55", dash: "", marker: "circle" },
    running: { color: "#1f9d55", dash: "", marker: "circle" },
    offline: { color: "#6b7480", dash: "6 3", marker: "square" },
    stopped: { color: "#6b7480", dash: "9 3 2 3", marker: "diamond" },
    cordoned: { color: "#b45309", dash: "2 3", marker: "triangle" },
    pending: { color: "#b45309", dash: "2 3", marker: "triangle" },
    draining: { color: "#7c3aed", dash: "9 3 2 3", marker: "diamond" },
    failed: { color: "#c62828", dash: "6 3", marker: "square" },
    errors: { color: "#c62828", dash: "6 3", marker: "square" },
    sent: { color: "#2f6fed", dash: "", marker: "circle" },
    requests: { color: "#2f6fed", dash: "", marker: "circle" },
    mean: { color: "#2f6fed", dash: "", marker: "circle" },
    max: { color: "#b45309", dash: "2 3", marker: "triangle" }
  };
  var PALETTE = ["cpu", "memory", "gpu", "vram"];

  function niceMax(top) {
    if (!(top > 0)) return 1;
    var step = Math.pow(10, Math.floor(Math.log10(top)));
    var nice = [1, 2, 2.5, 5, 10].map(function (m) { return m * step; }).filter(function (v) { return v >= top; })[0];
    return nice;
  }

  function fmt(v, unit) {
    var rounded = Math.abs(v) >= 10 || unit === "%" ? Math.round(v) : Math.round(v * 10) / 10;
    return rounded + unit;
  }

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(node);
    return node;
  }

  function segments(values, width, height, pad, top) {
    var n = values.length, out = [], current = [];
    top = top || 100;
    var dx = n > 1 ? (width - 2 * pad) / (n - 1) : 0;
    values.forEach(function (v, i) {
      if (v === null || v === undefined) {
        if (current.length) out.push(current);
        current = [];
        return;
      }
      var y = height - pad - (Math.max(0, Math.min(top, v)) / top) * (height - 2 * pad);
      current.push([pad + i * dx, y]);
    });
    if (current.length) out.push(current);
    return out;
  }

  function line(svg, points, style, width) {
    if (points.length === 1) points = [points[0], [points[0][0] + 1, points[0][1]]];
    el("polyline", {
      points: points.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join(" "),
      fill: "none", stroke: style.color, "stroke-width": width, "stroke-dasharray": style.dash,
      "stroke-linejoin": "round", "vector-effect": "non-scaling-stroke"
    }, svg);
  }

  function marker(svg, x, y, style, size) {
    var s = size, attrs = { fill: style.color, stroke: "#fff", "stroke-width": 1 };
    if (style.marker === "circle") { attrs.cx = x; attrs.cy = y; attrs.r = s; el("circle", attrs, svg); return; }
    if (style.marker === "square") { attrs.x = x - s; attrs.y = y - s; attrs.width = 2 * s; attrs.height = 2 * s; el("rect", attrs, svg); return; }
    var pts = style.marker === "triangle"
      ? [[x, y - s - 1], [x + s + 1, y + s], [x - s - 1, y + s]]
      : [[x, y - s - 1], [x + s + 1, y], [x, y + s + 1], [x - s - 1, y]];
    attrs.points = pts.map(function (p) { return p.join(","); }).join(" ");
    el("polygon", attrs, svg);
  }

  function lastPoint(segs) {
    var last = segs[segs.length - 1];
    return last ? last[last.length - 1] : null;
  }

  function drawChart(box) {
    var spec = JSON.parse(box.getAttribute("data-chart"));
    var unit = spec.unit === undefined ? "%" : spec.unit;
    var top = spec.max;
    if (top === undefined) top = 100;
    if (top === null) {
      var seen = [].concat.apply([], Object.keys(spec.series).map(function (n) { return spec.series[n]; }));
      top = niceMax(Math.max.apply(null, [0].concat(seen.filter(function (v) { return v !== null; }))));
      if (unit === "" && top < 2) top = 2; // counts: whole numbers on the grid
    }
    var W = 320, H = 120, PAD = 8;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, class: "chart-svg", "aria-hidden": "true", focusable: "false" });
    [0, top / 2, top].forEach(function (p) {
      var y = H - PAD - (p / top) * (H - 2 * PAD);
      el("line", { x1: PAD, x2: W - PAD, y1: y, y2: y, stroke: "#dfe3e8", "stroke-width": 1 }, svg);
      // the top label sits under its line, inside the drawing
      var t = el("text", { x: W - PAD, y: p === top ? y + 9 : y - 2, "text-anchor": "end", "font-size": 9, fill: "#6b7480" }, svg);
      t.textContent = fmt(p, unit);
    });
    var legend = document.createElement("ul");
    legend.className = "chart-legend";
    Object.keys(spec.series).forEach(function (name, i) {
      var style = STYLES[name] || STYLES[PALETTE[i % PALETTE.length]];
      var segs = segments(spec.series[name], W, H, PAD, top);
      segs.forEach(function (pts) { line(svg, pts, style, 2); });
      var end = lastPoint(segs);
      if (end) marker(svg, end[0], end[1], style, 3);
      var item = document.createElement("li");
      var key = el("svg", { viewBox: "0 0 30 10", width: 30, height: 10, "aria-hidden": "true" });
      el("line", { x1: 0, x2: 30, y1: 5, y2: 5, stroke: style.color, "stroke-width": 2, "stroke-dasharray": style.dash }, key);
      marker(key, 15, 5, style, 3);
      item.appendChild(key);
      var values = spec.series[name].filter(function (v) { return v !== null; });
      var now = values.length ? fmt(values[values.length - 1], unit) : "no data";
      item.appendChild(document.createTextNode(" " + (spec.labels[name] || name) + ": " + now));
      legend.appendChild(item);
    });
    box.textContent = "";
    box.appendChild(svg);
    box.appendChild(legend);
  }

  function drawSparkline(box) {
    var values = JSON.parse(box.getAttribute("data-sparkline"));
    var W = 80, H = 20, PAD = 2;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, class: "sparkline-svg", "aria-hidden": "true", focusable: "false" });
    el("line", { x1: PAD, x2: W - PAD, y1: H - PAD, y2: H - PAD, stroke: "#dfe3e8", "stroke-width": 1 }, svg);
    var style = { color: "#141a24", dash: "", marker: "circle" };
    var segs = segments(values, W, H, PAD);
    segs.forEach(function (pts) { line(svg, pts, style, 1.5); });
    var end = lastPoint(segs);
    if (end) marker(svg, end[0], end[1], style, 2);
    box.textContent = "";
    box.appendChild(svg);
  }

  function drawAll(root) {
    (root || document).querySelectorAll("[data-chart]:not([data-drawn])").forEach(function (box) {
      box.setAttribute("data-drawn", "1");
      drawChart(box);
    });
    (root || document).querySelectorAll("[data-sparkline]:not([data-drawn])").forEach(function (box) {
      box.setAttribute("data-drawn", "1");
      drawSparkline(box);
    });
  }

  window.CleverCharts = { drawAll: drawAll };
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:load", function (e) { drawAll(e.target && e.target.querySelectorAll ? e.target : document); });
})();
