"""The step log's file removed from under a serving group: requests go on, the log comes
back at its path with every step (the shared fixture verifies it in teardown). The group
may have served other modules first: their requests are in the log too."""
from __future__ import annotations

import os

from frontend.client import Client
from tests.logfaults import count
from tests.waiting import wait_until

REQ = dict(prompt=[5, 6, 7, 8], max_tokens=24, ignore_eos=True)


def test_removed_log_is_restored_while_serving(group):
    with Client(group.address, timeout=60) as c:
        wait_until(lambda: count(group.log) == c.stats()["steps"], what="the earlier steps")
        earlier = count(group.log, "requests")
        want = c.generate(**REQ).token_ids
        os.remove(group.log)
        during = [c.generate(**REQ).token_ids for _ in range(3)]
        wait_until(group.log.exists, timeout=15, what="the restored log")
        after = c.generate(**REQ).token_ids
        steps = c.stats()["steps"]
    assert during == [want] * 3 and after == want
    wait_until(lambda: count(group.log) == steps, what="every step in the restored log")
    assert count(group.log, "requests") == earlier + 5
    assert f"{group.log} was removed while in use; restored it" in group.stderr.read_text()
