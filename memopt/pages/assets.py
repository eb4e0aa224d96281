"""The memory page's style sheet and script, inlined into every page.

The script draws the page from its data (``<script id="memopt-data"
type="application/json">``, see :mod:`memopt.pages.model`) as SVG: per lane
a chart of each program's total live bytes on one x axis, then one chart
per program stacked by kind, each peak marked; hovering any chart shows the
op at that x and the largest holders there for every program; a sortable
table lists the largest holders at a program's peak; once a chart was
hovered, the arrow keys step its lane one op left or right.  It loads
nothing from the network.
"""

CSS = """
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 24px;
       color: #222; }
h1 { font-size: 19px; margin: 0 0 2px; }
h2 { font-size: 15px; margin: 18px 0 4px; }
.sub, .note { color: #555; }
.note { margin: 2px 0; }
.lane { border-top: 1px solid #ddd; margin-top: 12px; }
.wrap { display: flex; gap: 14px; align-items: flex-start; }
.charts { flex: 1 1 auto; min-width: 560px; }
.details { flex: 0 0 380px; position: sticky; top: 8px; border: 1px solid #ddd;
           border-radius: 4px; padding: 8px 10px; background: #fafafa; font-size: 12px;
           max-height: 92vh; overflow: auto; }
.details h3 { font-size: 13px; margin: 8px 0 2px; }
.details table { border-collapse: collapse; width: 100%; }
.details td { padding: 1px 4px; vertical-align: top; }
.details td.num, table.holders td.num { text-align: right; white-space: nowrap; }
.summary div { margin: 1px 0; }
.swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px;
          vertical-align: middle; }
svg { display: block; }
svg text { font-size: 11px; fill: #333; }
.axis line, .axis path { stroke: #999; }
.cross { stroke: #000; stroke-width: 1; stroke-dasharray: 3 3; pointer-events: none; }
.peak-marker { stroke: #fff; stroke-width: 1; }
.table-box { max-height: 360px; overflow: auto; margin: 6px 0 20px; border: 1px solid #eee; }
table.holders { border-collapse: collapse; font-size: 12px; }
table.holders thead th { position: sticky; top: 0; }
table.holders th { cursor: pointer; background: #eee; text-align: left; padding: 3px 6px;
                   user-select: none; }
table.holders th.sorted-asc::after { content: " \\25B2"; }
table.holders th.sorted-desc::after { content: " \\25BC"; }
table.holders td { border-top: 1px solid #eee; padding: 2px 6px; vertical-align: top; }
.added { color: #a14; }
"""

JS = r"""
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = {"parameters": "#8c8c8c", "optimizer state": "#c7a76c", "inputs": "#9edae5",
    "activations": "#1f77b4", "gradients": "#d62728", "optimizer update": "#ff9896",
    "workspaces": "#2ca02c"};
  var LINE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b"];
  var data = JSON.parse(document.getElementById("memopt-data").textContent);

  function fmt(n) {
    var sign = n < 0 ? "-" : ""; n = Math.abs(n);
    var units = ["B", "KiB", "MiB", "GiB"];
    for (var k = 0; k < units.length; k++) {
      if (n < 1024) { return k === 0 ? sign + Math.round(n) + " B" : sign + n.toFixed(1) + " " + units[k]; }
      n /= 1024;
    }
    return sign + n.toFixed(1) + " TiB";
  }
  function el(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function sv(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function totals(s) {
    var n = s.stack[0].length, out = new Array(n);
    for (var i = 0; i < n; i++) {
      var t = 0;
      for (var k = 0; k < s.stack.length; k++) { t += s.stack[k][i]; }
      out[i] = t;
    }
    return out;
  }
  function opText(lane, x) {
    var op = lane.ops[x];
    return op[0] + " at " + op[1] + (op[2] ? " (" + op[2] + ")" : "");
  }
  function peakLabel(s) {
    return s.label + ": peak " + fmt(s.peak) + " at x " + s.peak_x + " (" + s.peak_op +
      "), + " + fmt(s.persistable) + " persistable";
  }

  // a tick step of 1, 2, 2.5 or 5 times a power of ten in the unit fmt picks
  function niceStep(ymax) {
    var unit = 1;
    while (ymax / unit >= 1024 && unit < Math.pow(1024, 4)) { unit *= 1024; }
    var raw = ymax / unit / 4, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var m = [1, 2, 2.5, 5, 10].find(function (f) { return f * p >= raw; });
    return m * p * unit || 1;
  }

  // -- a chart: an SVG with an x axis shared by the lane --------------------------
  var W = 900, PAD_L = 64, PAD_R = 12, PAD_T = 14, PAD_B = 26;
  function chart(parent, lane, height, ymax, title) {
    var box = el("div", {"class": "chart"}, parent);
    el("div", {"class": "sub"}, box, title);
    var svg = sv("svg", {"viewBox": "0 0 " + W + " " + height, "width": "100%",
      "preserveAspectRatio": "none", "style": "max-width:" + W + "px;height:" + height + "px"}, box);
    var x0 = lane.first, x1 = Math.max(lane.ops.length, x0 + 1);
    var c = {svg: svg, h: height, x0: x0, x1: x1, ymax: ymax || 1,
      sx: function (x) { return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R); },
      sy: function (y) { return height - PAD_B - y / (ymax || 1) * (height - PAD_T - PAD_B); }};
    var axis = sv("g", {"class": "axis"}, svg);
    var step = niceStep(c.ymax);
    for (var y = 0; y <= c.ymax; y += step) {
      sv("line", {x1: PAD_L, x2: W - PAD_R, y1: c.sy(y), y2: c.sy(y), stroke: "#eee"}, axis);
      var t = sv("text", {x: PAD_L - 4, y: c.sy(y) + 4, "text-anchor": "end"}, axis);
      t.textContent = fmt(y);
    }
    var ticks = 8;
    for (var k = 0; k <= ticks; k++) {
      var xv = Math.round(x0 + (x1 - 1 - x0) * k / ticks);
      var t = sv("text", {x: c.sx(xv + 0.5), y: height - 8, "text-anchor": "middle"}, axis);
      t.textContent = xv;
    }
    c.cross = sv("line", {"class": "cross", x1: 0, x2: 0, y1: PAD_T, y2: height - PAD_B,
      visibility: "hidden"}, svg);
    return c;
  }
  function stepPath(c, lower, upper) {
    var pts = [], x0 = c.x0, x1 = c.x1, i;
    for (i = x0; i < x1; i++) { pts.push(c.sx(i) + "," + c.sy(upper[i])); pts.push(c.sx(i + 1) + "," + c.sy(upper[i])); }
    for (i = x1 - 1; i >= x0; i--) { pts.push(c.sx(i + 1) + "," + c.sy(lower[i])); pts.push(c.sx(i) + "," + c.sy(lower[i])); }
    return "M" + pts.join("L") + "Z";
  }
  function stepLine(c, ys) {
    var pts = [];
    for (var i = c.x0; i < c.x1; i++) { pts.push(c.sx(i) + "," + c.sy(ys[i])); pts.push(c.sx(i + 1) + "," + c.sy(ys[i])); }
    return "M" + pts.join("L");
  }
  function marker(c, x, y, color, id, label) {
    var px = c.sx(x + 0.5), py = c.sy(y);
    var m = sv("path", {"class": "peak-marker", id: id, fill: color, "data-x": x,
      d: "M" + (px - 6) + "," + (py - 11) + "L" + (px + 6) + "," + (py - 11) + "L" + px + "," + py + "Z"}, c.svg);
    var tip = sv("title", {}, m); tip.textContent = label;
    return m;
  }

  // -- the details panel -----------------------------------------------------------
  function details(panel, lane, x) {
    panel.textContent = "";
    el("div", {"class": "x"}, panel, "x " + x + " (run position of " + lane.series[0].label + ")");
    el("div", {"class": "op"}, panel, "op: " + opText(lane, x));
    lane.series.forEach(function (s) {
      var total = 0, rows = [];
      for (var k = 0; k < s.stack.length; k++) { total += s.stack[k][x]; }
      el("h3", {}, panel, s.label + ": " + fmt(total) + (x === s.peak_x ? "  (its peak)" : ""));
      if (s.ops_here[x]) { el("div", {"class": "added"}, panel, "runs here: " + s.ops_here[x]); }
      (s.added[x] || []).forEach(function (t) { el("div", {"class": "added"}, panel, t); });
      var parts = [];
      data.kinds.forEach(function (kind, k) { if (s.stack[k][x]) { parts.push(kind + " " + fmt(s.stack[k][x])); } });
      el("div", {"class": "sub"}, panel, parts.join(", "));
      var t = el("table", {}, panel);
      s.top[x].forEach(function (i) {
        var h = s.holders[i], tr = el("tr", {}, t);
        el("td", {}, tr, h[0] + (h[7].length ? " (shared with " + h[7].length + ")" : ""));
        el("td", {"class": "num"}, tr, fmt(h[1]));
        var tr2 = el("tr", {}, t);
        el("td", {"class": "sub", colspan: 2}, tr2, h[2] + "; made by " + h[3] + "; last read by " + h[4]);
      });
    });
  }

  // -- the sortable table of holders at a peak -------------------------------------
  function holderTable(parent, s) {
    var cols = [["name", 0], ["size", 1], ["kind", 2], ["made by", 3], ["last read by", 4],
      ["from x", 5], ["to x", 6], ["shares memory with", 7]];
    var rows = s.at_peak.map(function (i) { return s.holders[i]; });
    var t = el("table", {"class": "holders"}, parent);
    var head = el("tr", {}, el("thead", {}, t)), body = el("tbody", {}, t);
    var state = {col: 1, dir: -1};
    function fill() {
      rows.sort(function (a, b) {
        var u = a[state.col], v = b[state.col];
        if (state.col === 7) { u = u.length; v = v.length; }
        return (u < v ? -1 : u > v ? 1 : 0) * state.dir;
      });
      body.textContent = "";
      rows.forEach(function (h) {
        var tr = el("tr", {}, body);
        el("td", {}, tr, h[0]); el("td", {"class": "num"}, tr, fmt(h[1]));
        el("td", {}, tr, h[2]); el("td", {}, tr, h[3]); el("td", {}, tr, h[4]);
        el("td", {"class": "num"}, tr, h[5]); el("td", {"class": "num"}, tr, h[6]);
        el("td", {}, tr, h[7].join(", "));
      });
      Array.prototype.forEach.call(head.children, function (th, k) {
        th.className = k === state.col ? (state.dir > 0 ? "sorted-asc" : "sorted-desc") : "";
      });
    }
    cols.forEach(function (col) {
      var th = el("th", {}, head, col[0]);
      th.addEventListener("click", function () {
        state.dir = state.col === col[1] ? -state.dir : (col[1] === 1 ? -1 : 1);
        state.col = col[1]; fill();
      });
    });
    fill();
    return t;
  }

  // -- a lane: one program (or one rank) ---------------------------------------------
  function drawLane(root, lane, li) {
    var div = el("div", {"class": "lane", id: "lane-" + li}, root);
    if (lane.title) { el("h2", {}, div, lane.title); }
    var sum = el("div", {"class": "summary"}, div);
    lane.series.forEach(function (s, k) {
      var d = el("div", {"class": "peak-label", id: "peak-label-" + li + "-" + k}, sum);
      var sw = el("span", {"class": "swatch"}, d); sw.style.background = LINE[k % LINE.length];
      d.appendChild(document.createTextNode(peakLabel(s) +
        (s.reused ? "; " + s.reused + " buffers shared by several values" : "")));
    });
    var legend = el("div", {"class": "sub"}, div, "kinds:");
    data.kinds.forEach(function (kind) {
      var sw = el("span", {"class": "swatch"}, legend); sw.style.background = COLORS[kind];
      legend.appendChild(document.createTextNode(kind));
    });
    var wrap = el("div", {"class": "wrap"}, div);
    var charts = el("div", {"class": "charts"}, wrap);
    var panel = el("div", {"class": "details", id: "details-" + li}, wrap,
      "hover a chart: the op there and the largest holders");
    var tots = lane.series.map(totals);
    var ymax = Math.max.apply(null, tots.map(function (t) { return Math.max.apply(null, t.slice(lane.first).concat([0])); })) * 1.08;
    var all = [];
    var top = chart(charts, lane, 230, ymax, "total live bytes (persistable included) over the op sequence; x: run positions of " + lane.series[0].label);
    all.push(top);
    tots.forEach(function (t, k) {
      var color = LINE[k % LINE.length];
      if (k === 0) {
        var zeros = t.map(function () { return 0; });
        sv("path", {d: stepPath(top, zeros, t), fill: color, "fill-opacity": 0.15, stroke: "none"}, top.svg);
      }
      sv("path", {d: stepLine(top, t), fill: "none", stroke: color, "stroke-width": 1.5,
        "stroke-dasharray": k === 0 ? "" : "5 3"}, top.svg);
      var s = lane.series[k];
      marker(top, s.peak_x, t[s.peak_x], color, "peak-" + li + "-" + k, peakLabel(s));
      Object.keys(s.added).forEach(function (x) {
        sv("rect", {x: top.sx(+x), y: top.h - PAD_B, width: Math.max(1, top.sx(+x + 1) - top.sx(+x)),
          height: 4, fill: color}, top.svg);
      });
    });
    lane.series.forEach(function (s, k) {
      var c = chart(charts, lane, 190, ymax, s.label + ": live bytes by kind");
      all.push(c);
      var lower = s.stack[0].map(function () { return 0; });
      s.stack.forEach(function (values, kk) {
        var upper = values.map(function (v, i) { return lower[i] + v; });
        if (Math.max.apply(null, values) > 0) {
          sv("path", {d: stepPath(c, lower, upper), fill: COLORS[data.kinds[kk]], stroke: "none",
            "fill-opacity": 0.85}, c.svg);
        }
        lower = upper;
      });
      marker(c, s.peak_x, lower[s.peak_x], LINE[k % LINE.length], "peak-" + li + "-" + k + "-stack", peakLabel(s));
    });
    var state = {x: null, x0: top.x0, x1: top.x1};
    state.show = function (x) {
      x = Math.max(state.x0, Math.min(state.x1 - 1, x));
      state.x = x;
      all.forEach(function (o) {
        var sx = o.sx(x + 0.5);
        o.cross.setAttribute("x1", sx); o.cross.setAttribute("x2", sx);
        o.cross.setAttribute("visibility", "visible");
      });
      details(panel, lane, x);
    };
    function hover(evt) {
      var c = this.memoptChart, r = c.svg.getBoundingClientRect();
      var px = (evt.clientX - r.left) / r.width * W;
      active = state;
      state.show(Math.floor(c.x0 + (px - PAD_L) / (W - PAD_L - PAD_R) * (c.x1 - c.x0)));
    }
    all.forEach(function (c) { c.svg.memoptChart = c; c.svg.addEventListener("mousemove", hover); });
    var pick = el("div", {}, div);
    el("h2", {}, pick, "largest holders at the peak");
    var sel = el("select", {id: "table-series-" + li}, pick);
    lane.series.forEach(function (s, k) { el("option", {value: k}, sel, s.label + " (peak " + fmt(s.peak) + ")"); });
    sel.value = lane.series.length - 1;
    var holder = el("div", {"class": "table-box"}, pick);
    function show() { holder.textContent = ""; holderTable(holder, lane.series[+sel.value]); }
    sel.addEventListener("change", show);
    show();
  }

  // the arrow keys step the last hovered lane one op left or right
  var active = null;
  document.addEventListener("keydown", function (evt) {
    if (!active || active.x === null) { return; }
    if (evt.key === "ArrowLeft" || evt.key === "ArrowRight") {
      active.show(active.x + (evt.key === "ArrowLeft" ? -1 : 1));
      evt.preventDefault();
    }
  });

  var root = document.getElementById("memopt-page");
  el("h1", {}, root, data.title);
  if (data.subtitle) { el("div", {"class": "sub"}, root, data.subtitle); }
  data.notes.forEach(function (n) { el("div", {"class": "note"}, root, n); });
  data.lanes.forEach(function (lane, li) { drawLane(root, lane, li); });
  window.memoptReadyAt = performance.now();  // (benchmarks read the load time here)
  document.body.setAttribute("data-ready", "1");
})();
"""
