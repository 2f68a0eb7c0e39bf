// dpstream dashboard: polls /api/state every second and draws each statistic's released
// series with its 95% band in plain SVG (no library: the page works offline).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 720, HEIGHT = 220, PAD = { left: 64, right: 12, top: 10, bottom: 28 };
const COLOURS = ["#2f6db5", "#c2553a", "#3a8f5c", "#8a4fb0", "#b58a2f", "#2f9bb5"];

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(x) {
  if (x === null || x === undefined) return "–";
  if (Number.isInteger(x)) return x.toLocaleString("en");
  const abs = Math.abs(x);
  return abs >= 100 ? x.toFixed(0) : abs >= 1 ? x.toFixed(2) : x.toPrecision(3);
}

function clock(unix) {
  return new Date(unix * 1000).toISOString().slice(11, 19) + " UTC";
}

// One chart: each series' band (low..high) as a shaded polygon and its value as a line.
function chart(series, unit, height = HEIGHT) {
  const svg = el("svg:svg", { width: WIDTH, height: height, viewBox: `0 0 ${WIDTH} ${height}`,
                              role: "img" });
  const all = Object.values(series).flat().filter(p => p.value !== null);
  if (all.length === 0) {
    svg.appendChild(el("svg:text", { x: PAD.left, y: height / 2 }, "no value released yet"));
    return svg;
  }
  const ts = all.map(p => p.t);
  const ys = all.flatMap(p => [p.value, p.low ?? p.value, p.high ?? p.value]);
  let [t0, t1] = [Math.min(...ts), Math.max(...ts)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (t1 === t0) t1 = t0 + 1;
  if (y1 === y0) { y0 -= 1; y1 += 1; }
  const margin = (y1 - y0) * 0.05; y0 -= margin; y1 += margin;
  const x = t => PAD.left + (t - t0) / (t1 - t0) * (WIDTH - PAD.left - PAD.right);
  const y = v => height - PAD.bottom - (v - y0) / (y1 - y0) * (height - PAD.top - PAD.bottom);
  for (let i = 0; i <= 4; i++) {  // the value axis: five gridlines
    const v = y0 + (y1 - y0) * i / 4;
    svg.appendChild(el("svg:line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: y(v), y2: y(v),
                                     stroke: "#eceff4" }));
    svg.appendChild(el("svg:text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
  }
  svg.appendChild(el("svg:text", { x: PAD.left, y: height - 8 }, clock(t0)));
  svg.appendChild(el("svg:text", { x: WIDTH - PAD.right, y: height - 8, "text-anchor": "end" },
                     clock(t1)));
  svg.appendChild(el("svg:text", { x: 4, y: PAD.top + 4, transform: `rotate(90 4 ${PAD.top})` },
                     unit || ""));
  Object.entries(series).forEach(([name, points], i) => {
    const colour = COLOURS[i % COLOURS.length];
    const shown = points.filter(p => p.value !== null);
    const banded = shown.filter(p => p.low !== null && p.high !== null);
    if (banded.length > 0) {
      const upper = banded.map(p => `${x(p.t)},${y(p.high)}`);
      const lower = banded.slice().reverse().map(p => `${x(p.t)},${y(p.low)}`);
      svg.appendChild(el("svg:polygon", { points: upper.concat(lower).join(" "), fill: colour,
                                          "fill-opacity": 0.18, stroke: "none" }));
    }
    svg.appendChild(el("svg:polyline", { points: shown.map(p => `${x(p.t)},${y(p.value)}`).join(" "),
                                         fill: "none", stroke: colour, "stroke-width": 1.8 }));
    if (name) {
      const last = shown[shown.length - 1];
      if (last) svg.appendChild(el("svg:text", { x: x(last.t) - 4, y: y(last.value) - 6,
                                                 "text-anchor": "end", fill: colour }, name));
    }
  });
  return svg;
}

// A histogram's latest release: one bar per value with its 95% interval as a whisker.
function bars(bins) {
  const svg = el("svg:svg", { width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}` });
  const tops = bins.intervals.map(iv => iv[1]).concat(bins.values);
  const y1 = Math.max(1, ...tops), y0 = Math.min(0, ...bins.intervals.map(iv => iv[0]));
  const w = (WIDTH - PAD.left - PAD.right) / bins.values.length;
  const y = v => HEIGHT - PAD.bottom - (v - y0) / (y1 - y0) * (HEIGHT - PAD.top - PAD.bottom);
  bins.values.forEach((v, i) => {
    const left = PAD.left + i * w;
    svg.appendChild(el("svg:rect", { x: left + w * 0.15, width: w * 0.7, y: Math.min(y(v), y(0)),
                                     height: Math.abs(y(0) - y(v)), fill: COLOURS[0],
                                     "fill-opacity": 0.7 }));
    const [lo, hi] = bins.intervals[i];
    svg.appendChild(el("svg:line", { x1: left + w / 2, x2: left + w / 2, y1: y(lo), y2: y(hi),
                                     stroke: "#1d2330" }));
    svg.appendChild(el("svg:text", { x: left + w / 2, y: HEIGHT - 8, "text-anchor": "middle" },
                       String(i + 1)));
  });
  svg.appendChild(el("svg:text", { x: PAD.left - 6, y: y(y1) + 10, "text-anchor": "end" }, fmt(y1)));
  svg.appendChild(el("svg:text", { x: PAD.left - 6, y: y(0), "text-anchor": "end" }, "0"));
  return svg;
}

function budgetBar(spent, total) {
  const bar = el("div", { class: "budget" });
  const share = total > 0 && spent !== null ? Math.min(1, spent / total) : 0;
  bar.appendChild(el("div", { style: `width: ${(share * 100).toFixed(1)}%` }));
  return bar;
}

function statistic(s, state) {
  const latestPoints = Object.values(s.series).map(points => points[points.length - 1])
    .filter(p => p);
  const section = el("div", { class: "panel statistic", id: `stat-${s.name}`,
                              "data-statistic": s.name,
                              "data-latest-tick": s.latest_tick ?? "",
                              "data-points": Object.values(s.series).flat().length });
  section.appendChild(el("h2", {}, s.title));
  section.appendChild(el("div", { class: "small" },
    `${s.name}${s.unit ? " · " + s.unit : ""} · ${s.privacy}`));
  const summary = el("div", { class: "latest" });
  if (s.exhausted) {
    summary.appendChild(el("span", { class: "exhausted" },
      "Its privacy budget is spent: no further releases."));
  } else if (latestPoints.length === 1 && latestPoints[0].value !== null) {
    const p = latestPoints[0];
    const band = p.low !== null ? ` (95% interval ${fmt(p.low)} to ${fmt(p.high)})` : "";
    summary.textContent = `Latest: ${fmt(p.value)}${band} at ${clock(p.t)}`;
  } else if (latestPoints.length === 0) {
    summary.textContent = "Waiting for the first release…";
  } else {
    const at = clock(Math.max(...latestPoints.map(p => p.t)));
    summary.textContent = s.bins
      ? `Latest, per value (bars; the whiskers are 95% intervals), at ${at}`
      : `${latestPoints.length} series (one line per cell), latest at ${at}`;
  }
  section.appendChild(summary);
  section.appendChild(s.bins ? bars(s.bins) : chart(s.series, s.unit));
  if (s.privacy.includes("tracked")) {  // the contribution bound tau: auto tracks, over time
    const taus = Object.values(s.series)[0] || [];
    section.appendChild(el("div", { class: "small" },
      "Tracked contribution bound tau (each user's events beyond it are not counted):"));
    section.appendChild(chart({ "": taus.map(p => ({ t: p.t, value: p.tau, low: null, high: null })) },
                              "tau", 110));
  }
  const taus = latestPoints.map(p => p.tau).filter(t => t !== null);
  const details = [];
  if (taus.length > 0) details.push(`contribution bound tau: ${taus[taus.length - 1]}` +
    (s.privacy.includes("tracked") ? " (tracked privately, as released)" : ""));
  details.push(`${s.releases} releases shown`);
  if (s.spent !== null) {
    details.push(`privacy budget spent: epsilon ${fmt(s.spent)} of the pipeline's ` +
                 `total ${fmt(state.total_epsilon)}`);
  }
  section.appendChild(el("div", { class: "small" }, details.join(" · ")));
  if (s.spent !== null) section.appendChild(budgetBar(s.spent, state.total_epsilon));
  section.appendChild(el("div", { class: "small" }, `Configured as: ${s.config}`));
  return section;
}

function render(state) {
  document.getElementById("app").textContent = state.app_id;
  document.getElementById("tick").textContent = state.tick_seconds;
  document.getElementById("band").textContent = state.band;
  const budget = document.getElementById("budget");
  budget.replaceChildren();
  if (state.per_user_total !== null) {
    budget.appendChild(el("div", {},
      `Across all statistics, one person's data can change what is published by at most ` +
      `epsilon = ${fmt(state.per_user_total)}, of a total allowed of ${fmt(state.total_epsilon)} ` +
      `(privacy.total_epsilon). Smaller epsilon means more privacy.`));
    budget.appendChild(budgetBar(state.per_user_total, state.total_epsilon));
  } else {
    budget.textContent = `Total allowed: epsilon ${fmt(state.total_epsilon)}; ` +
      "waiting for the ledger's statement.";
  }
  const dead = document.getElementById("dead");
  dead.replaceChildren(el("div", { id: "dead-total" },
    `${state.dead_letters.total} records rejected (not valid input; their content is not shown)`));
  const reasons = el("table");
  for (const [reason, n] of Object.entries(state.dead_letters.by_reason)) {
    const row = el("tr"); row.appendChild(el("td", {}, String(n))); row.appendChild(el("td", {}, reason));
    reasons.appendChild(row);
  }
  dead.appendChild(reasons);
  const lag = document.getElementById("lag");
  lag.replaceChildren(el("div", { id: "lag-total" },
    `${state.lag_total} source records not yet read by the pipeline` +
    (state.lag_at ? ` (at ${clock(state.lag_at)})` : "")));
  const rows = el("table");
  for (const [partition, row] of Object.entries(state.lag)) {
    const tr = el("tr");
    [partition, `lag ${row.lag}`, `end ${row.end}`].forEach(t => tr.appendChild(el("td", {}, t)));
    rows.appendChild(tr);
  }
  lag.appendChild(rows);
  const problems = document.getElementById("problems");
  problems.replaceChildren(...Object.entries(state.problems).map(
    ([what, text]) => el("div", {}, `Reading ${what}: ${text}`)));
  const stats = document.getElementById("statistics");
  stats.replaceChildren(...state.statistics.map(s => statistic(s, state)));
  document.getElementById("updated").textContent = clock(state.now);
}

async function poll() {
  try {
    const response = await fetch("api/state", { cache: "no-store" });
    if (response.ok) render(await response.json());
  } catch (err) {
    document.getElementById("problems").textContent = `The dashboard server does not answer: ${err}`;
  }
  setTimeout(poll, 1000);
}

poll();
