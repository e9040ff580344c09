"""Python client for `cairn serve` (msgpack-RPC; see docs/protocol.md)."""
from .client import (
    CairnConnectionError,
    CairnError,
    Client,
    Delta,
    GenerationResult,
    InternalError,
    InvalidRequest,
    NotFound,
    Overloaded,
    PendingCall,
    Stream,
    TooLarge,
    Unauthorized,
    Unsupported,
    Usage,
    connect_from_env,
)

__all__ = [
    "CairnConnectionError", "CairnError", "Client", "Delta", "GenerationResult",
    "InternalError", "InvalidRequest", "NotFound", "Overloaded", "PendingCall", "Stream",
    "TooLarge", "Unauthorized", "Unsupported", "Usage", "connect_from_env",
]
__version__ = "0.1.0"
