"""The README's Spark example, run as written against a real broker and Spark session (only the
address changed): it once failed with ``UNKNOWN_TOPIC 'events-copy'``, a topic it never made."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tailrace import Admin, Consumer, Producer

ROOT = Path(__file__).resolve().parents[2]


def readme_spark_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Spark\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_spark_example_runs_as_written(spark, spark_broker, tmp_path, monkeypatch, capsys):
    code = readme_spark_example().replace("tcp://127.0.0.1:7420", spark_broker.bootstrap)
    assert "events-copy" in code and spark_broker.bootstrap in code
    with Admin(spark_broker.bootstrap) as admin:
        names = {t.name for t in admin.list_topics()}
        assert "events" not in names and "events-copy" not in names
        admin.create_topic("events", 2)
    with Producer(spark_broker.bootstrap) as p:
        p.send_batch("events", [b"e%d" % i for i in range(100)])
    # Its parquet folder is a relative path: Spark's JVM resolves it against its own working
    # directory (where the session started), so that copy is removed after the run.
    jvm_copy = Path.cwd() / "events-parquet"
    made_here = not jvm_copy.exists()
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        if made_here:
            shutil.rmtree(jvm_copy, ignore_errors=True)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "100"
    with Consumer(spark_broker.bootstrap, max_wait_ms=200) as c:
        c.assign("events-copy", start="earliest")
        got = []
        for _ in range(50):
            got += c.poll(200)
            if len(got) >= 100:
                break
    assert sorted(r.value for r in got) == sorted(b"e%d" % i for i in range(100))
