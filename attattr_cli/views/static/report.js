/* attattr report: provenance, a paged, sortable, filterable table of examples, each example's
   view in an overlay (inline JSON, or examples/NNNNNNNN.js beside a folder report's index.html),
   and the head importance heatmaps. Plain JavaScript, no external assets; only one page of rows
   is in the DOM at a time. */
(function (root) {
  "use strict";
  var PAGE = 50;
  var pending = {};

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function pad(i) { var s = String(i); while (s.length < 8) s = "0" + s; return s; }

  function start(host, data) {
    var state = { sort: 0, dir: 1, page: 0, filter: "", flag: "", rows: data.rows };
    host.innerHTML = "";  /* the still table the page carries for readers without scripts */
    host.appendChild(el("h1", null, "attattr report: " + data.title));
    var summary = el("div", "aa-meta");
    var f = data.flagged || {};
    summary.textContent = data.rows.length + " examples · family " + data.family + " · flagged: " + (f.wrong || 0) +
      " wrong, " + (f.residual || 0) + " with a |residual| above " + (100 * data.residual_flag) + "% of the largest |f(x) − f(baseline)| (and 1% of f(x)), " +
      (f.truncated || 0) + " truncated, " + (f.unconverged || 0) + " with a layer whose integral is not converged";
    host.appendChild(summary);
    var g = data.generations;
    if (g) host.appendChild(el("div", "aa-meta", g.examples + " generations scored step by step, " + g.steps +
      " steps in all; target per step: " + g.target + " given everything before it; max |step residual|: the largest of a step and layer"));

    var prov = el("details"); prov.appendChild(el("summary", null, "provenance"));
    var pt = el("table", "aa-prov");
    Object.keys(data.provenance).forEach(function (k) {
      var tr = el("tr"); tr.appendChild(el("td", null, k)); tr.appendChild(el("td", null, data.provenance[k])); pt.appendChild(tr);
    });
    prov.appendChild(pt); host.appendChild(prov);
    if (data.importance) host.appendChild(importance(data.importance));

    var bar = el("div", "aa-bar-row");
    var search = el("input"); search.type = "search"; search.placeholder = "filter: text, label, index"; search.className = "aa-filter";
    var flag = el("select", "aa-flag-filter");
    [["", "all examples"], ["wrong", "wrong predictions"], ["residual", "large residual"], ["truncated", "truncated"], ["unconverged", "not converged"]].filter(function (o) {
      return !(g && o[0] === "wrong");  /* a generation has no wrong prediction */
    }).forEach(function (o) {
      var op = el("option", null, o[1]); op.value = o[0]; flag.appendChild(op);
    });
    var prev = el("button", "aa-prev", "‹ previous"), next = el("button", "aa-next", "next ›");
    var where = el("span", "aa-where");
    [search, flag, prev, next, where].forEach(function (x) { bar.appendChild(x); });
    host.appendChild(bar);

    var table = el("table", "aa-rows"), thead = el("thead"), htr = el("tr"), tbody = el("tbody");
    data.columns.forEach(function (c, i) {
      var th = el("th", null, c);
      th.setAttribute("data-col", i);
      th.onclick = function () { if (state.sort === i) state.dir = -state.dir; else { state.sort = i; state.dir = 1; } state.page = 0; update(); };
      htr.appendChild(th);
    });
    thead.appendChild(htr); table.appendChild(thead); table.appendChild(tbody); host.appendChild(table);

    var overlay = el("div", "aa-overlay"), panel = el("div", "aa-panel"), close = el("button", "aa-close", "close ✕");
    var target = el("div");
    panel.appendChild(close); panel.appendChild(target); overlay.appendChild(panel); document.body.appendChild(overlay);
    close.onclick = function () { overlay.style.display = "none"; };
    overlay.onclick = function (ev) { if (ev.target === overlay) overlay.style.display = "none"; };
    document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") overlay.style.display = "none"; });

    var timer = null;
    search.oninput = function () { clearTimeout(timer); timer = setTimeout(function () { state.filter = search.value.toLowerCase(); state.page = 0; update(); }, 120); };
    flag.onchange = function () { state.flag = flag.value; state.page = 0; update(); };
    prev.onclick = function () { if (state.page > 0) { state.page--; draw(); } };
    next.onclick = function () { if ((state.page + 1) * PAGE < state.rows.length) { state.page++; draw(); } };

    var FLAGS = data.columns.indexOf("flags");
    var TEXTS = ["index", "text", "gold", "prediction", "prompt", "generated", "foil"].map(function (c) {
      return data.columns.indexOf(c); }).filter(function (i) { return i >= 0; });
    function cell(c, v) {  /* a cell's text by its column (still.py's report_cell writes the same) */
      if (v === null || v === undefined) return "";
      if (c === "probability") return v.toFixed(3);
      if (c.indexOf("max |") === 0) return AttattrView.fmt(v);
      return String(v);
    }
    function cmp(a, b) {
      var x = a[state.sort], y = b[state.sort];
      if (Array.isArray(x)) { x = x.length; y = y.length; }
      if (x === y) return a[0] - b[0];
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * state.dir;
    }
    function update() {
      var q = state.filter, fl = state.flag;
      state.rows = data.rows.filter(function (r) {
        if (fl && r[FLAGS].indexOf(fl) < 0) return false;
        if (!q) return true;
        return TEXTS.map(function (i) { return r[i] === null ? "" : String(r[i]); }).join(" ").toLowerCase().indexOf(q) >= 0;
      });
      state.rows.sort(cmp);
      draw();
    }
    function draw() {
      tbody.innerHTML = "";
      var lo = state.page * PAGE, hi = Math.min(state.rows.length, lo + PAGE);
      for (var k = lo; k < hi; k++) {
        var r = state.rows[k], tr = el("tr", "aa-row");
        tr.setAttribute("data-index", r[0]);
        data.columns.forEach(function (c, i) {
          if (c === "flags") {
            var fc = el("td");
            r[i].forEach(function (x) { fc.appendChild(el("span", "aa-flag", x)); });
            tr.appendChild(fc);
          } else if (c === "text" || c === "prompt" || c === "generated") {
            var t = el("td", "aa-text", cell(c, r[i])); t.title = cell(c, r[i]); tr.appendChild(t);
          } else {
            tr.appendChild(el("td", null, cell(c, r[i])));
          }
        });
        tr.onclick = (function (i) { return function () { open(i); }; })(r[0]);
        tbody.appendChild(tr);
      }
      where.textContent = state.rows.length ? "rows " + (lo + 1) + "–" + hi + " of " + state.rows.length +
        (state.rows.length !== data.rows.length ? " (of " + data.rows.length + ")" : "") : "no example matches";
      htr.querySelectorAll("th").forEach(function (th, i) {
        th.textContent = data.columns[i] + (i === state.sort ? (state.dir > 0 ? " ▲" : " ▼") : "");
      });
    }
    function open(i) {
      overlay.style.display = "block";
      target.textContent = "loading example " + i + " …";
      if (data.mode === "inline") {
        show(i, JSON.parse(document.getElementById("aa-ex-" + i).textContent));
        return;
      }
      pending[i] = show;
      var s = document.createElement("script");
      s.src = "examples/" + pad(i) + ".js";
      s.onerror = function () { target.textContent = "examples/" + pad(i) + ".js is missing beside this page"; };
      document.head.appendChild(s);
      s.onload = function () { s.parentNode.removeChild(s); };
    }
    function show(i, d) {
      /* a generation comes as its still HTML (views/steps.py step_still, escaped by Python): the
         step x source matrix with a value on every cell's hover, the steps, each step's strongest
         interactions a click away */
      if (d.steps_html !== undefined) target.innerHTML = d.steps_html; else AttattrView.render(target, d);
      target.setAttribute("data-shown", i);
    }
    update();
    root.AttattrReport.open = open;
  }

  function importance(imp) {
    var box = el("details"); box.open = true;
    box.appendChild(el("summary", null, "head importance (" + imp.file + "; rows layers, columns heads; darker = more important)"));
    var wrap = el("div", "aa-bar-row");
    imp.tables.forEach(function (t) {
      var fig = el("div"), top = 0, bottom = Infinity;
      t.values.forEach(function (r) { r.forEach(function (v) { top = Math.max(top, v); bottom = Math.min(bottom, v); }); });
      fig.appendChild(el("div", "aa-meta", t.name));
      var tb = el("table", "aa-imp"); tb.style.borderCollapse = "collapse";
      var hr = el("tr"); hr.appendChild(el("td"));
      t.values[0].forEach(function (_, h) { var c = el("td", null, h); c.style.fontSize = "10px"; c.style.textAlign = "center"; hr.appendChild(c); });
      tb.appendChild(hr);
      t.values.forEach(function (r, l) {
        var tr = el("tr"), lab = el("td", null, l); lab.style.fontSize = "10px"; tr.appendChild(lab);
        r.forEach(function (v, h) {
          var c = el("td"), f = top > bottom ? (v - bottom) / (top - bottom) : 0;
          c.style.width = c.style.height = "18px";
          c.style.background = "rgb(" + Math.round(255 - 222 * f) + "," + Math.round(255 - 160 * f) + "," + Math.round(255 - 80 * f) + ")";
          c.title = t.name + ": layer " + l + ", head " + h + ": " + AttattrView.fmt(v);
          tr.appendChild(c);
        });
        tb.appendChild(tr);
      });
      fig.appendChild(tb);
      fig.title = t.description;
      wrap.appendChild(fig);
    });
    box.appendChild(wrap);
    return box;
  }

  root.AttattrReport = {
    start: start,
    example: function (i, d) { var f = pending[i]; delete pending[i]; if (f) f(i, d); }
  };
})(window);
