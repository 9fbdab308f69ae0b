"""Live clients, the scratchpad and the workspace verbs against seed 001, on the durable LMDB store
and on the in-memory reference store."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from sessions import (
    ControllerConflictError,
    InvalidArgumentError,
    LimitExceededError,
    SessionStore,
    UnknownSessionError,
)
from tests.conftest import assert_rebuild_changes_nothing, refused


@pytest.fixture(params=["lmdb", "memory"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every test here runs on LMDB and on the in-memory reference store."""
    return str(request.param)


@pytest.fixture
def store(store: SessionStore) -> SessionStore:
    """The shared `store` fixture with session `s` open."""
    store.open_session("s")
    return store


def events(store: SessionStore, sid: str = "s") -> list[Any]:
    return store.log.read_stream(sid)[1:]  # after session_opened


def modes(store: SessionStore, sid: str = "s") -> dict[str, str]:
    return {c["client_id"]: c["mode"] for c in store.live_clients(sid)}


def controller(store: SessionStore, sid: str = "s") -> str | None:
    snap = store.snapshot(sid)
    assert snap is not None
    return snap["live_controller_id"]  # type: ignore[no-any-return]


# Live clients


def test_attach_observers_and_one_controller(store: SessionStore) -> None:
    portal = store.attach("s", "portal")
    assert portal["client_id"] == "portal" and portal["mode"] == "observer"
    assert portal["attached_at"] == portal["last_seen_at"]
    store.attach("s", "watch", {"mode": "observer", "metadata": {"device": "phone"}})
    tui = store.attach("s", "tui", {"mode": "controller"})
    assert tui["mode"] == "controller"
    assert modes(store) == {"portal": "observer", "watch": "observer", "tui": "controller"}
    assert [c["client_id"] for c in store.live_clients("s")] == ["portal", "watch", "tui"]
    assert store.live_clients("s")[1]["metadata"] == {"device": "phone"}
    assert controller(store) == "tui"
    snap = store.snapshot("s")
    assert snap is not None and snap["live_clients"] == store.live_clients("s")
    assert [(e.type, e.data.action, e.meta["client_id"]) for e in events(store)] == [
        ("live_session_client", "attached", "portal"),
        ("live_session_client", "attached", "watch"),
        ("live_session_client", "attached", "tui"),
    ]


def test_a_second_controller_needs_takeover(store: SessionStore) -> None:
    store.attach("s", "tui", {"mode": "controller"})
    refused(
        store,
        ControllerConflictError,
        "session `s` is controlled by `tui`; pass takeover=True",
        lambda: store.attach("s", "mobile", {"mode": "controller"}),
    )
    assert modes(store) == {"tui": "controller"}
    store.attach("s", "tui", {"mode": "controller"})  # the controller itself may re-attach
    taken = store.attach("s", "mobile", {"mode": "controller", "takeover": True})
    assert taken["mode"] == "controller"
    assert modes(store) == {"tui": "observer", "mobile": "controller"}
    assert controller(store) == "mobile"
    last = events(store)[-1].data
    assert (last.action, last.previous_controller_id) == ("taken_over", "tui")


def test_takeover_demotes_the_previous_controller(store: SessionStore) -> None:
    store.attach("s", "tui", {"mode": "controller"})
    result = store.takeover("s", "mobile", {"metadata": {"reason": "operator handoff"}})
    assert result["mode"] == "controller" and result["metadata"] == {"reason": "operator handoff"}
    assert modes(store) == {"tui": "observer", "mobile": "controller"}
    last = events(store)[-1]
    assert last.type == "live_session_client"
    assert last.data.action == "taken_over" and last.data.previous_controller_id == "tui"
    store.takeover("s", "tui", {"reason": "back"})
    assert modes(store) == {"tui": "controller", "mobile": "observer"}
    assert events(store)[-1].data.reason == "back"


def test_takeover_with_no_controller_just_takes_control(store: SessionStore) -> None:
    store.attach("s", "portal")
    store.takeover("s", "portal")
    assert modes(store) == {"portal": "controller"} and controller(store) == "portal"
    assert events(store)[-1].data.previous_controller_id is None


def test_detach_releases_control(store: SessionStore) -> None:
    store.attach("s", "portal")
    store.attach("s", "tui", {"mode": "controller"})
    assert store.detach("s", "portal") == {
        "ok": True,
        "client_id": "portal",
        "released_control": False,
    }
    assert controller(store) == "tui"
    result = store.detach("s", "tui", {"reason": "client_exit"})
    assert result["released_control"] is True
    assert controller(store) is None and store.live_clients("s") == []
    last = events(store)[-1]
    assert (last.type, last.data.action, last.data.reason) == (
        "live_session_client",
        "detached",
        "client_exit",
    )
    store.attach("s", "mobile", {"mode": "controller"})  # no takeover needed any more
    assert controller(store) == "mobile"
    refused(store, InvalidArgumentError, "`tui` is not attached", lambda: store.detach("s", "tui"))


def test_heartbeat_refreshes_last_seen_and_merges_metadata(store: SessionStore) -> None:
    first = store.attach("s", "portal", {"metadata": {"a": 1, "b": 1}})
    beat = store.heartbeat("s", "portal", {"metadata": {"b": 2, "c": 3}})
    event = events(store)[-1]
    assert event.type == "live_session_client" and event.data.action == "heartbeat"
    assert beat["last_seen_at"] == event.recorded_at.isoformat()
    assert datetime.fromisoformat(beat["last_seen_at"]) >= datetime.fromisoformat(
        first["last_seen_at"]
    )
    assert beat["attached_at"] == first["attached_at"]
    assert beat["metadata"] == {"a": 1, "b": 2, "c": 3} and beat["mode"] == "observer"
    assert store.live_clients("s")[0] == beat
    refused(
        store,
        InvalidArgumentError,
        "`ghost` is not attached",
        lambda: store.heartbeat("s", "ghost"),
    )


def test_only_the_controller_injects_prompts(store: SessionStore) -> None:
    store.attach("s", "portal")
    refused(
        store,
        ControllerConflictError,
        "client `portal` is not the controller of `s` (no client is the controller)",
        lambda: store.client_inject_prompt("s", "portal", "hi"),
    )
    store.attach("s", "tui", {"mode": "controller"})
    refused(
        store,
        ControllerConflictError,
        "(`tui` is the controller)",
        lambda: store.client_inject_prompt("s", "portal", "hi"),
    )
    assert store.client_inject_prompt("s", "tui", "continue from the failing test") is None
    store.client_inject_prompt("s", "tui", "more", {"metadata": {"trace": "t1"}})
    transcript = store.snapshot("s")["transcript"]  # type: ignore[index]
    assert transcript[0] == {
        "role": "user",
        "content": "continue from the failing test",
        "metadata": {"live_session": {"client_id": "tui"}},
    }
    assert transcript[1]["metadata"] == {"trace": "t1", "live_session": {"client_id": "tui"}}
    assert [e.type for e in events(store)][-2:] == ["message_injected", "message_injected"]
    assert events(store)[-1].meta["client_id"] == "tui"


def test_only_the_controller_routes_permissions(store: SessionStore) -> None:
    store.attach("s", "portal")
    request = {"tool": "rm", "args": ["-rf", "build"]}
    refused(
        store,
        ControllerConflictError,
        "route_permission: client `portal` is not the controller",
        lambda: store.route_permission("s", "portal", request),
    )
    store.takeover("s", "tui")
    result = store.route_permission("s", "tui", request, {"metadata": {"ttl": 30}})
    assert result == {"ok": True, "client_id": "tui", "request": request}
    last = events(store)[-1]
    assert last.type == "live_session_permission_route"
    assert (last.data.client_id, last.data.request, last.data.metadata) == (
        "tui",
        request,
        {"ttl": 30},
    )
    store.takeover("s", "mobile")
    refused(
        store,
        ControllerConflictError,
        "`mobile` is the controller",
        lambda: store.route_permission("s", "tui", request),
    )


def test_live_clients_belong_to_one_incarnation_of_one_session(store: SessionStore) -> None:
    store.attach("s", "portal")
    store.attach("s", "tui", {"mode": "controller"})
    child = store.fork("s", "child")
    assert store.live_clients(child) == [] and controller(store, child) is None
    assert controller(store) == "tui"
    store.reset("s")
    assert controller(store) == "tui"  # a reset wipes the transcript only
    store.close_session("s")
    store.open_session("s")
    assert store.live_clients("s") == [] and controller(store) is None


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda s: s.attach("s", "c", {"mode": "boss"}), InvalidArgumentError, "observer or"),
        (
            lambda s: s.attach("s", "c", {"role": "x"}),
            InvalidArgumentError,
            "unknown option 'role'",
        ),
        (lambda s: s.attach("s", "c", {"takeover": 1}), InvalidArgumentError, "must be a bool"),
        (lambda s: s.attach("s", "c", ["mode"]), InvalidArgumentError, "`opts` must be a dict"),
        (lambda s: s.attach("s", "", None), InvalidArgumentError, "`client_id` must be"),
        (lambda s: s.attach("s", 5, None), InvalidArgumentError, "`client_id` must be"),
        (lambda s: s.takeover("s", "c", {"mode": "x"}), InvalidArgumentError, "unknown option"),
        (lambda s: s.detach("s", "c", {"force": 1}), InvalidArgumentError, "unknown option"),
        (lambda s: s.heartbeat("s", "c", {"metadata": 3}), InvalidArgumentError, "metadata"),
        (lambda s: s.route_permission("s", "c", "rm"), InvalidArgumentError, "`request` must"),
        (lambda s: s.attach("nope", "c"), UnknownSessionError, "attach: no session `nope`"),
    ],
)
def test_live_verbs_refuse_bad_input(
    store: SessionStore, call: Callable[[SessionStore], object], error: type, text: str
) -> None:
    refused(store, error, text, lambda: call(store))
    assert store.live_clients("s") == []


def test_live_clients_per_session_are_bounded(store: SessionStore) -> None:
    with store.transaction():
        for i in range(256):
            store.attach("s", f"c{i}")
    refused(
        store,
        LimitExceededError,
        "257 exceeds live_clients_per_session_max = 256",
        lambda: store.attach("s", "one-more"),
    )
    store.heartbeat("s", "c0")  # a known client still works
    assert len(store.live_clients("s")) == 256


# Scratchpad


def test_scratchpad_set_clear_and_versions(store: SessionStore) -> None:
    assert store.scratchpad("s") is None
    snap = store.snapshot("s")
    assert snap is not None and snap["scratchpad"] is None and snap["scratchpad_version"] == 0
    first = store.set_scratchpad("s", {"plan": ["read", "fix"], "step": 1})
    assert first == {"ok": True, "version": 1, "scratchpad": {"plan": ["read", "fix"], "step": 1}}
    assert store.set_scratchpad("s", {"step": 2})["version"] == 2
    assert store.scratchpad("s") == {"step": 2}
    snap = store.snapshot("s")
    assert snap is not None and snap["scratchpad"] == {"step": 2}
    assert snap["scratchpad_version"] == 2
    assert store.clear_scratchpad("s") == {"ok": True, "version": 3, "scratchpad": None}
    assert store.scratchpad("s") is None
    assert store.snapshot("s")["scratchpad_version"] == 3  # type: ignore[index]
    assert [e.type for e in events(store)] == [
        "scratchpad_set",
        "scratchpad_set",
        "scratchpad_cleared",
    ]


def test_scratchpad_provenance_is_recorded(store: SessionStore) -> None:
    opts = {"source": "planner", "reason": "new plan", "metadata": {"turn": 4}}
    store.set_scratchpad("s", {"k": "v"}, opts)
    set_event = events(store)[-1].data
    assert (set_event.source, set_event.reason, set_event.metadata) == (
        "planner",
        "new plan",
        {"turn": 4},
    )
    assert set_event.scratchpad == {"k": "v"} and set_event.version == 1
    store.clear_scratchpad("s", {"source": "user", "reason": "done", "metadata": {"x": 1}})
    cleared = events(store)[-1].data
    assert (cleared.source, cleared.reason, cleared.metadata) == ("user", "done", {"x": 1})


def test_scratchpad_returned_and_stored_are_independent(store: SessionStore) -> None:
    given = {"items": [1]}
    result = store.set_scratchpad("s", given)
    given["items"].append(2)
    result["scratchpad"]["items"].append(3)
    read = store.scratchpad("s")
    assert read == {"items": [1]}
    read["items"].append(4)  # type: ignore[index]
    assert store.scratchpad("s") == {"items": [1]}


def test_a_forks_scratchpad_is_its_own(store: SessionStore) -> None:
    store.set_scratchpad("s", {"k": "parent"})
    store.fork("s", "child")
    store.set_scratchpad("child", {"k": "child"})
    store.clear_scratchpad("s")
    assert store.scratchpad("child") == {"k": "child"} and store.scratchpad("s") is None


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda s: s.set_scratchpad("s", ["a"]), InvalidArgumentError, "`scratchpad` must be"),
        (lambda s: s.set_scratchpad("s", None), InvalidArgumentError, "`scratchpad` must be"),
        (lambda s: s.set_scratchpad("s", {1: "a"}), InvalidArgumentError, "string keys"),
        (lambda s: s.set_scratchpad("s", {}, {"why": 1}), InvalidArgumentError, "unknown option"),
        (lambda s: s.set_scratchpad("s", {}, {"source": 1}), InvalidArgumentError, "`source`"),
        (lambda s: s.clear_scratchpad("s", {"reason": 2}), InvalidArgumentError, "`reason`"),
        (
            lambda s: s.set_scratchpad("s", {"blob": "x" * 70_000}),
            LimitExceededError,
            "scratchpad_bytes_max",
        ),
        (lambda s: s.scratchpad("nope"), UnknownSessionError, "scratchpad: no session `nope`"),
        (lambda s: s.set_scratchpad("nope", {}), UnknownSessionError, "no session `nope`"),
        (lambda s: s.clear_scratchpad("nope"), UnknownSessionError, "no session `nope`"),
    ],
)
def test_scratchpad_verbs_refuse_bad_input(
    store: SessionStore, call: Callable[[SessionStore], object], error: type, text: str
) -> None:
    refused(store, error, text, lambda: call(store))
    assert store.snapshot("s")["scratchpad_version"] == 0  # type: ignore[index]


# Workspace


def test_workspace_anchor_and_policy_from_open_and_setters(store: SessionStore) -> None:
    sid = store.open_session(
        "w",
        workspace_anchor={"root": "/repo", "vcs": "git"},
        workspace_policy={"default_mount_mode": "read_only"},
    )
    assert store.workspace_anchor(sid) == {"root": "/repo", "vcs": "git"}
    assert store.workspace_policy(sid) == {"default_mount_mode": "read_only"}
    assert store.set_workspace_anchor(sid, {"root": "/other"}) is True
    assert store.set_workspace_anchor(sid, {"root": "/other"}) is False
    assert store.workspace_anchor(sid) == {"root": "/other"}
    assert store.set_workspace_policy(sid, {"network": "off"}) is True
    assert store.workspace_policy(sid) == {"default_mount_mode": "read_only", "network": "off"}
    assert store.set_workspace_policy(sid, {"network": "off"}) is False
    assert store.set_workspace_anchor(sid, None) is True and store.workspace_anchor(sid) is None
    assert [e.type for e in events(store, sid)] == [
        "workspace_anchor_set",
        "workspace_policy_set",
        "workspace_anchor_set",
    ]
    assert store.workspace_anchor("s") is None and store.workspace_policy("s") == {}


def test_add_root_defaults_its_mount_mode_from_the_policy(store: SessionStore) -> None:
    sid = store.open_session(
        "w", workspace_anchor={"root": "/repo"}, workspace_policy={"default_mount_mode": "ro"}
    )
    added = store.add_root(sid, "/data")
    assert added["ok"] is True and added["mount_mode"] == "ro" and added["mounted_at"] == "/data"
    store.add_root(sid, "/scratch", {"mount_mode": "rw", "mounted_at": "/mnt/scratch"})
    store.set_workspace_policy(sid, {"default_mount_mode": "overlay"})
    store.add_root(sid, "/later")
    assert store.list_roots(sid) == {
        "primary": "/repo",
        "additional": [
            {"root": "/data", "mount_mode": "ro", "mounted_at": "/data"},
            {"root": "/scratch", "mount_mode": "rw", "mounted_at": "/mnt/scratch"},
            {"root": "/later", "mount_mode": "overlay", "mounted_at": "/later"},
        ],
    }
    # No policy at all: read_write.
    assert store.add_root("s", "/x")["mount_mode"] == "read_write"
    assert store.list_roots("s")["primary"] is None
    assert events(store, sid)[0].type == "workspace_root_added"


def test_remove_root(store: SessionStore) -> None:
    store.add_root("s", "/a")
    store.add_root("s", "/b")
    head = store.log.head
    missing = store.remove_root("s", "/nope")
    assert missing["ok"] is False and "`/nope` is not mounted" in missing["error"]
    assert store.log.head == head
    assert store.remove_root("s", "/a") == {"ok": True, "root": "/a"}
    assert [r["root"] for r in store.list_roots("s")["additional"]] == ["/b"]
    assert events(store)[-1].type == "workspace_root_removed"
    assert store.remove_root("s", "/a")["ok"] is False


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda s: s.add_root("s", ""), "`root` must be a non-empty str"),
        (lambda s: s.add_root("s", "/r", {"mode": "ro"}), "unknown option 'mode'"),
        (lambda s: s.add_root("s", "/r", {"mount_mode": 1}), "`mount_mode` must be a str"),
        (lambda s: s.remove_root("s", None), "`root` must be a non-empty str"),
        (lambda s: s.set_workspace_anchor("s", "/"), "`anchor` must be a dict"),
        (lambda s: s.set_workspace_policy("s", None), "`workspace_policy` must be a dict"),
        (
            lambda s: s.set_workspace_policy("s", {"default_mount_mode": ""}),
            "default_mount_mode` must be a non-empty str",
        ),
        (
            lambda s: s.open_session("w", workspace_policy={"default_mount_mode": 3}),
            "default_mount_mode",
        ),
        (lambda s: s.open_session("w", workspace_anchor="/"), "`workspace_anchor` must be a dict"),
    ],
)
def test_workspace_verbs_refuse_bad_input(
    store: SessionStore, call: Callable[[SessionStore], object], text: str
) -> None:
    refused(store, InvalidArgumentError, text, lambda: call(store))
    assert store.list_roots("s") == {"primary": None, "additional": []}
    assert not store.exists("w")


def test_live_scratchpad_and_workspace_state_survive_rebuild(store: SessionStore) -> None:
    store.attach("s", "portal", {"metadata": {"k": 1}})
    store.takeover("s", "tui")
    store.heartbeat("s", "portal", {"metadata": {"k": 2}})
    store.set_scratchpad("s", {"a": 1}, {"source": "x"})
    store.set_workspace_policy("s", {"default_mount_mode": "ro"})
    store.add_root("s", "/r")
    store.detach("s", "tui")
    snap = store.snapshot("s")
    assert_rebuild_changes_nothing(store)
    assert store.snapshot("s") == snap
    past = store.as_of(store.log.head - 1)  # before the detach
    assert {c["client_id"]: c["mode"] for c in past.live_clients("s")} == {
        "portal": "observer",
        "tui": "controller",
    }
