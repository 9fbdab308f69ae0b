"""Rules of the `sessions.testing` state machine for a session's live clients (attach, takeover,
detach, heartbeat, prompts and permission routes) and its workspace (policy and roots), mixed into
`SessionMachine`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from eventlog import ControllerConflictError
from sessions._rules_base import PICK, RulesBase, has_open
from sessions._strategies import MOUNT_MODES, ROOTS, client_ids, content_blocks, short_text


class LiveRules(RulesBase):
    """The live-client and workspace rules; `SessionMachine` supplies the store and the model."""

    @precondition(has_open)
    @rule(
        pick=PICK,
        client=client_ids(),
        mode=st.sampled_from(("observer", "controller")),
        takeover=st.booleans(),
    )
    def attach(self, pick: int, client: str, mode: str, takeover: bool) -> None:
        sid = self.pick_open(pick)
        opts = {"mode": mode, "takeover": takeover}
        controller = self.model.controller(sid)
        if mode == "controller" and controller not in (None, client) and not takeover:
            self.expect_refused(
                ControllerConflictError, lambda: self.store.attach(sid, client, opts)
            )
            return
        got = self.store.attach(sid, client, opts)
        self.model.attach(sid, client, mode)
        if got["client_id"] != client or got["mode"] != mode:
            raise AssertionError(f"attach returned {got}, expected {client!r} as {mode}")

    @precondition(has_open)
    @rule(pick=PICK, client=client_ids())
    def takeover(self, pick: int, client: str) -> None:
        sid = self.pick_open(pick)
        got = self.store.takeover(sid, client, {"reason": "handoff"})
        self.model.takeover(sid, client)
        if got["mode"] != "controller":
            raise AssertionError(f"takeover returned {got}")

    @precondition(has_open)
    @rule(pick=PICK, client=client_ids())
    def detach(self, pick: int, client: str) -> None:
        sid = self.pick_open(pick)
        if self.refuses_unknown_client(sid, client, lambda: self.store.detach(sid, client)):
            return
        got = self.store.detach(sid, client, {"reason": "client_exit"})
        released = self.model.detach(sid, client)
        self.expect_equal(
            "detach", got, {"ok": True, "client_id": client, "released_control": released}
        )

    @precondition(has_open)
    @rule(pick=PICK, client=client_ids())
    def heartbeat(self, pick: int, client: str) -> None:
        sid = self.pick_open(pick)
        if self.refuses_unknown_client(sid, client, lambda: self.store.heartbeat(sid, client)):
            return
        got = self.store.heartbeat(sid, client, {"metadata": {"beat": 1}})
        if got["mode"] != self.model.clients(sid)[client]:
            raise AssertionError(f"heartbeat returned {got}")

    def _acting_client(self, sid: str, as_controller: bool, client: str) -> str:
        controller = self.model.controller(sid)
        return controller if as_controller and controller is not None else client

    @precondition(has_open)
    @rule(
        pick=PICK,
        as_controller=st.booleans(),
        client=client_ids(),
        content=short_text() | content_blocks(),
        opts=st.sampled_from(({}, {"name": "operator"}, {"metadata": {"trace": "t-1"}})),
    )
    def client_inject_prompt(
        self, pick: int, as_controller: bool, client: str, content: Any, opts: dict[str, Any]
    ) -> None:
        """Only the active controller may inject a prompt; anyone else is refused."""
        sid = self.pick_open(pick)
        client = self._acting_client(sid, as_controller, client)
        if self.model.controller(sid) != client:
            self.expect_refused(
                ControllerConflictError,
                lambda: self.store.client_inject_prompt(sid, client, content, opts),
            )
            return
        self.store.client_inject_prompt(sid, client, content, opts)
        self.model.client_inject_prompt(sid, client, content, opts)

    @precondition(has_open)
    @rule(pick=PICK, as_controller=st.booleans(), client=client_ids())
    def route_permission(self, pick: int, as_controller: bool, client: str) -> None:
        sid = self.pick_open(pick)
        client = self._acting_client(sid, as_controller, client)
        request = {"tool": "shell", "command": "ls"}
        if self.model.controller(sid) != client:
            self.expect_refused(
                ControllerConflictError, lambda: self.store.route_permission(sid, client, request)
            )
            return
        got = self.store.route_permission(sid, client, request)
        if got != {"ok": True, "client_id": client, "request": request}:
            raise AssertionError(f"route_permission returned {got}")

    # Workspace

    @precondition(has_open)
    @rule(pick=PICK, mode=st.sampled_from(MOUNT_MODES))
    def set_workspace_policy(self, pick: int, mode: str) -> None:
        sid = self.pick_open(pick)
        policy = {"default_mount_mode": mode}
        changed = self.store.set_workspace_policy(sid, policy)
        if changed != self.model.set_workspace_policy(sid, policy):
            raise AssertionError(f"set_workspace_policy said changed={changed}")

    @precondition(has_open)
    @rule(pick=PICK, root=st.sampled_from(ROOTS), mode=st.none() | st.sampled_from(MOUNT_MODES))
    def add_root(self, pick: int, root: str, mode: str | None) -> None:
        sid = self.pick_open(pick)
        got = self.store.add_root(sid, root, None if mode is None else {"mount_mode": mode})
        expected = self.model.add_root(sid, root, mode)
        if got["mount_mode"] != expected:
            raise AssertionError(f"add_root mounted {got}, expected mode {expected}")

    @precondition(has_open)
    @rule(pick=PICK, root=st.sampled_from(ROOTS))
    def remove_root(self, pick: int, root: str) -> None:
        sid = self.pick_open(pick)
        removed = self.model.remove_root(sid, root)
        if removed:
            got = self.store.remove_root(sid, root)
        else:  # not mounted: {ok: False}, nothing written
            got = self._expect_no_write(lambda: self.store.remove_root(sid, root))
        if got.get("ok") is not removed:
            raise AssertionError(f"remove_root returned {got}, expected ok={removed}")
