"""Topic settings as the router takes them (router/topics.py ``check_config``): Kafka's names,
integers, -1 for no limit, ring.bytes at creation only, "" resets (alter only)."""

from __future__ import annotations

from tailrace.router.topics import check_config


def test_known_settings_become_integers_and_bad_ones_are_refused_whole():
    assert check_config({"retention.ms": "86400000", "retention.bytes": "-1", "ring.bytes": "65536"}, creating=True) == (
        {"retention.ms": 86400000, "retention.bytes": -1, "ring.bytes": 65536}, None)
    assert check_config({"retention.ms": ""}, creating=False) == ({"retention.ms": None}, None)  # back to the default
    for config, creating, words in (({"retention.hours": "1"}, True, "unknown topic setting"),
                                    ({"retention.ms": "soon"}, True, "an integer"),
                                    ({"retention.ms": "-2"}, True, "-1 for no limit"),
                                    ({"retention.bytes": "-5"}, False, "-1 for no limit"),
                                    ({"ring.bytes": "65536"}, False, "when a topic is created"),
                                    ({"retention.ms": "", "x": "1"}, False, "unknown topic setting")):
        got, why = check_config(config, creating)
        assert got == {} and why is not None and words in why, (config, why)
