from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("found", "value")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("key", "value", "sync")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    sync: bool
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., sync: _Optional[bool] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("key", "sync")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    sync: bool
    def __init__(self, key: _Optional[bytes] = ..., sync: _Optional[bool] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MultiGetRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MultiGetResponse(_message.Message):
    __slots__ = ("found", "values")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    found: _containers.RepeatedScalarFieldContainer[bool]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, found: _Optional[_Iterable[bool]] = ..., values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Mutation(_message.Message):
    __slots__ = ("key", "value", "is_delete")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    IS_DELETE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    is_delete: bool
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., is_delete: _Optional[bool] = ...) -> None: ...

class WriteRequest(_message.Message):
    __slots__ = ("mutations", "sync")
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    mutations: _containers.RepeatedCompositeFieldContainer[Mutation]
    sync: bool
    def __init__(self, mutations: _Optional[_Iterable[_Union[Mutation, _Mapping]]] = ..., sync: _Optional[bool] = ...) -> None: ...

class ShardWriteResult(_message.Message):
    __slots__ = ("shard", "applied", "mutations", "code", "message")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    shard: str
    applied: bool
    mutations: int
    code: int
    message: str
    def __init__(self, shard: _Optional[str] = ..., applied: _Optional[bool] = ..., mutations: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardWriteResult]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardWriteResult, _Mapping]]] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("start", "end", "limit")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start: bytes
    end: bytes
    limit: int
    def __init__(self, start: _Optional[bytes] = ..., end: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    values: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., values: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FilterReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CompactRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("dir",)
    DIR_FIELD_NUMBER: _ClassVar[int]
    dir: str
    def __init__(self, dir: _Optional[str] = ...) -> None: ...

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardSection(_message.Message):
    __slots__ = ("shard", "address", "ok", "code", "error", "json")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    shard: str
    address: str
    ok: bool
    code: int
    error: str
    json: str
    def __init__(self, shard: _Optional[str] = ..., address: _Optional[str] = ..., ok: _Optional[bool] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("shards", "totals", "json")
    class TotalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardSection]
    totals: _containers.ScalarMap[str, float]
    json: str
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardSection, _Mapping]]] = ..., totals: _Optional[_Mapping[str, float]] = ..., json: _Optional[str] = ...) -> None: ...

class FilterReportResponse(_message.Message):
    __slots__ = ("shards", "totals", "json")
    class TotalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardSection]
    totals: _containers.ScalarMap[str, float]
    json: str
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardSection, _Mapping]]] = ..., totals: _Optional[_Mapping[str, float]] = ..., json: _Optional[str] = ...) -> None: ...

class AdminResponse(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardSection]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardSection, _Mapping]]] = ...) -> None: ...

class SlotRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("name", "address", "slots", "health")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    slots: _containers.RepeatedCompositeFieldContainer[SlotRange]
    health: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., slots: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ..., health: _Optional[str] = ...) -> None: ...

class ClusterInfoResponse(_message.Message):
    __slots__ = ("role", "slot_count", "slot_function", "shards")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SLOT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    role: str
    slot_count: int
    slot_function: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    def __init__(self, role: _Optional[str] = ..., slot_count: _Optional[int] = ..., slot_function: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ...) -> None: ...
