"""One exception class per protocol error code (see client/protocol.py ``ErrorCode``)."""

from __future__ import annotations

from .protocol import RETRIABLE, ErrorCode


class TailraceError(Exception):
    """Raised when the broker answers a request with an error code."""

    code = ErrorCode.INTERNAL
    retriable = False

    def __init__(self, message: str, code: int | None = None, **details):
        super().__init__(message)
        if code is not None:
            self.code = ErrorCode(code)
        self.details = details


def _make(code: ErrorCode, doc: str) -> type[TailraceError]:
    name = "".join(w.capitalize() for w in code.name.split("_")) + "Error"
    return type(name, (TailraceError,), {"code": code, "retriable": code in RETRIABLE, "__doc__": doc})


MalformedError = _make(ErrorCode.MALFORMED, "Raised when the broker could not parse the request's frames or header.")
UnsupportedVersionError = _make(ErrorCode.UNSUPPORTED_VERSION, "Raised when the broker does not speak the request's protocol version.")
UnknownOpError = _make(ErrorCode.UNKNOWN_OP, "Raised when the request names an op the broker does not know.")
UnknownTopicError = _make(ErrorCode.UNKNOWN_TOPIC, "Raised when the topic does not exist.")
UnknownPartitionError = _make(ErrorCode.UNKNOWN_PARTITION, "Raised when the topic has no such partition.")
CorruptBatchError = _make(ErrorCode.CORRUPT_BATCH, "Raised when a batch fails its CRC-32C or structure checks.")
BatchTooLargeError = _make(ErrorCode.BATCH_TOO_LARGE, "Raised when a batch exceeds the broker's size limit.")
OffsetOutOfRangeError = _make(ErrorCode.OFFSET_OUT_OF_RANGE, "Raised when a fetch offset lies outside [log start, high watermark].")
NotOwnerError = _make(ErrorCode.NOT_OWNER, "Raised when the addressed worker does not own the partition.")
BackpressureError = _make(ErrorCode.BACKPRESSURE, "Raised when the partition's ring is full and the flusher is behind.")
StorageUnavailableError = _make(ErrorCode.STORAGE_UNAVAILABLE, "Raised when the broker cannot write its journal.")
TopicExistsError = _make(ErrorCode.TOPIC_EXISTS, "Raised when creating a topic that already exists.")
ShmBudgetExceededError = _make(ErrorCode.SHM_BUDGET_EXCEEDED, "Raised when a topic would exceed the shared-memory budget.")
InvalidRequestError = _make(ErrorCode.INVALID_REQUEST, "Raised when a request field is out of range.")
TimeoutError_ = _make(ErrorCode.TIMEOUT, "Raised when the broker or the client gave up waiting.")
NotReadyError = _make(ErrorCode.NOT_READY, "Raised when the broker is starting or stopping.")
InternalError = _make(ErrorCode.INTERNAL, "Raised when the broker hit an internal error serving the request.")
NotAuthorizedError = _make(ErrorCode.NOT_AUTHORIZED, "Raised when the broker refused the request to this principal.")
UnknownMemberIdError = _make(ErrorCode.UNKNOWN_MEMBER_ID, "Raised when the group does not know the member (left, or its session expired).")
FencedMemberEpochError = _make(ErrorCode.FENCED_MEMBER_EPOCH, "Raised when a member commits partitions it no longer owns.")
GroupNotEmptyError = _make(ErrorCode.GROUP_NOT_EMPTY, "Raised when deleting or resetting a group that has members.")
UnknownGroupError = _make(ErrorCode.UNKNOWN_GROUP, "Raised when the group does not exist.")
AuthenticationFailedError = _make(ErrorCode.AUTHENTICATION_FAILED,
                                  "Raised when the broker refused the CURVE handshake: no key, a wrong key or one not allowed.")
OutOfOrderSequenceError = _make(ErrorCode.OUT_OF_ORDER_SEQUENCE,
                                "Raised when an idempotent batch's base sequence skips ahead of, or falls behind, what the partition expects.")
StorageFullError = _make(ErrorCode.STORAGE_FULL, "Raised when the broker refuses produce because its journal's disk is nearly full (retriable).")
InternalTopicError = _make(ErrorCode.INTERNAL_TOPIC, "Raised when topic admin names one of the broker's own topics (__consumer_offsets).")
InvalidTimestampError = _make(ErrorCode.INVALID_TIMESTAMP, "Raised when a record's create time is further from the broker's clock than "
                              "the topic's message.timestamp.{before,after}.max.ms allow (nothing stored).")
NotLeaderOrFollowerError = _make(ErrorCode.NOT_LEADER_OR_FOLLOWER, "Raised when a cluster broker does not lead the partition "
                                 "(it moved, or its broker is down: unavailable). Retriable: refresh the leaders and resend.")
NotControllerError = _make(ErrorCode.NOT_CONTROLLER, "Raised when topic admin reached a broker that is not the cluster's "
                           "controller; the reply names the controller's endpoint.")
NotCoordinatorError = _make(ErrorCode.NOT_COORDINATOR, "Raised when a group op reached a cluster broker that does not "
                            "coordinate the group; the reply names the coordinator's endpoint (retriable there).")
MetadataUnavailableError = _make(ErrorCode.METADATA_UNAVAILABLE, "Raised when a cluster's metadata cannot be changed now "
                                 "(etcd unreachable, or no controller yet); nothing changed. Retriable.")
NotEnoughReplicasError = _make(ErrorCode.NOT_ENOUGH_REPLICAS, "Raised when an acks=all or durable batch reached a "
                               "replicated partition with fewer in-sync replicas than its min.insync.replicas; nothing "
                               "stored. Retriable (a follower back in sync).")
InvalidRecordStateError = _make(ErrorCode.INVALID_RECORD_STATE, "Raised when a share-group acknowledgement names records "
                                "this member does not hold (never acquired by it, or its lock expired and they went "
                                "to another): nothing changed for them.")



class BootstrapError(TailraceError, ValueError):
    """Raised when a bootstrap address is not ``host:port``, ``tcp://host:port``, a bare port or
    an ``ipc://`` path (nothing was sent)."""

    code = ErrorCode.INVALID_REQUEST


class BrokerUnavailableError(TimeoutError_):
    """Raised when no broker completed a connection handshake at the bootstrap address within
    the connect timeout (a stopped broker, a wrong port, a firewall)."""


class ConnectionLostError(TimeoutError_):
    """Raised when the connection a request went on was closed before its reply came: the
    broker dropped it (a message part over its frame limit), or the router or the worker the
    request was sent to stopped or was killed. The request's fate is unknown, as after a
    timeout (it may have been handled), but it is known at once instead of after
    ``request_timeout_ms``. Retriable: an idempotent producer resends the batch by itself (the
    broker recognises a batch it already stored); this error reaches the caller only for a
    request that cannot be resent safely (``idempotent=False``, an admin call)."""


BY_CODE: dict[int, type[TailraceError]] = {
    cls.code: cls
    for cls in (
        MalformedError, UnsupportedVersionError, UnknownOpError, UnknownTopicError, UnknownPartitionError,
        CorruptBatchError, BatchTooLargeError, OffsetOutOfRangeError, NotOwnerError, BackpressureError,
        StorageUnavailableError, TopicExistsError, ShmBudgetExceededError, InvalidRequestError, TimeoutError_,
        NotReadyError, InternalError, NotAuthorizedError, AuthenticationFailedError, UnknownMemberIdError,
        FencedMemberEpochError, GroupNotEmptyError, UnknownGroupError, OutOfOrderSequenceError, InternalTopicError,
        StorageFullError, InvalidTimestampError, NotLeaderOrFollowerError, NotControllerError,
        MetadataUnavailableError, NotCoordinatorError, NotEnoughReplicasError,
    )
}


__all__ = ["error_for", *(name for name, v in list(globals().items()) if isinstance(v, type) and issubclass(v, TailraceError))]


def error_for(code: int, message: str, **details) -> TailraceError:
    cls = BY_CODE.get(code, TailraceError)
    return cls(message, code=code, **details)
