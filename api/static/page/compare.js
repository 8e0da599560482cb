// Runs side by side: two or more jobs' curves overlaid on shared axes, and the settings in
// which their specs differ.

import { Refused, TERMINAL, api, el, fmt } from "./api.js";
import { Chart } from "./charts.js";

const $ = (id) => document.getElementById(id);
const PALETTE = ["#2f5fd0", "#c0392b", "#1f8a4c", "#b7791f", "#7b3fb0", "#0f8a8a", "#5c6577"];
const CHARTS = [
  ["compare-loss", "loss"], ["compare-val", "val_loss"], ["compare-tps", "tokens_per_s"],
];

// {"train": {"lr": 1}} -> {"train.lr": 1}: one row per setting.
export function flatten(value, prefix = "", out = {}) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, inner] of Object.entries(value)) {
      flatten(inner, prefix ? `${prefix}.${key}` : key, out);
    }
  } else {
    out[prefix] = JSON.stringify(value);
  }
  return out;
}

export class ComparePage {
  constructor(ids) {
    this.ids = ids;
    this.rows = ids.map(() => []);
    this.charts = null;
    $("compare-error").textContent = ids.length < 2 ? "Pick two or more jobs to compare." : "";
    $("compare-jobs").tBodies[0].replaceChildren();
    $("compare-diff").tBodies[0].replaceChildren();
    for (const [box] of CHARTS) $(box).replaceChildren();
  }

  async refresh() {
    let jobs, pages;
    try {
      jobs = await Promise.all(this.ids.map((id) => api(`/v1/jobs/${encodeURIComponent(id)}`)));
      const since = this.rows.map((rows) => rows.at(-1)?.step ?? 0);
      pages = await Promise.all(this.ids.map((id, i) =>
        api(`/v1/jobs/${encodeURIComponent(id)}/metrics?since_step=${since[i]}&limit=10000`)));
    } catch (err) {
      if (!(err instanceof Refused)) throw err;  // signed out or offline: the page says so
      $("compare-error").textContent = `Cannot compare these jobs: ${err.message}`;
      return false;
    }
    if (this.disposed) return false;
    pages.forEach((page, i) => this.rows[i].push(...page.metrics));
    if (this.charts === null) this.makeCharts(jobs);
    this.renderJobs(jobs);
    this.renderDiff(jobs);
    this.draw();
    return jobs.some((job) => !TERMINAL.has(job.state));  // polled while any still runs
  }

  dispose() {
    this.disposed = true;
    for (const chart of this.charts ?? []) chart.dispose();
  }

  makeCharts(jobs) {
    this.charts = CHARTS.map(([box, key]) => new Chart($(box), jobs.map((job, i) => ({
      key: `${key}#${i}`, label: `${job.name} (${job.id.slice(0, 6)})`,
      color: PALETTE[i % PALETTE.length],
    }))));
  }

  draw() {
    // One row per step, with each job's value under its own key.
    const byStep = new Map();
    this.rows.forEach((rows, i) => {
      for (const row of rows) {
        const merged = byStep.get(row.step) ?? { step: row.step };
        for (const [, key] of CHARTS) merged[`${key}#${i}`] = row[key];
        byStep.set(row.step, merged);
      }
    });
    const merged = [...byStep.values()].sort((a, b) => a.step - b.step);
    for (const chart of this.charts) chart.update(merged, { ended: true });
  }

  renderJobs(jobs) {
    $("compare-jobs").tBodies[0].replaceChildren(...jobs.map((job, i) => {
      const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
      swatch.style.background = PALETTE[i % PALETTE.length];
      const name = el("td", { "data-label": "Job" }, swatch,
        el("a", { href: `#/jobs/${job.id}`, text: job.name }));
      const m = job.latest_metrics ?? {};
      return el("tr", {}, name,
        el("td", { "data-label": "State", text: job.state }),
        el("td", { "data-label": "Step", text: `${job.step}/${job.steps}` }),
        el("td", { "data-label": "Loss", text: fmt(m.loss) }),
        el("td", { "data-label": "Tokens/s", text: fmt(m.tokens_per_s, 0) }));
    }));
  }

  renderDiff(jobs) {
    // The model as resolved (a preset's values, a model folder's): two jobs of one shape
    // do not differ because one named it and the other did not.
    const flat = jobs.map((job) => flatten({
      ...job.spec, model: { ...job.spec.model, ...(job.model_shape ?? {}) },
    }));
    const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort();
    const differing = keys.filter((key) => new Set(flat.map((f) => f[key] ?? "–")).size > 1);
    $("compare-same").hidden = differing.length > 0;
    const head = $("compare-diff").tHead.rows[0];
    head.replaceChildren(el("th", { text: "Setting" }),
      ...jobs.map((job) => el("th", { text: job.name })));
    $("compare-diff").tBodies[0].replaceChildren(...differing.map((key) => el("tr", {},
      el("td", { "data-label": "Setting", text: key }),
      ...flat.map((f, i) => el("td", { "data-label": jobs[i].name, text: f[key] ?? "–" })))));
  }
}
