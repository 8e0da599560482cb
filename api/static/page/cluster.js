// The cluster page: each node and what holds it, and the queue in admission order with a
// priority control on each queued job (the server decides who may change what).

import { age, api, el } from "./api.js";

const $ = (id) => document.getElementById(id);
const NODE_COLUMNS = ["Node", "State", "CPU", "GPU", "Memory", "Held by"];
const QUEUE_COLUMNS = ["Position", "Name", "Owner", "Priority", "Waiting", "Why"];

function gib(bytes) {
  return bytes ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : "–";
}

function amount(resources, key) {
  return key === "memory" ? gib(resources.memory) : String(resources[key] ?? 0);
}

function row(columns, cells) {
  return el("tr", {}, ...cells.map((cell, i) => {
    const td = el("td", { "data-label": columns[i] });
    td.append(cell);
    return td;
  }));
}

export class ClusterPage {
  constructor() {
    $("queue-error").textContent = "";
    $("queue").tBodies[0].replaceChildren();
    $("nodes").tBodies[0].replaceChildren();
  }

  async refresh() {
    const info = await api("/v1/cluster");
    const free = info.available ?? {};
    $("cluster-summary").textContent = info.connected
      ? `${info.message}: ${free.CPU ?? 0} of ${info.resources.CPU ?? 0} CPU and ` +
        `${free.GPU ?? 0} of ${info.resources.GPU ?? 0} GPU free.`
      : info.message;
    this.renderNodes(info);
    this.renderQueue(info.queue);
    return true;  // polled for as long as it is shown
  }

  renderNodes(info) {
    const none = info.nodes.length === 0;
    $("no-nodes").hidden = !none;
    $("no-nodes").textContent = info.connected ? "No node has joined." : "No cluster attached.";
    $("nodes").hidden = none;
    $("nodes").tBodies[0].replaceChildren(...info.nodes.map((node) => {
      const held = el("ul", { class: "held" }, ...node.held.map((h) => {
        const what = `${h.ranks} rank${h.ranks === 1 ? "" : "s"}, ${h.resources.CPU ?? 0} CPU` +
          (h.resources.GPU ? `, ${h.resources.GPU} GPU` : "");
        const who = h.job_id
          ? el("a", { href: `#/jobs/${h.job_id}`, text: h.name ?? h.job_id })
          : el("span", { text: "another user's job" });
        return el("li", {}, who, ` · ${what}`);
      }));
      if (node.held.length === 0) held.append(el("li", { class: "empty", text: "nothing" }));
      const state = el("span", { class: node.alive ? "" : "dead", text: node.alive ? "alive" : "dead" });
      const name = el("span", { title: node.node_id, text: node.address });
      return row(NODE_COLUMNS, [name, state, amount(node.resources, "CPU"),
        amount(node.resources, "GPU"), amount(node.resources, "memory"), held]);
    }));
  }

  renderQueue(queue) {
    $("no-queue").hidden = queue.length > 0;
    $("queue").hidden = queue.length === 0;
    const body = $("queue").tBodies[0];
    // A priority being typed is not overwritten by the next poll.
    if (body.contains(document.activeElement)) return;
    body.replaceChildren(...queue.map((job) => {
      const input = el("input", {
        type: "number", min: "-1000", max: "1000", step: "1", value: String(job.priority),
        "aria-label": `Priority of ${job.name}`,
      });
      const set = el("button", { type: "button", text: "Set" });
      set.onclick = () => this.setPriority(job, input.value.trim());
      const control = el("div", { class: "set-priority" }, input, set);
      const tr = row(QUEUE_COLUMNS, [String(job.position),
        el("a", { href: `#/jobs/${job.id}`, text: job.name }), job.owner, control,
        age(job.created_at), job.reason ?? "waiting for the scheduler's next look"]);
      tr.dataset.jobId = job.id;
      return tr;
    }));
  }

  async setPriority(job, typed) {
    $("queue-error").textContent = "";
    if (!/^-?\d{1,4}$/.test(typed)) {
      $("queue-error").textContent =
        `${job.name}'s priority: give a whole number from -1000 to 1000, not "${typed}"`;
      return;
    }
    const priority = Number(typed);
    try {
      await api(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: "PATCH", json: { priority } });
    } catch (err) {
      $("queue-error").textContent = `Could not change ${job.name}'s priority: ${err.message}`;
    }
    document.activeElement?.blur();
    this.onChange?.();
  }
}
