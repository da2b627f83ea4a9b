"""The topic settings a client may set (CREATE_TOPIC ``config``, ALTER_CONFIGS), re-exported as
``protocol.TOPIC_CONFIGS`` (docs/PROTOCOL.md): name -> what it takes."""

# Topic settings a client may set (CREATE_TOPIC config, ALTER_CONFIGS), Kafka's names where the
# concept is Kafka's: name -> what it takes
TOPIC_CONFIGS = {
    "retention.ms": "ms a record is kept, -1 for ever (the broker's --retention-ms by default)",
    "retention.bytes": "bytes of batches a partition keeps at most, -1 no limit (the broker's --retention-bytes by default)",
    "ring.bytes": "the shared-memory ring of each partition, bytes (at creation only: ring_bytes)",
    # the record settings (broker/record_policy.py SETTINGS, Kafka's names and meanings)
    "message.timestamp.type": "CreateTime (the producer's time per record, default) or LogAppendTime (the broker's)",
    "compression.type": "producer (keep what came, default), uncompressed, gzip, snappy, lz4 or zstd (recompressed on the broker)",
    "message.timestamp.before.max.ms": "a CreateTime record at most this many ms older than the broker's clock, -1 no limit (default)",
    "message.timestamp.after.max.ms": "a CreateTime record at most this many ms ahead of the broker's clock, -1 no limit (default 3600000)",
    "min.insync.replicas": "cluster: in-sync replicas an acks=all or durable batch needs, else refused NOT_ENOUGH_REPLICAS (default 2, at most the replication factor)",
    "unclean.leader.election.enable": "cluster: 1 lets a replica outside the ISR lead when no in-sync one lives (records may be lost, logged loudly); 0 keeps the partition offline (default)",
}
