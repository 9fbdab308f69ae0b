"""The session viewer in a real browser: the distribution's headless Chromium, driven by Playwright,
against a real `sessionlog serve` on loopback over a real LMDB store.

One server and one browser serve the whole module; each test opens its own page (its own
sessionStorage). Screenshots of each view go to var/screenshots/ (not committed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

import replay
from service._access import OWNER_KEY
from sessions import ContextPolicy, SessionStore
from tests import _browser
from tests._service import Server

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "demo" / "sample_transcript.jsonl"
CLAUDE_LOG = (
    ROOT
    / "tests/fixtures/agent-logs/claude-code/sample-project/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
)
CLAUDE_MAIN = "claude-code-dfe08cd71c5d7cc1b99faedc065c98c8"  # the blake3 of the log's first line
XSS = [
    '<img src=x onerror="window.__xss=1">',
    "<script>window.__xss=2</script>",
    '"><svg onload="window.__xss=3">',
    "javascript:window.__xss=4",
]
BIG = 100_000
WAIT_MS = 10_000
"""How long an expectation may wait before it fails: a bound on a broken page, not a speed claim
(speed is measured in bench/)."""


def _build(path: Path) -> dict[str, str]:
    """The demo's sessions (seeded, continued, forked twice, clients attached, one fork
    compacted), plus sessions made for these tests. Returns bearer tokens by principal."""
    with SessionStore.open(path) as store:
        assert replay.seed_from_jsonl(store, SAMPLE, rename_session="release-1").ok
        store.rename("release-1", "Release 1.4 changelog")
        store.inject("release-1", {"role": "user", "content": "Good. Add them to the changelog."})
        store.fork("release-1", "release-1-retry")
        store.fork_at("release-1", 4, "release-1-at-4")
        store.attach("release-1", "ui-1", {"mode": "observer"})
        store.compact("release-1-retry", keep_last=4, compact_strategy="truncate")

        store.open_session("xss", title=XSS[0])
        for text in XSS:
            store.inject("xss", {"role": "user", "content": text})
        store.inject(
            "xss",
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
                ],
            },
        )
        store.inject(
            "xss",
            {
                "role": "assistant",
                "content": "counted",
                "model": "mock-large",
                "usage": {"input": 12, "output": 34},
            },
        )
        store.inject(
            "xss",
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "permission denied",
                "metadata": {"is_error": True},
            },
        )

        store.open_session("steps", title="three steps")
        for n in range(1, 4):
            store.inject("steps", {"role": "user", "content": f"step number {n}"})

        store.open_session("alice-secret", title="alice only", metadata={OWNER_KEY: "alice"})
        store.inject("alice-secret", {"role": "user", "content": "the plan of alice"})

        store.open_session("big", title="one hundred thousand")
        batch = 10_000
        for start in range(0, BIG, batch):
            store.inject_many(
                "big",
                [
                    {"role": "user", "content": f"message {n + 1}"}
                    for n in range(start, start + batch)
                ],
            )
        imported = replay.import_agent_log(store, CLAUDE_LOG)
        assert imported.files[0].sessions[0].session_id == CLAUDE_MAIN
        expires = "2999-01-01T00:00:00Z"
        tokens = {
            "alice": store.tokens.create("alice", expires).token,
            "bob": store.tokens.create("bob", expires).token,
        }
    _build_context(path)
    return tokens


def _build_context(path: Path) -> None:
    """A session whose context policy summarized older turns into checkpoints and pruned large
    tool results from the context view."""
    policy = ContextPolicy(
        window_tokens=6_000,
        summarizer=lambda messages, **_: f"summary of {len(messages)} messages",
        prunable_chars_min=1_000,
        aggressive_prunable_chars_min=1_000,
    )
    with SessionStore.open(path, context_policy=policy) as store:
        store.open_session("ctx", title="context maintained")
        for turn in range(8):
            call = {"id": f"t{turn}", "type": "function", "function": {"name": "read"}}
            store.inject_many(
                "ctx",
                [
                    {"role": "user", "content": f"turn {turn}"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"t{turn}", "content": "x" * 12_000},
                    {"role": "assistant", "content": f"done {turn}"},
                ],
            )
            store.maintain_context("ctx")


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    path = tmp_path_factory.mktemp("viewer") / "store"
    tokens = _build(path)
    server = Server(path).start()
    try:
        with sync_playwright() as playwright:
            browser = _browser.launch(playwright)
            try:
                yield {"server": server, "browser": browser, "tokens": tokens}
            finally:
                browser.close()
    finally:
        server.stop()


def _page(viewer: dict[str, Any], token: str | None = None) -> Page:
    page: Page = viewer["browser"].new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors  # type: ignore[attr-defined]
    server: Server = viewer["server"]
    token = token or server.admin_key
    page.goto(f"{server.url}/#token={token}")
    expect(page.locator("#badge")).to_be_visible(timeout=WAIT_MS)
    return page


def _close(page: Page) -> None:
    """Close a page, failing the test if any script on it raised."""
    errors = getattr(page, "errors", [])
    page.close()
    assert errors == [], errors


def _open(page: Page, viewer: dict[str, Any], sid: str) -> None:
    page.goto(f"{viewer['server'].url}/#/s/{sid}")
    expect(page.locator("article.message").first).to_be_visible(timeout=WAIT_MS)


def test_sign_in_is_required_and_the_credential_stays_in_the_tab(viewer: dict[str, Any]) -> None:
    server: Server = viewer["server"]
    page: Page = viewer["browser"].new_page()
    page.goto(server.url + "/")
    expect(page.locator("#sign-in")).to_be_visible()
    assert page.locator("#view").is_hidden()
    assert page.locator("table.sessions").count() == 0
    _browser.screenshot(page, "sign-in")

    page.fill("#credential", "not-a-real-key-" + "x" * 20)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#sign-in-error")).to_contain_text("not accepted")
    assert page.locator("table.sessions").count() == 0

    page.fill("#credential", server.admin_key)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("table.sessions tbody tr").first).to_be_visible(timeout=WAIT_MS)
    # The tab keeps the credential, and (once the chain check it starts has answered, which may
    # or may not be yet) that check's report: nothing else, nowhere else.
    keys, local, cookie = page.evaluate(
        "[Object.keys(sessionStorage), localStorage.length, document.cookie]"
    )
    assert "sessionlog.credential" in keys
    assert set(keys) <= {"sessionlog.credential", "sessionlog.verified"}
    assert (local, cookie) == (0, "")
    holding = page.evaluate(
        "(key) => Object.keys(sessionStorage).filter((k) => sessionStorage.getItem(k).includes(key))",
        server.admin_key,
    )
    assert holding == ["sessionlog.credential"]
    assert server.admin_key not in page.url

    linked = _page(viewer)  # a #token= link signs in, then the token leaves the address bar
    assert "token" not in linked.url and server.admin_key not in linked.url
    _close(page)
    _close(linked)


def test_the_list_filters_and_the_transcript_pairs_calls(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    rows = page.locator("table.sessions tbody tr")
    expect(rows.first).to_be_visible(timeout=WAIT_MS)
    ids = rows.evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert set(ids) == {
        "release-1",
        "release-1-retry",
        "release-1-at-4",
        "xss",
        "steps",
        "alice-secret",
        "big",
        "ctx",
        CLAUDE_MAIN,
        CLAUDE_MAIN + ".sidechain-1",
        CLAUDE_MAIN + ".sidechain-2",
    }
    _browser.screenshot(page, "sessions")

    page.select_option("#source", "seeded")  # forks keep their parent's origin
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    assert rows.first.get_attribute("data-id") == "release-1"
    page.select_option("#source", "imported")
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    page.select_option("#source", "")
    page.fill("#q", "retry")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    assert rows.first.get_attribute("data-id") == "release-1-retry"

    _open(page, viewer, "release-1")
    call = page.locator(".tool-call").first
    expect(call.locator(".call-name")).to_have_text("read_file")
    expect(call.locator(".call-result")).to_contain_text("1.4.0 (unreleased)")
    expect(page.locator("article[data-index='2'] .paired-note")).to_contain_text("read_file")
    expect(page.locator(".clients")).to_contain_text("ui-1")
    expect(page.locator("input[name=mode][value=sanitized]")).to_be_checked()
    with page.expect_download() as download:
        page.click(".export button[type=submit]")
    assert download.value.suggested_filename == "release-1.sanitized.json"
    bundle = json.loads(Path(download.value.path()).read_text())
    assert bundle["redaction"]["mode"] == "sanitized"
    assert "ghx-31415" not in json.dumps(bundle)  # the token in a tool result is redacted
    _browser.screenshot(page, "session")
    page.emulate_media(color_scheme="dark")  # the reader's system setting picks the palette
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert dark == "rgb(21, 23, 26)"
    _browser.screenshot(page, "session-dark")
    _close(page)


def test_transcript_text_is_shown_as_text_never_run(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    expect(page.locator("table.sessions")).to_contain_text(XSS[0], timeout=WAIT_MS)
    _open(page, viewer, "xss")
    for index, text in enumerate(XSS):
        expect(page.locator(f"article[data-index='{index}'] .content")).to_have_text(text)
    expect(page.locator(".tool-call.has-error .error-tag")).to_have_count(1)
    counted = page.locator("article.message", has_text="counted")
    expect(counted.locator(".model")).to_have_text("mock-large")
    expect(counted.locator(".usage")).to_have_text("in 12 · out 34")
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img, main script, .transcript svg").count() == 0
    _close(page)


def test_fork_tree_has_every_branch_and_opens_one(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    _open(page, viewer, "release-1")
    nodes = page.locator("svg.tree g.node")
    expect(nodes).to_have_count(3, timeout=WAIT_MS)
    assert page.locator("svg.tree g.node.current").get_attribute("data-id") == "release-1"
    _browser.screenshot(page, "fork-tree")

    page.select_option("#diff-with", "release-1-at-4")
    page.click(".diff-form button")
    expect(page.locator(".diff-shared")).to_contain_text("first 4 messages", timeout=WAIT_MS)

    page.focus("svg.tree g.node[data-id='release-1-at-4']")  # a bar is a link for the keyboard too
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"#/s/release-1-at-4$"))
    expect(page.locator("article.message")).to_have_count(4, timeout=WAIT_MS)
    _close(page)


def test_time_travel_shows_an_earlier_state(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    _open(page, viewer, "steps")
    expect(page.locator("article.message")).to_have_count(3)
    slider = page.locator("#as-of")
    assert slider.get_attribute("max") == "4"  # opened, then three messages
    slider.evaluate("el => { el.value = '2'; el.dispatchEvent(new Event('input')); }")
    expect(page.locator(".as-of-label")).to_contain_text("as of event 2", timeout=WAIT_MS)
    expect(page.locator("article.message")).to_have_count(1)
    expect(page.locator("article.message .content")).to_have_text("step number 1")
    _browser.screenshot(page, "time-travel")
    page.click(".time-travel button")
    expect(page.locator("article.message")).to_have_count(3, timeout=WAIT_MS)
    _close(page)


def test_live_tail_shows_an_injected_message(viewer: dict[str, Any]) -> None:
    server: Server = viewer["server"]
    page = _page(viewer)
    _open(page, viewer, "steps")
    expect(page.locator(".live-state")).to_have_text("live", timeout=WAIT_MS)
    head = int(page.locator("#badge").get_attribute("data-head") or 0)
    answer = httpx.post(
        f"{server.url}/v1/sessions/steps/messages",
        json={"message": {"role": "assistant", "content": "arrived live"}},
        headers={"authorization": f"Bearer {server.admin_key}"},
    )
    assert answer.status_code == 201
    expect(page.locator("article.message").last).to_contain_text("arrived live", timeout=WAIT_MS)
    assert int(page.locator("#badge").get_attribute("data-head") or 0) > head
    answer = httpx.put(
        f"{server.url}/v1/sessions/steps/scratchpad",
        json={"scratchpad": {"plan": "<b>written live</b>"}},
        headers={"authorization": f"Bearer {server.admin_key}"},
    )
    assert answer.status_code == 200
    expect(page.locator(".details")).to_contain_text("<b>written live</b>", timeout=WAIT_MS)
    _close(page)


def test_a_principal_without_rights_sees_nothing_of_a_session(viewer: dict[str, Any]) -> None:
    bob = _page(viewer, viewer["tokens"]["bob"])
    expect(bob.locator("#main")).to_contain_text("No sessions match", timeout=WAIT_MS)
    bob.goto(f"{viewer['server'].url}/#/s/alice-secret")
    expect(bob.locator("#view .error")).to_contain_text("alice-secret", timeout=WAIT_MS)
    assert bob.locator("article.message").count() == 0
    assert "plan of alice" not in bob.content()
    _close(bob)

    alice = _page(viewer, viewer["tokens"]["alice"])
    rows = alice.locator("table.sessions tbody tr")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    _open(alice, viewer, "alice-secret")
    expect(alice.locator("article.message .content")).to_have_text("the plan of alice")
    _close(alice)


def test_a_session_of_100000_messages_opens_and_scrolls(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    _open(page, viewer, "big")
    expect(page.locator("article[data-index='0'] .content")).to_have_text("message 1")
    expect(page.locator(".facts")).to_contain_text(str(BIG))
    assert page.locator("article.message").count() <= 200  # only what is on screen
    page.click("text=Jump to end")
    last = page.locator(f"article[data-index='{BIG - 1}'] .content")
    expect(last).to_have_text(f"message {BIG}", timeout=WAIT_MS)
    assert page.locator("article.message").count() <= 200
    _browser.screenshot(page, "big-session")
    _close(page)


def test_the_page_is_public_and_locked_down_the_data_is_not(viewer: dict[str, Any]) -> None:
    server: Server = viewer["server"]
    page = httpx.get(server.url + "/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "unsafe-inline" not in policy and "<script>" not in page.text.replace(" ", "")
    assert page.headers["x-content-type-options"] == "nosniff"
    module = httpx.get(server.url + "/viewer/app.js")
    assert module.status_code == 200 and module.headers["content-type"].startswith(
        "text/javascript"
    )
    for path in ("/viewer/nothing.js", "/viewer/..%2F_api.py", "/viewer/"):
        assert httpx.get(server.url + path).status_code in (401, 404)
    for path in ("/v1/viewer/sessions", "/v1/viewer/status", "/v1/viewer/sessions/steps/tree"):
        assert httpx.get(server.url + path).status_code == 401

    def as_(who: str, path: str) -> httpx.Response:
        token = viewer["tokens"][who]
        return httpx.get(server.url + path, headers={"authorization": f"Bearer {token}"})

    for path in ("", "/tree", "/messages", "/pruned"):
        assert as_("bob", f"/v1/viewer/sessions/alice-secret{path}").status_code == 404
        assert as_("alice", f"/v1/viewer/sessions/alice-secret{path}").status_code == 200
    assert as_("bob", "/v1/viewer/diff?a=alice-secret&b=alice-secret").status_code == 404
    for path in ("/v1/viewer/status", "/v1/viewer/sessions", "/v1/viewer/sessions/alice-secret"):
        assert as_("alice", path).headers["cache-control"] == "no-store"  # private data, not kept


def test_the_viewer_reads_agree_with_the_session_api(viewer: dict[str, Any]) -> None:
    server: Server = viewer["server"]
    auth = {"authorization": f"Bearer {server.admin_key}"}

    def get(path: str, **params: Any) -> httpx.Response:
        return httpx.get(server.url + path, params=params, headers=auth, timeout=30)

    def every(sid: str) -> list[Any]:
        return get(f"/v1/sessions/{sid}/messages", limit=1000).json()["data"]

    tree = {node["id"]: node for node in get("/v1/viewer/sessions/release-1/tree").json()["nodes"]}
    assert tree["release-1-at-4"]["at"] == 4 and not tree["release-1-at-4"]["whole"]
    assert tree["release-1-retry"]["whole"]
    for a, b in (("release-1", "release-1-at-4"), ("release-1", "release-1-retry")):
        left, right = every(a), every(b)
        shared = next(
            (i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y), None
        )
        shared = min(len(left), len(right)) if shared is None else shared
        answer = get("/v1/viewer/diff", a=a, b=b).json()
        assert answer["shared"] == shared
        assert (
            answer["a"]["messages"] == left[shared:] and answer["b"]["messages"] == right[shared:]
        )
        assert tree[b]["at"] == shared  # where the picture draws the fork

    seen: list[str] = []
    cursor = None
    while True:
        page = get("/v1/viewer/sessions", limit=2, cursor=cursor or "").json()
        seen += [row["session_id"] for row in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    everyone = get("/v1/sessions", limit=200).json()["data"]
    assert seen == sorted(seen) and seen == [row["id"] for row in everyone]

    past = get("/v1/viewer/sessions/steps", version=2).json()
    assert past["length"] == 1 and past["as_of"] >= 1
    assert get("/v1/viewer/sessions/steps/messages", as_of=past["as_of"]).json()["data"] == [
        {"role": "user", "content": "step number 1"}
    ]
    wrong = get("/v1/viewer/sessions/steps", version=999)
    assert wrong.status_code == 422 and "version" in wrong.json()["detail"]
    assert get("/v1/viewer/sessions", source="elsewhere").status_code == 422


def test_sub_agent_sessions_hang_from_their_parent(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    _open(page, viewer, CLAUDE_MAIN)
    expect(page.locator("svg.tree g.node")).to_have_count(3, timeout=WAIT_MS)
    expect(page.locator("svg.tree g.node.subagent")).to_have_count(2)
    expect(page.locator("svg.tree path.edge.subagent")).to_have_count(2)
    expect(page.locator(".error-tag").first).to_be_visible()
    page.click(f"svg.tree g.node[data-id='{CLAUDE_MAIN}.sidechain-1']")
    expect(page.locator("#view h1")).to_have_attribute("title", CLAUDE_MAIN + ".sidechain-1")
    _close(page)


def test_checkpoints_and_pruned_results_are_marked(viewer: dict[str, Any]) -> None:
    page = _page(viewer)
    _open(page, viewer, "ctx")
    checkpoints = page.locator("article.message.checkpoint")
    expect(checkpoints.first).to_be_visible(timeout=WAIT_MS)
    assert checkpoints.count() >= 2 and checkpoints.count() % 2 == 0  # a pair each time
    pruned = page.locator("article.message.pruned")
    expect(pruned.first).to_be_visible(timeout=WAIT_MS)
    expect(pruned.first.locator(".pruned-tag")).to_have_text("pruned in context")
    expect(pruned.first.locator(".pruned-view")).to_contain_text("cleared from the context")
    _browser.screenshot(page, "checkpoints")
    _close(page)


def test_live_tail_resumes_after_the_server_restarts(viewer: dict[str, Any]) -> None:
    # Last in the module: it restarts the shared server.
    server: Server = viewer["server"]
    page = _page(viewer)
    _open(page, viewer, "steps")
    state = page.locator(".live-state")
    expect(state).to_have_text("live", timeout=WAIT_MS)
    server.stop()
    expect(state).to_have_text("reconnecting", timeout=WAIT_MS)
    server.start()
    expect(state).to_have_text("live", timeout=3 * WAIT_MS)
    answer = httpx.post(
        f"{server.url}/v1/sessions/steps/messages",
        json={"message": {"role": "assistant", "content": "after the restart"}},
        headers={"authorization": f"Bearer {server.admin_key}"},
    )
    assert answer.status_code == 201
    message = page.locator("article.message", has_text="after the restart")
    expect(message).to_have_count(1, timeout=WAIT_MS)
    _close(page)


def _admin_post(server: Server, path: str, body: dict[str, Any]) -> None:
    answer = httpx.post(
        server.url + path,
        json=body,
        headers={"authorization": f"Bearer {server.admin_key}"},
        timeout=60,
    )
    assert answer.status_code == 201, answer.text


def test_a_tool_call_recorded_as_null_does_not_break_the_transcript(
    viewer: dict[str, Any],
) -> None:
    server: Server = viewer["server"]
    _admin_post(server, "/v1/sessions", {"id": "odd-calls", "title": "odd calls"})
    call = {"id": "k1", "type": "function", "function": {"name": "probe", "arguments": "{}"}}
    message = {"role": "assistant", "content": "calls of odd shapes", "tool_calls": [None, call]}
    _admin_post(server, "/v1/sessions/odd-calls/messages", {"message": message})
    _admin_post(
        server,
        "/v1/sessions/odd-calls/messages",
        {"message": {"role": "user", "content": "after the odd calls"}},
    )
    page = _page(viewer)
    _open(page, viewer, "odd-calls")
    expect(page.locator("article.message")).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator(".call-name")).to_have_text("probe")
    expect(page.locator("article[data-index='1']")).to_contain_text("after the odd calls")
    _close(page)  # and no script on the page raised


def test_a_tree_naming_endless_sub_agents_is_cut(viewer: dict[str, Any]) -> None:
    server: Server = viewer["server"]
    children = [f"no-such-agent-{n}" for n in range(100_000)]
    metadata = {"agent_log": {"children": children}}
    _admin_post(server, "/v1/sessions", {"id": "many-agents", "metadata": metadata})
    answer = httpx.get(
        server.url + "/v1/viewer/sessions/many-agents/tree",
        headers={"authorization": f"Bearer {server.admin_key}"},
        timeout=WAIT_MS / 1000,
    )
    assert answer.status_code == 200
    family = answer.json()
    assert [node["id"] for node in family["nodes"]] == ["many-agents"]
    assert family["cut"] is True  # looked at a bounded number of candidates, and says so
