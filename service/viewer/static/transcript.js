// A transcript of any length in a scrolling box that holds only what is on screen: messages are
// fetched a page at a time when their page scrolls into view, pages off screen are replaced by
// spacers of their measured (or estimated) height, and at most a few dozen pages stay cached.

import { h, json } from "./dom.js";

export const PAGE = 50;
export const LOOK = 16; // messages read on each side of a page, to pair calls with their results
const CACHE_PAGES = 40;
const LONG_CHARS = 600;
const LONG_LINES = 12;

export class Transcript {
  // fetchPage(after, limit) -> Promise<{data, length}>
  constructor(fetchPage, length, { pruned, first } = {}) {
    this.fetchPage = fetchPage;
    this.first = first; // a read of messages [0, PAGE + LOOK) already under way
    this.length = length;
    this.pruned = pruned || new Map();
    this.pages = new Map(); // page -> {messages, context, start}
    this.loading = new Map();
    this.heights = new Map();
    this.estimate = PAGE * 72;
    this.rendered = new Map(); // page -> element
    this.generation = 0;
    this.top = h("div", { class: "spacer" });
    this.bottom = h("div", { class: "spacer" });
    this.host = h("div", { class: "pages" });
    this.empty = h("p", { class: "muted", text: "No messages." });
    this.element = h(
      "div",
      { class: "transcript", tabindex: "0", role: "log", "aria-label": "Transcript" },
      this.top,
      this.host,
      this.bottom,
    );
    this.element.addEventListener("scroll", () => this.schedule());
    this.resize = new ResizeObserver(() => this.schedule());
    this.resize.observe(this.element);
  }

  pageCount() {
    return Math.ceil(this.length / PAGE);
  }

  heightOf(page) {
    return this.heights.get(page) ?? this.estimate;
  }

  schedule() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => {
      this.pending = 0;
      this.update();
    });
  }

  atEnd() {
    const box = this.element;
    return box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  }

  scrollToEnd() {
    this.element.scrollTop = this.element.scrollHeight;
    this.schedule();
  }

  // The transcript grew (or was replaced, with `reset`): cached pages at the end are stale.
  setLength(length, { reset = false } = {}) {
    const follow = this.atEnd();
    if (reset) {
      this.generation += 1;
      this.pages.clear();
      this.heights.clear();
      this.loading.clear();
    } else {
      const stale = Math.floor(Math.max(Math.min(this.length, length) - LOOK - 1, 0) / PAGE);
      for (const page of [...this.pages.keys()]) if (page >= stale) this.pages.delete(page);
    }
    this.length = length;
    for (const [page, element] of this.rendered) {
      if (!this.pages.has(page)) {
        element.remove();
        this.rendered.delete(page);
      }
    }
    this.update();
    if (follow) this.scrollToEnd();
  }

  setPruned(pruned) {
    this.pruned = pruned;
    for (const element of this.rendered.values()) element.remove();
    this.rendered.clear();
    this.update();
  }

  visiblePages() {
    const box = this.element;
    const from = box.scrollTop - box.clientHeight / 2;
    const to = box.scrollTop + box.clientHeight * 1.5;
    let offset = 0;
    let first = -1;
    let last = -1;
    const count = this.pageCount();
    for (let page = 0; page < count; page += 1) {
      const end = offset + this.heightOf(page);
      if (end >= from && first < 0) first = page;
      if (offset <= to) last = page;
      else break;
      offset = end;
    }
    return first < 0 ? [0, -1] : [first, last];
  }

  update() {
    if (this.length === 0) {
      this.host.replaceChildren(this.empty);
      this.top.style.height = this.bottom.style.height = "0px";
      return;
    }
    this.empty.remove();
    const [first, last] = this.visiblePages();
    for (const [page, element] of this.rendered) {
      if (page < first || page > last) {
        element.remove();
        this.rendered.delete(page);
      }
    }
    const children = [];
    for (let page = first; page <= last; page += 1) {
      let element = this.rendered.get(page);
      if (!element) {
        const data = this.pages.get(page);
        element = data ? this.renderPage(page, data) : this.placeholder(page);
        if (data) this.rendered.set(page, element);
        else this.load(page);
      }
      children.push(element);
    }
    this.host.replaceChildren(...children);
    let above = 0;
    for (let page = 0; page < first; page += 1) above += this.heightOf(page);
    let below = 0;
    for (let page = last + 1; page < this.pageCount(); page += 1) below += this.heightOf(page);
    this.top.style.height = `${above}px`;
    this.bottom.style.height = `${below}px`;
    this.measure(children, first);
  }

  measure(children, first) {
    let changed = false;
    let total = 0;
    let seen = 0;
    children.forEach((element, i) => {
      if (!element.classList.contains("page")) return;
      const height = element.offsetHeight;
      if (height && this.heights.get(first + i) !== height) {
        this.heights.set(first + i, height);
        changed = true;
      }
    });
    for (const height of this.heights.values()) {
      total += height;
      seen += 1;
    }
    if (seen) this.estimate = Math.max(total / seen, 200);
    if (changed) this.schedule();
  }

  placeholder(page) {
    const start = page * PAGE;
    const end = Math.min(start + PAGE, this.length);
    const element = h("div", {
      class: "placeholder",
      text: `Loading messages ${start + 1}–${end}…`,
    });
    element.style.height = `${this.heightOf(page)}px`;
    return element;
  }

  async load(page) {
    if (this.loading.has(page)) return;
    const generation = this.generation;
    const start = page * PAGE;
    const after = Math.max(start - LOOK, 0);
    const limit = start - after + PAGE + LOOK;
    this.loading.set(page, true);
    try {
      const early = page === 0 && this.first;
      this.first = null;
      let answer = await (early || this.fetchPage(after, limit));
      // The early read may predate the header: read again if the transcript changed between.
      if (early && answer.length !== this.length) answer = await this.fetchPage(after, limit);
      if (generation !== this.generation) return;
      this.pages.set(page, { start, after, context: answer.data });
      while (this.pages.size > CACHE_PAGES) this.pages.delete(this.pages.keys().next().value);
      this.schedule();
    } catch (error) {
      const element = h("div", { class: "placeholder error", text: String(error.message) });
      this.host.append(element);
    } finally {
      this.loading.delete(page);
    }
  }

  renderPage(page, data) {
    const element = h("div", { class: "page", "data-page": page });
    const end = Math.min(data.start + PAGE, data.after + data.context.length);
    for (let index = data.start; index < end; index += 1) {
      element.append(this.renderMessage(index, data));
    }
    return element;
  }

  at(data, index) {
    return data.context[index - data.after];
  }

  renderMessage(index, data) {
    const message = this.at(data, index);
    const classes = ["message", `role-${safeClass(message.role)}`];
    const badges = [];
    if (message.summary) {
      classes.push("checkpoint");
      badges.push(h("span", { class: "tag checkpoint-tag", text: "checkpoint" }));
    }
    if (message.synthetic) badges.push(h("span", { class: "tag", text: "synthetic" }));
    const pruned = this.pruned.get(index);
    if (pruned !== undefined) {
      classes.push("pruned");
      badges.push(h("span", { class: "tag pruned-tag", text: "pruned in context" }));
    }
    const call = message.role === "tool" ? this.callOf(index, data) : null;
    if (message.role === "tool" && isError(message)) {
      classes.push("error-result");
      badges.push(h("span", { class: "tag error-tag", text: "error" }));
    }
    const head = h(
      "div",
      { class: "message-head" },
      h("span", { class: "index", text: `#${index + 1}` }),
      h("span", { class: "role", text: message.role }),
      message.name ? h("span", { class: "name", text: message.name }) : null,
      message.model ? h("span", { class: "model", text: message.model }) : null,
      usageText(message.usage) ? h("span", { class: "usage", text: usageText(message.usage) }) : null,
      badges,
    );
    const body = [];
    if (call) {
      body.push(
        h("p", {
          class: "paired-note",
          text: `Result of ${call.name} (call at #${call.index + 1}), shown with the call.`,
        }),
      );
    } else {
      if (message.role === "tool" && message.tool_call_id) {
        body.push(h("p", { class: "muted", text: `Result of call ${message.tool_call_id}` }));
      }
      body.push(contentOf(message.content));
    }
    for (const tool of callsOf(message)) body.push(this.renderCall(tool, index, data));
    if (pruned !== undefined) {
      body.push(h("details", { class: "pruned-view" },
        h("summary", { text: "What the context view shows instead" }),
        contentOf(pruned)));
    }
    return h("article", { class: classes.join(" "), "data-index": index }, head, body);
  }

  renderCall(tool, index, data) {
    const result = this.resultOf(tool.id, index, data);
    const error = result && isError(result.message);
    const parts = [
      h("div", { class: "call-head" },
        h("span", { class: "tag call-tag", text: "tool call" }),
        h("code", { class: "call-name", text: tool.name }),
        tool.id ? h("span", { class: "muted", text: tool.id }) : null),
      block(tool.arguments),
    ];
    if (result) {
      parts.push(
        h("div", { class: `call-result${error ? " error-result" : ""}` },
          h("div", { class: "call-head" },
            h("span", { class: "tag result-tag", text: `result #${result.index + 1}` }),
            error ? h("span", { class: "tag error-tag", text: "error" }) : null),
          contentOf(result.message.content)),
      );
    } else {
      parts.push(h("p", { class: "muted", text: "No result in the next messages." }));
    }
    return h("div", { class: `tool-call${error ? " has-error" : ""}` }, parts);
  }

  // The call a tool result answers, when it is close enough to be shown with it.
  callOf(index, data) {
    const message = this.at(data, index);
    for (let i = index - 1; i >= Math.max(index - LOOK, data.after); i -= 1) {
      for (const tool of callsOf(this.at(data, i))) {
        if (tool.id && tool.id === message.tool_call_id) return { name: tool.name, index: i };
      }
    }
    return null;
  }

  resultOf(id, index, data) {
    if (!id) return null;
    const last = Math.min(index + LOOK, data.after + data.context.length - 1);
    for (let i = index + 1; i <= last; i += 1) {
      const message = this.at(data, i);
      if (message.role === "tool" && message.tool_call_id === id) return { message, index: i };
    }
    return null;
  }
}

function safeClass(text) {
  return String(text || "unknown").replace(/[^a-z0-9_-]/gi, "_");
}

function isError(message) {
  const metadata = message.metadata || {};
  return metadata.is_error === true || message.is_error === true || metadata.status === "error";
}

function callsOf(message) {
  const calls = [];
  for (const call of Array.isArray(message.tool_calls) ? message.tool_calls : []) {
    // A recorded message may hold anything here (null, a number): show what is a call, skip the rest.
    if (!call || typeof call !== "object") continue;
    const fn = call.function && typeof call.function === "object" ? call.function : call;
    calls.push({ id: call.id, name: String(fn.name || "tool"), arguments: fn.arguments ?? fn.input });
  }
  if (Array.isArray(message.content)) {
    for (const part of message.content) {
      if (part && part.type === "tool_use") {
        calls.push({ id: part.id, name: String(part.name || "tool"), arguments: part.input });
      }
    }
  }
  return calls;
}

function usageText(usage) {
  if (!usage || typeof usage !== "object") return "";
  const names = [
    ["input", "in"],
    ["output", "out"],
    ["reasoning", "reasoning"],
    ["cache_read", "cache read"],
    ["cache_write", "cache write"],
  ];
  return names
    .filter(([key]) => typeof usage[key] === "number")
    .map(([key, label]) => `${label} ${usage[key]}`)
    .join(" · ");
}

function block(value) {
  if (value === undefined || value === null || value === "") return null;
  let text = value;
  if (typeof value === "string") {
    try {
      text = json(JSON.parse(value));
    } catch (_) {
      text = value;
    }
  } else {
    text = json(value);
  }
  return long(text, "pre");
}

// Long text is collapsed behind its first line; the whole of it is one click away.
function long(text, tag) {
  const lines = text.split("\n");
  if (text.length <= LONG_CHARS && lines.length <= LONG_LINES) {
    return h(tag, { class: "content", text });
  }
  const first = lines[0].slice(0, 120);
  return h("details", { class: "long" },
    h("summary", { text: `${first}… (${text.length} characters, ${lines.length} lines)` }),
    h(tag, { class: "content", text }));
}

export function contentOf(content) {
  if (content === undefined || content === null) return null;
  if (typeof content === "string") return long(content, "div");
  if (!Array.isArray(content)) return block(content);
  return content.map((part) => {
    if (part && part.type === "text" && typeof part.text === "string") return long(part.text, "div");
    if (part && part.type === "tool_use") return null; // shown as a call
    if (part && part.type === "tool_result") {
      return h("div", { class: `call-result${part.is_error ? " error-result" : ""}` },
        h("span", { class: "tag result-tag", text: "tool result" }),
        part.is_error ? h("span", { class: "tag error-tag", text: "error" }) : null,
        contentOf(part.content));
    }
    if (part && part.type === "image") return h("p", { class: "muted", text: "[image]" });
    return block(part);
  });
}
