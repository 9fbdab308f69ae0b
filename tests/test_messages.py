"""Message dicts keep every key a caller stored, at every level, through the log and back."""

from __future__ import annotations

from sessions import SessionStore


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
