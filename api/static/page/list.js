// The job list: newest first, filtered by state, paged with the API's cursors.

import { age, api, el, fmt } from "./api.js";

const PAGE_SIZE = 25;
export const STATES = [
  "QUEUED", "STARTING", "RUNNING", "RESTARTING", "PAUSING", "PAUSED",
  "CANCELLING", "SUCCEEDED", "FAILED", "CANCELLED",
];
const COLUMNS = ["Select", "Name", "Owner", "State", "Progress", "Step", "Loss", "Tokens/s",
  "Restarts", "Age"];

export class JobList {
  constructor() {
    this.body = document.querySelector("#jobs tbody");
    this.filter = document.getElementById("state-filter");
    this.cursors = [null];  // cursors[i] opens page i; the last one is the page shown
    this.nextCursor = null;
    this.selected = new Set();  // job ids ticked for comparison, across pages and polls
    const compare = document.getElementById("compare");
    compare.onclick = () => { location.hash = `#/compare/${[...this.selected].join(",")}`; };
    this.showSelected();
    if (this.filter.options.length === 1) {
      for (const state of STATES) this.filter.append(el("option", { value: state, text: state }));
    }
    this.filter.onchange = () => { this.cursors = [null]; this.onChange?.(); };
    document.getElementById("next-page").onclick = () => {
      this.cursors.push(this.nextCursor); this.onChange?.();
    };
    document.getElementById("first-page").onclick = () => {
      this.cursors = [null]; this.onChange?.();
    };
  }

  async refresh() {
    const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (this.filter.value) params.set("state", this.filter.value);
    const cursor = this.cursors.at(-1);
    if (cursor) params.set("cursor", cursor);
    const page = await api(`/v1/jobs?${params}`);
    this.nextCursor = page.next_cursor;
    this.render(page.jobs);
    return true;  // the list is polled for as long as it is shown
  }

  render(jobs) {
    const empty = jobs.length === 0 && this.cursors.length === 1;
    const filtered = Boolean(this.filter.value);
    document.getElementById("no-jobs").hidden = !empty || filtered;
    const noMatches = document.getElementById("no-matches");
    noMatches.hidden = !empty || !filtered;
    noMatches.textContent = `No ${this.filter.value} jobs.`;
    document.getElementById("jobs").hidden = empty;
    document.getElementById("next-page").hidden = !this.nextCursor;
    document.getElementById("first-page").hidden = this.cursors.length === 1;
    // Rows are updated in place, so a focused link keeps its focus between polls.
    const rows = new Map([...this.body.rows].map((row) => [row.dataset.jobId, row]));
    const wanted = jobs.map((job) => {
      const row = rows.get(job.id) ?? this.newRow(job);
      rows.delete(job.id);
      this.fill(row, job);
      return row;
    });
    for (const stale of rows.values()) stale.remove();
    const inOrder = wanted.every((row, i) => this.body.rows[i] === row);
    if (!inOrder) this.body.append(...wanted);
  }

  newRow(job) {
    const row = el("tr", { "data-job-id": job.id });
    const classes = ["select", "name", "owner", "state-cell", "progress-cell", "step num",
      "loss num", "tps num", "restarts num", "age"];
    classes.forEach((cls, i) => row.append(el("td", { class: cls, "data-label": COLUMNS[i] })));
    const tick = el("input", { type: "checkbox", "aria-label": `Select ${job.name}` });
    tick.checked = this.selected.has(job.id);
    tick.onchange = () => {
      if (tick.checked) this.selected.add(job.id);
      else this.selected.delete(job.id);
      this.showSelected();
    };
    row.cells[0].append(tick);
    row.cells[1].append(el("a", { href: `#/jobs/${job.id}` }));
    row.cells[3].append(el("span", { class: "state" }));
    const bar = el("div", { class: "progress", role: "progressbar", "aria-valuemin": "0" });
    bar.append(el("span"));
    row.cells[4].append(bar);
    return row;
  }

  showSelected() {
    const compare = document.getElementById("compare");
    compare.disabled = this.selected.size < 2;
    compare.textContent = `Compare selected (${this.selected.size})`;
  }

  fill(row, job) {
    const metrics = job.latest_metrics ?? {};
    row.cells[1].firstChild.textContent = job.name;
    row.cells[2].textContent = job.owner;
    const badge = row.cells[3].firstChild;
    badge.textContent = job.state;
    badge.className = `state ${job.state}`;
    const bar = row.cells[4].firstChild;
    bar.setAttribute("aria-valuemax", String(job.steps));
    bar.setAttribute("aria-valuenow", String(job.step));
    bar.firstChild.style.width = `${job.steps ? (100 * job.step) / job.steps : 0}%`;
    row.cells[5].textContent = `${job.step}/${job.steps}`;
    row.cells[6].textContent = fmt(metrics.loss);
    row.cells[7].textContent = fmt(metrics.tokens_per_s, 0);
    row.cells[8].textContent = String(job.restarts);
    row.cells[9].textContent = age(job.created_at);
    row.cells[9].title = job.created_at;
  }
}
