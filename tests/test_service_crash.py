"""SIGKILL of the server in the middle of injects from several clients and of live streams.

Fault model: the server process dies at an arbitrary instruction (SIGKILL), with requests in
flight, some committed and not yet answered. What must hold after a restart on the same store:
every message whose inject was acknowledged (2xx) is present exactly once; a client that retries
an unanswered inject with the same Idempotency-Key writes it at most once more in total (so every
message is present exactly once); and a stream that resumes from its last `Last-Event-ID` sees
every event of the session exactly once, in log order.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests._service import Server
from tests.test_service_log import Tail

CLIENTS = 4
MESSAGES_PER_CLIENT = 30
KILL_AFTER_ACKS = 40


@pytest.mark.slow
def test_sigkill_mid_writes_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = Server(tmp_path / "store").start()
    try:
        with server.client() as admin:
            sid = admin.open_session("crash")
        acked: list[str] = []
        lock = threading.Lock()
        failures: list[BaseException] = []

        def writer(number: int) -> None:
            with server.client(retries=200, retry_delay_s=0.05) as client:
                for i in range(MESSAGES_PER_CLIENT):
                    text = f"c{number}-{i}"
                    try:
                        client.inject(sid, {"role": "user", "content": text}, idempotency_key=text)
                    except BaseException as exc:  # reported below: the test fails on it
                        failures.append(exc)
                        return
                    with lock:
                        acked.append(text)

        watchers = [server.client() for _ in range(2)]
        tails = [Tail(watchers[0], sid), Tail(watchers[1], None)]
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        while len(acked) < KILL_AFTER_ACKS and not failures:
            time.sleep(0.005)
        server.kill()
        acked_before_kill = list(acked)
        time.sleep(0.3)
        server.start()
        for thread in threads:
            thread.join(120)
        assert not failures, failures
        with server.client() as admin:
            contents = Counter(m["content"] for m in admin.messages(sid))
            events = admin.events(sid, limit=1000)
            whole = admin.events(limit=1000)
            assert admin.verify(projections=True)["ok"] is True
        assert all(contents[text] == 1 for text in acked_before_kill)
        assert sorted(contents) == sorted(acked) and set(contents.values()) == {1}
        assert len(acked) == CLIENTS * MESSAGES_PER_CLIENT
        session_ids = [e["id"] for e in events]
        seen = [e["id"] for e in tails[0].take(len(session_ids), timeout_s=60)]
        assert seen == session_ids  # every event of the session, once, in order
        seen_whole = [e["id"] for e in tails[1].take(len(whole), timeout_s=60)]
        assert seen_whole == [e["id"] for e in whole]
        assert tails[0].events.empty() and tails[1].events.empty()
        for watcher in watchers:
            watcher.close()
    finally:
        server.kill()
