from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MatmulPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MATMUL_PATH_AUTO: _ClassVar[MatmulPath]
    W16: _ClassVar[MatmulPath]
    MMQ: _ClassVar[MatmulPath]
    FUSED_B: _ClassVar[MatmulPath]
MATMUL_PATH_AUTO: MatmulPath
W16: MatmulPath
MMQ: MatmulPath
FUSED_B: MatmulPath

class LoadModelRequest(_message.Message):
    __slots__ = ("name", "path", "matmul_path", "ctx", "pinned", "keep_alive_seconds", "parallel", "kv_tokens", "device")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MATMUL_PATH_FIELD_NUMBER: _ClassVar[int]
    CTX_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    matmul_path: MatmulPath
    ctx: int
    pinned: bool
    keep_alive_seconds: float
    parallel: int
    kv_tokens: int
    device: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., matmul_path: _Optional[_Union[MatmulPath, str]] = ..., ctx: _Optional[int] = ..., pinned: _Optional[bool] = ..., keep_alive_seconds: _Optional[float] = ..., parallel: _Optional[int] = ..., kv_tokens: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class LoadProgress(_message.Message):
    __slots__ = ("phase", "bytes_done", "bytes_total", "model")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    phase: str
    bytes_done: int
    bytes_total: int
    model: ModelInfo
    def __init__(self, phase: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("name", "freed_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    freed_bytes: int
    def __init__(self, name: _Optional[str] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ListAvailableRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AvailableModel(_message.Message):
    __slots__ = ("name", "path", "file_bytes", "architecture", "type_mix", "loaded", "plan", "plan_reason", "bytes", "fits", "error")
    class TypeMixEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TYPE_MIX_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PLAN_REASON_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    file_bytes: int
    architecture: str
    type_mix: _containers.ScalarMap[str, int]
    loaded: bool
    plan: str
    plan_reason: str
    bytes: ByKind
    fits: bool
    error: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., file_bytes: _Optional[int] = ..., architecture: _Optional[str] = ..., type_mix: _Optional[_Mapping[str, int]] = ..., loaded: _Optional[bool] = ..., plan: _Optional[str] = ..., plan_reason: _Optional[str] = ..., bytes: _Optional[_Union[ByKind, _Mapping]] = ..., fits: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class ListAvailableResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[AvailableModel]
    def __init__(self, models: _Optional[_Iterable[_Union[AvailableModel, _Mapping]]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("pool", "models", "events", "pools")
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pool: PoolInfo
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    events: _containers.RepeatedScalarFieldContainer[str]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, pool: _Optional[_Union[PoolInfo, _Mapping]] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., events: _Optional[_Iterable[str]] = ..., pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("device", "capacity_bytes", "used_bytes", "reserved_bytes", "free_bytes", "total_bytes", "w16_min_bytes", "allocated_bytes", "loading", "unloading")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    W16_MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOADING_FIELD_NUMBER: _ClassVar[int]
    UNLOADING_FIELD_NUMBER: _ClassVar[int]
    device: str
    capacity_bytes: int
    used_bytes: int
    reserved_bytes: int
    free_bytes: int
    total_bytes: int
    w16_min_bytes: int
    allocated_bytes: int
    loading: _containers.RepeatedScalarFieldContainer[str]
    unloading: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, device: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., w16_min_bytes: _Optional[int] = ..., allocated_bytes: _Optional[int] = ..., loading: _Optional[_Iterable[str]] = ..., unloading: _Optional[_Iterable[str]] = ...) -> None: ...

class ByKind(_message.Message):
    __slots__ = ("weights", "w16", "kv", "scratch")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    W16_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    SCRATCH_FIELD_NUMBER: _ClassVar[int]
    weights: int
    w16: int
    kv: int
    scratch: int
    def __init__(self, weights: _Optional[int] = ..., w16: _Optional[int] = ..., kv: _Optional[int] = ..., scratch: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "path", "architecture", "type_mix", "matmul_path", "reason", "planned_matmul_path", "bytes", "ctx", "pinned", "keep_alive_seconds", "keep_alive_left_seconds", "last_used_unix", "loaded_unix", "requests", "tokens_generated", "shared_with", "busy", "waiting_for_w16", "weight_set", "engine", "device", "classes")
    class TypeMixEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TYPE_MIX_FIELD_NUMBER: _ClassVar[int]
    MATMUL_PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLANNED_MATMUL_PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CTX_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_LEFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    LOADED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    SHARED_WITH_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_W16_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SET_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    architecture: str
    type_mix: _containers.ScalarMap[str, int]
    matmul_path: str
    reason: str
    planned_matmul_path: str
    bytes: ByKind
    ctx: int
    pinned: bool
    keep_alive_seconds: float
    keep_alive_left_seconds: float
    last_used_unix: float
    loaded_unix: float
    requests: int
    tokens_generated: int
    shared_with: _containers.RepeatedScalarFieldContainer[str]
    busy: bool
    waiting_for_w16: bool
    weight_set: str
    engine: EngineInfo
    device: str
    classes: _containers.RepeatedCompositeFieldContainer[TensorClass]
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., architecture: _Optional[str] = ..., type_mix: _Optional[_Mapping[str, int]] = ..., matmul_path: _Optional[str] = ..., reason: _Optional[str] = ..., planned_matmul_path: _Optional[str] = ..., bytes: _Optional[_Union[ByKind, _Mapping]] = ..., ctx: _Optional[int] = ..., pinned: _Optional[bool] = ..., keep_alive_seconds: _Optional[float] = ..., keep_alive_left_seconds: _Optional[float] = ..., last_used_unix: _Optional[float] = ..., loaded_unix: _Optional[float] = ..., requests: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., shared_with: _Optional[_Iterable[str]] = ..., busy: _Optional[bool] = ..., waiting_for_w16: _Optional[bool] = ..., weight_set: _Optional[str] = ..., engine: _Optional[_Union[EngineInfo, _Mapping]] = ..., device: _Optional[str] = ..., classes: _Optional[_Iterable[_Union[TensorClass, _Mapping]]] = ...) -> None: ...

class TensorClass(_message.Message):
    __slots__ = ("name", "quantized_bytes", "f16_copy_bytes", "note")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUANTIZED_BYTES_FIELD_NUMBER: _ClassVar[int]
    F16_COPY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    name: str
    quantized_bytes: int
    f16_copy_bytes: int
    note: str
    def __init__(self, name: _Optional[str] = ..., quantized_bytes: _Optional[int] = ..., f16_copy_bytes: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("running", "waiting", "blocks_total", "blocks_used", "blocks_cached", "blocks_free", "block_size", "kv_tokens")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_CACHED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    blocks_total: int
    blocks_used: int
    blocks_cached: int
    blocks_free: int
    block_size: int
    kv_tokens: int
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., blocks_total: _Optional[int] = ..., blocks_used: _Optional[int] = ..., blocks_cached: _Optional[int] = ..., blocks_free: _Optional[int] = ..., block_size: _Optional[int] = ..., kv_tokens: _Optional[int] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "max_tokens", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPEAT_LAST_N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    seed: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repeat_penalty: _Optional[float] = ..., repeat_last_n: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "text", "ids", "sampling", "add_special", "keep_alive_seconds")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    ids: TokenIds
    sampling: SamplingParams
    add_special: bool
    keep_alive_seconds: float
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., add_special: _Optional[bool] = ..., keep_alive_seconds: _Optional[float] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("text", "token_id", "finish_reason", "timings")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_id: int
    finish_reason: str
    timings: Timings
    def __init__(self, text: _Optional[str] = ..., token_id: _Optional[int] = ..., finish_reason: _Optional[str] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("generate", "chat")
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    generate: GenerateRequest
    chat: ChatRequest
    def __init__(self, generate: _Optional[_Union[GenerateRequest, _Mapping]] = ..., chat: _Optional[_Union[ChatRequest, _Mapping]] = ...) -> None: ...

class SocketHello(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class SocketError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SocketReply(_message.Message):
    __slots__ = ("event", "error")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    event: GenerateEvent
    error: SocketError
    def __init__(self, event: _Optional[_Union[GenerateEvent, _Mapping]] = ..., error: _Optional[_Union[SocketError, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("prompt_tokens", "generated_tokens", "prefill_ms", "decode_ms", "prefill_tok_s", "decode_tok_s", "cached_tokens", "preemptions")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOK_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOK_S_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    generated_tokens: int
    prefill_ms: float
    decode_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    cached_tokens: int
    preemptions: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., prefill_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., prefill_tok_s: _Optional[float] = ..., decode_tok_s: _Optional[float] = ..., cached_tokens: _Optional[int] = ..., preemptions: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("model", "messages", "sampling", "keep_alive_seconds")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    sampling: SamplingParams
    keep_alive_seconds: float
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., keep_alive_seconds: _Optional[float] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "text", "add_special")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    add_special: bool
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., add_special: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class SetModelOptionsRequest(_message.Message):
    __slots__ = ("name", "pinned", "keep_alive_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    pinned: bool
    keep_alive_seconds: float
    def __init__(self, name: _Optional[str] = ..., pinned: _Optional[bool] = ..., keep_alive_seconds: _Optional[float] = ...) -> None: ...

class DemoteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
