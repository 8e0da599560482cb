// Profiling from the job page: ask every rank of the running job to record its next
// steps, follow the profile, then offer the merged Chrome trace (for Perfetto).

import { api, download } from "./api.js";

const $ = (id) => document.getElementById(id);
const FOLLOW_MS = 1000;

export class ProfileControl {
  constructor(jobId) {
    this.base = `/v1/jobs/${encodeURIComponent(jobId)}`;
    this.jobId = jobId;
    this.current = null;
    $("profile-state").textContent = "";
    $("profile-trace").hidden = true;
    $("profile").onclick = () => this.start();
    $("profile-trace").onclick = (event) => { event.preventDefault(); this.download(); };
  }

  show(job) {
    $("profile-box").hidden = job.state !== "RUNNING" && this.current === null;
    $("profile").disabled = job.state !== "RUNNING" || this.current?.state === "recording";
  }

  async start() {
    const steps = Number($("profile-steps").value);
    $("profile-trace").hidden = true;
    try {
      this.current = await api(`${this.base}/profile`, { method: "POST", json: { steps } });
    } catch (err) {
      $("profile-state").textContent = `Could not profile: ${err.message}`;
      return;
    }
    this.follow();
  }

  stop() {
    this.stopped = true;  // the page moved on: no more polls, no more writes to it
    clearTimeout(this.timer);
  }

  async follow() {
    if (this.stopped) return;
    const p = this.current;
    try {
      this.current = await api(`${this.base}/profiles/${p.id}`);
      if (this.stopped) return;
    } catch (err) {
      $("profile-state").textContent = `Profile ${p.id}: ${err.message}`;
      return;
    }
    const now = this.current;
    $("profile").disabled = now.state === "recording";
    if (now.state === "recording") {
      $("profile-state").textContent =
        `Recording ${now.steps} steps: ${now.ranks_done.length} of ${now.world_size} ranks done`;
      this.timer = setTimeout(() => this.follow(), FOLLOW_MS);
    } else if (now.state === "done") {
      $("profile-state").textContent = `Profile of ${now.steps} steps on ${now.world_size} rank(s):`;
      $("profile-trace").hidden = false;
    } else {
      $("profile-state").textContent = `Profile failed: ${now.error}`;
    }
  }

  async download() {
    if (this.current?.state !== "done") return;
    const name = `profile-${this.jobId}-${this.current.id}.json`;
    const failed = await download(this.current.trace, name);
    if (failed) $("profile-state").textContent = `Could not download the trace: ${failed}`;
  }
}
