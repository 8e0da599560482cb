// One job: summary, charts with what happened marked, timeline, restarts, checkpoints,
// log tail and actions.

import { TERMINAL, age, api, download, el, fmt } from "./api.js";
import { Chart } from "./charts.js";
import { marksFrom } from "./markers.js";
import { ProfileControl } from "./profile.js";
import { renderRanks } from "./ranks.js";

const LOG_LINES = 200;
const LOSS_SERIES = [
  { key: "loss", label: "train", color: "#2f5fd0" },
  { key: "val_loss", label: "validation", color: "#b7791f" },
];
// The memory kinds a logged step reports (workers/contract/memory_model.py KINDS).
const MEMORY_KINDS = [["params", "#2f5fd0"], ["grads", "#1f8a4c"], ["optim", "#b7791f"]];
const $ = (id) => document.getElementById(id);

export class JobPage {
  constructor(jobId) {
    this.jobId = jobId;
    this.lastEventId = 0;
    this.lastStep = 0;
    this.metrics = [];
    this.events = [];
    this.rankNodes = null;  // each rank's node, from the newest placement event
    this.parent = undefined;  // the job `resume_from` names, once looked up
    this.job = null;
    for (const id of ["timeline", "restarts", "log", "spec", "job-summary", "action-error"]) {
      $(id).replaceChildren();
    }
    $("checkpoints").tBodies[0].replaceChildren();
    $("no-restarts").hidden = false;
    $("rank").replaceChildren(el("option", { value: "0", text: "0" }));
    $("rank").onchange = () => this.onChange?.();
    $("log-search").value = "";
    $("log-search").onchange = () => this.onChange?.();
    $("log-error").textContent = "";
    $("log-download").onclick = async (event) => {
      event.preventDefault();
      const rank = $("rank").value || "0";
      const failed = await download(
        `/v1/jobs/${encodeURIComponent(jobId)}/logs/download?rank=${rank}`,
        `${jobId}-rank-${rank}.log`,
      );
      $("log-error").textContent = failed ? `Could not download the log: ${failed}` : "";
    };
    $("cancel").onclick = () => this.act("cancel", "Cancel this job?");
    $("pause").onclick = () => this.act("pause");
    $("resume").onclick = () => this.act("resume");
    $("delete").onclick = () => this.remove();
    $("marks").replaceChildren();
    $("ranks-section").hidden = true;
    $("parent-link").hidden = true;
    this.profiling = new ProfileControl(jobId);
    const memory = (row, key) => row.mem_bytes?.[key] ?? NaN;
    this.charts = [
      new Chart($("loss-chart"), LOSS_SERIES, { marked: true }),
      new Chart($("throughput-chart"), [{ key: "tokens_per_s", label: "tokens/s", color: "#2f5fd0" }]),
      new Chart($("lr-chart"), [{ key: "lr", label: "lr", color: "#2f5fd0" }]),
      new Chart($("grad-chart"), [{ key: "grad_norm", label: "grad norm", color: "#2f5fd0" }],
        { marked: true }),
      new Chart($("mfu-chart"), [{ key: "mfu", label: "MFU", color: "#2f5fd0" }]),
      new Chart($("memory-chart"), MEMORY_KINDS.map(([key, color]) => ({ key, label: key, color })),
        { value: memory, bytes: true }),
      new Chart($("traffic-chart"), [{ key: "grad_bytes", label: "bytes", color: "#2f5fd0" }],
        { value: (row) => row.grad_bytes ?? NaN, bytes: true }),
    ];
    $("smoothing").oninput = () => this.drawCharts();
    $("log-scale").onchange = () => this.drawCharts();
    this.drawCharts();
  }

  async refresh() {
    const base = `/v1/jobs/${encodeURIComponent(this.jobId)}`;
    // The job first: if it has ended, what is read after it is complete.
    const job = await api(base);
    if (this.parent === undefined) await this.loadParent(job);
    const term = $("log-search").value.trim();
    // A search reads up to 64 MiB of log on the server: once in 10 s, or when it changes.
    const searchDue = !term || term !== this.searched?.term || Date.now() - this.searched.at > 10_000;
    const rank = $("rank").value || "0";
    const logQuery = new URLSearchParams({ rank, tail: String(LOG_LINES) });
    if (term) logQuery.set("contains", term);
    const [events, metrics, checkpoints, logs] = await Promise.all([
      api(`${base}/events?after=${this.lastEventId}&limit=1000`),
      api(`${base}/metrics?since_step=${this.lastStep}&limit=10000`),
      api(`${base}/checkpoints`),
      searchDue ? api(`${base}/logs?${logQuery}`) : null,
    ]);
    if (this.disposed) return false;  // another page took over while this one read
    this.job = job;
    this.renderJob(job);
    this.addEvents(events.events);
    this.addMetrics(metrics.metrics);
    this.renderCheckpoints(checkpoints.checkpoints);
    if (logs) {
      this.renderLogs(logs);
      this.searched = term ? { term, at: Date.now() } : null;
    }
    if (TERMINAL.has(job.state)) this.drawCharts();  // "nothing was logged", if so
    return !TERMINAL.has(job.state);  // a finished job is not polled any more
  }

  // A job started with `resume_from` continues another's curve: that job's steps up to
  // the checkpoint it started from are drawn before its own, in grey, and linked.
  async loadParent(job) {
    const from = job.spec.resume_from;
    this.parent = null;
    if (!from) return;
    const base = `/v1/jobs/${encodeURIComponent(from.job_id)}`;
    const upTo = from.step ?? Infinity;
    let parent;
    const rows = [];
    try {
      parent = await api(base);
      // Page through its metrics up to the step this job started from.
      for (let since = 0; ;) {
        const page = (await api(`${base}/metrics?since_step=${since}&limit=10000`)).metrics;
        rows.push(...page.filter((r) => r.step <= upTo));
        if (page.length < 10000 || page.at(-1).step >= upTo) break;
        since = page.at(-1).step;
      }
    } catch {
      return;  // gone, or not this user's to see: the job's own curve stands alone
    }
    this.parent = { job: parent, rows };
    const link = $("parent-link");
    link.replaceChildren("Continues ", el("a", { href: `#/jobs/${parent.id}`, text: parent.name }),
      ` from ${from.step ? `its step ${from.step}` : "its newest checkpoint"} (its curve in grey).`);
    link.hidden = false;
    this.charts[0].dispose();
    this.charts[0] = new Chart($("loss-chart"), [...LOSS_SERIES,
      { key: "parent_loss", label: `${parent.name} (before)`, color: "#9aa3b2" }], { marked: true });
  }

  dispose() {
    this.disposed = true;
    for (const chart of this.charts) chart.dispose();
    this.profiling.stop();
  }

  async act(verb, question) {
    if (question && !window.confirm(question)) return;
    $("action-error").textContent = "";
    try {
      await api(`/v1/jobs/${encodeURIComponent(this.jobId)}/${verb}`, { method: "POST" });
    } catch (err) {
      $("action-error").textContent = `Could not ${verb}: ${err.message}`;
    }
    this.onChange?.();
  }

  // An ended job, with its logs, metrics and checkpoints; then the list.
  async remove() {
    if (!window.confirm("Delete this job with its logs, metrics and checkpoints?")) return;
    $("action-error").textContent = "";
    try {
      await api(`/v1/jobs/${encodeURIComponent(this.jobId)}`, { method: "DELETE" });
    } catch (err) {
      $("action-error").textContent = `Could not delete: ${err.message}`;
      return;
    }
    window.location.hash = "#/";
  }

  renderJob(job) {
    document.title = `${job.name} · Shardline`;
    $("job-title").textContent = job.name;
    $("job-state").textContent = job.state;
    $("job-state").className = `state ${job.state}`;
    $("cancel").hidden = TERMINAL.has(job.state) || job.state === "CANCELLING";
    $("pause").hidden = job.state !== "RUNNING";
    $("resume").hidden = job.state !== "PAUSED";
    $("delete").hidden = !TERMINAL.has(job.state);
    this.profiling.show(job);
    const m = job.latest_metrics ?? {};
    const rows = [
      ["Job id", job.id], ["Owner", job.owner], ["Priority", job.priority],
      ["Step", `${job.step}/${job.steps}`],
      ["Loss", fmt(m.loss)], ["Tokens/s", fmt(m.tokens_per_s, 0)], ["Restarts", job.restarts],
      // The budget only while it can still be spent: an ended job was retried or not.
      ["Failures", TERMINAL.has(job.state) ? String(job.failures)
        : `${job.failures} of at most ${job.spec.fault_tolerance?.max_failures ?? "–"}`],
      ["Age", age(job.created_at)], ["Started", when(job.started_at)],
      ["Finished", when(job.finished_at)],
    ];
    if (job.restarts > 0) {
      // What recoveries cost: steps trained again, seconds lost, share of time kept.
      rows.push(["Steps lost", job.steps_lost], ["Seconds lost", fmt(job.seconds_lost, 1)]);
      rows.push(["Goodput", job.goodput === null ? "–" : `${(job.goodput * 100).toFixed(1)}%`]);
    }
    if (job.queue_reason && job.state === "QUEUED") rows.push(["Waiting for", job.queue_reason]);
    if (job.failure_reason) rows.push(["Failure", job.failure_reason]);
    $("job-summary").replaceChildren(
      ...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })]),
    );
    const spec = JSON.stringify(job.spec, null, 2);
    if ($("spec").textContent !== spec) $("spec").textContent = spec;
  }

  addEvents(events) {
    this.events.push(...events);
    for (const event of events) {
      if (event.data?.kind === "placement" && event.data.ranks) {
        // Each rank's node, as an index into the event's distinct nodes.
        this.rankNodes = event.data.ranks.map((i) => event.data.nodes[i]);
      }
    }
    if (events.some((e) => ["recovery", "checkpoint_committed"].includes(e.data?.kind)
      || e.kind === "state")) {
      this.renderMarks();
    }
    for (const event of events) {
      this.lastEventId = Math.max(this.lastEventId, event.id);
      const moved = event.kind === "state" && event.data;
      const what = moved ? `${event.data.from} → ${event.data.to}: ${event.message}` : event.message;
      const time = el("time", { datetime: event.time, text: event.time.slice(11, 19) });
      $("timeline").append(el("li", { class: `kind-${event.kind}` }, time, what));
      const recovered = event.data && event.data.kind === "recovery";
      if ((moved && event.data.to === "RESTARTING") || recovered) {
        $("restarts").append(el("li", {}, time.cloneNode(true), " ", event.message));
        $("no-restarts").hidden = true;
      }
    }
  }

  addMetrics(rows) {
    if (rows.length === 0) return;
    this.metrics.push(...rows);
    this.lastStep = rows.at(-1).step;
    this.drawCharts();
    if (this.job) renderRanks(this.job, this.metrics, this.rankNodes);
  }

  renderMarks() {
    this.marks = marksFrom(this.events);
    const told = this.marks.filter((m) => m.kind !== "checkpoint");
    const saved = this.marks.filter((m) => m.kind === "checkpoint");
    const items = told.map((m) => el("li", { class: m.kind, text: m.text }));
    if (saved.length) {
      items.push(el("li", { class: "checkpoint", text:
        `${saved.length} checkpoint${saved.length === 1 ? "" : "s"} (dotted), the newest at ` +
        `step ${saved.at(-1).step}` }));
    }
    $("marks").replaceChildren(...items);
    this.drawCharts();
  }

  drawCharts() {
    if (!this.charts) return;
    const ended = Boolean(this.job && TERMINAL.has(this.job.state));
    const shown = {
      smoothing: Number($("smoothing").value), log: $("log-scale").checked,
      marks: this.marks ?? [], ended,
    };
    $("mfu-figure").hidden = !this.metrics.some((r) => Number.isFinite(r.mfu));
    $("memory-figure").hidden = !this.metrics.some((r) => r.mem_bytes);
    $("traffic-figure").hidden = !this.metrics.some((r) => r.grad_bytes > 0);
    // Local SGD sends its bytes only when the replicas sync: say how often that was.
    const outer = this.metrics.findLast((r) => Number.isFinite(r.outer_steps));
    $("outer-steps").hidden = !outer;
    if (outer) {
      $("outer-steps").textContent = `Local SGD: ${outer.outer_steps} outer ` +
        `step${outer.outer_steps === 1 ? "" : "s"} (replicas averaged) by step ${outer.step}.`;
    }
    // Async replicas: how stale the gradients the parameter servers took were.
    const stale = this.metrics.findLast((r) => Number.isFinite(r.staleness_mean));
    $("staleness").hidden = !stale;
    if (stale) {
      const dropped = this.metrics.reduce((n, r) => n + (r.stale_dropped ?? 0), 0);
      $("staleness").textContent = `Async: gradients ${stale.staleness_mean.toFixed(2)} ` +
        `steps stale on average, at most ${stale.staleness_max}, by step ${stale.step}; ` +
        `${dropped} dropped as too stale in all.`;
    }
    // The parent's steps before this job's own, where it has one (they never overlap).
    const first = this.metrics[0]?.step ?? Infinity;
    const before = (this.parent?.rows ?? []).filter((r) => r.step < first)
      .map((r) => ({ step: r.step, parent_loss: r.loss }));
    const lossRows = before.length ? [...before, ...this.metrics] : this.metrics;
    this.charts.forEach((chart, i) => chart.update(i === 0 ? lossRows : this.metrics, shown));
  }

  renderCheckpoints(checkpoints) {
    $("no-checkpoints").hidden = checkpoints.length > 0;
    $("checkpoints").hidden = checkpoints.length === 0;
    $("checkpoints").tBodies[0].replaceChildren(...checkpoints.map((c) => el("tr", {},
      el("td", { "data-label": "Step", text: String(c.step) }),
      el("td", { "data-label": "Size", text: `${(c.bytes / 2 ** 20).toFixed(1)} MiB` }),
      el("td", { "data-label": "Layout", text: c.layout }),
      el("td", { "data-label": "Time", text: c.created_at.slice(0, 19).replace("T", " ") }),
    )));
  }

  renderLogs(logs) {
    const picker = $("rank");
    const known = [...picker.options].map((o) => Number(o.value));
    if (logs.ranks.length && logs.ranks.join() !== known.join()) {
      const chosen = picker.value;
      picker.replaceChildren(...logs.ranks.map((r) => el("option", { value: String(r), text: String(r) })));
      picker.value = chosen;
    }
    const box = $("log");
    const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    const text = logs.lines.join("\n");
    if (box.textContent !== text) {
      box.textContent = text;
      if (atBottom) box.scrollTop = box.scrollHeight;
    }
  }
}

function when(iso) {
  return iso ? iso.slice(0, 19).replace("T", " ") + " UTC" : "–";
}
