/* attattr views: the interactive view of one example. Plain JavaScript, no external assets.
   AttattrView.render(element, data) draws into element; data is what attattr's views module
   writes (tokens, maps [layer][head][query][key] for "attr" and "attention", packed as float16 in base64 by views/still.py, the causal mask,
   token importance, top-k rows, header, notes). */
(function (root) {
  "use strict";
  var ATTR_NEG = [33, 102, 172], ATTR_POS = [178, 24, 43], ATT_HI = [34, 34, 34];
  var KIND = { attr: "attribution", attention: "attention" };

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function mix(c, f) {  /* white -> c by f in [0, 1] */
    f = Math.max(0, Math.min(1, f));
    return "rgb(" + Math.round(255 + (c[0] - 255) * f) + "," + Math.round(255 + (c[1] - 255) * f) + "," +
      Math.round(255 + (c[2] - 255) * f) + ")";
  }
  function colour(kind, v, top) {
    if (!(top > 0)) return "#fff";
    if (kind === "attr") return v >= 0 ? mix(ATTR_POS, v / top) : mix(ATTR_NEG, -v / top);
    return mix(ATT_HI, v / top);
  }
  function fmt(v, signed) {  /* the one number format of every view: views/data.py format_number */
    if (v === null || v === undefined || !isFinite(v)) return "n/a";
    var a = Math.abs(v), s;
    if (a === 0) s = "0";
    else if (a < 1e-3 || a >= 1e4) {
      var parts = v.toExponential(2).split("e");
      s = parts[0].replace(/\.?0+$/, "") + "e" + parseInt(parts[1], 10);
    } else s = v.toFixed(Math.max(0, 2 - Math.floor(Math.log10(a) + 1e-12))).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
    return (signed && v > 0 ? "+" : "") + s;
  }
  function scaleOf(data, kind, head) {  /* shared across layers: the head sum, or every single head */
    var m = data.maps[kind], top = 0, single = data.heads[head] !== "sum";
    for (var l = 0; l < m.length; l++) for (var h = 0; h < m[l].length; h++) {
      if ((data.heads[h] !== "sum") !== single) continue;
      var rows = m[l][h];
      for (var i = 0; i < rows.length; i++) for (var j = 0; j < rows[i].length; j++) {
        if (data.masked && data.masked[i][j]) continue;
        var a = Math.abs(rows[i][j]);
        if (a > top) top = a;
      }
    }
    return top || 1;
  }

  function half(u) {  /* an IEEE float16 (little-endian uint16) as a number; NaN and infinities as null */
    var e = (u >> 10) & 31, f = u & 1023, v;
    if (e === 31) return null;
    v = e === 0 ? f * Math.pow(2, -24) : (1 + f / 1024) * Math.pow(2, e - 15);
    return u & 0x8000 ? -v : v;
  }
  function unpack(m) {  /* a map packed by views/still.py pack(): {f16: base64, exp, shape} -> nested arrays */
    if (!m || Array.isArray(m)) return m;
    var bin = atob(m.f16), s = Math.pow(2, -m.exp), k = 0;
    function build(d) {
      var out = new Array(m.shape[d]);
      for (var i = 0; i < out.length; i++) {
        if (d < m.shape.length - 1) { out[i] = build(d + 1); continue; }
        var v = half(bin.charCodeAt(2 * k) | (bin.charCodeAt(2 * k + 1) << 8));
        out[i] = v === null ? null : v * s;
        k++;
      }
      return out;
    }
    return build(0);
  }

  function render(host, data) {
    host.innerHTML = "";  /* the still picture the page carries for readers without scripts */
    if (data.maps) for (var mk in data.maps) data.maps[mk] = unpack(data.maps[mk]);
    var view = el("div", "aa-view");
    host.appendChild(view);
    var kinds = ["attr", "attention"].filter(function (k) { return data.maps && data.maps[k]; });
    var init = data.initial || {};
    var state = { layer: init.layer || 0, head: init.head || 0, token: null, side: "both",
      kind: init.kind === "both" && kinds.length > 1 ? "both" : (kinds.indexOf(init.kind) >= 0 ? init.kind : kinds[0]) };
    var h = data.header;

    var title = "example " + h.index + (data.family !== "self" ? " · family " + data.family : "");
    view.appendChild(el("h2", null, title));
    var text = el("div", "aa-meta");
    text.appendChild(el("b", null, "text: "));
    text.appendChild(document.createTextNode(h.text_a + (h.text_b !== null && h.text_b !== undefined ? "  ‖  " + h.text_b : "")));
    view.appendChild(text);
    var pred = el("div", "aa-meta");
    pred.textContent = h.summary;  /* prediction, target, foil, what was attributed (views/data.py header_of) */
    if (h.correct === false) pred.appendChild(el("span", "aa-wrong", "  wrong"));
    if (h.truncated) pred.appendChild(el("span", "aa-wrong", "  truncated"));
    view.appendChild(pred);
    var res = [];
    for (var l in h.residual) res.push("L" + l + " " + fmt(h.residual[l], true));
    var resLine = el("div", "aa-meta", "completeness residual per layer: " + res.join(", "));
    var bad = [];
    for (var u in (h.unconverged || {})) bad.push("L" + u + " (" + h.unconverged[u] + ")");
    if (bad.length) resLine.appendChild(el("span", "aa-wrong aa-unconverged", "  not converged: " + bad.join(", ")));
    view.appendChild(resLine);
    var notes = el("ul", "aa-notes");
    (data.notes || []).forEach(function (n) { notes.appendChild(el("li", null, n)); });
    view.appendChild(notes);

    var tip = el("div", "aa-tip");
    view.appendChild(tip);
    var panels = [], reads = null, buttons = {};
    var label = function (tokens, idx, i) { return data.mode === "window" ? tokens[i] + " " + idx[i] : tokens[i]; };

    function makePanel() {  /* one heatmap: legend, key labels on top, query labels on the left */
      var nq = data.query_tokens.length, nk = data.key_tokens.length;
      var cell = Math.max(9, Math.min(22, Math.floor(420 / Math.max(nk, 1))));
      var box = el("div", "aa-map"), legend = el("div", "aa-legend"), grid = el("div", "aa-grid"), cells = [];
      box.style.setProperty("--aa-cell", cell + "px");
      grid.style.gridTemplateColumns = "max-content repeat(" + nk + ", " + cell + "px)";
      grid.appendChild(el("div"));
      // a token on an axis: its label, the click that shows what it reads from (q) or who reads it (k)
      function axisLabel(side, i) {
        var q = side === "q", tokens = q ? data.query_tokens : data.key_tokens, idx = q ? data.q_idx : data.k_idx;
        var a = el("div", q ? "aa-row-label" : "aa-col-label", label(tokens, idx, i));
        a.setAttribute("data-pos", idx[i]);
        var pieces = q ? data.query_pieces : data.key_pieces;
        a.title = (q ? "query " : "key ") + tokens[i] + " (" + idx[i] + (pieces && pieces[i] !== tokens[i] ? ", piece " + pieces[i] : "") + "): click to see " +
          (q ? "what it reads from" : "who reads it");
        a.setAttribute("data-side", side);
        a.onclick = function () { pick(idx[i], false, side); };
        grid.appendChild(a);
      }
      for (var j = 0; j < nk; j++) axisLabel("k", j);
      for (var i = 0; i < nq; i++) {
        axisLabel("q", i);
        cells.push([]);
        for (var j2 = 0; j2 < nk; j2++) {
          var d = el("div", "aa-cell");
          d.setAttribute("data-q", i); d.setAttribute("data-k", j2);
          if (data.masked && data.masked[i][j2]) d.className += " aa-masked";
          cells[i].push(d); grid.appendChild(d);
        }
      }
      var panel = { box: box, legend: legend, grid: grid, cells: cells, kind: null };
      grid.addEventListener("mousemove", function (ev) {
        var t = ev.target;
        if (!t.classList || !t.classList.contains("aa-cell")) { tip.style.display = "none"; return; }
        var qi = +t.getAttribute("data-q"), kj = +t.getAttribute("data-k");
        var masked = data.masked && data.masked[qi][kj];
        var v = data.maps[panel.kind][state.layer][state.head][qi][kj];
        tip.textContent = data.query_tokens[qi] + " (" + data.q_idx[qi] + ") → " + data.key_tokens[kj] + " (" + data.k_idx[kj] + "): " +
          (masked ? "masked (causal)" : KIND[panel.kind] + " " + fmt(v));
        tip.style.display = "block";
        tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
      });
      grid.addEventListener("mouseleave", function () { tip.style.display = "none"; });
      box.appendChild(legend); box.appendChild(grid);
      return panel;
    }

    if (kinds.length) {
      var controls = el("div", "aa-controls");
      var lsel = el("select", "aa-layer");
      data.layers.forEach(function (layer, i) { var o = el("option", null, "layer " + layer); o.value = i; lsel.appendChild(o); });
      lsel.value = state.layer;
      var hsel = el("select", "aa-head");
      data.heads.forEach(function (hd, i) { var o = el("option", null, hd === "sum" ? "all heads (sum / mean)" : "head " + hd); o.value = i; hsel.appendChild(o); });
      hsel.value = state.head;
      var lab = el("label", null, "layer "); lab.appendChild(lsel); controls.appendChild(lab);
      lab = el("label", null, "head "); lab.appendChild(hsel); controls.appendChild(lab);
      var choices = kinds.length > 1 ? ["both"].concat(kinds) : kinds;
      choices.forEach(function (k) {
        var b = el("button", "aa-kind", k === "both" ? "side by side" : KIND[k]);
        b.type = "button";
        b.setAttribute("data-kind", k);
        b.onclick = function () { state.kind = k; draw(); };
        buttons[k] = b;
        controls.appendChild(b);
      });
      lsel.onchange = function () { state.layer = +lsel.value; draw(); };
      hsel.onchange = function () { state.head = +hsel.value; draw(); };
      view.appendChild(controls);
      var row = el("div", "aa-controls");
      row.style.alignItems = "flex-start";
      kinds.forEach(function () { var p = makePanel(); panels.push(p); row.appendChild(p.box); });
      view.appendChild(row);
      reads = el("div", "aa-reads", "Click a token (an axis label or a token below) to see what it reads from and who reads it.");
      view.appendChild(reads);
    }

    var imp = data.importance;
    if (imp && imp.tokens && imp.tokens.length) {
      view.appendChild(el("div", "aa-meta", "token importance: " + imp.description + " (green +, red −)"));
      view.appendChild(highlight(imp.tokens, imp.values, function (p) { pick(p, false, "k"); }));
    }
    if (data.topk && data.topk.length) {
      view.appendChild(el("div", "aa-meta", "top interactions (by |value|)"));
      var tb = el("table", "aa-topk"), tr = el("tr");
      ["layer", "head", "query → key", "value"].forEach(function (s) { tr.appendChild(el("th", null, s)); });
      tb.appendChild(tr);
      data.topk.forEach(function (t) {
        var row = el("tr");
        row.appendChild(el("td", null, t.layer)); row.appendChild(el("td", null, t.head));
        row.appendChild(el("td", null, t.query_token + " (" + t.query + ") → " + t.key_token + " (" + t.key + ")"));
        row.appendChild(el("td", "aa-num", fmt(t.value)));
        tb.appendChild(row);
      });
      view.appendChild(tb);
    }

    function shown() { return state.kind === "both" ? kinds : [state.kind]; }
    function draw() {
      if (!panels.length) return;
      var ks = shown();
      panels.forEach(function (p, n) {
        var kind = ks[n];
        p.box.style.display = kind ? "" : "none";
        p.kind = kind || null;
        if (!kind) return;
        var m = data.maps[kind][state.layer][state.head], top = scaleOf(data, kind, state.head);
        for (var i = 0; i < p.cells.length; i++) for (var j = 0; j < p.cells[i].length; j++) {
          if (data.masked && data.masked[i][j]) continue;
          p.cells[i][j].style.background = colour(kind, m[i][j], top);
          p.cells[i][j].setAttribute("data-v", m[i][j]);
        }
        p.grid.setAttribute("data-kind", kind);
        p.legend.innerHTML = "";
        var bar = el("span", "aa-bar");
        bar.style.background = kind === "attr" ?
          "linear-gradient(to right," + mix(ATTR_NEG, 1) + ",#fff," + mix(ATTR_POS, 1) + ")" :
          "linear-gradient(to right,#fff," + mix(ATT_HI, 1) + ")";
        p.legend.appendChild(el("span", null, kind === "attr" ? "−" + fmt(top) : "0"));
        p.legend.appendChild(bar);
        p.legend.appendChild(el("span", null, fmt(top) + "  " + KIND[kind] + ", layer " + data.layers[state.layer] + ", " +
          (data.heads[state.head] === "sum" ? (kind === "attr" ? "sum of heads" : "mean of heads") : "head " + data.heads[state.head]) +
          "; scale shared by every layer" + (data.masked ? "; hatched: masked (causal)" : "")));
      });
      for (var k in buttons) buttons[k].className = "aa-kind" + (k === state.kind ? " aa-on" : "");
      if (state.token !== null) pick(state.token, true, state.side);
    }

    function pick(pos, keep, side) {
      side = data.same_axis === false ? (side || "k") : "both";
      if (!keep && state.token === pos && state.side === side) pos = null;
      state.token = pos; state.side = side;
      view.querySelectorAll(".aa-label-on").forEach(function (e) { e.classList.remove("aa-label-on"); });
      view.querySelectorAll(".aa-sel-row,.aa-sel-col").forEach(function (e) { e.classList.remove("aa-sel-row", "aa-sel-col"); });
      if (pos === null) { if (reads) reads.textContent = ""; return; }
      view.querySelectorAll('[data-pos="' + pos + '"]').forEach(function (e) {
        if (side === "both" || e.getAttribute("data-side") === side) e.classList.add("aa-label-on");
      });
      if (!panels.length) return;
      var qi = side === "k" ? -1 : data.q_idx.indexOf(pos), kj = side === "q" ? -1 : data.k_idx.indexOf(pos), kind = shown()[0];
      var m = data.maps[kind][state.layer][state.head];
      var tok = (qi >= 0 ? data.query_tokens[qi] : kj >= 0 ? data.key_tokens[kj] : "") + " (" + pos + ")";
      var say = [];
      panels.forEach(function (p) {
        if (!p.kind) return;
        if (qi >= 0) p.cells[qi].forEach(function (c) { c.classList.add("aa-sel-row"); });
        if (kj >= 0) p.cells.forEach(function (row) { row[kj].classList.add("aa-sel-col"); });
      });
      if (qi >= 0) say.push(tok + " reads from (" + KIND[kind] + "): " + best(m[qi].map(function (v, j) { return [v, data.key_tokens[j] + " (" + data.k_idx[j] + ")", data.masked && data.masked[qi][j]]; })));
      if (kj >= 0) say.push(tok + " is read by: " + best(m.map(function (row, i) { return [row[kj], data.query_tokens[i] + " (" + data.q_idx[i] + ")", data.masked && data.masked[i][kj]]; })));
      if (!say.length) say.push(tok + " is outside the shown window");
      reads.textContent = say.join("  ·  ");
    }
    function best(list) {
      list = list.filter(function (x) { return !x[2]; }).sort(function (a, b) { return Math.abs(b[0]) - Math.abs(a[0]); }).slice(0, 5);
      return list.map(function (x) { return x[1] + " " + fmt(x[0]); }).join(", ");
    }
    draw();
    return view;
  }

  function highlight(tokens, values, onClick) {
    var box = el("div", "aa-tokens"), top = 0;
    values.forEach(function (v) { top = Math.max(top, Math.abs(v)); });
    tokens.forEach(function (t, i) {
      var s = el("span", "aa-tok", t);
      var v = values[i];
      s.style.background = top > 0 ? (v >= 0 ? mix([41, 158, 61], v / top) : mix([214, 48, 39], -v / top)) : "#fff";
      s.title = t + " (" + i + "): " + fmt(v);
      s.setAttribute("data-pos", i);
      s.setAttribute("data-side", "k");
      if (onClick) s.onclick = function () { onClick(i); };
      box.appendChild(s);
      box.appendChild(document.createTextNode(" "));
    });
    return box;
  }

  root.AttattrView = { render: render, highlight: highlight, fmt: fmt, unpack: unpack };
})(window);
