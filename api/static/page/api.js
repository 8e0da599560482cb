// The JSON API as the page uses it: one fetch wrapper, three kinds of failure.

const TOKEN_KEY = "shardline-token";

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

// The token lives in localStorage, never in a URL, so it is not in history or server logs.
export const token = {
  get: () => localStorage.getItem(TOKEN_KEY),
  set: (value) => localStorage.setItem(TOKEN_KEY, value),
  clear: () => localStorage.removeItem(TOKEN_KEY),
};

export class Rejected extends Error {}     // 401: the token is wrong or revoked
export class Unreachable extends Error {}  // no answer, or a proxy in front says the API is down
export class Refused extends Error {}      // any other 4xx/5xx; message is the API's

export async function api(path, { method = "GET", json = undefined } = {}) {
  let response;
  const headers = { Authorization: `Bearer ${token.get()}` };
  if (json !== undefined) headers["Content-Type"] = "application/json";
  try {
    response = await fetch(path, {
      method,
      cache: "no-store",
      headers,
      body: json === undefined ? undefined : JSON.stringify(json),
    });
  } catch (err) {
    throw new Unreachable(String(err));
  }
  if (response.status === 401) throw new Rejected("token rejected");
  if ([502, 503, 504].includes(response.status)) throw new Unreachable(`HTTP ${response.status}`);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Refused(body?.error?.message ?? `HTTP ${response.status}`);
  }
  return body;
}

export function el(tag, attrs = {}, ...children) {
  // Text goes in through textContent only: job names and log lines are user data.
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

export function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  return Math.abs(value) >= 1000 ? Math.round(value).toLocaleString("en") : value.toFixed(digits);
}

export function age(iso, now = Date.now()) {
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

// Saves what `path` answers as a file: fetched with the token (a plain link would carry
// none), then handed to the browser as a download. Returns an error message, or null.
export async function download(path, filename) {
  let response;
  try {
    response = await fetch(path, { headers: { Authorization: `Bearer ${token.get()}` } });
  } catch (err) {
    return `cannot reach the server (${err})`;
  }
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    return body?.error?.message ?? `HTTP ${response.status}`;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = filename;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  return null;
}
