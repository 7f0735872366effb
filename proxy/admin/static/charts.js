// Small SVG charts for the dashboard: no library, text only through textContent.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function chartFrame(svg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const width = svg.clientWidth || 420;
  const height = svg.clientHeight || 220;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  return { width, height, left: 52, right: 10, top: 18, bottom: 40 };
}

// axis titles: what the x and y of a chart are (options.xLabel, options.yLabel)
function axisTitles(svg, f, options) {
  if (options.xLabel) {
    svg.appendChild(svgEl("text", { class: "axis-title x-title", x: f.left + (f.width - f.left - f.right) / 2, y: f.height - 4, "text-anchor": "middle" }, options.xLabel));
  }
  if (options.yLabel) {
    const cy = f.top + (f.height - f.top - f.bottom) / 2;
    svg.appendChild(svgEl("text", { class: "axis-title y-title", x: 10, y: cy, "text-anchor": "middle", transform: `rotate(-90 10 ${cy})` }, options.yLabel));
  }
}

function noData(svg, f) {
  svg.appendChild(svgEl("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle" }, "no data yet"));
  svg.dataset.points = "0";
}

function yAxis(svg, f, min, max) {
  const y = (v) => f.top + (f.height - f.top - f.bottom) * (1 - (v - min) / (max - min || 1));
  svg.appendChild(svgEl("line", { class: "axis", x1: f.left, x2: f.width - f.right, y1: y(min), y2: y(min) }));
  for (const v of [min, (min + max) / 2, max]) {
    svg.appendChild(svgEl("text", { x: f.left - 4, y: y(v) + 3, "text-anchor": "end" }, formatNumber(v)));
  }
  return y;
}

function formatNumber(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(1);
  return String(Math.round(v * 1000) / 1000);
}

// items: [{label, value, cls?, title?}]; options: {xLabel, yLabel}
function barChart(svg, items, options = {}) {
  const f = chartFrame(svg);
  axisTitles(svg, f, options);
  if (!items.length) return noData(svg, f);
  const values = items.map((i) => i.value);
  const min = Math.min(0, ...values);
  const max = Math.max(0, ...values);
  const y = yAxis(svg, f, min, max === min ? min + 1 : max);
  const slot = (f.width - f.left - f.right) / items.length;
  items.forEach((item, i) => {
    const x = f.left + i * slot + slot * 0.15;
    const top = Math.min(y(item.value), y(0));
    const bar = svgEl("rect", {
      class: "bar " + (item.cls || ""),
      x, y: top, width: Math.max(1, slot * 0.7), height: Math.max(1, Math.abs(y(item.value) - y(0))),
    });
    bar.appendChild(svgEl("title", {}, `${item.title || item.label}: ${formatNumber(item.value)}`));
    svg.appendChild(bar);
    if (items.length <= 12) {
      const above = item.value >= 0 ? top - 3 : top + Math.abs(y(item.value) - y(0)) + 11;
      svg.appendChild(svgEl("text", { class: "value", x: x + slot * 0.35, y: above, "text-anchor": "middle" }, formatNumber(item.value)));
    }
    if (items.length <= 24) {
      const label = item.label.length > 14 ? item.label.slice(0, 13) + "…" : item.label;
      svg.appendChild(svgEl("text", { x: x + slot * 0.35, y: f.height - f.bottom + 12, "text-anchor": "middle" }, label));
    }
  });
  svg.dataset.points = String(items.length);
}

// points: [{label, value}] in time order; options: {min, max} fix the y range, marks:
// [{index, label}] draw a dashed line just before points[index] (e.g. a stage change)
function lineChart(svg, points, options = {}) {
  const f = chartFrame(svg);
  axisTitles(svg, f, options);
  if (!points.length) return noData(svg, f);
  const values = points.map((p) => p.value);
  let min = options.min ?? Math.min(...values);
  let max = options.max ?? Math.max(...values);
  if (min === max) { min -= 0.5; max += 0.5; }
  const y = yAxis(svg, f, min, max);
  const step = points.length > 1 ? (f.width - f.left - f.right) / (points.length - 1) : 0;
  const x = (i) => f.left + (points.length > 1 ? i * step : (f.width - f.left - f.right) / 2);
  for (const mark of options.marks || []) {
    const at = mark.index > 0 ? (x(mark.index - 1) + x(mark.index)) / 2 : x(0);
    svg.appendChild(svgEl("line", { class: "mark", x1: at, x2: at, y1: f.top, y2: f.height - f.bottom }));
    svg.appendChild(svgEl("text", { class: "mark-label", x: at + 3, y: f.top + 8 }, mark.label));
  }
  const path = points.map((p, i) => `${i ? "L" : "M"}${x(i)},${y(p.value)}`).join(" ");
  svg.appendChild(svgEl("path", { class: "line", d: path }));
  points.forEach((p, i) => {
    const dot = svgEl("circle", { class: "dot", cx: x(i), cy: y(p.value), r: 3 });
    dot.appendChild(svgEl("title", {}, `${p.label}: ${formatNumber(p.value)}`));
    svg.appendChild(dot);
  });
  const ends = points.length > 1 ? [[0, "start"], [points.length - 1, "end"]] : [[0, "middle"]];
  for (const [i, anchor] of ends) {
    svg.appendChild(svgEl("text", { x: x(i), y: f.height - f.bottom + 12, "text-anchor": anchor }, points[i].label));
  }
  svg.dataset.points = String(points.length);
}

const PALETTE = ["#2f6fde", "#d9730d", "#2e9d5b", "#9a6bd8", "#c93c3c", "#0f9aa8", "#b58900", "#6b7385"];

// Several series on a numeric x axis (a time in ms, or a step), each a line with dots and,
// where its points have low/high, a shaded band. series: [{name, points: [{x, y, low?,
// high?, title}]}]; options: {xLabel, yLabel, xTick(x) -> text, min, max}
function seriesChart(svg, series, options = {}) {
  const f = chartFrame(svg);
  axisTitles(svg, f, options);
  const shown = series.filter((s) => s.points.length);
  if (!shown.length) return noData(svg, f);
  const all = shown.flatMap((s) => s.points);
  const ys = all.flatMap((p) => [p.y, p.low, p.high]).filter((v) => v !== null && v !== undefined && Number.isFinite(v));
  let min = options.min ?? Math.min(...ys);
  let max = options.max ?? Math.max(...ys);
  if (min === max) { min -= 0.5; max += 0.5; }
  const y = yAxis(svg, f, min, max);
  const xs = all.map((p) => p.x);
  let x0 = Math.min(...xs);
  let x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const x = (v) => f.left + 6 + (f.width - f.left - f.right - 12) * (v - x0) / (x1 - x0);
  const clamp = (v) => Math.min(max, Math.max(min, v));
  const tick = options.xTick || ((v) => formatNumber(v));
  for (const [v, anchor] of [[x0, "start"], [x1, "end"]]) {
    svg.appendChild(svgEl("text", { x: x(v), y: f.height - f.bottom + 12, "text-anchor": anchor }, tick(v)));
  }
  shown.forEach((s, k) => {
    const color = PALETTE[k % PALETTE.length];
    const group = svgEl("g", { class: "series", "data-series": s.name });
    const banded = s.points.filter((p) => p.low !== null && p.low !== undefined && p.high !== null && p.high !== undefined);
    if (banded.length) {
      const upper = banded.map((p) => `${x(p.x)},${y(clamp(p.high))}`);
      const lower = banded.slice().reverse().map((p) => `${x(p.x)},${y(clamp(p.low))}`);
      // a single banded point still shows its interval, as a narrow box
      const points = banded.length > 1 ? [...upper, ...lower] : [`${x(banded[0].x) - 3},${y(clamp(banded[0].high))}`, `${x(banded[0].x) + 3},${y(clamp(banded[0].high))}`, `${x(banded[0].x) + 3},${y(clamp(banded[0].low))}`, `${x(banded[0].x) - 3},${y(clamp(banded[0].low))}`];
      const shade = svgEl("polygon", { class: "band", points: points.join(" ") });
      shade.style.fill = color; // through the CSSOM: the page's CSP refuses style attributes
      group.appendChild(shade);
    }
    const path = s.points.map((p, i) => `${i ? "L" : "M"}${x(p.x)},${y(p.y)}`).join(" ");
    const line = svgEl("path", { class: "line", d: path });
    line.style.stroke = color;
    group.appendChild(line);
    for (const p of s.points) {
      const dot = svgEl("circle", { class: "dot", cx: x(p.x), cy: y(p.y), r: 3 });
      dot.style.fill = color;
      dot.appendChild(svgEl("title", {}, p.title || `${s.name}: ${formatNumber(p.y)}`));
      group.appendChild(dot);
    }
    svg.appendChild(group);
  });
  svg.dataset.points = String(all.length);
  svg.dataset.series = String(shown.length);
  return shown.map((s, k) => ({ name: s.name, color: PALETTE[k % PALETTE.length] }));
}

window.charts = { barChart, lineChart, seriesChart, formatNumber };
