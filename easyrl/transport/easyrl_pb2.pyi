from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_NONE: _ClassVar[StopKind]
    STOP_OUTPUT_MAX_STEPS: _ClassVar[StopKind]
    STOP_EVAL_TARGET: _ClassVar[StopKind]
    STOP_TARGET: _ClassVar[StopKind]
    STOP_MAX_ENV_STEPS: _ClassVar[StopKind]
    STOP_MAX_SECONDS: _ClassVar[StopKind]
STOP_NONE: StopKind
STOP_OUTPUT_MAX_STEPS: StopKind
STOP_EVAL_TARGET: StopKind
STOP_TARGET: StopKind
STOP_MAX_ENV_STEPS: StopKind
STOP_MAX_SECONDS: StopKind

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("known_version", "min_round", "wait_s", "optimizer_state", "shm_name")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATE_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    min_round: int
    wait_s: float
    optimizer_state: bool
    shm_name: str
    def __init__(self, known_version: _Optional[int] = ..., min_round: _Optional[int] = ..., wait_s: _Optional[float] = ..., optimizer_state: _Optional[bool] = ..., shm_name: _Optional[str] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("version", "current", "tensors", "round", "optimizer_state", "shm_body", "body")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATE_FIELD_NUMBER: _ClassVar[int]
    SHM_BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    version: int
    current: bool
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    round: int
    optimizer_state: _containers.RepeatedCompositeFieldContainer[Tensor]
    shm_body: int
    body: bytes
    def __init__(self, version: _Optional[int] = ..., current: _Optional[bool] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., round: _Optional[int] = ..., optimizer_state: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., shm_body: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("version", "gradients", "learner", "return_values", "queue", "shm_name", "shm_body", "shm_lent", "body")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    RETURN_VALUES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    SHM_BODY_FIELD_NUMBER: _ClassVar[int]
    SHM_LENT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    version: int
    gradients: _containers.RepeatedCompositeFieldContainer[Tensor]
    learner: int
    return_values: bool
    queue: bool
    shm_name: str
    shm_body: int
    shm_lent: bool
    body: bytes
    def __init__(self, version: _Optional[int] = ..., gradients: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., learner: _Optional[int] = ..., return_values: _Optional[bool] = ..., queue: _Optional[bool] = ..., shm_name: _Optional[str] = ..., shm_body: _Optional[int] = ..., shm_lent: _Optional[bool] = ..., body: _Optional[bytes] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("version", "applied", "staleness", "reason", "queued", "tensors", "body")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    version: int
    applied: bool
    staleness: int
    reason: str
    queued: bool
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    body: bytes
    def __init__(self, version: _Optional[int] = ..., applied: _Optional[bool] = ..., staleness: _Optional[int] = ..., reason: _Optional[str] = ..., queued: _Optional[bool] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., body: _Optional[bytes] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("tensors", "only_if_empty", "optimizer_state", "updates", "body")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ONLY_IF_EMPTY_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    only_if_empty: bool
    optimizer_state: _containers.RepeatedCompositeFieldContainer[Tensor]
    updates: int
    body: bytes
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., only_if_empty: _Optional[bool] = ..., optimizer_state: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., updates: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class AssignResponse(_message.Message):
    __slots__ = ("assigned", "version")
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    assigned: bool
    version: int
    def __init__(self, assigned: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("role", "task", "env_steps", "updates", "episode_returns", "episode_lengths", "stats", "eval_returns", "episode_policies")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_POLICIES_FIELD_NUMBER: _ClassVar[int]
    role: str
    task: int
    env_steps: int
    updates: int
    episode_returns: _containers.RepeatedScalarFieldContainer[float]
    episode_lengths: _containers.RepeatedScalarFieldContainer[int]
    stats: _containers.ScalarMap[str, float]
    eval_returns: _containers.RepeatedScalarFieldContainer[float]
    episode_policies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, role: _Optional[str] = ..., task: _Optional[int] = ..., env_steps: _Optional[int] = ..., updates: _Optional[int] = ..., episode_returns: _Optional[_Iterable[float]] = ..., episode_lengths: _Optional[_Iterable[int]] = ..., stats: _Optional[_Mapping[str, float]] = ..., eval_returns: _Optional[_Iterable[float]] = ..., episode_policies: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("stopping",)
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    stopping: bool
    def __init__(self, stopping: _Optional[bool] = ...) -> None: ...

class PublishRoundRequest(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class PublishRoundResponse(_message.Message):
    __slots__ = ("stopping",)
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    stopping: bool
    def __init__(self, stopping: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("role", "task", "version", "initialized", "stopping", "counters", "recent_returns", "stop_reason", "elapsed_s", "stop_kind")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    RECENT_RETURNS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    STOP_KIND_FIELD_NUMBER: _ClassVar[int]
    role: str
    task: int
    version: int
    initialized: bool
    stopping: bool
    counters: _containers.ScalarMap[str, float]
    recent_returns: _containers.RepeatedScalarFieldContainer[float]
    stop_reason: str
    elapsed_s: float
    stop_kind: StopKind
    def __init__(self, role: _Optional[str] = ..., task: _Optional[int] = ..., version: _Optional[int] = ..., initialized: _Optional[bool] = ..., stopping: _Optional[bool] = ..., counters: _Optional[_Mapping[str, float]] = ..., recent_returns: _Optional[_Iterable[float]] = ..., stop_reason: _Optional[str] = ..., elapsed_s: _Optional[float] = ..., stop_kind: _Optional[_Union[StopKind, str]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InsertRequest(_message.Message):
    __slots__ = ("tensors", "priorities", "actor", "round", "sender", "sequence", "shm_name", "shm_body", "body")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    SHM_BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    priorities: Tensor
    actor: int
    round: int
    sender: int
    sequence: int
    shm_name: str
    shm_body: int
    body: bytes
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., priorities: _Optional[_Union[Tensor, _Mapping]] = ..., actor: _Optional[int] = ..., round: _Optional[int] = ..., sender: _Optional[int] = ..., sequence: _Optional[int] = ..., shm_name: _Optional[str] = ..., shm_body: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class InsertResponse(_message.Message):
    __slots__ = ("size", "inserted", "refused", "round", "duplicate")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    size: int
    inserted: int
    refused: bool
    round: int
    duplicate: bool
    def __init__(self, size: _Optional[int] = ..., inserted: _Optional[int] = ..., refused: _Optional[bool] = ..., round: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("batch_size", "timeout_s", "round", "shm_name")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    timeout_s: float
    round: int
    shm_name: str
    def __init__(self, batch_size: _Optional[int] = ..., timeout_s: _Optional[float] = ..., round: _Optional[int] = ..., shm_name: _Optional[str] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("ready", "tensors", "keys", "weights", "round", "incomplete", "shm_body", "body")
    READY_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    SHM_BODY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    keys: Tensor
    weights: Tensor
    round: int
    incomplete: bool
    shm_body: int
    body: bytes
    def __init__(self, ready: _Optional[bool] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., keys: _Optional[_Union[Tensor, _Mapping]] = ..., weights: _Optional[_Union[Tensor, _Mapping]] = ..., round: _Optional[int] = ..., incomplete: _Optional[bool] = ..., shm_body: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class UpdatePrioritiesRequest(_message.Message):
    __slots__ = ("keys", "priorities", "body")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    keys: Tensor
    priorities: Tensor
    body: bytes
    def __init__(self, keys: _Optional[_Union[Tensor, _Mapping]] = ..., priorities: _Optional[_Union[Tensor, _Mapping]] = ..., body: _Optional[bytes] = ...) -> None: ...

class UpdatePrioritiesResponse(_message.Message):
    __slots__ = ("updated",)
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    updated: int
    def __init__(self, updated: _Optional[int] = ...) -> None: ...
