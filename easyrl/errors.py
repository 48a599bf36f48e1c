"""The easyrl error hierarchy: every error the framework raises on purpose."""


class EasyRLError(Exception):
    """Base class of every error easyrl raises on purpose."""


class ConfigError(EasyRLError):
    """A config file, an override or a cluster spec is invalid."""


class TransportError(EasyRLError):
    """A gRPC call failed after its retries, or a message could not be encoded."""


class ReplayError(EasyRLError):
    """A replay table was used against its contract (bad spec, bad keys, empty table)."""


class RateLimitTimeout(ReplayError):
    """A rate-limited insert or sample did not become legal before its deadline."""
