"""``cached_property`` without a lock: the planner's objects compute each figure on first use.

Python 3.11's ``functools.cached_property`` takes an ``RLock`` on every first access (removed in 3.12: the lock
serialized unrelated instances and did not make a computation run once anyway). A 92k-tensor plan makes ~185k
first accesses: the lock cost 0.3 s of an 8 s plan here (bench/plan.py). Planning runs in one thread, and a
computation that ran twice would give the same value. On 3.12 and later this is functools' own."""

from __future__ import annotations

import sys

__all__ = ["cached_property"]

if sys.version_info >= (3, 12):
    from functools import cached_property
else:

    class cached_property:  # noqa: N801 - functools' name and behaviour
        """The value ``func(instance)``, stored in the instance's ``__dict__`` under the attribute's name on
        first access (a non-data descriptor: later reads never reach it)."""

        def __init__(self, func):
            self.func = func
            self.attrname: str | None = None
            self.__doc__ = func.__doc__
            self.__module__ = func.__module__

        def __set_name__(self, owner, name: str) -> None:
            self.attrname = name

        def __get__(self, instance, owner=None):
            if instance is None:
                return self
            value = instance.__dict__[self.attrname] = self.func(instance)
            return value
