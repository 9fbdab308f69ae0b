// The family of a session as a picture: each session is a bar as long as its transcript, a fork
// starts under its parent's bar at the message it branched from, a sub-agent session hangs from
// the session that spawned it (dashed). Every bar is a link to that session.

import { svg, shortId } from "./dom.js";

const ROW = 46;
const LEFT = 16;
const WIDTH = 320;
const BAR = 10;
const LABEL = 360; // room right of the longest bar for its label

export function forkTree(family, current, open) {
  const byId = new Map(family.nodes.map((node) => [node.id, { ...node, children: [] }]));
  for (const node of byId.values()) {
    const parent = node.parent_id && byId.get(node.parent_id);
    if (parent) parent.children.push(node);
  }
  const root = byId.get(family.root_id) || byId.values().next().value;
  if (!root) return svg("svg", { class: "tree", role: "img", "aria-label": "No sessions" });
  const rows = [];
  const place = (node, start, depth) => {
    node.start = start;
    node.depth = depth;
    rows.push(node);
    for (const child of node.children) {
      const offset = child.kind === "fork" ? Math.min(child.at ?? 0, node.length ?? 0) : 0;
      place(child, start + offset, depth + 1);
    }
  };
  place(root, 0, 0);
  const extent = Math.max(1, ...rows.map((node) => node.start + Math.max(node.length || 0, 1)));
  const x = (messages) => LEFT + (messages / extent) * WIDTH;
  const height = rows.length * ROW + 12;
  const picture = svg("svg", {
    class: "tree",
    viewBox: `0 0 ${LEFT * 2 + WIDTH + LABEL} ${height}`,
    width: "100%",
    preserveAspectRatio: "xMinYMin meet",
    role: "group",
    "aria-label": `Fork tree of ${rows.length} sessions`,
  });
  rows.forEach((node, row) => {
    node.y = 22 + row * ROW;
  });
  for (const node of rows) {
    const parent = node.parent_id && byId.get(node.parent_id);
    if (!parent || parent.y === undefined) continue;
    const from = x(node.start);
    picture.append(
      svg("path", {
        class: `edge ${node.kind}`,
        d: `M ${from} ${parent.y + BAR / 2} L ${from} ${node.y - BAR / 2}`,
      }),
    );
    if (node.kind === "fork") {
      picture.append(svg("circle", { class: "fork-point", cx: from, cy: parent.y, r: 4 }));
    }
  }
  for (const node of rows) picture.append(bar(node, x, current, open));
  return picture;
}

function bar(node, x, current, open) {
  const left = x(node.start);
  const width = Math.max(x(node.start + Math.max(node.length || 0, 1)) - left, 4);
  const title = node.title && node.title.length > 24 ? `${node.title.slice(0, 23)}…` : node.title;
  const label = title ? `${title} (${shortId(node.id)})` : shortId(node.id);
  const where =
    node.kind === "fork"
      ? node.whole
        ? `whole fork, ${node.at} shared`
        : `fork at message ${node.at}`
      : node.kind === "subagent"
        ? "sub-agent"
        : "root";
  const text = `${label} · ${node.length ?? 0} msgs · ${where}`;
  const group = svg(
    "g",
    {
      class: `node ${node.kind}${node.id === current ? " current" : ""}`,
      tabindex: "0",
      role: "link",
      "data-id": node.id,
      "aria-label": `${text}${node.id === current ? " (this session)" : ""}`,
      onclick: () => open(node.id),
      onkeydown: (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          open(node.id);
        }
      },
    },
    svg("title", {}, `${node.id}\n${node.title || ""}\n${text}`),
    svg("rect", { x: left, y: node.y - BAR / 2, width, height: BAR, rx: 3 }),
    svg("text", { x: left, y: node.y - BAR / 2 - 4 }, text),
  );
  return group;
}
