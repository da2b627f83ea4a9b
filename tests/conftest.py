"""Shared fixtures: a real broker on a temporary directory and a free loopback port."""

from __future__ import annotations

import pytest

from tailrace.bench.launcher import Broker


@pytest.fixture
def make_broker(tmp_path):
    """Factory: make_broker(workers=2, **settings) -> started Broker; all stopped at teardown."""
    started: list[Broker] = []

    def make(workers: int = 2, start: bool = True, data_dir=None, **settings) -> Broker:
        settings.setdefault("segment_bytes", 8 << 20)
        settings.setdefault("shm_budget_bytes", 512 << 20)
        b = Broker(data_dir or tmp_path / f"broker{len(started)}", workers=workers, **settings)
        started.append(b)
        if start:
            b.start()
        return b

    yield make
    for b in started:  # every one stopped before anything is cleaned (two may share a data directory)
        b.stop()
    left = sorted({name for b in started for name in b.shm_regions()})
    for b in started:
        b.cleanup_shm()
    assert not left, f"shared memory left after a clean stop: {left}"


@pytest.fixture
def broker(make_broker) -> Broker:
    return make_broker()


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """One broker, as ``broker`` makes it, for every test of a module that takes it (a module
    overrides ``broker`` with it): a start and a clean stop cost 8-10 s on a 2-core CI box, more
    than most of those tests. Each test there uses topics of its own names and leaves the broker
    as it found it (a program it froze is thawed). Stopped at the end of the module, when no
    shared memory may be left, as ``make_broker`` checks."""
    b = Broker(tmp_path_factory.mktemp("module-broker") / "data", workers=2, segment_bytes=8 << 20,
               shm_budget_bytes=512 << 20)
    try:
        b.start()
        yield b
    finally:
        b.stop()
        left = sorted(b.shm_regions())
        b.cleanup_shm()
    assert not left, f"shared memory left after a clean stop: {left}"


@pytest.fixture(params=["blocking", "async"])
def client(request):
    """The blocking client, then the asyncio one behind the same API (tests/clients.py): a test
    that takes it runs its assertions against both."""
    from tests.clients import CLIENTS

    return CLIENTS[request.param]
