// The attention explorer without a kernel: weights precomputed by selfattn_lite.course.explorer_data,
// drawn on canvases with plain JavaScript (no library, no network). Reads window.SELFATTN_EXPLORER
// (explorer_data.js) and fills <div id="selfattn-explorer">.
(function () {
  "use strict";

  // viridis at 9 stops (matplotlib's), interpolated linearly
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                   [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  const SELECTED = "#D55E00";
  const TOP_K = 3;

  function colour(w) {
    const x = Math.min(Math.max(w, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
    const c = VIRIDIS[i].map((a, k) => Math.round(a + f * (VIRIDIS[i + 1][k] - a)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // base64 uint8 -> Float32Array (n_layers * n_heads * T * T), unpacking the causal lower triangle
  function decode(item, model, scale) {
    const raw = atob(item.weights), T = item.tokens.length, heads = model.n_layers * model.n_heads;
    const out = new Float32Array(heads * T * T);
    let p = 0;
    for (let h = 0; h < heads; h++)
      for (let i = 0; i < T; i++)
        for (let j = 0; j < (model.causal ? i + 1 : T); j++)
          out[(h * T + i) * T + j] = raw.charCodeAt(p++) / scale;
    if (p !== raw.length) throw new Error(`explorer data: ${raw.length} bytes for ${p} weights`);
    return out;
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => (k === "text" ? (node.textContent = v) : node.setAttribute(k, v)));
    (children || []).forEach((c) => node.appendChild(c));
    return node;
  }

  function select(name, label) {
    const s = el("select", { id: `sae-${name}`, "data-control": name });
    return [el("label", { for: `sae-${name}`, text: label }), s];
  }

  function fill(s, options, value) {
    s.innerHTML = "";
    options.forEach(([v, text]) => s.appendChild(el("option", { value: String(v), text })));
    s.value = String(options.some(([v]) => String(v) === String(value)) ? value : options[0][0]);
  }

  function start(root, data) {
    const cache = new Map();
    const controls = el("div", { class: "sae-controls" });
    const [lSentence, sentence] = select("sentence", "sentence");
    const [lModel, model] = select("model", "model");
    const [lLayer, layer] = select("layer", "layer");
    const [lHead, head] = select("head", "head");
    const [lQuery, query] = select("query", "query token");
    [lSentence, sentence, lModel, model, lLayer, layer, lHead, head, lQuery, query].forEach((n) => controls.appendChild(n));
    const note = el("p", { class: "sae-note" });
    const grid = el("div", { class: "sae-grid", "aria-label": "every head of the layer" });
    const heat = el("canvas", { class: "sae-heatmap", "aria-label": "attention weights of the selected head" });
    const caption = el("p", { class: "sae-caption" });
    const top = el("ol", { class: "sae-top", "aria-label": "top keys" });
    const main = el("div", { class: "sae-main" }, [grid, el("div", { class: "sae-right" }, [heat, caption, top])]);
    root.append(controls, note, main);

    fill(sentence, data.sentences.map((s, i) => [i, s]), 0);
    fill(model, Object.entries(data.models).map(([k, m]) => [k, m.label]), "minilm");

    function current() {
      const m = data.models[model.value], item = m.items[Number(sentence.value)];
      const key = `${model.value}/${sentence.value}`;
      if (!cache.has(key)) cache.set(key, decode(item, m, data.scale));
      return { m, item, w: cache.get(key), T: item.tokens.length };
    }

    function headWeights(s, l, h) {
      const off = (l * s.m.n_heads + h) * s.T * s.T;
      return s.w.subarray(off, off + s.T * s.T);
    }

    function drawMatrix(canvas, w, T, cell, labels, tokens, q) {
      const pad = labels ? Math.ceil(Math.max(...tokens.map((t) => t.length)) * 6.5) + 8 : 0;
      const ratio = window.devicePixelRatio || 1;
      canvas.width = (pad + T * cell) * ratio;
      canvas.height = (pad + T * cell) * ratio;
      canvas.style.width = `${pad + T * cell}px`;
      canvas.style.height = `${pad + T * cell}px`;
      const ctx = canvas.getContext("2d");
      ctx.scale(ratio, ratio);
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, pad + T * cell, pad + T * cell);
      for (let i = 0; i < T; i++)
        for (let j = 0; j < T; j++) {
          ctx.fillStyle = colour(w[i * T + j]);
          ctx.fillRect(pad + j * cell, pad + i * cell, cell, cell);
        }
      if (labels) {
        ctx.fillStyle = "#222";
        ctx.font = "11px sans-serif";
        ctx.textBaseline = "middle";
        ctx.textAlign = "right";
        tokens.forEach((t, i) => ctx.fillText(t, pad - 4, pad + (i + 0.5) * cell));     // queries: rows
        tokens.forEach((t, j) => {                                                       // keys: columns
          ctx.save();
          ctx.translate(pad + (j + 0.5) * cell, pad - 4);
          ctx.rotate(-Math.PI / 2);
          ctx.textAlign = "left";
          ctx.fillText(t, 0, 0);
          ctx.restore();
        });
      }
      if (q !== null) {
        ctx.strokeStyle = SELECTED;
        ctx.lineWidth = 2;
        ctx.strokeRect(pad + 1, pad + q * cell + 1, T * cell - 2, cell - 2);
      }
    }

    function draw() {
      const s = current(), l = Number(layer.value), h = Number(head.value), q = Number(query.value);
      note.textContent = `${s.m.label}: ${s.m.note}. ${s.T} tokens, ${s.m.n_layers} layers × ${s.m.n_heads} heads.`;
      grid.innerHTML = "";
      const size = Math.max(2, Math.floor(56 / s.T));
      for (let k = 0; k < s.m.n_heads; k++) {
        const c = el("canvas", { "data-head": String(k), title: `head ${k}` });
        drawMatrix(c, headWeights(s, l, k), s.T, size, false, null, null);
        const fig = el("figure", { class: k === h ? "sae-thumb sae-selected" : "sae-thumb" },
          [c, el("figcaption", { text: `head ${k}` })]);
        fig.addEventListener("click", () => { head.value = String(k); draw(); });
        grid.appendChild(fig);
      }
      const w = headWeights(s, l, h), cell = Math.max(9, Math.min(28, Math.floor(420 / s.T)));
      drawMatrix(heat, w, s.T, cell, true, s.item.tokens, q);
      caption.textContent = `layer ${l}, head ${h}: row i is query token i, column j key token j; ` +
        `the outlined row is the query "${s.item.tokens[q]}".`;
      const row = Array.from(w.subarray(q * s.T, (q + 1) * s.T)).map((v, j) => [v, j]);
      row.sort((a, b) => b[0] - a[0] || a[1] - b[1]);
      top.innerHTML = "";
      row.slice(0, TOP_K).forEach(([v, j]) =>
        top.appendChild(el("li", { text: `${j}: ${s.item.tokens[j]}  ${v.toFixed(2)}` })));
      root.dataset.state = [sentence.value, model.value, l, h, q].join("/");
    }

    function reset() {   // the sentence or the model changed: new layers, heads and tokens
      const s = current();
      fill(layer, Array.from({ length: s.m.n_layers }, (_, i) => [i, `layer ${i}`]), layer.value || 0);
      fill(head, Array.from({ length: s.m.n_heads }, (_, i) => [i, `head ${i}`]), head.value || 0);
      const it = s.item.tokens.findIndex((t) => t.toLowerCase() === "it");
      fill(query, s.item.tokens.map((t, i) => [i, `${i}: ${t}`]), it >= 0 ? it : s.T - 1);
      draw();
    }

    sentence.addEventListener("change", reset);
    model.addEventListener("change", reset);
    [layer, head, query].forEach((c) => c.addEventListener("change", draw));
    reset();
  }

  function boot() {
    const root = document.getElementById("selfattn-explorer");
    if (!root) return;
    if (!window.SELFATTN_EXPLORER) {
      root.textContent = "The explorer's data (explorer_data.js) did not load.";
      throw new Error("SELFATTN_EXPLORER missing");
    }
    start(root, window.SELFATTN_EXPLORER);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
