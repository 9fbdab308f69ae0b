// One session: its header, the transcript, the family tree with the diff of two branches, the
// details, the time-travel slider, the live tail and the export buttons.

import * as api from "./api.js";
import { h, json, shortId, when } from "./dom.js";
import { forkTree } from "./tree.js";
import { contentOf, LOOK, PAGE, Transcript } from "./transcript.js";

export async function sessionView(view, sid, page) {
  const base = `/v1/viewer/sessions/${encodeURIComponent(sid)}`;
  const live = { position: null, version: null };
  const fetchPage = (after, limit) =>
    api.get(`${base}/messages`, { after, limit, as_of: live.position ?? undefined });
  const first = fetchPage(0, PAGE + LOOK); // the first screen, read beside the header
  first.catch(() => {});
  const header = await api.get(base);
  const transcript = new Transcript(fetchPage, header.length, { first });
  const title = h("h1", { text: header.title || shortId(sid), title: sid });
  const facts = h("dl", { class: "facts" }, factsOf(sid, header));
  const details = h("div", { class: "details" }, ...detailsOf(header));
  const refresh = (data) => {
    facts.replaceChildren(...factsOf(sid, data));
    details.replaceChildren(...detailsOf(data));
  };
  const slider = timeTravel(header, async (version) => {
    const data = await api.get(base, version === null ? {} : { version });
    live.position = version === null ? null : data.as_of;
    refresh(data);
    transcript.setLength(data.length, { reset: true });
    return version === null ? null : data;
  });
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
  tail(sid, header.head, live, {
    transcript, slider, liveState, follow, base, refresh, ...page,
  });
}

function factsOf(sid, data) {
  const items = [
    ["Session", sid], ["Status", data.status], ["Source", data.source],
    ["Principal", data.principal || "—"], ["Created", when(data.created_at)],
    ["Messages", data.length], ["Events", data.events],
    ["Last activity", when(data.last_activity_at)],
  ];
  return items.map(([name, value]) => [h("dt", { text: name }), h("dd", { text: value })]).flat();
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
      parts.onHead(event.id, event.hash);
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
  parts.cleanup.push(() => stream.close());
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

