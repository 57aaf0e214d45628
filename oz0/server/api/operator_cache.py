"""Operator certificates the management API found current a moment ago, with who they are
(the person: role and tenants).

Without it every request reads the `operators` table before doing its work; a burst of
requests from one operator then costs a database round trip each for the same answer.
A certificate found current (its person) is taken again without a read for HOLD_FOR
seconds, unless the operator changed meanwhile: the `oz0_operators` notification (sent in
the same transaction as any renewal, re-issue, removal or change of role or tenants,
whichever server or `server operator issue` made it) forgets every entry of that operator
at once, and a LISTEN gap forgets them all. So a replaced certificate is refused as soon as
this server hears of the change, and never later than HOLD_FOR after it even if that
notification is lost. Only acceptance is kept: a refusal is read again each time.

The requests of a burst arrive together, all after the last one's HOLD_FOR ran out: they
share one read (`confirmed`) instead of each making its own (50 reads in worker threads,
which spread a burst of 50 blocks over 45-80 ms more before the first was written).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import trio

from oz0 import access, pki
from oz0.store.events import OPERATORS, EventHub, Subscription
from oz0.store.listen import Notification

HOLD_FOR = 1.0
# Expired entries are swept once there are more than this (one per operator certificate
# seen within HOLD_FOR: a handful in practice).
SWEEP_ABOVE = 1024

Key = tuple[str, int]


@dataclass(eq=False)
class _Read:
    version: tuple[int, int]
    done: trio.Event = field(default_factory=trio.Event)
    answer: access.Person | None = None
    answered: bool = False  # False: the read failed or was cancelled


@dataclass
class OperatorCache:
    hold_for: float = HOLD_FOR
    _until: dict[Key, tuple[float, access.Person]] = field(default_factory=dict)
    # Bumped whenever an operator changes: a read that began before must not be kept.
    _changes: collections.Counter[str] = field(default_factory=collections.Counter)
    _all_changes: int = 0
    _reading: dict[Key, _Read] = field(default_factory=dict)

    def subscribed(self, hub: EventHub) -> AbstractContextManager[Subscription]:
        """HUB's news of operators heard (what changed forgotten) while the block runs."""
        return hub.subscription(OPERATORS, notified=self._notified, on_gap=self.forget_all)

    def _notified(self, notification: Notification) -> None:
        self.forget(notification.payload)

    def current(self, identity: pki.Identity) -> access.Person | None:
        """IDENTITY's person, if its certificate was found current within the last
        HOLD_FOR s."""
        key = (identity.name, identity.serial)
        kept = self._until.get(key)
        if kept is None:
            return None
        if identity.not_after <= pki.utcnow():
            return None  # the database's answer too, from that moment
        if trio.current_time() >= kept[0]:
            del self._until[key]
            return None
        return kept[1]

    async def confirmed(
        self, identity: pki.Identity, read: Callable[[], Awaitable[access.Person | None]]
    ) -> access.Person | None:
        """IDENTITY's person if its certificate is current (else None): from the cache, else
        from READ (the database's answer), one READ for all who ask while it runs. An answer
        from a read that the operator's change crossed is not shared: the one who asked
        later reads again. A failed read fails only its caller (the others read for themselves)."""
        kept = self.current(identity)
        if kept is not None:
            return kept
        key = (identity.name, identity.serial)
        running = self._reading.get(key)
        if running is not None:
            await running.done.wait()
            if running.answered and running.version == self.version(identity.name):
                return running.answer
            return await read()
        mine = self._reading[key] = _Read(self.version(identity.name))
        try:
            answer = mine.answer = await read()
            mine.answered = True
        finally:
            del self._reading[key]
            mine.done.set()
        if answer is not None:
            self.remember(identity, mine.version, answer)
        return answer

    def version(self, name: str) -> tuple[int, int]:
        """Take before reading the database about NAME; give to `remember`."""
        return self._all_changes, self._changes[name]

    def remember(
        self, identity: pki.Identity, version: tuple[int, int], person: access.Person
    ) -> None:
        """Keep IDENTITY as current (it is PERSON), read so at VERSION, unless it changed
        since."""
        if version != self.version(identity.name):
            return
        now = trio.current_time()
        if len(self._until) >= SWEEP_ABOVE:
            self._until = {k: v for k, v in self._until.items() if v[0] > now}
        self._until[(identity.name, identity.serial)] = (now + self.hold_for, person)

    def forget(self, name: str) -> None:
        self._changes[name] += 1
        for key in [k for k in self._until if k[0] == name]:
            del self._until[key]

    def forget_all(self) -> None:
        self._all_changes += 1
        self._until.clear()
