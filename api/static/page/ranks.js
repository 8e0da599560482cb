// A job's ranks: each one's place in the layout (its pp, dp and tp coordinates, as the
// engine's (pp, dp, tp) device mesh numbers them, and its node), its step time over the
// last logged steps as a heat map in which a slow rank stands out, and where the last
// logged step's time went on each and what it holds (the engine's per-rank breakdown).

import { el } from "./api.js";

const $ = (id) => document.getElementById(id);
const WINDOW = 30;  // logged steps in the heat map
const SLOW = 1.2;  // a rank this much slower than the median, on average, is "slow"
export const PARTS = [
  ["compute_s", "compute", "#2f5fd0"], ["comm_s", "communication", "#c0392b"],
  ["bubble_s", "pipeline bubble", "#b7791f"], ["data_s", "data", "#1f8a4c"],
  ["checkpoint_s", "checkpoint", "#5c6577"],
];

function bytes(n) {
  if (!Number.isFinite(n)) return "–";
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

// Rank r of a (pp, dp, tp) mesh, row-major: tp varies fastest.
export function coordinates(rank, { pp = 1, dp = 1, tp = 1 }) {
  return { tp: rank % tp, dp: Math.floor(rank / tp) % dp, pp: Math.floor(rank / (tp * dp)) % pp };
}

export function renderRanks(job, rows, rankNodes) {
  const logged = rows.filter((r) => Array.isArray(r.breakdown) && r.breakdown.length).slice(-WINDOW);
  $("ranks-section").hidden = logged.length === 0;
  if (logged.length === 0) return;
  const world = logged.at(-1).breakdown.length;
  const par = job.spec.parallel ?? {};
  const dims = (par.dp ?? 1) * (par.tp ?? 1) * (par.pp ?? 1) === world ? par : null;
  const recent = logged.filter((r) => r.breakdown.length === world);
  // Each rank's step time over the median of the other ranks' (with two ranks, the other
  // one's): 1 is typical, above is slower.
  const ratios = recent.map((r) => r.breakdown.map((b, rank) => {
    const others = r.breakdown.filter((_, o) => o !== rank).map((o) => o.step_s);
    return others.length ? b.step_s / (median(others) || 1) : 1;
  }));
  const slowness = Array.from({ length: world }, (_, rank) =>
    ratios.reduce((sum, row) => sum + row[rank], 0) / ratios.length);
  const last = recent.at(-1).breakdown;
  const longest = Math.max(...last.map((b) => b.step_s)) || 1;
  $("ranks").tBodies[0].replaceChildren(...last.map((b, rank) => {
    const at = dims ? coordinates(rank, dims) : null;
    const node = rankNodes?.[rank];
    const bar = el("div", { class: "parts", role: "img",
      "aria-label": PARTS.map(([key, name]) => `${name} ${(b[key] ?? 0).toFixed(3)} s`).join(", ") });
    bar.style.width = `${(100 * b.step_s) / longest}%`;
    for (const [key, name, color] of PARTS) {
      const part = el("span", { title: `${name}: ${(b[key] ?? 0).toFixed(3)} s` });
      part.style.width = `${(100 * (b[key] ?? 0)) / (b.step_s || 1)}%`;
      part.style.background = color;
      bar.append(part);
    }
    const slow = slowness[rank] > SLOW;
    const row = el("tr", { class: slow ? "slow" : "", "data-rank": String(rank) },
      el("td", { "data-label": "Rank", text: slow ? `${rank} (slow)` : String(rank) }),
      el("td", { "data-label": "pp", text: at ? String(at.pp) : "–" }),
      el("td", { "data-label": "dp", text: at ? String(at.dp) : "–" }),
      el("td", { "data-label": "tp", text: at ? String(at.tp) : "–" }),
      el("td", { "data-label": "Node", title: node ?? "", text: node ? node.slice(0, 8) : "–" }),
      el("td", { "data-label": "Step time", class: "num", text: `${b.step_s.toFixed(3)} s` }),
      el("td", { "data-label": "Memory", class: "num", text: bytes(b.mem_bytes) }),
      el("td", { "data-label": "Where it went" }, bar));
    return row;
  }));
  renderHeat(recent, ratios, world);
  $("ranks-hint").textContent = `Step ${recent.at(-1).step}; the heat map shows each rank's ` +
    `step time against the other ranks' median over the last ${recent.length} logged steps (darker: slower).`;
  $("parts-legend").replaceChildren(...PARTS.map(([, name, color]) => {
    const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
    swatch.style.background = color;
    return el("span", { class: "part-name" }, swatch, name);
  }));
}

function renderHeat(recent, ratios, world) {
  const head = el("tr", {}, el("th", { text: "rank \\ step" }),
    ...recent.map((r) => el("th", { text: String(r.step) })));
  const body = Array.from({ length: world }, (_, rank) => el("tr", {},
    el("th", { text: String(rank) }),
    ...recent.map((r, i) => {
      const cell = el("td", { title: `rank ${rank}, step ${r.step}: ${r.breakdown[rank].step_s.toFixed(3)} s` });
      cell.style.background = `rgba(192, 57, 43, ${Math.min(1, Math.max(0, (ratios[i][rank] - 1) * 2))})`;
      return cell;
    })));
  $("rank-heat").replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
}
