// One job: summary, charts, timeline, restarts, checkpoints, log tail and actions.

import { TERMINAL, age, api, el, fmt } from "./api.js";
import { drawChart } from "./charts.js";

const LOG_LINES = 200;
const $ = (id) => document.getElementById(id);

export class JobPage {
  constructor(jobId) {
    this.jobId = jobId;
    this.lastEventId = 0;
    this.lastStep = 0;
    this.metrics = [];
    this.job = null;
    for (const id of ["timeline", "restarts", "log", "spec", "job-summary", "action-error"]) {
      $(id).replaceChildren();
    }
    $("checkpoints").tBodies[0].replaceChildren();
    $("no-restarts").hidden = false;
    $("rank").replaceChildren(el("option", { value: "0", text: "0" }));
    $("rank").onchange = () => this.onChange?.();
    $("cancel").onclick = () => this.act("cancel", "Cancel this job?");
    $("pause").onclick = () => this.act("pause");
    $("resume").onclick = () => this.act("resume");
    this.drawCharts();
  }

  async refresh() {
    const base = `/v1/jobs/${encodeURIComponent(this.jobId)}`;
    // The job first: if it has ended, what is read after it is complete.
    const job = await api(base);
    const rank = $("rank").value || "0";
    const [events, metrics, checkpoints, logs] = await Promise.all([
      api(`${base}/events?after=${this.lastEventId}&limit=1000`),
      api(`${base}/metrics?since_step=${this.lastStep}&limit=10000`),
      api(`${base}/checkpoints`),
      api(`${base}/logs?rank=${rank}&tail=${LOG_LINES}`),
    ]);
    this.job = job;
    this.renderJob(job);
    this.addEvents(events.events);
    this.addMetrics(metrics.metrics);
    this.renderCheckpoints(checkpoints.checkpoints);
    this.renderLogs(logs);
    return !TERMINAL.has(job.state);  // a finished job is not polled any more
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

  renderJob(job) {
    document.title = `${job.name} · Shardline`;
    $("job-title").textContent = job.name;
    $("job-state").textContent = job.state;
    $("job-state").className = `state ${job.state}`;
    $("cancel").hidden = TERMINAL.has(job.state) || job.state === "CANCELLING";
    $("pause").hidden = job.state !== "RUNNING";
    $("resume").hidden = job.state !== "PAUSED";
    const m = job.latest_metrics ?? {};
    const rows = [
      ["Job id", job.id], ["Owner", job.owner], ["Priority", job.priority],
      ["Step", `${job.step}/${job.steps}`],
      ["Loss", fmt(m.loss)], ["Tokens/s", fmt(m.tokens_per_s, 0)], ["Restarts", job.restarts],
      ["Failures", `${job.failures} of at most ${job.spec.fault_tolerance?.max_failures ?? "–"}`],
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
    for (const event of events) {
      this.lastEventId = Math.max(this.lastEventId, event.id);
      const moved = event.kind === "state" && event.data;
      const what = moved ? `${event.data.from} → ${event.data.to}: ${event.message}` : event.message;
      const time = el("time", { datetime: event.time, text: event.time.slice(11, 19) });
      $("timeline").append(el("li", { class: `kind-${event.kind}` }, time, what));
      const recovered = event.data && event.data.kind === "recovery";
      if ((moved && event.data.to === "RESTARTING") || recovered) {
        $("restarts").append(el("li", {}, time.cloneNode(true), event.message));
        $("no-restarts").hidden = true;
      }
    }
  }

  addMetrics(rows) {
    if (rows.length === 0) return;
    this.metrics.push(...rows);
    this.lastStep = rows.at(-1).step;
    this.drawCharts();
  }

  drawCharts() {
    const series = (key) => this.metrics.filter((r) => r[key] != null).map((r) => [r.step, r[key]]);
    drawChart($("loss-chart"), [
      { name: "loss", points: series("loss") }, { name: "val_loss", points: series("val_loss") },
    ]);
    drawChart($("throughput-chart"), [{ name: "tokens_per_s", points: series("tokens_per_s") }]);
  }

  renderCheckpoints(checkpoints) {
    $("no-checkpoints").hidden = checkpoints.length > 0;
    $("checkpoints").hidden = checkpoints.length === 0;
    $("checkpoints").tBodies[0].replaceChildren(...checkpoints.map((c) => el("tr", {},
      el("td", { text: String(c.step) }), el("td", { text: `${(c.bytes / 2 ** 20).toFixed(1)} MiB` }),
      el("td", { text: c.layout }), el("td", { text: c.created_at.slice(0, 19) }),
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
