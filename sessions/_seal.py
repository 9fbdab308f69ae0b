"""Sealing: the content of an encrypted session's events, encrypted with the session's data key.

What is sealed, keyed and left readable, event by event: `sessions/_sealed_fields.py`.

Each ciphertext is AES-256-GCM under the data key of the session that wrote it, behind a header
that starts with its format:
- format 1, one message or value: which key (its keyring slot), the log position and the index of
  the message in its event (0 for a value);
- format 2, the whole list of a batch event (`messages_injected`, `session_compacted`), encoded
  and sealed as one ciphertext in the first message's `sealed`: which key, the log position and
  how many messages the list holds. Every message keeps its readable part (role, usage and the
  flags) and an empty `sealed`. Opening a list costs one call for the batch instead of one per
  message; reading a few messages of a big batch opens all of it.
The header and the field's name are the associated data, so a ciphertext moved to another event,
field or session, cut short or altered fails to open (`IntegrityError` naming the position); so
does a message the session wrote itself (since it was opened) that is found unsealed, or sealed
under another session's key (a transcript pointed at another session's events, or a header
relabelled to a destroyed key, which would read as a forgotten placeholder). New
writes seal batches in format 2; format 1 batches, as older stores hold them, read as before. A
fork's shared prefix stays sealed under its parent's key.
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import projections as pj
from eventlog import (
    DECODE_ERRORS,
    IntegrityError,
    InvalidArgumentError,
    LogView,
    StructCodec,
    Transaction,
)
from eventlog import events as ev
from eventlog.errors import ForgottenError
from sessions._keyed_refs import SPAWN_REF, keyed_ref, open_ref
from sessions._keyring import Keyring
from sessions._keys import NONCE_BYTES
from sessions._sealed_fields import (
    KEYED,
    KEYED_REFS,
    MESSAGE_LISTS,
    MESSAGES,
    READABLE_METADATA,
    SEALED_KINDS,
    SHOWN,
    TEXTS,
    VALUE_LISTS,
    VALUES,
)

_HEADER = struct.Struct(">BIQH")
"""Format (1), keyring slot, log position, index of the message in its event."""
_FORMAT = 1
_BATCH_HEADER = struct.Struct(">BIQI")
"""Format (2), keyring slot, log position, number of messages in the list."""
_BATCH_FORMAT = 2
_TAG_BYTES = 16
SEALED_TEXT = "\x00sealed:"
"""How a sealed text or value starts (then base64 of header, nonce and ciphertext): JSON carries
it, and no text a caller gives starts with a NUL."""

_MESSAGES_CODEC = StructCodec(ev.Message, "sealed message")
_MESSAGE_DECODER = msgspec.msgpack.Decoder(ev.Message)
"""The same decoding without the codec's wrapping call, for the opener's common case."""
_BATCH_DECODER = msgspec.msgpack.Decoder(list[ev.Message])
_RAWS_DECODER = msgspec.msgpack.Decoder(list[msgspec.Raw])
"""A sealed list split into its messages' bytes, for decoding only the few a read wants."""
_FEW = 4
"""Fewer than one in `_FEW` of a list's messages wanted: only those are decoded."""
_VALUES_CODEC = StructCodec(object, "sealed value")


_M = b"message"


def _aad(header: bytes, label: str) -> bytes:
    return header + label.encode()


class Sealer:
    """Seals what an encrypted session writes and opens what it reads, with the keyring's keys."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    # Writing

    def seal(self, tx: Transaction, session_id: str, events: list[ev.Event]) -> list[ev.Event]:
        """`events` as they are stored for `session_id`: sealed when the session is encrypted."""
        first = events[0]
        if isinstance(first, (ev.SessionOpened, ev.SessionForked)):
            slot = first.key_slot
        else:
            state = pj.load_state(tx, session_id)
            if state is None or not state.key_slot:
                return events
            if state.forgotten:
                raise ForgottenError(session_id, "write", state.forgotten_reason)
            slot = state.key_slot
        if not slot or not any(type(event) in SEALED_KINDS for event in events):
            return events
        aead = self.keyring.key(slot, "write")
        if aead is None:
            raise ForgottenError(session_id, "write")
        position = tx.head + 1
        return [
            self._seal_event(aead, slot, position + offset, event)
            for offset, event in enumerate(events)
        ]

    def _seal_event(self, aead: AESGCM, slot: int, position: int, event: ev.Event) -> ev.Event:
        kind = type(event)
        if kind not in SEALED_KINDS:
            return event
        changes: dict[str, Any] = {}
        for index, name in enumerate(MESSAGES.get(kind, ())):
            changes[name] = seal_message(aead, slot, position, index, getattr(event, name))
        listed = MESSAGE_LISTS.get(kind)
        if listed is not None and getattr(event, listed):
            changes[listed] = seal_batch(aead, slot, position, listed, getattr(event, listed))
        for name in TEXTS.get(kind, ()):
            text = getattr(event, name)
            if text is not None:
                changes[name] = _seal_value(aead, slot, position, name, text)
        shown = SHOWN.get(kind, ())
        for name in KEYED.get(kind, ()):  # a digest, the same each retry (`KEYED`)
            text = getattr(event, name)
            if text is not None:
                changes[name] = self.keyring.keyed(slot, text, "write")
                if name in shown:  # what the runtime's answers show while the key lives
                    changes[f"sealed_{name}"] = _seal_value(aead, slot, position, name, text)
        refs = KEYED_REFS.get(kind)
        if refs is not None and getattr(event, refs[0]) is not None:
            changes[refs[0]] = keyed_ref(
                getattr(event, refs[0]),
                refs,
                lambda text: self.keyring.keyed(slot, text, "write"),
                lambda label, text: _seal_value(aead, slot, position, label, text),
            )
        for name in VALUES.get(kind, ()):
            values = getattr(event, name)
            changes[name] = {
                key: value
                if name == "metadata" and key in READABLE_METADATA
                else _seal_value(aead, slot, position, f"{name}\x00{key}", value)
                for key, value in values.items()
            }
        records = VALUE_LISTS.get(kind)
        if records is not None:
            changes[records] = [
                {
                    key: value
                    if key == "filter"
                    else _seal_value(aead, slot, position, f"{records}\x00{key}", value)
                    for key, value in record.items()
                }
                for record in getattr(event, records)
            ]
        return msgspec.structs.replace(event, **changes)

    # Reading

    def opener(self, view: LogView, state: pj.SessionState, verb: str) -> pj.Opener:
        """What opens the messages of `state`'s transcript, an event at a time (a fork of an
        encrypted parent opens what it inherited even when it is plain itself)."""
        if state.forgotten:
            raise ForgottenError(state.session_id, verb, state.forgotten_reason)
        keys = _Keys(self.keyring, state.key_slot, verb, state.session_id, _opened_at(view, state))
        open_message = _message_opener(keys)
        lists, singles = MESSAGE_LISTS, MESSAGES

        def open_event(data: ev.Event, position: int, indexes: list[int]) -> list[ev.Message]:
            if type(data) is ev.MessageInjected:  # the most common event
                return [open_message(data.message, position, 0) for _ in indexes]
            field = lists.get(type(data))
            if field is None:
                names = singles[type(data)]
                return [open_message(getattr(data, names[i]), position, i) for i in indexes]
            messages: list[ev.Message] = getattr(data, field)
            first = messages[0].sealed if messages else None
            if first and first[0] == _BATCH_FORMAT:
                return open_batch(keys, messages, position, field, indexes)
            if first is None and len(messages) > 1 and messages[-1].sealed == b"":
                raise IntegrityError(  # shells of a sealed list (format 2) without its ciphertext
                    f"{verb}: the sealed list at position {position} lost its ciphertext", position
                )
            return [open_message(messages[i], position, i) for i in indexes]

        return open_event

    def open_state(self, state: pj.SessionState, verb: str) -> pj.SessionState:
        """`state` with its sealed texts and values opened (those under a destroyed key of an
        ancestor read as None)."""
        if state.forgotten:
            raise ForgottenError(state.session_id, verb, state.forgotten_reason)
        keys = _Keys(self.keyring, state.key_slot, verb, state.session_id)
        keys.root = state.parent_id is None  # a fork inherits its parent's values, sealed by it
        return msgspec.structs.replace(
            state,
            title=keys.text(state.title, "title"),
            system_prompt=keys.text(state.system_prompt, "system_prompt"),
            metadata=keys.values(state.metadata, "metadata"),
            parent_spawn_ref=open_ref(state.parent_spawn_ref, SPAWN_REF, keys.text),
            scratchpad=None
            if state.scratchpad is None
            else keys.values(state.scratchpad, "scratchpad"),
            clients=[
                msgspec.structs.replace(client, metadata=keys.values(client.metadata, "metadata"))
                if client.metadata
                else client
                for client in state.clients
            ],
        )

    def open_text(self, text: str | None, own_slot: int, label: str, verb: str) -> str | None:
        """A sealed text kept in a projection, sealed as `label`; None under a destroyed key."""
        return _Keys(self.keyring, own_slot, verb).text(text, label)

    def open_event(self, event: ev.Event, own_slot: int, verb: str) -> ev.Event:
        """An event's sealed texts and values opened (for comparing what a session was opened
        with)."""
        keys = _Keys(self.keyring, own_slot, verb)
        changes: dict[str, Any] = {}
        for name in TEXTS.get(type(event), ()):
            changes[name] = keys.text(getattr(event, name), name)
        for name in VALUES.get(type(event), ()):
            changes[name] = keys.values(getattr(event, name), name)
        refs = KEYED_REFS.get(type(event))
        if refs is not None:
            changes[refs[0]] = open_ref(getattr(event, refs[0]), refs, keys.text)
        return msgspec.structs.replace(event, **changes) if changes else event


def seal_message(
    aead: AESGCM, slot: int, position: int, index: int, message: ev.Message
) -> ev.Message:
    if message.sealed is not None:
        raise InvalidArgumentError(
            "a message given to an encrypted session carries `sealed` already; it is the "
            "engine's field"
        )
    header = _HEADER.pack(_FORMAT, slot, position, index)
    nonce = os.urandom(NONCE_BYTES)
    body = aead.encrypt(nonce, _MESSAGES_CODEC.encode(message), _aad(header, "message"))
    return ev.Message(
        role=message.role,
        usage=message.usage,
        synthetic=message.synthetic,
        summary=message.summary,
        sealed=header + nonce + body,
    )


def seal_batch(
    aead: AESGCM, slot: int, position: int, field: str, messages: list[ev.Message]
) -> list[ev.Message]:
    """`messages`, the list `field` of the event at `position`, sealed whole (format 2): the first
    message's `sealed` holds the ciphertext, every message keeps its readable part."""
    if any(message.sealed is not None for message in messages):
        raise InvalidArgumentError(
            "a message given to an encrypted session carries `sealed` already; it is the "
            "engine's field"
        )
    header = _BATCH_HEADER.pack(_BATCH_FORMAT, slot, position, len(messages))
    nonce = os.urandom(NONCE_BYTES)
    body = aead.encrypt(nonce, _VALUES_CODEC.encode(messages), _aad(header, field))
    shells = [
        ev.Message(
            role=message.role,
            usage=message.usage,
            synthetic=message.synthetic,
            summary=message.summary,
            sealed=b"",
        )
        for message in messages
    ]
    shells[0] = msgspec.structs.replace(shells[0], sealed=header + nonce + body)
    return shells


def _seal_value(aead: AESGCM, slot: int, position: int, label: str, value: Any) -> str:
    header = _HEADER.pack(_FORMAT, slot, position, 0)
    nonce = os.urandom(NONCE_BYTES)
    body = aead.encrypt(nonce, _VALUES_CODEC.encode(value), _aad(header, label))
    return SEALED_TEXT + base64.b64encode(header + nonce + body).decode("ascii")


class _Keys:
    """The data keys one read needs: the session's own (which reading checked is not forgotten)
    and its ancestors', whose slots are read again, since another process may have shredded them.

    `opened_at`, when given, finds the log position where the session was opened: what it wrote
    from there on is its own, sealed under its own key, so a message there that is not sealed, or
    is sealed under another session's key, was put there by someone else. What it
    inherited (a fork's prefix) may be plain (a parent from before the store had keys) or under
    a parent's destroyed key."""

    __slots__ = ("found", "keyring", "opened_at", "own", "root", "session_id", "since", "verb")

    def __init__(
        self,
        keyring: Keyring,
        own: int,
        verb: str,
        session_id: str | None = None,
        opened_at: Callable[[], int] | None = None,
    ) -> None:
        self.keyring, self.own, self.verb, self.opened_at = keyring, own, verb, opened_at
        self.session_id = session_id
        self.found: dict[int, AESGCM | None] = {}
        self.since: int | None = None
        self.root = False
        """Whether every value read is the session's own (it is not a fork)."""

    def owns(self, position: int) -> bool:
        """Whether the event at `position` is the encrypted session's own, not inherited (looked
        up once, on the first message that needs it: sealed ones read as usual never do)."""
        if not self.own or self.opened_at is None:
            return False
        if self.since is None:
            self.since = self.opened_at()
        return position >= self.since

    def unsealed(self, message: ev.Message, position: int) -> ev.Message:
        """`message`, read at `position` with no ciphertext: as it is when the session inherited
        it from a plain parent; refused when the session wrote it."""
        if self.owns(position):
            raise IntegrityError(
                f"{self.verb}: the message at position {position} is not sealed, but the "
                "encrypted session wrote it there: it was replaced",
                position,
            )
        return message

    def foreign(self, slot: int, position: int) -> None:
        """Refuse content read at `position` sealed under another key than the session's own
        (another session's, live or destroyed) when the session wrote it there itself: a
        transcript pointed at another session's events, or a header relabelled to read as
        forgotten."""
        if slot != self.own and self.owns(position):
            raise IntegrityError(
                f"{self.verb}: the content at position {position} is sealed under key {slot}, "
                f"but the session wrote what it holds there under its own key {self.own}: it "
                "is another session's, or was altered",
                position,
            )

    def get(self, slot: int) -> AESGCM | None:
        if slot in self.found:
            return self.found[slot]
        key = self.keyring.key(slot, self.verb, fresh=slot != self.own)
        if key is None and slot == self.own and self.session_id is not None:
            # The session's own key is gone though the state read says it is not forgotten: a
            # view of the store as of before the forget, or a forget committed since the read.
            raise ForgottenError(self.session_id, self.verb)
        self.found[slot] = key
        return key

    def open(
        self,
        blob: bytes,
        label: str,
        check: Callable[[int, int], None] | None,
        at: int | None = None,
    ) -> Any:
        """The plaintext of `blob` (format 1), sealed as `label`; `at`: the log position it was
        read at, when known, for the errors to name."""
        read_at = "" if at is None else f" read at position {at}"
        if len(blob) < _HEADER.size + NONCE_BYTES:
            raise IntegrityError(
                f"{self.verb}: a sealed value of {len(blob)} bytes{read_at} is cut short", at
            )
        header = blob[: _HEADER.size]
        form, slot, position, index = _HEADER.unpack(header)
        if form != _FORMAT:
            raise IntegrityError(
                f"{self.verb}: a sealed value{read_at} is in format {form}, not {_FORMAT}", at
            )
        if check is not None:
            check(position, index)
        if at is not None:
            self.foreign(slot, at)
        elif self.root and slot != self.own:
            raise IntegrityError(
                f"{self.verb}: a sealed {label.split(chr(0), maxsplit=1)[0]} of session "
                f"`{self.session_id}` is under key {slot}, not its own: it is another session's",
                position,
            )
        key = self.get(slot)
        if key is None:
            return _FORGOTTEN
        nonce = blob[_HEADER.size : _HEADER.size + NONCE_BYTES]
        try:
            return key.decrypt(nonce, blob[_HEADER.size + NONCE_BYTES :], _aad(header, label))
        except InvalidTag as exc:
            raise IntegrityError(
                f"{self.verb}: the sealed {label.split(chr(0), maxsplit=1)[0]} written at position "
                f"{position} does not open with its key: it was altered or moved",
                position,
            ) from exc

    def text(self, text: str | None, label: str) -> str | None:
        if text is None or not text.startswith(SEALED_TEXT):
            return text
        plain = self.open(_unbase(text), label, None)
        return None if plain is _FORGOTTEN else str(_VALUES_CODEC.decode(plain))

    def values(self, values: Mapping[str, Any], label: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, str) and value.startswith(SEALED_TEXT):
                plain = self.open(_unbase(value), f"{label}\x00{key}", None)
                out[key] = None if plain is _FORGOTTEN else _VALUES_CODEC.decode(plain)
            else:
                out[key] = value
        return out


_FORGOTTEN: Any = object()


def _opened_at(view: LogView, state: pj.SessionState) -> Callable[[], int]:
    """What finds the log position of the event that opened `state`'s incarnation (a fork's
    inherited messages all come before it)."""

    def find() -> int:
        after = state.opened_version - 1
        opened = view.read_stream(state.session_id, after=after, limit=1)
        return opened[0].position if opened else view.head + 1

    return find


def _unbase(text: str) -> bytes:
    try:
        return base64.b64decode(text[len(SEALED_TEXT) :], validate=True)
    except ValueError as exc:
        raise IntegrityError("a sealed value is not base64") from exc


def _message_opener(keys: _Keys) -> Callable[[ev.Message, int, int], ev.Message]:
    """What opens one message sealed on its own (format 1) with `keys`, given where it was read."""
    found, unpack, own = keys.found, _HEADER.unpack_from, keys.own
    size, body_at, decode = _HEADER.size, _HEADER.size + NONCE_BYTES, _MESSAGE_DECODER.decode

    def open_message(message: ev.Message, position: int, index: int) -> ev.Message:
        # The common case inline; anything unusual (a short or moved ciphertext, a key not yet
        # looked up or destroyed, another session's key where the session wrote, bytes that do
        # not decode) takes `open_message_at`, which names what is wrong.
        blob = message.sealed
        if blob is None:
            return keys.unsealed(message, position)
        if len(blob) > body_at:
            form, slot, at, at_index = unpack(blob)
            key = found.get(slot)
            if (
                key is not None
                and at == position
                and at_index == index
                and form == _FORMAT
                and (slot == own or position < (keys.since or 0))
            ):
                try:
                    found_message: ev.Message = decode(
                        key.decrypt(blob[size:body_at], blob[body_at:], blob[:size] + _M)
                    )
                except (InvalidTag, *DECODE_ERRORS):
                    pass
                else:
                    return found_message
        return open_message_at(keys, message, position, index)

    return open_message


def open_message_at(keys: _Keys, message: ev.Message, position: int, index: int) -> ev.Message:
    """The message sealed in `message`, read at log position `position`, index `index`; a
    placeholder saying so when its key (an ancestor's) was destroyed."""

    def check(claimed: int, claimed_index: int) -> None:
        if (claimed, claimed_index) != (position, index):
            raise IntegrityError(
                f"{keys.verb}: the sealed message at position {position} (index {index}) was "
                f"written at position {claimed} (index {claimed_index}): it was moved",
                position,
            )

    assert message.sealed is not None
    plain = keys.open(message.sealed, "message", check, position)
    if plain is _FORGOTTEN:
        return _forgotten(message)
    return _MESSAGES_CODEC.decode(plain)


def open_batch(
    keys: _Keys, shells: list[ev.Message], position: int, field: str, indexes: list[int]
) -> list[ev.Message]:
    """Messages `indexes` of the list `field` of the event at log position `position`, sealed
    whole (format 2) in the first of its `shells`; placeholders saying so when its key (an
    ancestor's) was destroyed. The list is decrypted whole; when a few of its messages are
    wanted (a page, a tail), only those are decoded."""
    blob = shells[0].sealed
    assert blob is not None
    size = _BATCH_HEADER.size
    where = f"{keys.verb}: the sealed list of {len(shells)} messages at position {position}"
    if len(blob) < size + NONCE_BYTES + _TAG_BYTES:
        raise IntegrityError(f"{where} is cut short ({len(blob)} bytes)", position)
    header = blob[:size]
    _, slot, at, count = _BATCH_HEADER.unpack(header)
    if (at, count) != (position, len(shells)):
        raise IntegrityError(
            f"{where} was written at position {at} with {count} messages: it was moved", position
        )
    keys.foreign(slot, position)
    key = keys.get(slot)
    if key is None:
        return [_forgotten(shells[i]) for i in indexes]
    try:
        plain = key.decrypt(  # the body as a view: a copy of a big list costs more than opening it
            blob[size : size + NONCE_BYTES],
            memoryview(blob)[size + NONCE_BYTES :],
            _aad(header, field),
        )
    except InvalidTag as exc:
        raise IntegrityError(
            f"{where} does not open with its key as `{field}`: it was altered or moved", position
        ) from exc
    return _decoded(plain, count, indexes, where, position)


def _decoded(
    plain: bytes, count: int, indexes: list[int], where: str, position: int
) -> list[ev.Message]:
    """Messages `indexes` of a sealed list of `count` messages, decrypted: when fewer than one in
    `_FEW` are wanted (a page, a tail), only those are decoded."""
    try:
        if len(indexes) * _FEW < count:
            raws = _RAWS_DECODER.decode(plain)
            if len(raws) == count:
                decode = _MESSAGE_DECODER.decode
                return [decode(raws[i]) for i in indexes]
            found = len(raws)
        else:
            opened = _BATCH_DECODER.decode(plain)
            if len(opened) == count:
                return [opened[i] for i in indexes]
            found = len(opened)
    except DECODE_ERRORS as exc:
        raise IntegrityError(f"{where} opens but does not decode: {exc}", position) from exc
    raise IntegrityError(f"{where} holds {found} messages, not {count}", position)


def _forgotten(message: ev.Message) -> ev.Message:
    """What a message sealed under a destroyed key reads as: its readable part, marked."""
    return ev.Message(
        role=message.role,
        synthetic=message.synthetic,
        summary=message.summary,
        metadata={"forgotten": True},
    )
