// The viewer: sign-in, the sessions list and one session (transcript, family tree, time travel,
// diff, details, live tail, export). Read-only: it only ever sends GET requests.

import * as api from "./api.js";
import { clear, h, json, shortId, when } from "./dom.js";
import { forkTree } from "./tree.js";
import { contentOf, LOOK, PAGE, Transcript } from "./transcript.js";

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
    if (match) await sessionView(view, decodeURIComponent(match[1]));
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

// One session

async function sessionView(view, sid) {
  const base = `/v1/viewer/sessions/${encodeURIComponent(sid)}`;
  const live = { position: null, version: null };
  const fetchPage = (after, limit) =>
    api.get(`${base}/messages`, { after, limit, as_of: live.position ?? undefined });
  const first = fetchPage(0, PAGE + LOOK); // the first screen, read beside the header
  first.catch(() => {});
  const header = await api.get(base);
  const transcript = new Transcript(fetchPage, header.length, { first });
  const title = h("h1", { text: header.title || shortId(sid), title: sid });
  const facts = h("dl", { class: "facts" });
  const showFacts = (data) => {
    clear(facts);
    const items = [
      ["Session", sid], ["Status", data.status], ["Source", data.source],
      ["Principal", data.principal || "—"], ["Created", when(data.created_at)],
      ["Messages", data.length], ["Events", data.events],
      ["Last activity", when(data.last_activity_at)],
    ];
    for (const [name, value] of items) facts.append(h("dt", { text: name }), h("dd", { text: value }));
  };
  showFacts(header);
  const slider = timeTravel(header, async (version) => {
    if (version === null) {
      live.position = null;
      const now = await api.get(base);
      showFacts(now);
      details.replaceChildren(...detailsOf(now));
      transcript.setLength(now.length, { reset: true });
      return null;
    }
    const past = await api.get(base, { version });
    live.position = past.as_of;
    showFacts(past);
    details.replaceChildren(...detailsOf(past));
    transcript.setLength(past.length, { reset: true });
    return past;
  });
  const details = h("div", { class: "details" }, ...detailsOf(header));
  const treeHost = h("div", { class: "tree-host" });
  const diffHost = h("div", { class: "diff-host" });
  const follow = h("input", { id: "follow", type: "checkbox", checked: true });
  const liveState = h("span", { class: "live-state", role: "status", text: "connecting…" });
  view.append(
    h("nav", { class: "crumbs" }, h("a", { href: "#/", text: "← Sessions" })),
    title,
    facts,
    h("div", { class: "toolbar" },
      slider.element,
      h("span", { class: "live" }, follow, h("label", { for: "follow", text: "Follow new messages" }),
        liveState),
      h("button", { type: "button", text: "Jump to end", onclick: () => transcript.scrollToEnd() }),
      exportForm(sid)),
    h("div", { class: "panes" },
      h("section", { class: "pane-main", "aria-label": "Transcript" }, transcript.element),
      h("aside", { class: "pane-side" },
        h("h2", { text: "Fork tree" }), treeHost,
        h("h2", { text: "Compare branches" }), diffHost,
        h("h2", { text: "Details" }), details)),
  );
  transcript.update();
  loadTree(base, sid, treeHost, diffHost);
  // Pruned results are marked once the first screen is drawn (finding them reads the whole
  // context view on the server).
  first.then(() => api.get(`${base}/pruned`)).then((answer) => {
    transcript.setPruned(new Map(answer.data.map((item) => [item.index, item.shown])));
  }).catch(() => {});
  const refresh = (now) => {
    showFacts(now);
    details.replaceChildren(...detailsOf(now));
  };
  tail(sid, header.head, live, { transcript, slider, liveState, follow, base, refresh });
}

function timeTravel(header, go) {
  const events = header.events;
  const range = h("input", {
    id: "as-of", type: "range", min: 1, max: Math.max(events, 1), value: events, step: 1,
  });
  const label = h("output", { for: "as-of", class: "as-of-label", text: "now" });
  const back = h("button", { type: "button", text: "Now", disabled: true });
  let timer = 0;
  let pending = Promise.resolve();
  const apply = () => {
    const version = Number(range.value);
    const latest = version >= Number(range.max);
    back.disabled = latest;
    label.textContent = latest ? "now" : `event ${version} of ${range.max}…`;
    pending = pending.then(() => go(latest ? null : version)).then((past) => {
      if (past) label.textContent = `as of event ${version} of ${range.max} (log #${past.as_of})`;
      range.dataset.asOf = past ? String(past.as_of) : "";
    }).catch((error) => {
      label.textContent = error.message;
    });
  };
  range.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(apply, 150);
  });
  back.addEventListener("click", () => {
    range.value = range.max;
    apply();
  });
  return {
    element: h("span", { class: "time-travel" },
      h("label", { for: "as-of", text: "Time travel" }), range, label, back),
    grow(count) {
      const latest = Number(range.value) >= Number(range.max);
      range.max = String(count);
      if (latest) range.value = String(count);
      return latest;
    },
    atLatest() {
      return Number(range.value) >= Number(range.max);
    },
  };
}

function detailsOf(data) {
  const parts = [];
  const section = (name, content) => parts.push(h("h3", { text: name }), content);
  section("Live clients", data.live_clients && data.live_clients.length
    ? h("ul", { class: "clients" }, data.live_clients.map((client) =>
      h("li", {}, h("code", { text: client.client_id || client.id || "" }),
        client.client_id === data.live_controller_id ? " (controller) " : " ",
        h("span", { class: "muted", text: json(client) }))))
    : h("p", { class: "muted", text: "None attached." }));
  section("Scratchpad", data.scratchpad === null || data.scratchpad === undefined
    ? h("p", { class: "muted", text: "Empty." })
    : h("pre", { class: "content", text: json(data.scratchpad) }));
  section("Workspace roots", data.roots && data.roots.length
    ? h("ul", {}, data.roots.map((root) => h("li", {}, h("code", {
      text: typeof root === "string" ? root : root.path || json(root) }))))
    : h("p", { class: "muted", text: "None." }));
  if (data.system_prompt) {
    section("System prompt", contentOf(data.system_prompt));
  }
  section("Metadata", h("pre", { class: "content", text: json(data.metadata || {}) }));
  return parts;
}

async function loadTree(base, sid, host, diffHost) {
  try {
    const family = await api.get(`${base}/tree`);
    const open = (id) => {
      location.hash = `#/s/${encodeURIComponent(id)}`;
    };
    host.replaceChildren(forkTree(family, sid, open));
    if (family.cut) host.append(h("p", { class: "muted", text: "The family is larger than shown." }));
    diffForm(sid, family.nodes.filter((node) => node.id !== sid), diffHost);
  } catch (error) {
    host.replaceChildren(h("p", { class: "error", text: error.message }));
  }
}

function diffForm(sid, others, host) {
  if (!others.length) {
    host.replaceChildren(h("p", { class: "muted", text: "No other branch in this family." }));
    return;
  }
  const other = h("select", { id: "diff-with" },
    others.map((node) => h("option", { value: node.id,
      text: `${node.title || shortId(node.id)} (${node.kind})` })));
  const out = h("div", { class: "diff" });
  const run = async () => {
    out.replaceChildren(h("p", { class: "muted", text: "Comparing…" }));
    try {
      const answer = await api.get("/v1/viewer/diff", { a: sid, b: other.value });
      out.replaceChildren(
        h("p", { class: "diff-shared",
          text: `Both share their first ${answer.shared} messages; then:` }),
        h("div", { class: "diff-columns" },
          diffSide("This session", answer.a, answer.shared),
          diffSide(shortId(other.value), answer.b, answer.shared)));
    } catch (error) {
      out.replaceChildren(h("p", { class: "error", text: error.message }));
    }
  };
  host.replaceChildren(
    h("div", { class: "diff-form" },
      h("label", { for: "diff-with", text: "Compare with" }), other,
      h("button", { type: "button", text: "Diff", onclick: run })),
    out);
}

function diffSide(name, side, shared) {
  return h("div", { class: "diff-side" },
    h("h3", { text: `${name}: ${side.length - shared} more` }),
    side.messages.length
      ? side.messages.map((message, i) => h("div", { class: `diff-message role-${message.role}` },
        h("span", { class: "index", text: `#${shared + i + 1} ${message.role}` }),
        contentOf(message.content)))
      : h("p", { class: "muted", text: "Nothing after the fork point." }));
}

const TRANSCRIPT_EVENTS = new Set([
  "message_injected", "messages_injected", "session_reset", "session_trimmed",
  "session_rewound", "session_compacted", "doom_loop_detected",
]);

// New events of this session as they commit: the transcript, the header and the details follow
// (unless the slider shows the past).
function tail(sid, head, live, parts) {
  const { transcript, slider, liveState, follow, base, refresh } = parts;
  let busy = Promise.resolve();
  const stream = api.stream(`/v1/sessions/${encodeURIComponent(sid)}/events/stream`, {
    after: head,
    onState: (what) => {
      liveState.textContent = what;
    },
    onEvent: (frame) => {
      const event = frame.data;
      if (!event || typeof event !== "object" || event.id === undefined) return;
      showHead(event.id, event.hash);
      const latest = slider.grow(event.sequence);
      if (!latest || live.position !== null) return;
      busy = busy.then(async () => {
        const now = await api.get(base);
        if (live.position !== null) return;
        refresh(now);
        if (!TRANSCRIPT_EVENTS.has(event.event)) return;
        const grew = event.event === "message_injected" || event.event === "messages_injected";
        const wasAtEnd = transcript.atEnd();
        transcript.setLength(now.length, { reset: !grew });
        if (follow.checked && (wasAtEnd || grew)) transcript.scrollToEnd();
      }).catch(() => {});
    },
  });
  state.cleanup.push(() => stream.close());
}

function exportForm(sid) {
  const modes = [
    ["sanitized", "sanitized (secrets redacted)"],
    ["replay_only", "replay only"],
    ["local", "local (everything)"],
  ];
  const note = h("span", { class: "muted", role: "status" });
  const form = h("form", { class: "export" },
    h("fieldset", {},
      h("legend", { text: "Export bundle" }),
      modes.map(([mode, label]) => h("label", {},
        h("input", { type: "radio", name: "mode", value: mode, checked: mode === "sanitized" }),
        ` ${label}`)),
      h("button", { type: "submit", text: "Download" }),
      note));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const mode = new FormData(form).get("mode");
    note.textContent = "Exporting…";
    try {
      const answer = await api.get(`/v1/sessions/${encodeURIComponent(sid)}/bundle`, { mode },
        { raw: true });
      const blob = await answer.blob();
      const link = h("a", { href: URL.createObjectURL(blob), download: `${sid}.${mode}.json` });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
      note.textContent = `Downloaded (${mode}).`;
    } catch (error) {
      note.textContent = error.message;
    }
  });
  return form;
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
