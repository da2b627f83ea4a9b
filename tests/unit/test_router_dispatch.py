"""The router's dispatch (router/server.py ``dispatch_table``) is a view of client/ops.py SPEC:
every op the router takes has exactly one handler, and a missing or stray one fails at start."""

from __future__ import annotations

import pytest

from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.router import status, topics
from tailrace.router.server import DispatchError, dispatch_table


def _handler(req):  # never called: the table is only built
    raise AssertionError(req)


def _own():
    own = {op: _handler for op in (*topics.HANDLERS, *status.HANDLERS)}
    own[P.Op.DESCRIBE_TOPIC] = _handler
    own[P.Op.FIND_COORDINATOR] = _handler  # the group coordinator's (router/groups.py Coordinator.find)
    own[P.Op.PRODUCE_DELAYED] = _handler  # the timer's (router/timer.py Timer.produce)
    return own


BY_SERVED = {ops.OWNER: _handler, ops.ANY_WORKER: _handler, ops.COORDINATOR: _handler, ops.SHARE: _handler}


def test_every_op_the_router_takes_has_a_handler_and_no_other_op_has_one():
    table = dispatch_table(_own(), BY_SERVED)
    assert set(table) == set(ops.frames_at("router"))
    assert not set(table) & ops.INTERNAL_OPS


def test_the_router_own_handlers_are_exactly_its_router_rows():
    assert set(_own()) == {row.op for row in ops.SPEC if row.served == ops.ROUTER}


@pytest.mark.parametrize("op", [P.Op.CREATE_TOPIC, P.Op.STATUS, P.Op.DESCRIBE_TOPIC])
def test_a_router_op_without_a_handler_fails_at_start_naming_it(op):
    own = _own()
    del own[op]
    with pytest.raises(DispatchError, match=op.name):
        dispatch_table(own, BY_SERVED)


def test_a_served_column_without_a_handler_fails_at_start():
    with pytest.raises(DispatchError, match="GROUP_HEARTBEAT"):
        dispatch_table(_own(), {ops.OWNER: _handler, ops.ANY_WORKER: _handler})


def test_a_handler_for_an_op_the_router_does_not_serve_itself_fails():
    with pytest.raises(DispatchError, match="PRODUCE"):
        dispatch_table({**_own(), P.Op.PRODUCE: _handler}, BY_SERVED)
