// The viewer: sign-in, the badge, routing and the sessions list (one session is session.js).
// Read-only: it only ever sends GET requests.

import * as api from "./api.js";
import { clear, h, shortId, when } from "./dom.js";
import { sessionView } from "./session.js";

const $ = (id) => document.getElementById(id);
const state = { status: null, live: null, cleanup: [] };

function takeTokenFromAddress() {
  // A link ending in #token=... signs in once; the token leaves the address bar at once.
  const hash = location.hash;
  if (!hash.startsWith("#token=")) return;
  const token = decodeURIComponent(hash.slice("#token=".length));
  history.replaceState(null, "", location.pathname + location.search);
  if (token) api.setCredential(token);
}

function showSignIn(message) {
  stopAll();
  $("view").hidden = true;
  clear($("view"));
  $("badge").hidden = $("who").hidden = $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
  $("credential").focus();
}

async function signedIn() {
  try {
    state.status = await api.get("/v1/viewer/status");
  } catch (error) {
    if (error instanceof api.AuthError) {
      api.forget();
      showSignIn("That key or token was not accepted.");
      return false;
    }
    throw error;
  }
  $("sign-in").hidden = true;
  $("view").hidden = false;
  $("who").hidden = $("sign-out").hidden = false;
  $("who").textContent = `${state.status.principal}${state.status.admin ? " (admin)" : ""}`;
  showHead(state.status.head, state.status.head_hash);
  verifyChain();
  return true;
}

// The badge: the head of the log and whether its hash chain verified.
const chain = { text: "chain: not checked", ok: null };

function showHead(head, hash) {
  const badge = $("badge");
  badge.hidden = false;
  badge.dataset.head = String(head);
  badge.className = `badge${chain.ok === true ? " ok" : chain.ok === false ? " bad" : ""}`;
  badge.textContent = `${chain.text} · head #${head} ${hash ? hash.slice(0, 16) : "(empty log)"}`;
  badge.title = `${hash ? `head hash ${hash}. ` : ""}Click to verify the chain again.`;
}

// The whole chain is verified once per tab (it is walked end to end on the server); the badge
// says up to which head, and a click verifies again.
const VERIFIED = "sessionlog.verified";

async function verifyChain(again = false) {
  if (!state.status.admin) {
    chain.text = "chain: verifying needs an API key";
    showHead(Number($("badge").dataset.head), state.status.head_hash);
    return;
  }
  let report = again ? null : JSON.parse(sessionStorage.getItem(VERIFIED) || "null");
  if (!report) {
    chain.text = "chain: verifying…";
    chain.ok = null;
    showHead(Number($("badge").dataset.head), state.status.head_hash);
    try {
      report = await api.get("/v1/verify");
      report.head = state.status.head;
      sessionStorage.setItem(VERIFIED, JSON.stringify(report));
    } catch (error) {
      chain.text = `chain: ${error.message}`;
      showHead(Number($("badge").dataset.head), state.status.head_hash);
      return;
    }
  }
  chain.ok = report.ok;
  chain.text = report.ok
    ? `chain verified to #${report.head}`
    : `chain broken at #${report.first_bad_position}`;
  showHead(Number($("badge").dataset.head), state.status.head_hash);
}

function stopAll() {
  for (const stop of state.cleanup.splice(0)) stop();
}

async function route() {
  stopAll();
  const view = clear($("view"));
  const match = location.hash.match(/^#\/s\/(.+)$/);
  try {
    if (match) {
      const page = { onHead: showHead, cleanup: state.cleanup };
      await sessionView(view, decodeURIComponent(match[1]), page);
    }
    else await listView(view);
  } catch (error) {
    if (error instanceof api.AuthError) {
      api.forget();
      showSignIn("Your key or token is no longer accepted.");
      return;
    }
    view.append(h("p", { class: "error", role: "alert", text: error.message }));
  }
}

// The sessions list

async function listView(view) {
  const params = new URLSearchParams(location.hash.replace(/^#\/?\??/, ""));
  const search = h("input", { id: "q", type: "search", value: params.get("q") || "" });
  const status = select("status", ["", "active", "closed"], params.get("status"));
  const source = select(
    "source",
    ["", "seeded", "imported", "runtime", "api"],
    params.get("source"),
    { seeded: "seeded", imported: "imported agent log", runtime: "runtime", api: "API / library" },
  );
  const body = h("tbody");
  const more = h("button", { type: "button", text: "Next page", hidden: true });
  const first = h("button", { type: "button", text: "First page", hidden: true });
  const note = h("p", { class: "muted", role: "status" });
  const filters = h("form", { class: "filters", role: "search" },
    h("label", { for: "q", text: "Search id or title" }), search,
    h("label", { for: "status", text: "Status" }), status,
    h("label", { for: "source", text: "Source" }), source);
  view.append(
    h("h1", { text: "Sessions" }),
    filters,
    h("table", { class: "sessions" },
      h("thead", {}, h("tr", {},
        ["Session", "Title", "Status", "Messages", "Last activity", "Principal", "Source"].map(
          (name) => h("th", { scope: "col", text: name }),
        ))),
      body),
    h("div", { class: "pager" }, first, more),
    note,
  );
  let timer = 0;
  const load = async (cursor) => {
    const page = await api.get("/v1/viewer/sessions", {
      q: search.value.trim(),
      status: status.value,
      source: source.value,
      cursor,
      limit: 50,
    });
    clear(body);
    for (const row of page.data) body.append(sessionRow(row));
    note.textContent = page.data.length ? "" : "No sessions match.";
    more.hidden = !page.next_cursor;
    first.hidden = !cursor;
    more.onclick = () => load(page.next_cursor);
  };
  const reload = () => {
    clearTimeout(timer);
    timer = setTimeout(() => load(undefined).catch(report(note)), 200);
  };
  filters.addEventListener("submit", (event) => event.preventDefault());
  search.addEventListener("input", reload);
  status.addEventListener("change", reload);
  source.addEventListener("change", reload);
  first.onclick = () => load(undefined);
  await load(undefined);
}

function sessionRow(row) {
  return h("tr", { "data-id": row.session_id },
    h("td", {}, h("a", { href: `#/s/${encodeURIComponent(row.session_id)}`, title: row.session_id,
      text: shortId(row.session_id) })),
    h("td", { text: row.title || "" }),
    h("td", { text: row.status }),
    h("td", { class: "number", text: row.length }),
    h("td", { text: when(row.last_activity_at) }),
    h("td", { text: row.principal || "" }),
    h("td", { text: row.source }));
}

function select(id, values, chosen, labels = {}) {
  return h("select", { id },
    values.map((value) => h("option", { value, selected: value === (chosen || ""),
      text: value ? labels[value] || value : "any" })));
}

function report(element) {
  return (error) => {
    element.textContent = error.message;
  };
}

async function start() {
  takeTokenFromAddress();
  $("sign-in").addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = $("credential").value.trim();
    $("credential").value = "";
    if (!value) return;
    api.setCredential(value);
    if (await signedIn()) route();
  });
  $("sign-out").addEventListener("click", () => {
    api.forget();
    showSignIn("Signed out.");
  });
  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#token=")) {
      takeTokenFromAddress();
      signedIn().then((ok) => ok && route());
    } else if (api.credential()) {
      route();
    }
  });
  $("badge").addEventListener("click", () => verifyChain(true));
  if (!api.credential()) {
    showSignIn();
    return;
  }
  // The view and the credential check start together: a refused credential replaces the view
  // with the sign-in (nothing is drawn before the first answer anyway).
  $("view").hidden = false;
  const checked = signedIn();
  route();
  await checked;
}

start();
