// Wires the views to the URL hash, the token and one polling loop.

import { Rejected, Unreachable, token } from "./api.js";
import { ClusterPage } from "./cluster.js";
import { ComparePage } from "./compare.js";
import { JobPage } from "./job.js";
import { JobList } from "./list.js";

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
let view = null;
let timer = null;
let generation = 0;  // a poll that returns after the view changed is dropped

function showOnly(sectionId) {
  for (const id of ["login", "jobs-view", "job-view", "cluster-view", "compare-view"]) {
    $(id).hidden = id !== sectionId;
  }
  $("logout").hidden = sectionId === "login";
}

function showLogin(rejected) {
  clearTimeout(timer);
  view?.dispose?.();
  view = null;
  $("offline").hidden = true;
  $("login-rejected").hidden = !rejected;
  showOnly("login");
  $("token").focus();
}

function open() {
  view?.dispose?.();  // its charts stop watching their boxes, its timers stop
  view = null;
  if (!token.get()) return showLogin(false);
  let shown;
  const match = location.hash.match(/^#\/jobs\/([\w.-]+)$/);
  if (match) [view, shown] = [new JobPage(match[1]), "job-view"];
  else if (location.hash === "#/cluster") [view, shown] = [new ClusterPage(), "cluster-view"];
  else if (location.hash.startsWith("#/compare/")) {
    const ids = location.hash.slice("#/compare/".length).split(",").filter((id) => /^[\w.-]+$/.test(id));
    [view, shown] = [new ComparePage(ids), "compare-view"];
  }
  else [view, shown] = [new JobList(), "jobs-view"];
  view.onChange = poll;
  showOnly(shown);
  poll();
}

async function poll() {
  clearTimeout(timer);
  const mine = ++generation;
  const current = view;
  let again = true;
  try {
    again = await current.refresh();
    if (mine !== generation) return;
    $("offline").hidden = true;
  } catch (err) {
    if (mine !== generation) return;
    if (err instanceof Rejected) {
      token.clear();
      return showLogin(true);
    }
    // Unreachable: say so and keep retrying; anything else is shown and retried too.
    $("offline").hidden = !(err instanceof Unreachable);
    if (!(err instanceof Unreachable)) console.error(err);
  }
  if (again) timer = setTimeout(poll, POLL_MS);
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token.set($("token").value.trim());
  $("token").value = "";
  open();
});
$("logout").addEventListener("click", () => {
  token.clear();
  showLogin(false);
});
window.addEventListener("hashchange", open);
open();
