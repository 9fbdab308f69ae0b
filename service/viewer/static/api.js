// Talking to the service: the credential lives in this tab's sessionStorage only (never a cookie,
// never localStorage, never a URL), every request carries it as a bearer header, and event
// streams are read with fetch (EventSource cannot send that header) and resumed after a drop
// with Last-Event-ID.

const KEY = "sessionlog.credential";

export class AuthError extends Error {}

export function credential() {
  return sessionStorage.getItem(KEY);
}

export function setCredential(value) {
  sessionStorage.setItem(KEY, value);
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

function headers(extra) {
  return { authorization: `Bearer ${credential() || ""}`, ...extra };
}

export function url(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") query.set(name, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

export async function get(path, params, options = {}) {
  const answer = await fetch(url(path, params), {
    headers: headers(options.headers),
    cache: "no-store",
    signal: options.signal,
  });
  if (answer.status === 401) throw new AuthError("the credential was not accepted");
  if (!answer.ok) {
    let detail = `${answer.status} ${answer.statusText}`;
    try {
      const problem = await answer.json();
      detail = problem.detail || problem.title || detail;
    } catch (_) {
      // not JSON: keep the status line
    }
    throw new Error(detail);
  }
  return options.raw ? answer : answer.json();
}

// Server-Sent Events over fetch. `onEvent({id, event, data})` for each frame; the stream
// reconnects with the last id it saw until `close()` is called or the server reports an error.
export function stream(path, { after, onEvent, onState }) {
  const control = new AbortController();
  let last = after;
  let closed = false;

  async function once() {
    const answer = await fetch(url(path, last === undefined ? {} : { after: last }), {
      headers: headers(last === undefined ? {} : { "last-event-id": String(last) }),
      cache: "no-store",
      signal: control.signal,
    });
    if (answer.status === 401) throw new AuthError("the credential was not accepted");
    if (!answer.ok || !answer.body) throw new Error(`stream: ${answer.status}`);
    onState?.("live");
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return "ended";
      buffer += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = parse(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (!frame) continue;
        if (frame.id !== undefined) last = Number(frame.id);
        if (frame.event === "error") return "error";
        onEvent(frame);
      }
    }
  }

  async function run() {
    let delay = 250;
    while (!closed) {
      try {
        const how = await once();
        if (how === "error") {
          onState?.("stopped");
          return;
        }
        delay = 250;
      } catch (error) {
        if (closed) return;
        if (error instanceof AuthError) {
          onState?.("stopped");
          return;
        }
      }
      if (closed) return;
      onState?.("reconnecting");
      await new Promise((done) => setTimeout(done, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }

  run();
  return {
    close() {
      closed = true;
      control.abort();
    },
    get last() {
      return last;
    },
  };
}

function parse(text) {
  const frame = { data: "" };
  let any = false;
  for (const line of text.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") frame.data += (frame.data ? "\n" : "") + value;
    else if (field === "id" || field === "event") frame[field] = value;
    any = true;
  }
  if (!any) return null;
  try {
    frame.data = frame.data ? JSON.parse(frame.data) : null;
  } catch (_) {
    // a frame that is not JSON is passed on as text
  }
  return frame;
}
