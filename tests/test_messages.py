"""Message dicts keep every key a caller stored, at every level, through the log and back."""

from __future__ import annotations

import projections as pj
from sessions import SessionStore
from sessions._messages import to_dict, to_dicts


def test_unknown_keys_in_files_and_usage_come_back() -> None:
    message = {
        "role": "assistant",
        "content": "done",
        "files": ["a.py", {"path": "b.py", "sha": "f00", "mime_type": "text/x-python"}],
        "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4},
        "x_vendor": {"trace": [1, 2]},
    }
    with SessionStore.memory() as store:
        sid = store.open_session()
        store.inject(sid, message)
        [stored] = store.messages(sid)
        store.rebuild()
        assert store.messages(sid) == [stored]
    assert stored == {**message, "files": [{"path": "a.py"}, message["files"][1]]}


SHAPES = [
    {"role": "user", "content": "plain"},
    {"role": "user"},
    {"role": "assistant", "name": "bot"},
    {"role": "system", "x_trace": "t"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "content": "out", "tool_call_id": "c1", "x_vendor": 1},
    {"role": "user", "content": [{"type": "text", "text": "hi"}], "metadata": {"k": "v"}},
    {"role": "assistant", "content": "ok", "usage": {"input_tokens": 3, "cached": 1}},
    {"role": "user", "content": "see", "files": [{"path": "a.py", "sha": "f00"}]},
    {"item": {"type": "function_call", "call_id": "c2", "arguments": b"\x00{}"}},
]


def test_a_transcript_of_every_shape_reads_the_same_cold_and_warm() -> None:
    # The whole-transcript conversion skips messages holding nothing but role and content; every
    # other shape goes the per-message way, and the cold read (from the log, hash-checked) and
    # the cached one hand out equal dicts.
    with SessionStore.memory() as store:
        sid, other = store.open_session(), store.open_session()
        for message in SHAPES:
            store.inject(sid, message)
            store.inject(other, {"role": "user", "content": "between"})
        warm = store.snapshot(sid)
        cold = SessionStore(store.log, hot_sessions=0).snapshot(sid)
        assert warm is not None and cold == warm == store.snapshot(sid)
        with store.log.view() as view:
            transcript = pj.load_transcript(view, sid)
            assert transcript is not None
            messages = pj.read_messages(view, transcript)
    assert to_dicts(messages) == [to_dict(message) for message in messages] == warm["transcript"]
    assert [message["role"] for message in warm["transcript"]] == [
        message.get("role", "item") for message in SHAPES
    ]
