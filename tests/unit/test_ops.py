"""The op spec (client/ops.py) is the one description of every op: its views, the ACL needs that
fail closed, the envelope both endpoints run, and docs/PROTOCOL.md's op table all follow it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailrace.broker import acl
from tailrace.broker.envelope import Envelope
from tailrace.client import ops
from tailrace.client import protocol as P
from tests.unit.test_layers import assemble

ROOT = Path(__file__).resolve().parents[2]
E = P.ErrorCode


def test_every_client_facing_op_needs_an_acl_operation_and_every_op_has_a_row():
    assert {row.op for row in ops.SPEC} == set(P.Op)
    for row in ops.SPEC:
        if row.served == ops.INTERNAL:
            assert row.op not in acl.OP_NEEDS and row.acl == ops.INTERNAL
        else:
            assert acl.OP_NEEDS[row.op] in acl.OPERATIONS, row


@pytest.mark.parametrize("plant, where, says", [
    # a client-facing op whose row names no ACL operation
    (('"group",    None,                      P.Empty)', '"",         None,                      P.Empty)'),
     "client/ops.py", "no ACL operation"),
    # ... or one broker/acl.py does not know
    (('"group",    None,                      P.Empty)', '"groups",   None,                      P.Empty)'),
     "client/ops.py", "needs acl='groups'"),
    # a new op with no row at all
    (("    ADOPT = 31", "    ADOPT = 31\n    REPLICA_FETCH = 39"), "client/protocol.py", "ops without a row: REPLICA_FETCH"),
])
def test_a_planted_op_without_an_acl_need_does_not_import(tmp_path, plant, where, says):
    tree = assemble(tmp_path)
    target = tree / "tailrace" / where
    text = target.read_text()
    assert text.count(plant[0]) == 1, plant[0]
    target.write_text(text.replace(plant[0], plant[1]))
    r = subprocess.run([sys.executable, "-c", "import tailrace.broker.acl"], cwd=str(tree), capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tree)})
    assert r.returncode != 0 and says in r.stderr, r.stderr
    target.write_text(text)  # unplanted, the same copy imports
    r = subprocess.run([sys.executable, "-c", "import tailrace.broker.acl"], cwd=str(tree), capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tree)})
    assert r.returncode == 0, r.stderr


def test_a_principal_without_rules_is_refused_every_op_including_ping_and_listing(tmp_path):
    data = str(tmp_path)
    acl.add_rule(data, acl.check_rule("alice", "*", "prefix", acl.OPERATIONS))  # rules exist: authorization is on
    rules = acl.Acls(data)
    for row in ops.SPEC:
        topic = b"" if row.names == ops.NOTHING else b"t"
        assert rules.refusal_for("nobody", row.op, topic) is not None, row.op.name
        allowed = rules.refusal_for("alice", row.op, topic)
        assert (allowed is None) == (row.served != ops.INTERNAL), (row.op.name, allowed)


def test_listing_topics_needs_describe_somewhere_and_is_not_refused_for_a_topic_rule(tmp_path):
    data = str(tmp_path)
    acl.add_rule(data, acl.check_rule("bob", "events", "exact", ["consume"]))
    acl.add_rule(data, acl.check_rule("carol", "g", "exact", ["group"]))
    rules = acl.Acls(data)
    assert rules.refusal_for("bob", P.Op.LIST_TOPICS, b"") is None  # consume implies describe on events
    assert "may not list topics" in rules.refusal_for("carol", P.Op.LIST_TOPICS, b"")


def test_the_envelope_refuses_internal_ops_to_clients_at_both_endpoints():
    router, worker = Envelope("router"), Envelope("worker")
    for op in ops.INTERNAL_OPS:
        assert router.check(1, op, b"", 2)[0] == E.UNKNOWN_OP
        assert worker.check(1, op, b"", 2)[0] == E.UNKNOWN_OP
        frames = ops.BY_OP[op].frames
        assert worker.check(1, op, b"", frames, from_router=True) is None
        assert worker.check(1, op, b"", frames)[0] == E.UNKNOWN_OP  # internal first, whatever the frames
    assert router.check(1, P.Op.WATCH, b"t", 2)[0] == E.INVALID_REQUEST  # same host only
    assert worker.check(1, P.Op.CREATE_TOPIC, b"t", 2)[0] == E.UNKNOWN_OP
    assert router.check(1, P.Op.STATUS, b"", 1) is None and worker.check(1, P.Op.LIST_OFFSETS, b"t", 1)[0] == E.MALFORMED
    assert router.check(1, P.Op.PRODUCE, b"x" * (P.MAX_TOPIC_BYTES + 1), 3)[0] == E.INVALID_REQUEST
    assert router.check(3, P.Op.PRODUCE, b"t", 3)[0] == E.UNSUPPORTED_VERSION
    assert router.check(2, P.Op.PRODUCE, b"t", 3) is None and router.check(0, P.Op.PRODUCE, b"t", 3)[0] == E.UNSUPPORTED_VERSION
    assert router.check(1, 99, b"t", 2)[0] == E.UNKNOWN_OP


def test_protocol_md_op_table_is_the_spec():
    """docs/PROTOCOL.md section 3 carries ``ops.doc_table()`` as it is (``python -m
    tailrace.client.ops`` prints it): a row changed in one place only fails here."""
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    assert ops.doc_table() in text, "docs/PROTOCOL.md's op table differs from client/ops.py: paste `python -m tailrace.client.ops`"


def test_every_handler_decodes_frame_1_with_its_rows_request_type():
    """ops.DECODERS comes from the rows, and the handlers' module-level decoders are those objects."""
    from tailrace.actors import fetch, fetch_multi, offsets, produce
    from tailrace.router import status, topics
    assert set(ops.DECODERS) == {row.op for row in ops.SPEC if row.request is not None}
    used = {produce._produce_dec, produce._multi_dec, fetch._fetch_dec, fetch_multi._dec, offsets._list_offsets_dec,
            status._set_workers_dec, topics._create_dec, topics._create_partitions_dec, topics._alter_configs_dec,
            topics._list_topics_dec, topics._reassign_dec}
    assert used <= set(ops.DECODERS.values())
