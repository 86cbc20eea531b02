from enum import StrEnum


class RunStatus(StrEnum):
    CANCELLED = "cancelled"
    FAILED = "failed"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    TIMED_OUT = "timed_out"

    def __str__(self) -> str:
        return str(self.value)
