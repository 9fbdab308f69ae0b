"""Verbs on a session's live clients, scratchpad and workspace, mixed into `SessionStore`.

A session has many observers and at most one controller. Only the controller may inject a prompt
or claim a permission route; a second controller needs an explicit takeover, which demotes the
first. Each change is one event; the projection holds the resulting state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import projections as pj
from eventlog import (
    ControllerConflictError,
    InvalidArgumentError,
    check_encodable,
    limits,
    to_builtins,
)
from eventlog import events as ev
from eventlog.limits import check_at_most
from sessions._checks import check_dict, check_policy, check_text, client_dict
from sessions._host import Command, SessionHost
from sessions._messages import to_message

MODES = ("observer", "controller")


def _options(opts: object, allowed: frozenset[str], verb: str) -> dict[str, Any]:
    if opts is None:
        return {}
    if not isinstance(opts, Mapping):
        raise InvalidArgumentError(f"{verb}: `opts` must be a dict, got {type(opts).__name__}")
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise InvalidArgumentError(
            f"{verb}: unknown option {', '.join(map(repr, unknown))} "
            f"(expected one of: {', '.join(sorted(allowed))})"
        )
    return dict(opts)


def _client_id(client_id: object, verb: str) -> str:
    if not isinstance(client_id, str) or not client_id or len(client_id) > 256:
        raise InvalidArgumentError(
            f"{verb}: `client_id` must be a non-empty str of at most 256 characters, "
            f"got {client_id!r}"
        )
    return client_id


def _find(state: pj.SessionState, client_id: str) -> pj.LiveClient | None:
    return next((c for c in state.clients if c.client_id == client_id), None)


class LiveVerbs(SessionHost):
    """Live clients, scratchpad and workspace verbs."""

    # Scratchpad

    def scratchpad(self, session_id: str) -> dict[str, Any] | None:
        """The session's scratchpad dict (None when empty); raises for an unknown id."""
        with self._view() as view:
            state = self._state(view, session_id, "scratchpad")
        opened = self._opened(state, "scratchpad")
        return to_builtins(opened.scratchpad)  # type: ignore[no-any-return]

    def set_scratchpad(
        self, session_id: str, scratchpad: Mapping[str, Any], opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Replace the scratchpad; returns ``{ok, version, scratchpad}``."""
        verb = "set_scratchpad"
        options = _options(opts, frozenset(("source", "reason", "metadata")), verb)
        data = check_dict(scratchpad, "scratchpad", verb, optional=False)
        size = check_encodable(data, what=f"{verb}: `scratchpad`")
        check_at_most(
            size, limits.scratchpad_bytes_max, "scratchpad_bytes_max", f"{verb}: scratchpad"
        )
        fields = _provenance(options, verb)

        def decide(cmd: Command) -> int:
            version = cmd.state.scratchpad_version + 1
            cmd.emit([ev.ScratchpadSet(scratchpad=data, version=version, **fields)])
            return version

        version = self._command(verb, session_id, decide)
        return {"ok": True, "version": version, "scratchpad": to_builtins(data)}

    def clear_scratchpad(
        self, session_id: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Empty the scratchpad; returns ``{ok, version, scratchpad: None}``."""
        verb = "clear_scratchpad"
        options = _options(opts, frozenset(("source", "reason", "metadata")), verb)
        fields = _provenance(options, verb)

        def decide(cmd: Command) -> int:
            version = cmd.state.scratchpad_version + 1
            cmd.emit([ev.ScratchpadCleared(version=version, **fields)])
            return version

        version = self._command(verb, session_id, decide)
        return {"ok": True, "version": version, "scratchpad": None}

    # Live clients

    def attach(
        self, session_id: str, client_id: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Attach a live client as `observer` (default) or `controller`. A second controller
        needs ``takeover: True``; otherwise `ControllerConflictError`."""
        verb = "attach"
        options = _options(opts, frozenset(("mode", "takeover", "metadata")), verb)
        client = _client_id(client_id, verb)
        mode = options.get("mode", "observer")
        if mode not in MODES:
            raise InvalidArgumentError(
                f"{verb}: `mode` must be observer or controller, got {mode!r}"
            )
        takeover = options.get("takeover", False)
        if not isinstance(takeover, bool):
            raise InvalidArgumentError(f"{verb}: `takeover` must be a bool, got {takeover!r}")
        metadata = check_dict(options.get("metadata"), "metadata", verb)

        def decide(cmd: Command) -> None:
            state = cmd.state
            current = state.controller_id
            action = "attached"
            previous = None
            if mode == "controller" and current is not None and current != client:
                if not takeover:
                    raise ControllerConflictError(
                        f"{verb}: session `{state.session_id}` is controlled by `{current}`; "
                        f"pass takeover=True or call takeover() to replace it"
                    )
                action, previous = "taken_over", current
            self._check_client_room(state, client, verb)
            event = ev.LiveSessionClient(
                client_id=client,
                action=action,
                mode=mode,
                previous_controller_id=previous,
                metadata=metadata,
            )
            cmd.emit([event], meta={"client_id": client})

        self._command(verb, session_id, decide)
        return self._client_after(session_id, client, verb)

    def takeover(
        self, session_id: str, client_id: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Attach `client_id` as the controller, demoting any prior controller to observer."""
        verb = "takeover"
        options = _options(opts, frozenset(("metadata", "reason")), verb)
        client = _client_id(client_id, verb)
        metadata = check_dict(options.get("metadata"), "metadata", verb)
        reason = check_text(options.get("reason"), "reason", verb)

        def decide(cmd: Command) -> None:
            state = cmd.state
            self._check_client_room(state, client, verb)
            previous = state.controller_id if state.controller_id != client else None
            event = ev.LiveSessionClient(
                client_id=client,
                action="taken_over",
                mode="controller",
                previous_controller_id=previous,
                reason=reason,
                metadata=metadata,
            )
            cmd.emit([event], meta={"client_id": client})

        self._command(verb, session_id, decide)
        return self._client_after(session_id, client, verb)

    def detach(
        self, session_id: str, client_id: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Detach a live client; if it was the controller, control is released."""
        verb = "detach"
        options = _options(opts, frozenset(("reason", "metadata")), verb)
        client = _client_id(client_id, verb)
        reason = check_text(options.get("reason"), "reason", verb)
        metadata = check_dict(options.get("metadata"), "metadata", verb)

        def decide(cmd: Command) -> bool:
            found = self._require_client(cmd.state, client, verb)
            event = ev.LiveSessionClient(
                client_id=client,
                action="detached",
                mode=found.mode,
                reason=reason,
                metadata=metadata,
            )
            cmd.emit([event], meta={"client_id": client})
            return cmd.state.controller_id == client

        was_controller = self._command(verb, session_id, decide)
        return {"ok": True, "client_id": client, "released_control": was_controller}

    def heartbeat(
        self, session_id: str, client_id: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Refresh an attached client's last-seen time and, optionally, merge metadata."""
        verb = "heartbeat"
        options = _options(opts, frozenset(("metadata",)), verb)
        client = _client_id(client_id, verb)
        metadata = check_dict(options.get("metadata"), "metadata", verb)

        def decide(cmd: Command) -> None:
            found = self._require_client(cmd.state, client, verb)
            event = ev.LiveSessionClient(
                client_id=client, action="heartbeat", mode=found.mode, metadata=metadata
            )
            cmd.emit([event], meta={"client_id": client})

        self._command(verb, session_id, decide)
        return self._client_after(session_id, client, verb)

    def live_clients(self, session_id: str) -> list[dict[str, Any]]:
        """The attached clients, oldest attachment first."""
        with self._view() as view:
            state = self._state(view, session_id, "live_clients")
        return [client_dict(c) for c in self._opened(state, "live_clients").clients]

    def client_inject_prompt(
        self,
        session_id: str,
        client_id: str,
        content: Any,
        opts: Mapping[str, Any] | None = None,
    ) -> None:
        """Append a user prompt from the active controller, recording its client id in the
        message metadata (``metadata.live_session.client_id``)."""
        verb = "client_inject_prompt"
        options = _options(opts, frozenset(("metadata", "name")), verb)
        client = _client_id(client_id, verb)
        metadata = check_dict(options.get("metadata"), "metadata", verb)
        live = {**metadata.get("live_session", {}), "client_id": client}
        message = to_message(
            {
                "role": "user",
                "content": content,
                "name": options.get("name"),
                "metadata": {**metadata, "live_session": live},
            },
            where=verb,
        )

        def decide(cmd: Command) -> None:
            self._require_controller(cmd.state, client, verb)
            cmd.emit([ev.MessageInjected(message=message)], meta={"client_id": client})

        self._command(verb, session_id, decide)

    def route_permission(
        self,
        session_id: str,
        client_id: str,
        request: Mapping[str, Any],
        opts: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record that the active controller owns routing for a permission request."""
        verb = "route_permission"
        options = _options(opts, frozenset(("metadata",)), verb)
        client = _client_id(client_id, verb)
        body = check_dict(request, "request", verb, optional=False)
        metadata = check_dict(options.get("metadata"), "metadata", verb)

        def decide(cmd: Command) -> None:
            self._require_controller(cmd.state, client, verb)
            event = ev.LiveSessionPermissionRoute(client_id=client, request=body, metadata=metadata)
            cmd.emit([event], meta={"client_id": client})

        self._command(verb, session_id, decide)
        return {"ok": True, "client_id": client, "request": body}

    def _check_client_room(self, state: pj.SessionState, client: str, verb: str) -> None:
        if _find(state, client) is None:
            check_at_most(
                len(state.clients) + 1,
                limits.live_clients_per_session_max,
                "live_clients_per_session_max",
                f"{verb}: live clients of `{state.session_id}`",
            )

    @staticmethod
    def _require_client(state: pj.SessionState, client: str, verb: str) -> pj.LiveClient:
        found = _find(state, client)
        if found is None:
            raise InvalidArgumentError(
                f"{verb}: client `{client}` is not attached to session `{state.session_id}`"
            )
        return found

    @staticmethod
    def _require_controller(state: pj.SessionState, client: str, verb: str) -> None:
        if state.controller_id != client:
            holder = state.controller_id
            who = f"`{holder}` is" if holder else "no client is"
            raise ControllerConflictError(
                f"{verb}: client `{client}` is not the controller of `{state.session_id}` "
                f"({who} the controller)"
            )

    def _client_after(self, session_id: str, client: str, verb: str) -> dict[str, Any]:
        with self._view() as view:
            state = self._state(view, session_id, verb)
        found = _find(self._opened(state, verb), client)
        if found is None:
            raise AssertionError(f"{verb}: client `{client}` missing right after its event")
        return client_dict(found)

    # Workspace

    def workspace_anchor(self, session_id: str) -> dict[str, Any] | None:
        with self._view() as view:
            state = self._state(view, session_id, "workspace_anchor")
        return to_builtins(state.workspace_anchor)  # type: ignore[no-any-return]

    def set_workspace_anchor(self, session_id: str, anchor: Mapping[str, Any] | None) -> bool:
        """Replace the typed workspace anchor; returns whether it changed."""
        verb = "set_workspace_anchor"
        data = None if anchor is None else check_dict(anchor, "anchor", verb, optional=False)

        def decide(cmd: Command) -> bool:
            if to_builtins(cmd.state.workspace_anchor) == to_builtins(data):
                return False
            cmd.emit([ev.WorkspaceAnchorSet(anchor=data)])
            return True

        return self._command(verb, session_id, decide)

    def workspace_policy(self, session_id: str) -> dict[str, Any]:
        with self._view() as view:
            state = self._state(view, session_id, "workspace_policy")
        return to_builtins(state.workspace_policy)  # type: ignore[no-any-return]

    def set_workspace_policy(self, session_id: str, policy: Mapping[str, Any]) -> bool:
        """Merge `policy` into the workspace defaults; returns whether anything changed."""
        verb = "set_workspace_policy"
        update = check_policy(policy, verb)

        def decide(cmd: Command) -> bool:
            merged = {**cmd.state.workspace_policy, **update}
            if to_builtins(merged) == to_builtins(cmd.state.workspace_policy):
                return False
            cmd.emit([ev.WorkspacePolicySet(policy=merged)])
            return True

        return self._command(verb, session_id, decide)

    def add_root(
        self, session_id: str, root: str, opts: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Mount an additional root; its mount mode defaults to the policy's
        `default_mount_mode` (then `read_write`). Returns ``{ok, mounted_at}``."""
        verb = "add_root"
        options = _options(opts, frozenset(("mount_mode", "mounted_at")), verb)
        if not isinstance(root, str) or not root:
            raise InvalidArgumentError(f"{verb}: `root` must be a non-empty str, got {root!r}")
        mode = check_text(options.get("mount_mode"), "mount_mode", verb)
        mounted_at = check_text(options.get("mounted_at"), "mounted_at", verb)

        def decide(cmd: Command) -> Any:
            policy = cmd.state.workspace_policy
            chosen = mode or policy.get("default_mount_mode") or "read_write"
            cmd.emit([ev.WorkspaceRootAdded(root=root, mount_mode=chosen, mounted_at=mounted_at)])
            return chosen

        chosen = self._command(verb, session_id, decide)
        return {"ok": True, "root": root, "mount_mode": chosen, "mounted_at": mounted_at or root}

    def remove_root(self, session_id: str, root: str) -> dict[str, Any]:
        """Unmount a root; ``{ok: False, error}`` when it was not mounted."""
        verb = "remove_root"
        if not isinstance(root, str) or not root:
            raise InvalidArgumentError(f"{verb}: `root` must be a non-empty str, got {root!r}")

        def decide(cmd: Command) -> dict[str, Any]:
            if not any(entry.get("root") == root for entry in cmd.state.roots):
                return {"ok": False, "root": root, "error": f"`{root}` is not mounted"}
            cmd.emit([ev.WorkspaceRootRemoved(root=root)])
            return {"ok": True, "root": root}

        return self._command(verb, session_id, decide)

    def list_roots(self, session_id: str) -> dict[str, Any]:
        """``{primary, additional}``: the anchor's root and the mounted roots."""
        with self._view() as view:
            state = self._state(view, session_id, "list_roots")
        anchor = state.workspace_anchor or {}
        additional = [
            {**entry, "mounted_at": entry.get("mounted_at", entry["root"])}
            for entry in to_builtins(state.roots)
        ]
        return {"primary": anchor.get("root"), "additional": additional}


def _provenance(options: dict[str, Any], verb: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("source", "reason"):
        if options.get(name) is not None:
            fields[name] = check_text(options[name], name, verb)
    if options.get("metadata") is not None:
        fields["metadata"] = check_dict(options["metadata"], "metadata", verb)
    return fields
