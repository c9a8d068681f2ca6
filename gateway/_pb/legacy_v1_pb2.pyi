from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TYPE_INVALID: _ClassVar[DataType]
    TYPE_BOOL: _ClassVar[DataType]
    TYPE_UINT8: _ClassVar[DataType]
    TYPE_UINT16: _ClassVar[DataType]
    TYPE_UINT32: _ClassVar[DataType]
    TYPE_UINT64: _ClassVar[DataType]
    TYPE_INT8: _ClassVar[DataType]
    TYPE_INT16: _ClassVar[DataType]
    TYPE_INT32: _ClassVar[DataType]
    TYPE_INT64: _ClassVar[DataType]
    TYPE_FP16: _ClassVar[DataType]
    TYPE_FP32: _ClassVar[DataType]
    TYPE_FP64: _ClassVar[DataType]
    TYPE_STRING: _ClassVar[DataType]

class RequestStatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INVALID: _ClassVar[RequestStatusCode]
    SUCCESS: _ClassVar[RequestStatusCode]
    UNKNOWN: _ClassVar[RequestStatusCode]
    INTERNAL: _ClassVar[RequestStatusCode]
    NOT_FOUND: _ClassVar[RequestStatusCode]
    INVALID_ARG: _ClassVar[RequestStatusCode]
    UNAVAILABLE: _ClassVar[RequestStatusCode]
    UNSUPPORTED: _ClassVar[RequestStatusCode]
    ALREADY_EXISTS: _ClassVar[RequestStatusCode]

class ModelReadyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_UNKNOWN: _ClassVar[ModelReadyState]
    MODEL_READY: _ClassVar[ModelReadyState]
    MODEL_UNAVAILABLE: _ClassVar[ModelReadyState]
    MODEL_LOADING: _ClassVar[ModelReadyState]
    MODEL_UNLOADING: _ClassVar[ModelReadyState]

class ServerReadyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_INVALID: _ClassVar[ServerReadyState]
    SERVER_INITIALIZING: _ClassVar[ServerReadyState]
    SERVER_READY: _ClassVar[ServerReadyState]
    SERVER_EXITING: _ClassVar[ServerReadyState]
    SERVER_FAILED_TO_INITIALIZE: _ClassVar[ServerReadyState]
TYPE_INVALID: DataType
TYPE_BOOL: DataType
TYPE_UINT8: DataType
TYPE_UINT16: DataType
TYPE_UINT32: DataType
TYPE_UINT64: DataType
TYPE_INT8: DataType
TYPE_INT16: DataType
TYPE_INT32: DataType
TYPE_INT64: DataType
TYPE_FP16: DataType
TYPE_FP32: DataType
TYPE_FP64: DataType
TYPE_STRING: DataType
INVALID: RequestStatusCode
SUCCESS: RequestStatusCode
UNKNOWN: RequestStatusCode
INTERNAL: RequestStatusCode
NOT_FOUND: RequestStatusCode
INVALID_ARG: RequestStatusCode
UNAVAILABLE: RequestStatusCode
UNSUPPORTED: RequestStatusCode
ALREADY_EXISTS: RequestStatusCode
MODEL_UNKNOWN: ModelReadyState
MODEL_READY: ModelReadyState
MODEL_UNAVAILABLE: ModelReadyState
MODEL_LOADING: ModelReadyState
MODEL_UNLOADING: ModelReadyState
SERVER_INVALID: ServerReadyState
SERVER_INITIALIZING: ServerReadyState
SERVER_READY: ServerReadyState
SERVER_EXITING: ServerReadyState
SERVER_FAILED_TO_INITIALIZE: ServerReadyState

class ModelInput(_message.Message):
    __slots__ = ("name", "data_type", "dims")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelOutput(_message.Message):
    __slots__ = ("name", "data_type", "dims", "label_filename")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FILENAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    dims: _containers.RepeatedScalarFieldContainer[int]
    label_filename: str
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., label_filename: _Optional[str] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "platform", "max_batch_size", "input", "output")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    platform: str
    max_batch_size: int
    input: _containers.RepeatedCompositeFieldContainer[ModelInput]
    output: _containers.RepeatedCompositeFieldContainer[ModelOutput]
    def __init__(self, name: _Optional[str] = ..., platform: _Optional[str] = ..., max_batch_size: _Optional[int] = ..., input: _Optional[_Iterable[_Union[ModelInput, _Mapping]]] = ..., output: _Optional[_Iterable[_Union[ModelOutput, _Mapping]]] = ...) -> None: ...

class RequestStatus(_message.Message):
    __slots__ = ("code", "msg", "server_id", "request_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    code: RequestStatusCode
    msg: str
    server_id: str
    request_id: int
    def __init__(self, code: _Optional[_Union[RequestStatusCode, str]] = ..., msg: _Optional[str] = ..., server_id: _Optional[str] = ..., request_id: _Optional[int] = ...) -> None: ...

class InferSharedMemory(_message.Message):
    __slots__ = ("name", "offset", "byte_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    byte_size: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class InferRequestHeader(_message.Message):
    __slots__ = ("batch_size", "input", "output", "correlation_id", "id", "flags", "priority", "timeout_microseconds")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FLAG_NONE: _ClassVar[InferRequestHeader.Flag]
        FLAG_SEQUENCE_START: _ClassVar[InferRequestHeader.Flag]
        FLAG_SEQUENCE_END: _ClassVar[InferRequestHeader.Flag]
    FLAG_NONE: InferRequestHeader.Flag
    FLAG_SEQUENCE_START: InferRequestHeader.Flag
    FLAG_SEQUENCE_END: InferRequestHeader.Flag
    class Input(_message.Message):
        __slots__ = ("name", "dims", "batch_byte_size", "shared_memory")
        NAME_FIELD_NUMBER: _ClassVar[int]
        DIMS_FIELD_NUMBER: _ClassVar[int]
        BATCH_BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
        SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
        name: str
        dims: _containers.RepeatedScalarFieldContainer[int]
        batch_byte_size: int
        shared_memory: InferSharedMemory
        def __init__(self, name: _Optional[str] = ..., dims: _Optional[_Iterable[int]] = ..., batch_byte_size: _Optional[int] = ..., shared_memory: _Optional[_Union[InferSharedMemory, _Mapping]] = ...) -> None: ...
    class Output(_message.Message):
        __slots__ = ("name", "cls", "shared_memory")
        class Class(_message.Message):
            __slots__ = ("count",)
            COUNT_FIELD_NUMBER: _ClassVar[int]
            count: int
            def __init__(self, count: _Optional[int] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        CLS_FIELD_NUMBER: _ClassVar[int]
        SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
        name: str
        cls: InferRequestHeader.Output.Class
        shared_memory: InferSharedMemory
        def __init__(self, name: _Optional[str] = ..., cls: _Optional[_Union[InferRequestHeader.Output.Class, _Mapping]] = ..., shared_memory: _Optional[_Union[InferSharedMemory, _Mapping]] = ...) -> None: ...
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    input: _containers.RepeatedCompositeFieldContainer[InferRequestHeader.Input]
    output: _containers.RepeatedCompositeFieldContainer[InferRequestHeader.Output]
    correlation_id: int
    id: int
    flags: int
    priority: int
    timeout_microseconds: int
    def __init__(self, batch_size: _Optional[int] = ..., input: _Optional[_Iterable[_Union[InferRequestHeader.Input, _Mapping]]] = ..., output: _Optional[_Iterable[_Union[InferRequestHeader.Output, _Mapping]]] = ..., correlation_id: _Optional[int] = ..., id: _Optional[int] = ..., flags: _Optional[int] = ..., priority: _Optional[int] = ..., timeout_microseconds: _Optional[int] = ...) -> None: ...

class InferResponseHeader(_message.Message):
    __slots__ = ("model_name", "model_version", "batch_size", "output", "id")
    class Output(_message.Message):
        __slots__ = ("name", "raw", "batch_classes", "data_type")
        class Raw(_message.Message):
            __slots__ = ("dims", "batch_byte_size")
            DIMS_FIELD_NUMBER: _ClassVar[int]
            BATCH_BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
            dims: _containers.RepeatedScalarFieldContainer[int]
            batch_byte_size: int
            def __init__(self, dims: _Optional[_Iterable[int]] = ..., batch_byte_size: _Optional[int] = ...) -> None: ...
        class Class(_message.Message):
            __slots__ = ("idx", "value", "label")
            IDX_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            LABEL_FIELD_NUMBER: _ClassVar[int]
            idx: int
            value: float
            label: str
            def __init__(self, idx: _Optional[int] = ..., value: _Optional[float] = ..., label: _Optional[str] = ...) -> None: ...
        class Classes(_message.Message):
            __slots__ = ("cls",)
            CLS_FIELD_NUMBER: _ClassVar[int]
            cls: _containers.RepeatedCompositeFieldContainer[InferResponseHeader.Output.Class]
            def __init__(self, cls: _Optional[_Iterable[_Union[InferResponseHeader.Output.Class, _Mapping]]] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        RAW_FIELD_NUMBER: _ClassVar[int]
        BATCH_CLASSES_FIELD_NUMBER: _ClassVar[int]
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        name: str
        raw: InferResponseHeader.Output.Raw
        batch_classes: _containers.RepeatedCompositeFieldContainer[InferResponseHeader.Output.Classes]
        data_type: DataType
        def __init__(self, name: _Optional[str] = ..., raw: _Optional[_Union[InferResponseHeader.Output.Raw, _Mapping]] = ..., batch_classes: _Optional[_Iterable[_Union[InferResponseHeader.Output.Classes, _Mapping]]] = ..., data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: int
    batch_size: int
    output: _containers.RepeatedCompositeFieldContainer[InferResponseHeader.Output]
    id: int
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[int] = ..., batch_size: _Optional[int] = ..., output: _Optional[_Iterable[_Union[InferResponseHeader.Output, _Mapping]]] = ..., id: _Optional[int] = ...) -> None: ...

class ModelReadyStateReason(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ModelVersionStatus(_message.Message):
    __slots__ = ("ready_state", "ready_state_reason")
    READY_STATE_FIELD_NUMBER: _ClassVar[int]
    READY_STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    ready_state: ModelReadyState
    ready_state_reason: ModelReadyStateReason
    def __init__(self, ready_state: _Optional[_Union[ModelReadyState, str]] = ..., ready_state_reason: _Optional[_Union[ModelReadyStateReason, _Mapping]] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("config", "version_status")
    class VersionStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: ModelVersionStatus
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[ModelVersionStatus, _Mapping]] = ...) -> None: ...
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    VERSION_STATUS_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    version_status: _containers.MessageMap[int, ModelVersionStatus]
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ..., version_status: _Optional[_Mapping[int, ModelVersionStatus]] = ...) -> None: ...

class ServerStatus(_message.Message):
    __slots__ = ("id", "version", "uptime_ns", "model_status", "ready_state")
    class ModelStatusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelStatus
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelStatus, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_NS_FIELD_NUMBER: _ClassVar[int]
    MODEL_STATUS_FIELD_NUMBER: _ClassVar[int]
    READY_STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    uptime_ns: int
    model_status: _containers.MessageMap[str, ModelStatus]
    ready_state: ServerReadyState
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., uptime_ns: _Optional[int] = ..., model_status: _Optional[_Mapping[str, ModelStatus]] = ..., ready_state: _Optional[_Union[ServerReadyState, str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("model_name",)
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    def __init__(self, model_name: _Optional[str] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("request_status", "server_status")
    REQUEST_STATUS_FIELD_NUMBER: _ClassVar[int]
    SERVER_STATUS_FIELD_NUMBER: _ClassVar[int]
    request_status: RequestStatus
    server_status: ServerStatus
    def __init__(self, request_status: _Optional[_Union[RequestStatus, _Mapping]] = ..., server_status: _Optional[_Union[ServerStatus, _Mapping]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: str
    def __init__(self, mode: _Optional[str] = ...) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("request_status", "health")
    REQUEST_STATUS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    request_status: RequestStatus
    health: bool
    def __init__(self, request_status: _Optional[_Union[RequestStatus, _Mapping]] = ..., health: bool = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("model_name", "model_version", "meta_data", "raw_input")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    META_DATA_FIELD_NUMBER: _ClassVar[int]
    RAW_INPUT_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    model_version: int
    meta_data: InferRequestHeader
    raw_input: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, model_name: _Optional[str] = ..., model_version: _Optional[int] = ..., meta_data: _Optional[_Union[InferRequestHeader, _Mapping]] = ..., raw_input: _Optional[_Iterable[bytes]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("request_status", "meta_data", "raw_output")
    REQUEST_STATUS_FIELD_NUMBER: _ClassVar[int]
    META_DATA_FIELD_NUMBER: _ClassVar[int]
    RAW_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    request_status: RequestStatus
    meta_data: InferResponseHeader
    raw_output: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, request_status: _Optional[_Union[RequestStatus, _Mapping]] = ..., meta_data: _Optional[_Union[InferResponseHeader, _Mapping]] = ..., raw_output: _Optional[_Iterable[bytes]] = ...) -> None: ...
